//! How answers go back over HTTP: JSON bodies, JSON-RPC errors with their HTTP status, the 401
//! challenge, what the client accepts, and a request run in its own task with its notifications
//! streamed before its result.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use axum::response::IntoResponse;
use futures::StreamExt;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;

use super::streams::ServerFull;
use super::{Endpoint, MAX_HEAD_BYTES, sse};
use crate::auth::AuthError;
use crate::mrtr::Notifier;
use crate::protocol::jsonrpc::{error_bytes, success_bytes};
use crate::protocol::{Method, ProtocolError, RequestId};
use crate::server::{Era, RequestEnv};

/// What a streamed request's task produces: notifications, then exactly one final message, or
/// word that the client cancelled the request (then there is no final message).
enum Frame {
    Notification(Vec<u8>),
    Final(Result<Vec<u8>, ProtocolError>),
    Cancelled,
}

/// Completes when the client cancels a request (a 2025-11-25 `notifications/cancelled`).
pub(super) type Cancelled = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs the request in its own task and streams its notifications, then its response. Nothing is
/// sent until the first frame exists, so a request that fails (or finishes) before notifying
/// anything gets a plain JSON answer with the HTTP status its wire gives the error (its own on
/// 2026-07-28; in a legacy session 200, or 500 for an internal one). When `cancelled`
/// completes first, the handler is dropped and the stream ends without a response.
pub(super) async fn streamed(
    endpoint: &Arc<Endpoint>,
    mut env: RequestEnv,
    (id, method, params): (RequestId, Method, Map<String, Value>),
    cancelled: Option<Cancelled>,
) -> Response<Body> {
    let in_session = !matches!(env.era, Era::Modern);
    // An error sent before any frame is a plain JSON answer, with the status of its wire.
    let early = |error: ProtocolError| {
        let error = WireError::from(error).answering(Some(&id));
        if in_session {
            error.within_session()
        } else {
            error
        }
        .into_response()
    };
    let (frames_tx, mut frames_rx) = mpsc::channel::<Frame>(16);
    let (notes_tx, mut notes_rx) = mpsc::channel::<Vec<u8>>(16);
    let server = endpoint.server.clone();
    let reply_id = id.clone();
    let task = tokio::spawn(async move {
        env.notifier = Some(Notifier::new(notes_tx));
        let forward = frames_tx.clone();
        let relay = async move {
            while let Some(note) = notes_rx.recv().await {
                if forward.send(Frame::Notification(note)).await.is_err() {
                    break;
                }
            }
        };
        // Notifications are relayed as they come; the relay ends when the handler drops its notifier.
        let handling = async { tokio::join!(server.handle(method, &params, env), relay) };
        let (reply, ()) = match cancelled {
            None => handling.await,
            Some(cancelled) => tokio::select! {
                done = handling => done,
                () = cancelled => {
                    let _ = frames_tx.send(Frame::Cancelled).await;
                    return;
                }
            },
        };
        let last = reply.map(|reply| success_bytes(&reply_id, &reply));
        let _ = frames_tx.send(Frame::Final(last)).await;
    });
    let guard = AbortOnDropHandle::new(task);
    let first = match frames_rx.recv().await {
        Some(Frame::Final(Ok(body))) => return sse::json(StatusCode::OK, body),
        Some(Frame::Final(Err(e))) => return early(e),
        Some(Frame::Cancelled) => {
            return sse::stream(futures::stream::empty(), guard, None);
        }
        Some(Frame::Notification(note)) => sse::frame(&note),
        None => {
            return early(ProtocolError::internal(
                "the request ended without a response",
            ));
        }
    };
    let rest = ReceiverStream::new(frames_rx).filter_map(move |frame| {
        let bytes = match frame {
            Frame::Notification(note) => Some(sse::frame(&note)),
            Frame::Final(Ok(body)) => Some(sse::frame(&body)),
            Frame::Final(Err(e)) => Some(sse::frame(&error_bytes(Some(&id), &e))),
            Frame::Cancelled => None,
        };
        std::future::ready(bytes)
    });
    sse::stream(
        futures::stream::once(async { first }).chain(rest),
        guard,
        None,
    )
}

/// What the client accepts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Accept {
    pub(super) sse: bool,
}

