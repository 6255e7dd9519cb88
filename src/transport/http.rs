//! The POST handler: validation in the order the spec gives, then dispatch, then JSON or SSE.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::headers::{MCP_PROTOCOL_VERSION, check_method, check_name, check_params, header_text};
use super::{Endpoint, sse};
use crate::auth::Principal;
use crate::mrtr::Notifier;
use crate::protocol::jsonrpc::{error_bytes, success_bytes};
use crate::protocol::{Incoming, ProtocolError, RequestId, RequestMeta, version};
use crate::server::{Era, RequestEnv, Subscription};

/// Methods whose handlers may stream progress or log messages before their result.
pub(super) const STREAMABLE: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];

pub(super) async fn post(
    State(endpoint): State<Arc<Endpoint>>,
    http_request: axum::extract::Request,
) -> Response<Body> {
    // Taken apart rather than extracted, which would copy the headers.
    let (parts, body) = http_request.into_parts();
    let headers = parts.headers;
    if let Err(reason) = endpoint.options.origin.check(&headers) {
        tracing::warn!("refused request: {reason}");
        return error(
            StatusCode::FORBIDDEN,
            None,
            &ProtocolError::invalid_request(reason),
        );
    }
    if !is_json(&headers) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            &ProtocolError::invalid_request("Content-Type must be application/json"),
        );
    }
    let Some(accept) = Accept::from_headers(&headers) else {
        return error(
            StatusCode::NOT_ACCEPTABLE,
            None,
            &ProtocolError::invalid_request(
                "Accept must allow application/json or text/event-stream",
            ),
        );
    };
    let limit = endpoint.options.max_body_bytes;
    let body = match to_bytes(body, limit).await {
        Ok(body) => body,
        Err(_) => {
            let too_large = ProtocolError::invalid_request(format!(
                "Request body is larger than {limit} bytes"
            ));
            return error(StatusCode::PAYLOAD_TOO_LARGE, None, &too_large);
        }
    };
    let incoming = match Incoming::parse(&body) {
        Ok(incoming) => incoming,
        Err((id, e)) => return error_response(id.as_ref(), &e),
    };
    #[cfg(feature = "legacy")]
    if super::legacy::routes_here(&headers, &incoming) {
        return super::legacy::post(&endpoint, &headers, accept, incoming).await;
    }
    #[cfg(not(feature = "legacy"))]
    if let Some(refusal) = refuse_initialize(&incoming) {
        return refusal;
    }
    match incoming {
        // No client notification is defined for this wire; accept and ignore, as the binding says.
        Incoming::Notification { .. } => Response::builder()
            .status(StatusCode::ACCEPTED)
            .body(Body::empty())
            .unwrap_or_default(),
        Incoming::Response { id, .. } => error_response(
            Some(&id),
            &ProtocolError::invalid_request(
                "Clients must not send JSON-RPC responses on this protocol version",
            ),
        ),
        Incoming::Request { id, method, params } => {
            match request(&endpoint, &headers, accept, &id, &method, params).await {
                Ok(response) => response,
                Err(e) => error_response(Some(&id), &e),
            }
        }
    }
}

/// A modern-only server answers `initialize` with the versions it does support, so a legacy
/// client can show its user why it cannot connect.
#[cfg(not(feature = "legacy"))]
fn refuse_initialize(incoming: &Incoming) -> Option<Response<Body>> {
    let Incoming::Request { id, method, params } = incoming else {
        return None;
    };
    if method != "initialize" || params.contains_key("_meta") {
        return None;
    }
    let requested = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let refusal = ProtocolError::unsupported_version(requested, version::supported());
    Some(error_response(Some(id), &refusal))
}

#[cfg(not(feature = "legacy"))]
pub(super) async fn method_not_allowed() -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

/// Validates a 2026-07-28 request and serves it.
async fn request(
    endpoint: &Arc<Endpoint>,
    headers: &HeaderMap,
    accept: Accept,
    id: &RequestId,
    method: &str,
    params: Map<String, Value>,
) -> Result<Response<Body>, ProtocolError> {
    let principal = match endpoint.options.authenticator.authenticate(headers) {
        Ok(principal) => principal,
        Err(e) => return Ok(unauthorized(id, &e.0)),
    };
    let Some(header_version) = header_text(headers, &MCP_PROTOCOL_VERSION)? else {
        return Err(ProtocolError::header_mismatch(
            "Missing MCP-Protocol-Version header",
        ));
    };
    let meta = RequestMeta::from_params(&params)?;
    if header_version != meta.protocol_version {
        return Err(ProtocolError::header_mismatch(format!(
            "Header mismatch: MCP-Protocol-Version header value '{header_version}' does not match _meta value '{}'",
            meta.protocol_version
        )));
    }
    let supported = version::supported();
    if !supported.contains(&meta.protocol_version.as_str()) {
        return Err(ProtocolError::unsupported_version(
            &meta.protocol_version,
            supported,
        ));
    }
    check_method(headers, method)?;
    let server = &endpoint.server;
    if !server.implements(method) {
        return Err(ProtocolError::method_not_found(method));
    }
    check_name(headers, method, &params)?;
    if method == "tools/call"
        && let Some(tool) = params
            .get("name")
            .and_then(Value::as_str)
            .and_then(|name| server.registry().tool(name))
    {
        check_params(headers, &tool.header_params, params.get("arguments"))?;
    }

    if method == "subscriptions/listen" {
        if !accept.sse {
            return Err(ProtocolError::invalid_request(
                "subscriptions/listen needs Accept: text/event-stream",
            ));
        }
        let registry = server.registry();
        let subscription = Subscription::from_params(id.clone(), &params)?.limited_to(
            registry.has_tools(),
            registry.has_prompts(),
            registry.has_resources(),
        );
        return Ok(listen(endpoint, subscription));
    }

    let wants_stream = accept.sse
        && STREAMABLE.contains(&method)
        && (meta.progress_token.is_some() || meta.log_level.is_some());
    if !wants_stream {
        let env = RequestEnv {
            principal,
            meta,
            notifier: None,
            era: Era::Modern,
        };
        let reply = server.handle(method, &params, env).await?;
        return Ok(sse::json(StatusCode::OK, success_bytes(id, &reply)));
    }
    Ok(streamed(
        endpoint,
        principal,
        meta,
        Era::Modern,
        id.clone(),
        method.to_owned(),
        params,
    )
    .await)
}

