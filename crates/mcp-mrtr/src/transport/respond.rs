//! How answers go back over HTTP: JSON bodies, JSON-RPC errors with their HTTP status, the 401
//! challenge, what the client accepts, and a request run in its own task with its notifications
//! streamed before its result.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use axum::response::IntoResponse;
use futures::StreamExt;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument as _;

use super::run_on_room::RunOnRoom;
use super::streams::ServerFull;
use super::{Endpoint, MAX_HEAD_BYTES, sse};
use crate::auth::AuthError;
use crate::drain::{Drain, DrainHold};
use crate::mrtr::Notifier;
use crate::protocol::jsonrpc::{error_bytes, success_bytes};
use crate::protocol::{Method, ProtocolError, RequestId};
use crate::server::{Era, RequestEnv};
use crate::store::Owner;

/// What a streamed request's task produces: notifications, then exactly one final message, or
/// word that the client cancelled the request (then there is no final message).
enum Frame {
    Notification(Vec<u8>),
    Final(Result<Vec<u8>, ProtocolError>),
    Cancelled,
}

/// Completes when the client cancels a request (a 2025-11-25 `notifications/cancelled`).
pub(super) type Cancelled = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What stops a streamed request before its end.
pub(super) enum Stop {
    /// Its client closing the stream: on 2026-07-28 that is the cancellation.
    OnClose,
    /// Its client's `notifications/cancelled` (`cancelled` completes). On 2025-11-25 a closed
    /// stream is no cancellation (a network may drop it): the request runs on to its end, for
    /// [`MOST_RUN_ON`] at most, while `room` has a place for it (and `owner`, its caller, has
    /// one left of its share) and the server is not shutting down. What it sends after the
    /// close (a question, its response) is lost, a question given up at once. With no place,
    /// or while draining, a closed stream stops it.
    #[cfg_attr(
        not(feature = "legacy"),
        expect(dead_code, reason = "only legacy sessions")
    )]
    OnNotice {
        cancelled: Cancelled,
        room: Arc<RunOnRoom>,
        owner: Owner,
    },
}

/// The longest a request runs on after its client closed its stream: its own waits (a question's
/// answer, a provider's reply) are bounded well within this; a handler stuck past it is stopped.
const MOST_RUN_ON: Duration = Duration::from_secs(300);

/// A streamed request's task, held by its stream: when the stream is dropped before the task
/// has its outcome, the task is stopped, or runs on within its room (holding the drain open).
struct RequestTask {
    task: Option<JoinHandle<()>>,
    /// Set once the handler is done: all the task has left to do is send its last frame.
    handled: Arc<AtomicBool>,
    runs_on: Option<RunOn>,
}

/// Where a request of `owner` may run on after its stream closed, and for how long.
struct RunOn {
    room: Arc<RunOnRoom>,
    owner: Owner,
    drain: Drain,
    limit: Duration,
}

impl Drop for RequestTask {
    fn drop(&mut self) {
        let Some(mut task) = self.task.take() else {
            return;
        };
        if task.is_finished() || self.handled.load(Ordering::Acquire) {
            return;
        }
        let place = self.runs_on.take().and_then(|run_on| {
            if run_on.drain.has_begun() {
                return None;
            }
            let place = run_on.room.take(&run_on.owner)?;
            Some((place, run_on.drain.hold(), run_on.limit))
        });
        // A body dropped as the runtime shuts down has no runtime left to run on.
        match (place, tokio::runtime::Handle::try_current()) {
            (Some((place, hold, limit)), Ok(runtime)) => {
                runtime.spawn(async move {
                    let _held: (_, DrainHold) = (place, hold);
                    if tokio::time::timeout(limit, &mut task).await.is_err() {
                        task.abort();
                        tracing::warn!(
                            "stopped a request still running {} s after its client closed its stream",
                            limit.as_secs()
                        );
                    }
                });
            }
            _ => task.abort(),
        }
    }
}