impl Accept {
    /// `None` when the client accepts neither JSON nor SSE. Every `Accept` line counts (a list
    /// may be split over several); for each type the most specific range that names it decides,
    /// and `q=0` refuses it (RFC 9110, section 12.5.1).
    pub(super) fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut lines = headers.get_all(header::ACCEPT).iter().peekable();
        if lines.peek().is_none() {
            return Some(Self { sse: true });
        }
        let ranges: Vec<(String, bool)> = lines
            .filter_map(|line| line.to_str().ok())
            .flat_map(|line| line.split(','))
            .filter_map(media_range)
            .collect();
        let accepts = |kind: &str, subtype: &str| {
            ranges
                .iter()
                .filter_map(|(range, wanted)| {
                    let specificity = match range.split_once('/')? {
                        (k, s) if k == kind && s == subtype => 2,
                        (k, "*") if k == kind => 1,
                        ("*", "*") => 0,
                        _ => return None,
                    };
                    Some((specificity, *wanted))
                })
                .max_by_key(|(specificity, _)| *specificity)
                .is_some_and(|(_, wanted)| wanted)
        };
        let json = accepts("application", "json");
        let sse = accepts("text", "event-stream");
        (json || sse).then_some(Self { sse })
    }
}

/// One media range of an `Accept` list, in lower case, and whether it is wanted (its `q` is not
/// zero); `None` for an empty element.
fn media_range(element: &str) -> Option<(String, bool)> {
    let mut parts = element.split(';');
    let range = parts.next()?.trim().to_ascii_lowercase();
    if range.is_empty() {
        return None;
    }
    let refused = parts.any(|parameter| {
        parameter
            .split_once('=')
            .filter(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
            .and_then(|(_, value)| value.trim().parse::<f32>().ok())
            .is_some_and(|q| q <= 0.0)
    });
    Some((range, !refused))
}

pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// A JSON-RPC error on its way back over HTTP: the error, the id of the request it answers when
/// one is known, and the HTTP status (the error's own, unless a rule of the wire says another).
#[derive(Debug)]
pub(super) struct WireError {
    error: ProtocolError,
    id: Option<RequestId>,
    status: Option<StatusCode>,
    /// A header the refusal needs: the `WWW-Authenticate` challenge of a refused credential, or
    /// the `Retry-After` of a busy server.
    header: Option<(HeaderName, HeaderValue)>,
}

impl WireError {
    /// The same error as a 2025-11-25 session sends it: with HTTP 200 (to its client a 404
    /// means "session gone", and other statuses a failed transport), an internal one with 500.
    pub(super) fn within_session(self) -> Self {
        let status = if self.error.code == crate::protocol::error::INTERNAL_ERROR {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        self.with_status(status)
    }

    /// An invalid request refused with `status` (403 for a foreign Origin, 415, 413…).
    pub(super) fn refused(status: StatusCode, message: impl Into<String>) -> Self {
        Self::from(ProtocolError::invalid_request(message)).with_status(status)
    }

    /// HTTP 401 with the refusal's Bearer challenge (one naming its reason by default). A 401
    /// always carries a challenge (RFC 6750): one that is not a valid header value gives way to
    /// the default, whose description keeps to printable ASCII.
    pub(super) fn unauthorized(refusal: &AuthError) -> Self {
        let reason = &refusal.reason;
        let described = || {
            let description: String = reason
                .chars()
                .map(|c| match c {
                    '"' | '\\' => '\'',
                    ' '..='~' => c,
                    _ => '?',
                })
                .collect();
            HeaderValue::from_str(&format!(
                "Bearer error=\"invalid_token\", error_description=\"{description}\""
            ))
            .unwrap_or_else(|_| HeaderValue::from_static("Bearer error=\"invalid_token\""))
        };
        // `from_str` takes bytes past ASCII, which clients cannot read as text.
        let challenge = refusal
            .challenge
            .as_deref()
            .filter(|challenge| challenge.is_ascii())
            .and_then(|challenge| HeaderValue::from_str(challenge).ok())
            .unwrap_or_else(described);
        Self {
            header: Some((header::WWW_AUTHENTICATE, challenge)),
            ..Self::refused(StatusCode::UNAUTHORIZED, format!("Unauthorized: {reason}"))
        }
    }

    /// HTTP 403 with the `challenge` naming the scope a caller's token lacks.
    pub(super) fn insufficient_scope(scope: &str, challenge: &str) -> Self {
        Self {
            header: HeaderValue::from_str(challenge)
                .ok()
                .map(|value| (header::WWW_AUTHENTICATE, value)),
            ..Self::refused(
                StatusCode::FORBIDDEN,
                format!("Forbidden: this needs the {scope} scope, which the token does not grant"),
            )
        }
    }

    /// HTTP 503 (with `Retry-After: 1`, as every 503): every turn stayed taken for the whole
    /// wait.
    pub(super) fn busy() -> Self {
        let error = ProtocolError::internal("The server is busy; try again in a moment");
        Self::from(error).with_status(StatusCode::SERVICE_UNAVAILABLE)
    }

    /// The refusal (HTTP 431 with -32600) of a request whose `headers` (names, values and their
    /// separators) take more than [`MAX_HEAD_BYTES`].
    pub(super) fn head_too_large(headers: &HeaderMap) -> Option<Self> {
        let head_bytes: usize = headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + ": \r\n".len())
            .sum();
        (head_bytes > MAX_HEAD_BYTES).then(|| {
            Self::refused(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!(
                    "Request headers over {} KiB ({head_bytes} bytes)",
                    MAX_HEAD_BYTES / 1024
                ),
            )
        })
    }

    /// HTTP 503 with `Retry-After: 5`: the server holds as many long-lived streams as it may.
    pub(super) fn busy_with_streams() -> Self {
        let error = ProtocolError::internal(
            "The server holds as many open streams as it may; try again later",
        );
        Self {
            header: Some((header::RETRY_AFTER, HeaderValue::from_static("5"))),
            ..Self::from(error).with_status(StatusCode::SERVICE_UNAVAILABLE)
        }
    }

    /// The same error, answering the request `id` (unless it already answers one).
    pub(super) fn answering(mut self, id: Option<&RequestId>) -> Self {
        if self.id.is_none() {
            self.id = id.cloned();
        }
        self
    }

    /// The same error, sent with `status`.
    pub(super) fn with_status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }
}