/// What a streamed request's task produces: notifications, then exactly one final message.
enum Frame {
    Notification(Vec<u8>),
    Final(Result<Vec<u8>, ProtocolError>),
}

/// Runs the request in its own task and streams its notifications, then its response. Nothing is
/// sent until the first frame exists, so a request that fails (or finishes) before notifying
/// anything gets a plain JSON answer with the error's own HTTP status.
pub(super) async fn streamed(
    endpoint: &Arc<Endpoint>,
    principal: Principal,
    meta: RequestMeta,
    era: Era,
    id: RequestId,
    method: String,
    params: Map<String, Value>,
) -> Response<Body> {
    let (frames_tx, mut frames_rx) = mpsc::channel::<Frame>(16);
    let (notes_tx, mut notes_rx) = mpsc::channel::<Vec<u8>>(16);
    let server = endpoint.server.clone();
    let reply_id = id.clone();
    let task = tokio::spawn(async move {
        let env = RequestEnv {
            principal,
            meta,
            notifier: Some(Notifier::new(notes_tx)),
            era,
        };
        let forward = frames_tx.clone();
        let relay = async move {
            while let Some(note) = notes_rx.recv().await {
                if forward.send(Frame::Notification(note)).await.is_err() {
                    break;
                }
            }
        };
        // Notifications are relayed as they come; the relay ends when the handler drops its notifier.
        let (reply, ()) = tokio::join!(server.handle(&method, &params, env), relay);
        let last = reply.map(|reply| success_bytes(&reply_id, &reply));
        let _ = frames_tx.send(Frame::Final(last)).await;
    });
    let guard = sse::AbortOnDrop(task.abort_handle());
    let first = match frames_rx.recv().await {
        Some(Frame::Final(Ok(body))) => return sse::json(StatusCode::OK, body),
        Some(Frame::Final(Err(e))) => return error_response(Some(&id), &e),
        Some(Frame::Notification(note)) => sse::frame(&note),
        None => {
            return error_response(
                Some(&id),
                &ProtocolError::internal("the request ended without a response"),
            );
        }
    };
    let rest = ReceiverStream::new(frames_rx).map(move |frame| match frame {
        Frame::Notification(note) => sse::frame(&note),
        Frame::Final(Ok(body)) => sse::frame(&body),
        Frame::Final(Err(e)) => sse::frame(&error_bytes(Some(&id), &e)),
    });
    sse::stream(
        futures::stream::once(async { first }).chain(rest),
        guard,
        None,
    )
}

/// Opens a `subscriptions/listen` stream: the acknowledgement, then the events it opted into,
/// with keep-alive comments, until the client goes away.
fn listen(endpoint: &Arc<Endpoint>, subscription: Subscription) -> Response<Body> {
    let (frames_tx, frames_rx) = mpsc::channel::<Bytes>(64);
    let mut events = endpoint.server.events().subscribe();
    let task = tokio::spawn(async move {
        if frames_tx
            .send(sse::frame(&subscription.acknowledgement()))
            .await
            .is_err()
        {
            return;
        }
        loop {
            match events.recv().await {
                Ok(event) if subscription.wants(&event) => {
                    if frames_tx
                        .send(sse::frame(&subscription.notification(&event)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    sse::stream(
        ReceiverStream::new(frames_rx),
        sse::AbortOnDrop(task.abort_handle()),
        Some(endpoint.options.keepalive),
    )
}

/// What the client accepts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Accept {
    pub(super) sse: bool,
}

impl Accept {
    /// `None` when the client accepts neither JSON nor SSE.
    fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
            return Some(Self { sse: true });
        };
        let (mut json, mut sse) = (false, false);
        for media_type in accept
            .split(',')
            .map(|t| t.split(';').next().unwrap_or_default().trim())
        {
            match media_type {
                "*/*" => (json, sse) = (true, true),
                "application/json" | "application/*" => json = true,
                "text/event-stream" | "text/*" => sse = true,
                _ => {}
            }
        }
        (json || sse).then_some(Self { sse })
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

pub(super) fn error_response(id: Option<&RequestId>, e: &ProtocolError) -> Response<Body> {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, id, e)
}

pub(super) fn error(
    status: StatusCode,
    id: Option<&RequestId>,
    e: &ProtocolError,
) -> Response<Body> {
    sse::json(status, error_bytes(id, e))
}

pub(super) fn unauthorized(id: &RequestId, reason: &str) -> Response<Body> {
    let mut response = error(
        StatusCode::UNAUTHORIZED,
        Some(id),
        &ProtocolError::invalid_request(format!("Unauthorized: {reason}")),
    );
    let challenge = format!(
        "Bearer error=\"invalid_token\", error_description=\"{}\"",
        reason.replace('"', "'")
    );
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}