/// Runs the request in its own task and streams its notifications, then its response. Nothing is
/// sent until the first frame exists, so a request that fails (or finishes) before notifying
/// anything gets a plain JSON answer with the HTTP status its wire gives the error (its own on
/// 2026-07-28; in a legacy session 200, or 500 for an internal one). What `stop` names ends the
/// request early: its handler is dropped and the stream ends without a response.
pub(super) async fn streamed(
    endpoint: &Arc<Endpoint>,
    mut env: RequestEnv,
    (id, method, params): (RequestId, Method, Map<String, Value>),
    stop: Stop,
) -> Response<Body> {
    let (cancelled, runs_on) = match stop {
        Stop::OnClose => (None, None),
        Stop::OnNotice {
            cancelled,
            room,
            owner,
        } => {
            let run_on = RunOn {
                room,
                owner,
                drain: endpoint.options.drain.clone(),
                limit: MOST_RUN_ON,
            };
            (Some(cancelled), Some(run_on))
        }
    };
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
    let handled = Arc::new(AtomicBool::new(false));
    let handler_done = handled.clone();
    let task = tokio::spawn(
        async move {
            env.notifier = Some(Notifier::new(notes_tx));
            let forward = frames_tx.clone();
            // Notifications are relayed as they come. The relay ends when the handler drops its
            // notifier, or as soon as the stream closes: what the handler sends after that (a
            // question, above all) then fails at once instead of waiting in the channel.
            let relay = async move {
                loop {
                    let note = tokio::select! {
                        biased;
                        () = forward.closed() => break,
                        note = notes_rx.recv() => note,
                    };
                    let Some(note) = note else { break };
                    if forward.send(Frame::Notification(note)).await.is_err() {
                        break;
                    }
                }
            };
            let handling = async { tokio::join!(server.handle(method, &params, env), relay) };
            let (reply, ()) = match cancelled {
                None => handling.await,
                Some(cancelled) => tokio::select! {
                    done = handling => done,
                    () = cancelled => {
                        handler_done.store(true, Ordering::Release);
                        let _ = frames_tx.send(Frame::Cancelled).await;
                        return;
                    }
                },
            };
            handler_done.store(true, Ordering::Release);
            let last = reply.map(|reply| success_bytes(&reply_id, &reply));
            let _ = frames_tx.send(Frame::Final(last)).await;
        }
        // In the request's span, as the requests answered in place are: its log lines name it.
        .in_current_span(),
    );
    let guard = RequestTask {
        task: Some(task),
        handled,
        runs_on,
    };
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
    // Kept alive: a 2025-11-25 call may wait minutes for its user's answer, and a proxy would
    // otherwise take the quiet stream for a dead one.
    let frames = futures::stream::once(async { first }).chain(rest);
    sse::stream(sse::kept_alive(frames, endpoint.keepalive()), guard, None)
}

/// What the client accepts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Accept {
    pub(super) sse: bool,
}

impl Accept {
    /// `None` when the client accepts neither JSON nor SSE. Every `Accept` line counts (a list
    /// may be split over several); for each type the most specific range that names it decides,
    /// and `q=0` refuses it (RFC 9110, section 12.5.1); of two ranges as specific, the later.
    /// Read in one pass without copying: every POST's headers go through it.
    pub(super) fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut lines = headers.get_all(header::ACCEPT).iter().peekable();
        if lines.peek().is_none() {
            return Some(Self { sse: true });
        }
        // The most specific range naming each type so far, and whether it wants it.
        let (mut json, mut sse): (Best, Best) = (None, None);
        let ranges = lines
            .filter_map(|line| line.to_str().ok())
            .flat_map(|line| line.split(','))
            .filter_map(media_range);
        for (range, wanted) in ranges {
            for (best, kind, subtype) in [
                (&mut json, "application", "json"),
                (&mut sse, "text", "event-stream"),
            ] {
                if let Some(specificity) = specificity(range, kind, subtype)
                    && best.is_none_or(|(so_far, _)| specificity >= so_far)
                {
                    *best = Some((specificity, wanted));
                }
            }
        }
        let wanted = |best: Best| best.is_some_and(|(_, wanted)| wanted);
        (wanted(json) || wanted(sse)).then_some(Self { sse: wanted(sse) })
    }
}

/// The most specific media range met that names a type: its specificity (see [`specificity`])
/// and whether it wants the type.
type Best = Option<(u8, bool)>;