impl From<ProtocolError> for WireError {
    fn from(error: ProtocolError) -> Self {
        Self {
            error,
            id: None,
            status: None,
            header: None,
        }
    }
}

impl IntoResponse for WireError {
    fn into_response(self) -> Response<Body> {
        let status = self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.error.http_status()).unwrap_or(StatusCode::BAD_REQUEST)
        });
        let mut response = sse::json(status, error_bytes(self.id.as_ref(), &self.error));
        // Every 503 says when to try again; an error that passes may say so with any status.
        let retry_after = self
            .error
            .retry_after_secs()
            .or((status == StatusCode::SERVICE_UNAVAILABLE).then_some(1));
        let header = self.header.or_else(|| {
            retry_after.map(|seconds| (header::RETRY_AFTER, HeaderValue::from(seconds)))
        });
        if let Some((name, value)) = header {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

impl From<ServerFull> for WireError {
    fn from(ServerFull: ServerFull) -> Self {
        WireError::busy_with_streams()
    }
}

/// HTTP 202 with no body: a notification or a client's answer was taken.
pub(super) fn accepted() -> Response<Body> {
    Response::builder()
        .status(StatusCode::ACCEPTED)
        .body(Body::empty())
        .unwrap_or_default()
}

/// GET and DELETE without the `legacy` feature: only POST is served.
#[cfg(not(feature = "legacy"))]
pub(super) async fn method_not_allowed() -> Response<Body> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge_of(refusal: &AuthError) -> Option<String> {
        let response = WireError::unauthorized(refusal).into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    }

    #[test]
    fn a_401_carries_a_challenge_whatever_its_reason_holds() {
        let reason = "the token says \"Grüße\" \\ and\r\nX-Injected: yes";
        let challenge = challenge_of(&AuthError::new(reason));
        assert_eq!(
            challenge.as_deref(),
            Some(
                "Bearer error=\"invalid_token\", error_description=\"the token says 'Gr??e' ' and??X-Injected: yes\""
            )
        );
        // An authenticator's own challenge that is no header value gives way to the default.
        for broken in ["Bearer realm=\"é\"", "Bearer realm=\"x\"\n"] {
            let refusal = AuthError::new("expired").with_challenge(broken.into());
            assert_eq!(
                challenge_of(&refusal).as_deref(),
                Some("Bearer error=\"invalid_token\", error_description=\"expired\""),
                "{broken:?}"
            );
        }
    }
}
