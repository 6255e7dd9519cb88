//! The front door of `POST /mcp`: what HTTP adds is checked first, in the spec's order (Origin,
//! content type, `Accept`, body size, JSON), then the message goes to the wire of its era: the
//! 2026-07-28 wire ([`modern`](super::modern)), or with the `legacy` feature the 2025-11-25 one
//! for clients that open with `initialize`.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{Response, StatusCode};
#[cfg(not(feature = "legacy"))]
use serde_json::Value;

use super::Endpoint;
use super::respond::{Accept, error, error_response, is_json};
#[cfg(not(feature = "legacy"))]
use crate::protocol::Method;
#[cfg(not(feature = "legacy"))]
use crate::protocol::version;
use crate::protocol::{Incoming, ProtocolError};

/// `POST /mcp`.
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
    super::modern::post(&endpoint, &headers, accept, incoming).await
}

/// A modern-only server answers `initialize` with the versions it does support, so a legacy
/// client can show its user why it cannot connect.
#[cfg(not(feature = "legacy"))]
fn refuse_initialize(incoming: &Incoming) -> Option<Response<Body>> {
    let Incoming::Request { id, method, params } = incoming else {
        return None;
    };
    if method != Method::Initialize.as_str() || params.contains_key("_meta") {
        return None;
    }
    let requested = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let refusal = ProtocolError::unsupported_version(requested, version::supported());
    Some(error_response(Some(id), &refusal))
}