/// How specifically `range` names `kind/subtype` (2 exactly, 1 as `kind/*`, 0 as `*/*`), or
/// `None` when it names another type. Media types are case-insensitive.
fn specificity(range: &str, kind: &str, subtype: &str) -> Option<u8> {
    let (k, s) = range.split_once('/')?;
    if k.eq_ignore_ascii_case(kind) {
        if s.eq_ignore_ascii_case(subtype) {
            return Some(2);
        }
        return (s == "*").then_some(1);
    }
    (k == "*" && s == "*").then_some(0)
}

/// One media range of an `Accept` list and whether it is wanted (its `q` is not zero); `None`
/// for an empty element.
fn media_range(element: &str) -> Option<(&str, bool)> {
    let mut parts = element.split(';');
    let range = parts.next()?.trim();
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
    /// Whether a method's handler answered with it, and so counted it already.
    handled: bool,
}

impl WireError {
    /// The error a method's handler answered with (counted with the requests it handled).
    pub(super) fn handled(error: ProtocolError) -> Self {
        Self {
            handled: true,
            ..Self::from(error)
        }
    }

    /// Counts a refusal the transport made in `mcp_requests_refused_total`.
    pub(super) fn count_refusal(&self) {
        if !self.handled {
            crate::observe::request_refused(self.status().as_u16(), self.error.code);
        }
    }

    /// The HTTP status it goes out with.
    fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.error.http_status()).unwrap_or(StatusCode::BAD_REQUEST)
        })
    }

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
            handled: false,
        }
    }
}

impl IntoResponse for WireError {
    fn into_response(self) -> Response<Body> {
        let status = self.status();
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

/// A method the endpoint does not serve (HEAD; GET and DELETE without the `legacy` feature):
/// 405, naming those it does.
pub(super) async fn method_not_allowed() -> Response<Body> {
    let served = if cfg!(feature = "legacy") {
        "GET, POST, DELETE"
    } else {
        "POST"
    };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(served));
    response
}

#[cfg(test)]
mod tests {
    use tokio::sync::Semaphore;

    use super::*;

