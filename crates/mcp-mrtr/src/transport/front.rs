//! The front door of `POST /mcp`: what HTTP adds is checked first, in the spec's order (Origin,
//! then the size of the headers, content type, `Accept`, the credentials, body size, JSON), then
//! the message goes to the wire of its era: the 2026-07-28 wire ([`modern`](super::modern)), or
//! with the `legacy` feature the 2025-11-25 one for clients that open with `initialize`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Response, StatusCode, Version, header};
use bytes::{Bytes, BytesMut};
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

/// `POST /mcp`: its answer, a refusal counted as such.
pub(super) async fn post(
    endpoint: State<Arc<Endpoint>>,
    http_request: axum::extract::Request,
) -> Result<Response<Body>, WireError> {
    let answer = answer(endpoint, http_request).await;
    if let Err(refusal) = &answer {
        refusal.count_refusal();
    }
    answer
}

async fn answer(
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
    let (incoming, claim) = read_message(&endpoint, &headers, body).await?;
    // Taken once the body is in, so that a body that is slow to come (or never comes) holds
    // no turn: only what it sent of the budget of body bytes. Held while the request is handled;
    // a streamed answer returns its response, and so its turn, as soon as the stream starts.
    let _turn = within_busy_wait(&endpoint.turns, 1).await?;
    // The message waiting for its turn counted as its body did.
    drop(claim);
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
/// body bytes held at once (claimed as they arrive), with what it claimed.
async fn read_message(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Incoming, BodyClaim), WireError> {
    let limit = body_limit(endpoint);
    if declared_length(headers).is_some_and(|length| length > limit) {
        return Err(too_large(limit));
    }
    let wait = endpoint.options.body_read_timeout;
    let (body, claim) = read_claimed(body, limit, &endpoint.body_bytes, wait).await?;
    let incoming =
        Incoming::parse(&body).map_err(|(id, e)| WireError::from(e).answering(id.as_ref()))?;
    Ok((incoming, claim))
}

fn too_large(limit: usize) -> WireError {
    let message = format!("Request body is larger than {limit} bytes");
    WireError::refused(StatusCode::PAYLOAD_TOO_LARGE, message)
}

/// The budget of body bytes held at once, claimed as they arrive (so a body that stalls holds
/// only what it sent), and an overdraft that lets one request at a time finish reading past it:
/// bodies that filled the budget between them would otherwise each wait for the others' bytes,
/// and all fail. At most the budget and one body are claimed.
pub(super) struct BodyBudget {
    bytes: Arc<Semaphore>,
    overdraft: Arc<Semaphore>,
}

/// What one request holds of the [`BodyBudget`], given back when dropped.
#[derive(Default)]
struct BodyClaim {
    bytes: Option<OwnedSemaphorePermit>,
    overdraft: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    pub(super) fn new(bytes: usize) -> Self {
        Self {
            bytes: Arc::new(Semaphore::new(bytes)),
            overdraft: Arc::new(Semaphore::new(1)),
        }
    }

    /// Adds `bytes` to `claim` from the budget, waiting up to [`BUSY_WAIT`] for them (HTTP 503
    /// after that). A request that holds some of the budget already may take the overdraft
    /// instead, when it comes free first, and reads the rest of its body on it.
    async fn claim(&self, claim: &mut BodyClaim, bytes: u32) -> Result<(), WireError> {
        if claim.overdraft.is_some() {
            return Ok(());
        }
        let permit = match self.bytes.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => permit,
            Err(_) if claim.bytes.is_none() => within_busy_wait(&self.bytes, bytes).await?,
            Err(_) => {
                let (budget, overdraft) = (self.bytes.clone(), self.overdraft.clone());
                let either = async {
                    tokio::select! {
                        permit = budget.acquire_many_owned(bytes) => permit.map(Ok),
                        overdraft = overdraft.acquire_owned() => overdraft.map(Err),
                    }
                };
                match tokio::time::timeout(BUSY_WAIT, either).await {
                    Ok(Ok(Ok(permit))) => permit,
                    Ok(Ok(Err(overdraft))) => {
                        claim.overdraft = Some(overdraft);
                        return Ok(());
                    }
                    _ => return Err(WireError::busy()),
                }
            }
        };
        match &mut claim.bytes {
            Some(held) => held.merge(permit),
            None => claim.bytes = Some(permit),
        }
        Ok(())
    }
}

/// The whole of `body`, up to `limit` bytes, each chunk claimed from `budget` as it arrives,
/// with the claim; HTTP 408 when the body is not in within `wait` (a wait for the budget, the
/// server's doing, ends in 503 instead).
async fn read_claimed(
    body: Body,
    limit: usize,
    budget: &BodyBudget,
    wait: Duration,
) -> Result<(Bytes, BodyClaim), WireError> {
    let mut chunks = body.into_data_stream();
    let mut claim = BodyClaim::default();
    // Most bodies come in one chunk, kept as it is; more are joined.
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    // One timer for the whole body, polled only while a chunk is awaited.
    let late = tokio::time::sleep(wait);
    tokio::pin!(late);
    loop {
        let next = tokio::select! {
            next = chunks.next() => next,
            () = &mut late => {
                let message = format!(
                    "The request body did not arrive within {} s",
                    wait.as_secs()
                );
                return Err(WireError::refused(StatusCode::REQUEST_TIMEOUT, message));
            }
        };
        let Some(chunk) = next else {
            break;
        };
        let chunk = chunk.map_err(|_| {
            WireError::refused(
                StatusCode::BAD_REQUEST,
                "The request body could not be read",
            )
        })?;
        let read = first.len() + joined.as_ref().map_or(0, BytesMut::len) + chunk.len();
        if read > limit {
            return Err(too_large(limit));
        }
        if chunk.is_empty() {
            continue;
        }
        // Never past u32::MAX: the limit is at most MOST_BODY_BYTES.
        let bytes = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        budget.claim(&mut claim, bytes).await?;
        if first.is_empty() && joined.is_none() {
            first = chunk;
        } else {
            let joined = joined.get_or_insert_with(|| BytesMut::from(std::mem::take(&mut first)));
            joined.extend_from_slice(&chunk);
        }
    }
    let body = joined.map_or(first, BytesMut::freeze);
    Ok((body, claim))
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
