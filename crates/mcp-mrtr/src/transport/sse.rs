//! Response framing: a single JSON body, or an SSE stream of one-line `data:` frames that ends with
//! the final response. Dropping an SSE body (the client closed the stream) drops what it holds:
//! the work behind it, which then stops (or, for a 2025-11-25 call, runs on).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::Drain;
use super::streams::StreamSlot;

/// A complete JSON response.
pub fn json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Frames one JSON message as an SSE event.
pub fn frame(message: &[u8]) -> Bytes {
    let mut event = Vec::with_capacity(message.len() + 8);
    event.extend_from_slice(b"data: ");
    event.extend_from_slice(message);
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}

/// `frames`, with a comment line every `period` beside them (clients ignore comments; proxies and
/// load balancers see a stream that is alive), ending with them.
pub fn kept_alive<S>(frames: S, period: Duration) -> impl Stream<Item = Bytes> + Send + 'static
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let ticks = tokio_stream::wrappers::IntervalStream::new(tokio::time::interval_at(
        tokio::time::Instant::now() + period,
        period,
    ))
    .map(|_| Bytes::from_static(b": keep-alive\n\n"));
    // End with the frames: once the producer is gone there is nothing left to keep alive.
    tokio_stream::StreamExt::merge(
        frames
            .map(Some)
            .chain(futures::stream::once(async { None })),
        ticks.map(Some),
    )
    .take_while(|item| std::future::ready(item.is_some()))
    .filter_map(std::future::ready)
}

/// How a long-lived stream is kept: comment lines during quiet periods, its place among the
/// streams open, and an end when the server drains or its owner opens one stream more than its
/// share (a listen stream then ends with its closing response, which tells its client that the
/// subscription ended; one that still wants the notifications listens again, on another replica
/// when this one drains).
pub struct LongLived {
    /// Period of the comment lines.
    pub keepalive: Duration,
    /// Ends the stream when it begins.
    pub drain: Drain,
    /// The stream's place among those open, given back when the stream ends.
    pub slot: StreamSlot,
    /// The first frame, sent however soon the stream ends (a listen stream's acknowledgement).
    pub opening: Option<Bytes>,
    /// The last frame, when the server ends the stream (a listen stream's closing response).
    pub farewell: Option<Bytes>,
    /// When the server ends the stream: the moment the credentials it was opened with stop
    /// being accepted.
    pub ends_at: Option<tokio::time::Instant>,
}

/// An SSE response of `frames` (already framed), holding `guard` (what becomes of the work
/// behind the stream when it is dropped) until the client goes away or the frames end. A
/// `long_lived` stream gets keep-alive comments and ends when the server drains, its slot is
/// taken or its credentials expire.
pub fn stream<S, G>(frames: S, guard: G, long_lived: Option<LongLived>) -> Response<Body>
where
    S: Stream<Item = Bytes> + Send + 'static,
    G: Send + 'static,
{
    let body = match long_lived {
        None => Body::from_stream(frames.map(move |frame| {
            let _owned = &guard;
            Ok::<_, Infallible>(frame)
        })),
        Some(LongLived {
            keepalive: period,
            drain,
            slot,
            opening,
            farewell,
            ends_at,
        }) => {
            let replaced = slot.end_signal();
            let ended_by_server = Arc::new(AtomicBool::new(false));
            let ended = ended_by_server.clone();
            let server_ends = async move {
                let expired = async {
                    match ends_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = drain.begun() => {}
                    () = replaced.notified() => {}
                    () = expired => {}
                }
                ended.store(true, Ordering::Relaxed);
            };
            let merged = kept_alive(frames, period).take_until(server_ends);
            let framed = futures::stream::iter(opening).chain(merged).chain(
                // Read once the frames have ended: only a stream the server ended says farewell.
                futures::stream::iter(farewell)
                    .filter(move |_| std::future::ready(ended_by_server.load(Ordering::Relaxed))),
            );
            Body::from_stream(framed.map(move |frame| {
                let _owned = (&guard, &slot);
                Ok::<_, Infallible>(frame)
            }))
        }
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