    /// A task that finishes once `go` has a permit for it, saying so in `done`.
    fn waiting_task(go: Arc<Semaphore>, done: Arc<AtomicBool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            if go.acquire().await.is_ok() {
                done.store(true, Ordering::SeqCst);
            }
        })
    }

    /// Waits (5 s at most) for the task of `handle` to end.
    async fn ended(handle: &tokio::task::AbortHandle) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !handle.is_finished() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the task ends");
    }

    /// `task` held by its stream, which may run on in `room` for `limit` unless `drain` has
    /// begun; `handled` says its handler is done.
    fn held_by_stream(
        task: JoinHandle<()>,
        handled: bool,
        (room, drain, limit): (&Arc<RunOnRoom>, &Drain, Duration),
    ) -> RequestTask {
        RequestTask {
            task: Some(task),
            handled: Arc::new(AtomicBool::new(handled)),
            runs_on: Some(RunOn {
                room: room.clone(),
                owner: Owner::new("user:ann"),
                drain: drain.clone(),
                limit,
            }),
        }
    }

    /// Waits (5 s at most) until `room` holds `count` places.
    async fn holding(room: &RunOnRoom, count: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while room.held() != count {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the room holds as many places");
    }

    #[tokio::test]
    async fn a_task_runs_on_after_its_stream_closes_while_its_room_has_a_place() {
        let room = RunOnRoom::new(1);
        let drain = Drain::default();
        let go = Arc::new(Semaphore::new(0));
        let (first_done, second_done) = (Arc::default(), Arc::default());
        let held = |task| held_by_stream(task, false, (&room, &drain, MOST_RUN_ON));
        let first = held(waiting_task(go.clone(), Arc::clone(&first_done)));
        let second = held(waiting_task(go.clone(), Arc::clone(&second_done)));
        drop(first);
        assert_eq!(room.held(), 1, "the first took the place");
        drop(second);
        go.add_permits(2);
        tokio::time::timeout(Duration::from_secs(5), drain.released())
            .await
            .expect("the drain is released once the task that ran on ends");
        assert!(first_done.load(Ordering::SeqCst), "ran on to its end");
        assert!(!second_done.load(Ordering::SeqCst), "stopped: no room");
        holding(&room, 0).await;
    }

    #[tokio::test]
    async fn a_task_without_a_room_stops_when_its_stream_closes() {
        let go = Arc::new(Semaphore::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let task = waiting_task(go.clone(), done.clone());
        let aborted = task.abort_handle();
        drop(RequestTask {
            task: Some(task),
            handled: Arc::default(),
            runs_on: None,
        });
        ended(&aborted).await;
        go.add_permits(1);
        tokio::task::yield_now().await;
        assert!(!done.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_task_runs_on_for_its_limit_at_most_and_not_while_draining() {
        let room = RunOnRoom::new(1);
        let drain = Drain::default();
        let go = Arc::new(Semaphore::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let held = |task, limit| held_by_stream(task, false, (&room, &drain, limit));
        let stuck = waiting_task(go.clone(), done.clone());
        let stopped = stuck.abort_handle();
        drop(held(stuck, Duration::from_millis(50)));
        assert_eq!(room.held(), 1, "it runs on");
        // Its place is given back once its time is up.
        holding(&room, 0).await;
        tokio::time::timeout(Duration::from_secs(5), drain.released())
            .await
            .expect("and the drain with it");
        ended(&stopped).await;

        drain.begin();
        let late = waiting_task(go.clone(), done.clone());
        let stopped = late.abort_handle();
        drop(held(late, MOST_RUN_ON));
        assert_eq!(room.held(), 0, "no place taken while draining");
        ended(&stopped).await;
        go.add_permits(2);
        tokio::task::yield_now().await;
        assert!(!done.load(Ordering::SeqCst), "neither ran to its end");
    }

    #[tokio::test]
    async fn a_task_whose_handler_is_done_takes_no_place() {
        let room = RunOnRoom::new(1);
        let go = Arc::new(Semaphore::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let task = waiting_task(go.clone(), done.clone());
        drop(held_by_stream(
            task,
            true,
            (&room, &Drain::default(), MOST_RUN_ON),
        ));
        assert_eq!(room.held(), 0);
        go.add_permits(1);
        tokio::time::timeout(Duration::from_secs(5), async {
            while !done.load(Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("it sends its last frame all the same");
    }

    /// What `Accept` lines make of the two types: `None` for a refusal (406), else whether SSE
    /// is taken.
    fn accepting(lines: &[&str]) -> Option<bool> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(
                header::ACCEPT,
                HeaderValue::from_str(line).expect("a header"),
            );
        }
        Accept::from_headers(&headers).map(|accept| accept.sse)
    }

    #[test]
    fn accept_lists_are_read_as_rfc_9110_has_them() {
        assert_eq!(accepting(&[]), Some(true), "no Accept takes anything");
        assert_eq!(
            accepting(&["application/json, text/event-stream"]),
            Some(true)
        );
        assert_eq!(
            accepting(&["Application/JSON"]),
            Some(false),
            "types ignore case"
        );
        assert_eq!(accepting(&["TEXT/Event-Stream;Q=1"]), Some(true));
        assert_eq!(
            accepting(&["application/json", "text/event-stream"]),
            Some(true)
        );
        assert_eq!(accepting(&["text/*"]), Some(true));
        assert_eq!(accepting(&["*/*"]), Some(true));
        assert_eq!(accepting(&["image/png, , application/*"]), Some(false));
        // The most specific range decides, whatever its place in the list.
        assert_eq!(accepting(&["text/event-stream;q=0, */*"]), Some(false));
        assert_eq!(accepting(&["*/*;q=0, application/json"]), Some(false));
        assert_eq!(
            accepting(&["text/*;q=0, text/event-stream;q=0.5"]),
            Some(true)
        );
        // Of two as specific, the later.
        assert_eq!(
            accepting(&["text/event-stream;q=0, text/event-stream"]),
            Some(true)
        );
        assert_eq!(
            accepting(&["text/event-stream, text/event-stream;q=0.0"]),
            None
        );
        assert_eq!(accepting(&["image/png"]), None);
        assert_eq!(accepting(&["application/json;q=0, text/*;q=0"]), None);
        assert_eq!(accepting(&["application/jsonx, texts/event-stream"]), None);
    }

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
