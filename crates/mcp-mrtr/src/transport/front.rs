//! The front door of `POST /mcp`: what HTTP adds is checked first, in the spec's order (Origin,
//! then the size of the headers, content type, `Accept`, the credentials, body size, JSON), then
//! the message goes to the wire of its era: the 2026-07-28 wire ([`modern`](super::modern)), or
//! with the `legacy` feature the 2025-11-25 one for clients that open with `initialize`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Response, StatusCode, Version, header};
use futures::StreamExt as _;
#[cfg(not(feature = "legacy"))]
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::respond::{Accept, WireError, is_json};
use super::{BUSY_WAIT, Endpoint, MOST_BODY_BYTES};
use crate::protocol::Incoming;
#[cfg(not(feature = "legacy"))]
use crate::protocol::Method;
#[cfg(not(feature = "legacy"))]
use crate::protocol::ProtocolError;
#[cfg(not(feature = "legacy"))]
use crate::protocol::meta::is_modern_meta;
#[cfg(not(feature = "legacy"))]
use crate::protocol::version;

/// How long a refused request's body is read, to be dropped, before the refusal goes out.
const DISCARD_WAIT: Duration = Duration::from_secs(2);

/// `POST /mcp`.
pub(super) async fn post(
    State(endpoint): State<Arc<Endpoint>>,
    http_request: axum::extract::Request,
) -> Result<Response<Body>, WireError> {
    // Taken apart rather than extracted, which would copy the headers.
    let (parts, body) = http_request.into_parts();
    let headers = parts.headers;
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| address.ip());
    if let Some(refusal) = endpoint.head_refusal(&parts.uri, &headers) {
        return Err(refusal);
    }
    if !is_json(&headers) {
        return Err(WireError::refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
        ));
    }
    let accept = Accept::from_headers(&headers).ok_or_else(|| {
        WireError::refused(
            StatusCode::NOT_ACCEPTABLE,
            "Accept must allow application/json or text/event-stream",
        )
    })?;
    // Credentials travel in the headers, on either wire: a caller whose credentials are refused
    // never holds a turn or the budget of body bytes while its body arrives, and its body is not
    // parsed (the 401 names no JSON-RPC id, as for the refusals above).
    let caller = match endpoint.options.authenticator.authenticate(&headers).await {
        Ok(caller) => caller,
        Err(refusal) => {
            let limit = body_limit(&endpoint);
            if wants_draining(parts.version, &headers, limit) {
                discard(body, limit).await;
            }
            return Err(WireError::unauthorized(&refusal));
        }
    };
    // Taken after the checks above, which need no body, so that requests they refuse never wait
    // for a turn. Held while the body is read and the request handled; a streamed
    // answer returns its response, and so its turn, as soon as the stream starts.
    let _turn = within_busy_wait(&endpoint.turns, 1).await?;
    let incoming = read_message(&endpoint, &headers, body).await?;
    #[cfg(feature = "legacy")]
    if super::legacy::routes_here(&headers, &incoming) {
        return super::legacy::post(&endpoint, &headers, (caller, peer), accept, incoming).await;
    }
    #[cfg(not(feature = "legacy"))]
    if let Some(refusal) = initialize_refusal(&incoming) {
        return Err(refusal);
    }
    super::modern::post(&endpoint, &headers, (caller, peer), accept, incoming).await
}

/// Reads and parses the body, within the size limit, the body-read timeout and the budget of
/// body bytes held at once (claimed up front from `Content-Length`, or the size limit without
/// one, and given back once the message is parsed).
async fn read_message(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<Incoming, WireError> {
    let limit = body_limit(endpoint);
    let too_large = || {
        let message = format!("Request body is larger than {limit} bytes");
        WireError::refused(StatusCode::PAYLOAD_TOO_LARGE, message)
    };
    let declared = declared_length(headers);
    if declared.is_some_and(|length| length > limit) {
        return Err(too_large());
    }
    // Never past u32::MAX: the limit is at most MOST_BODY_BYTES.
    let claim = u32::try_from(declared.unwrap_or(limit).max(1)).unwrap_or(u32::MAX);
    let _bytes = within_busy_wait(&endpoint.body_bytes, claim).await?;
    let wait = endpoint.options.body_read_timeout;
    let body = match tokio::time::timeout(wait, to_bytes(body, limit)).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return Err(too_large()),
        Err(_) => {
            let message = format!(
                "The request body did not arrive within {} s",
                wait.as_secs()
            );
            return Err(WireError::refused(StatusCode::REQUEST_TIMEOUT, message));
        }
    };
    Incoming::parse(&body).map_err(|(id, e)| WireError::from(e).answering(id.as_ref()))
}

/// The largest body this endpoint reads.
fn body_limit(endpoint: &Endpoint) -> usize {
    endpoint.options.max_body_bytes.clamp(1, MOST_BODY_BYTES)
}

/// The body's length as `Content-Length` declares it.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok())
}

/// Whether a refused request's body is worth reading to drop it: on HTTP/1 only (HTTP/2 ends a
/// stream cleanly with its body unread), not when the client waits for `100 Continue` before it
/// sends its body (reading would ask it for the body), and not when the body is declared larger
/// than `limit` (the connection is cut short anyway).
fn wants_draining(version: Version, headers: &HeaderMap, limit: usize) -> bool {
    let waits_to_send = headers
        .get(header::EXPECT)
        .is_some_and(|expect| expect.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    version < Version::HTTP_2
        && !waits_to_send
        && declared_length(headers).is_none_or(|length| length <= limit)
}

/// Reads and drops what arrives of a refused request's body, up to `most` bytes and for at most
/// [`DISCARD_WAIT`]: an HTTP/1 connection closed with bytes unread is reset, and a reset can
/// take the answer with it, so a client whose token just expired would not see its 401. Nothing
/// is kept, and a client slower than that is cut off.
async fn discard(body: Body, most: usize) {
    let mut chunks = body.into_data_stream();
    let drained = async {
        let mut read = 0;
        while let Some(Ok(chunk)) = chunks.next().await {
            read += chunk.len();
            if read > most {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_WAIT, drained).await;
}

/// `permits` of `semaphore`, waiting up to [`BUSY_WAIT`] for them (HTTP 503 after that). Taken
/// at once when free, which is the common case: no timeout is built then.
async fn within_busy_wait(
    semaphore: &Arc<Semaphore>,
    permits: u32,
) -> Result<OwnedSemaphorePermit, WireError> {
    if let Ok(taken) = semaphore.clone().try_acquire_many_owned(permits) {
        return Ok(taken);
    }
    match tokio::time::timeout(BUSY_WAIT, semaphore.clone().acquire_many_owned(permits)).await {
        Ok(Ok(taken)) => Ok(taken),
        _ => Err(WireError::busy()),
    }
}

/// A modern-only server answers `initialize` with the versions it does support, so a legacy
/// client can show its user why it cannot connect (once it is signed in: credentials come first).
#[cfg(not(feature = "legacy"))]
fn initialize_refusal(incoming: &Incoming) -> Option<WireError> {
    let Incoming::Request { id, method, params } = incoming else {
        return None;
    };
    if method != Method::Initialize.as_str() || is_modern_meta(params) {
        return None;
    }
    let requested = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let refusal = ProtocolError::unsupported_version(requested, version::supported());
    Some(WireError::from(refusal).answering(Some(id)))
}
