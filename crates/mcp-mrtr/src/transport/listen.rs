//! Accepting connections: the accept loop behind [`serve`](super::serve), and the hygiene that
//! keeps one client's sockets from starving everybody else's.
//!
//! Open connections are capped below the process's open-file limit; when the cap is reached the
//! connection idle the longest is closed to make room, and a failing `accept` (out of file
//! descriptors) backs off instead of spinning. A connection is closed when it takes too long to
//! send a request's headers (timed from the connection's opening for its first request, from the
//! first byte for later ones), or when it has sat idle (no request being handled, no byte read, and
//! nothing written while a request was in flight) for the idle timeout; a request counts until its
//! response body is handed over, so streams stay open, and the idle clock starts again when it
//! ends, so a client too slow to read its answers is not kept open by their last bytes. A
//! connection whose writes the client has held up (by not reading) in every check for the idle
//! timeout is closed too, requests in flight or not: a client that sends many requests at once
//! and reads the answers a trickle at a time would otherwise keep one in flight forever. On
//! HTTP/2, whose flow control lets a client stall an answer without filling the socket, a
//! connection is cut off when an answer has waited for the client to give it room for the idle
//! timeout, and only requests and answers keep it from being idle (a client's PINGs do not). These
//! rules are checked here rather than by hyper, whose header timer also runs while a kept-alive
//! connection waits for its next request and would close it long before the idle timeout. Each
//! request carries its peer's address as [`ConnectInfo`].
//!
//! When the server drains, it takes the connections already waiting in the listen queue (up to
//! the connection cap), then closes the listener (a balancer's new connections are refused, which
//! it may safely retry elsewhere). The queued ones are served: the kernel finished their
//! handshake, so a balancer may have sent a request on them, which it would not retry if closing
//! the listener reset them. Responses then say `Connection: close`, and a connection is closed
//! once it has sat idle for [`DRAIN_IDLE`] (a balancer's pooled connections, which it closes
//! itself sooner) or when the grace period ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, header};
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use super::Drain;

/// File descriptors kept free of connections, for the stores, the database, logs and the listener.
pub const RESERVED_DESCRIPTORS: u64 = 128;
/// The most connections one process is ever given, however high its open-file limit.
const CONNECTIONS_CEILING: usize = 1_000_000;
/// While draining, how long a connection with nothing to do stays open: longer than a balancer
/// keeps an unused pooled connection (nginx's `keepalive_timeout` in `deploy/nginx.conf` is 4 s),
/// so the balancer closes it first and never sends a request into a closing connection.
pub const DRAIN_IDLE: Duration = Duration::from_secs(5);
/// The shortest idle timeout served: a zero one would close every connection at its first check
/// and cut off any answer bigger than the socket's buffers.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long accept waits after failing (for instance out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How connections are bounded.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Most connections open at once; see [`max_connections`] for a bound that fits the process.
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers: timed from the opening for the
    /// first request, from the first byte read after the previous one began for later ones
    /// (bytes that came with the previous request are left to the idle timeout). Zero: no limit.
    pub header_read_timeout: Duration,
    /// Longest a connection may stay open with nothing to do.
    pub idle_timeout: Duration,
    /// On shutdown, how long requests being served may take to finish.
    pub shutdown_grace: Duration,
}

/// The most connections this process can hold: `wanted` when given, but always below the
/// open-file limit (raised to its hard maximum first) less [`RESERVED_DESCRIPTORS`].
pub fn max_connections(wanted: Option<usize>) -> usize {
    let limit = raise_open_file_limit();
    let fits = usize::try_from(limit.saturating_sub(RESERVED_DESCRIPTORS))
        .unwrap_or(usize::MAX)
        .clamp(1, CONNECTIONS_CEILING);
    match wanted {
        Some(wanted) if wanted > fits => {
            tracing::warn!(
                wanted,
                fits,
                open_file_limit = limit,
                "connection cap lowered to fit the open-file limit"
            );
            fits
        }
        Some(wanted) => wanted.max(1),
        None => fits.min(10_000),
    }
}

/// Raises the soft open-file limit to the hard one, returning the limit in force.
fn raise_open_file_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if limit.maximum != limit.current {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum.unwrap_or(u64::MAX);
        }
    }
    current
}

/// One open connection, as the accept loop sees it.
#[derive(Default)]
struct Tracked {
    /// Milliseconds since the registry's clock started, at the last check that found bytes
    /// moved (checks run every quarter of the idle timeout, at most every second).
    last_active: AtomicU64,
    /// Set when a byte is read, or written while a request is in flight, and when a request ends;
    /// cleared by the next check: no clock read per I/O. Bytes written after the last request
    /// ended do not count, so a client too slow to read its answers is not kept open by them.
    moved: AtomicBool,
    /// Requests being handled (from their headers until their response body is sent).
    busy: AtomicUsize,
    /// Requests begun since the connection opened.
    started: AtomicU64,
    /// One more than `started` was when bytes were last read with no request in flight (the start
    /// of the next request's headers), 0 before that.
    read_after: AtomicU64,
    /// Whether the connection speaks HTTP/2, which idles between streams with no headers due.
    http2: AtomicBool,
    /// Set when a write could not be made whole (the client is not reading fast enough to make
    /// room), cleared by the next check.
    held_up: AtomicBool,
    /// Whether the last write could not be made whole: the connection is waiting for room, and
    /// may wait long (the kernel wakes a writer only once a good part of its buffer is free).
    blocked: AtomicBool,
    /// Asks the connection to close once its current request, if any, is answered.
    close: Notify,
    /// HTTP/2 only: the answers hyper holds a frame of until the client gives it room (flow
    /// control), by number, with when each began to wait.
    awaiting_room: Mutex<HashMap<u64, Instant>>,
    /// HTTP/2 answers numbered so far.
    answers: AtomicU64,
}

impl Tracked {
    fn awaiting_room(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.awaiting_room.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long the answer that has waited the longest for the client to give it room has
    /// waited, if one is waiting (only HTTP/2 answers wait for room).
    fn longest_wait_for_room(&self) -> Option<Duration> {
        if !self.http2.load(Ordering::Relaxed) {
            return None;
        }
        let waiting = self.awaiting_room();
        waiting.values().min().map(Instant::elapsed)
    }

    /// Whether the connection owes a request's headers: an HTTP/1 connection with no request in
    /// flight that has had no request yet, or has read bytes since its last request began.
    fn awaits_headers(&self) -> bool {
        if self.http2.load(Ordering::Relaxed) || self.busy.load(Ordering::Acquire) > 0 {
            return false;
        }
        let started = self.started.load(Ordering::Acquire);
        started == 0 || self.read_after.load(Ordering::Acquire) == started + 1
    }
}

/// The open connections, and the permits that cap them.
struct Registry {
    clock: Instant,
    open: Mutex<HashMap<u64, Arc<Tracked>>>,
    next_id: AtomicU64,
    permits: Arc<Semaphore>,
}

impl Registry {
    fn now(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn add(&self) -> (u64, Arc<Tracked>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let tracked = Arc::new(Tracked {
            last_active: AtomicU64::new(self.now()),
            ..Tracked::default()
        });
        self.lock().insert(id, tracked.clone());
        (id, tracked)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Tracked>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the connection idle the longest, if one is idle.
    fn close_idlest(&self) {
        let open = self.lock();
        let idlest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0)
            // One that moved bytes since its last check is not idle, whatever its stamp says.
            .min_by_key(|c| {
                (
                    c.moved.load(Ordering::Relaxed),
                    c.last_active.load(Ordering::Relaxed),
                )
            });
        if let Some(connection) = idlest {
            // Seen as active from now on, so the next call picks another one.
            connection.last_active.store(u64::MAX, Ordering::Relaxed);
            connection.close.notify_one();
        }
    }
}

/// Serves `router` on `listener` within `limits` until `drain` begins, then lets the requests
/// being served finish for up to the grace period.
pub async fn serve(listener: TcpListener, router: Router, limits: ConnectionLimits, drain: Drain) {
    let registry = Arc::new(Registry {
        clock: Instant::now(),
        open: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        permits: Arc::new(Semaphore::new(limits.max_connections)),
    });
    let limits = Arc::new(ConnectionLimits {
        idle_timeout: limits.idle_timeout.max(MIN_IDLE_TIMEOUT),
        ..limits
    });
    let shutdown = drain.begun();
    tokio::pin!(shutdown);
    let served_with = Served {
        registry: registry.clone(),
        router,
        limits: limits.clone(),
        drain: drain.clone(),
    };
    let mut last_accept_error: Option<Instant> = None;
    loop {
        let permit = match registry.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                registry.close_idlest();
                tokio::select! {
                    permit = registry.permits.clone().acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let accepted = tokio::select! {
            // Draining wins over a ready accept: the queue is emptied below, in one go.
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => spawn_connection(stream, peer, permit, &served_with),
            Err(error) => {
                // Logged at most once a second: a full descriptor table fails every accept.
                if last_accept_error.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(%error, "accept failed; closing an idle connection and retrying");
                    last_accept_error = Some(Instant::now());
                }
                registry.close_idlest();
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
    let queued = serve_queued(listener, &served_with);
    tracing::info!(
        // Counted by permits: the connections just spawned may not have registered yet.
        open = limits.max_connections - registry.permits.available_permits(),
        queued,
        "draining: no longer accepting; finishing the requests being served"
    );
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(limits.shutdown_grace, registry.permits.acquire_many(all));
    if drained.await.is_err() {
        tracing::warn!(
            open = registry.lock().len(),
            "connections still open after the shutdown grace period"
        );
    }
}

/// Serves one accepted connection on its own task.
fn spawn_connection(
    stream: TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    with: &Served,
) {
    let _ = stream.set_nodelay(true);
    tokio::spawn(with.clone().connection(stream, peer, permit));
}

/// Accepts and serves the connections already waiting in `listener`'s queue, without waiting for
/// more, then closes the listener; returns how many were taken. Each accept is a real `accept`
/// call on the socket (not the reactor's possibly stale readiness), so the queue is really empty
/// when the listener closes, unless accepting fails. Connections beyond the cap are left to be
/// reset.
fn serve_queued(listener: TcpListener, with: &Served) -> usize {
    let listener = match listener.into_std() {
        Ok(listener) => listener,
        Err(error) => {
            tracing::warn!(%error, "draining: could not take the queued connections");
            return 0;
        }
    };
    let mut taken = 0;
    while let Ok(permit) = with.registry.permits.clone().try_acquire_owned() {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            // The error of one queued connection (its client gave up, its network failed):
            // that entry is used up, the next may be fine.
            Err(error) if one_connection_failed(&error) => continue,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => {
                tracing::warn!(%error, "draining: accepting a queued connection failed");
                break;
            }
        };
        // The listener is non-blocking, but what it accepts is not.
        let stream = stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream));
        match stream {
            Ok(stream) => {
                spawn_connection(stream, peer, permit, with);
                taken += 1;
            }
            Err(error) => tracing::warn!(%error, "draining: a queued connection was dropped"),
        }
    }
    taken
}

/// Whether a failed `accept` failed for one queued connection only, rather than for the listener:
/// Linux passes on a connection's pending network error, to be treated like "try again".
fn one_connection_failed(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::NetworkDown
            | ErrorKind::NetworkUnreachable
            | ErrorKind::HostUnreachable
    ) || error.raw_os_error().is_some_and(|code| {
        use rustix::io::Errno;
        [
            Errno::PROTO,
            Errno::NONET,
            Errno::HOSTDOWN,
            Errno::NOPROTOOPT,
            Errno::OPNOTSUPP,
        ]
        .iter()
        .any(|errno| errno.raw_os_error() == code)
    })
}

/// What a connection is served with.
#[derive(Clone)]
struct Served {
    registry: Arc<Registry>,
    router: Router,
    limits: Arc<ConnectionLimits>,
    drain: Drain,
}

impl Served {
    /// Serves one connection until it ends, is idle too long, or is asked to close.
    async fn connection(self, stream: TcpStream, peer: SocketAddr, _permit: OwnedSemaphorePermit) {
        let Self {
            registry,
            router,
            limits,
            drain,
        } = self;
        let (id, tracked) = registry.add();
        let io = TokioIo::new(Watched {
            inner: stream,
            tracked: tracked.clone(),
            preface_seen: Some(0),
        });
        let service = {
            let (tracked, drain) = (tracked.clone(), drain.clone());
            hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                let busy = Busy::start(tracked.clone());
                // Only HTTP/2 answers are watched for room (see `RoomWatched`).
                let http2 = tracked
                    .http2
                    .load(Ordering::Relaxed)
                    .then(|| tracked.clone());
                let (router, drain) = (router.clone(), drain.clone());
                async move {
                    let response = router.oneshot(request).await;
                    response.map(|response| {
                        let mut response = response.map(|body| {
                            // Busy until the body is sent (or dropped): streams are not idle.
                            let body = Body::new(body.map_frame(move |frame| {
                                let _busy = &busy;
                                frame
                            }));
                            match http2 {
                                Some(tracked) => Body::new(RoomWatched::new(body, tracked)),
                                None => body,
                            }
                        });
                        if drain.has_begun() {
                            response
                                .headers_mut()
                                .insert(header::CONNECTION, HeaderValue::from_static("close"));
                        }
                        response
                    })
                }
            })
        };
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // Timed by the checks below instead (see the module's comment).
        builder.http1().header_read_timeout(None);
        let served = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(served);
        let header_timeout = Some(limits.header_read_timeout).filter(|limit| !limit.is_zero());
        let shortest = header_timeout.map_or(limits.idle_timeout, |h| h.min(limits.idle_timeout));
        let check_every = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut ticks = tokio::time::interval(check_every);
        // Checks late under load are not made up in a burst: two checks back to back would find
        // nothing new in the second and restart the held-up clock.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut closing_since: Option<Instant> = None;
        let mut draining_since: Option<Instant> = None;
        // Since when the next request's headers have been due, and how many requests had begun
        // then; the first request's are due from the opening.
        let mut headers_due: Option<(u64, Instant)> = Some((0, Instant::now()));
        // Since when every check has found a write held up by the client.
        let mut held_up_since: Option<Instant> = None;
        // Made once, not at every wake of the connection: each registers a waiter.
        let close_asked = tracked.close.notified();
        let drain_begun = drain.begun();
        tokio::pin!(close_asked, drain_begun);
        loop {
            tokio::select! {
                _ = served.as_mut() => break,
                () = &mut close_asked, if closing_since.is_none() => {
                    served.as_mut().graceful_shutdown();
                    closing_since = Some(Instant::now());
                }
                () = &mut drain_begun, if draining_since.is_none() => {
                    draining_since = Some(Instant::now());
                }
                _ = ticks.tick() => {
                    if let Some(since) = closing_since.or(draining_since)
                        && since.elapsed() >= limits.shutdown_grace
                    {
                        // A client that keeps a closing connection open is cut off.
                        break;
                    }
                    if let Some(limit) = header_timeout
                        && tracked.awaits_headers()
                    {
                        let started = tracked.started.load(Ordering::Acquire);
                        let since = match headers_due {
                            Some((counted, since)) if counted == started => since,
                            _ => Instant::now(),
                        };
                        headers_due = Some((started, since));
                        if since.elapsed() >= limit {
                            // Too slow to send its headers: cut off, as hyper would.
                            tracing::debug!(%peer, "connection cut off: headers too slow");
                            break;
                        }
                    } else {
                        headers_due = None;
                    }
                    let held_up = tracked.held_up.swap(false, Ordering::Relaxed);
                    if held_up || tracked.blocked.load(Ordering::Relaxed) {
                        let since = *held_up_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= limits.idle_timeout {
                            // Its client has not kept up with its answers in any check for a
                            // whole idle timeout (while a request is in flight the connection
                            // is never idle): cut off.
                            tracing::debug!(%peer, "connection cut off: answers not read");
                            break;
                        }
                    } else {
                        held_up_since = None;
                    }
                    if tracked
                        .longest_wait_for_room()
                        .is_some_and(|waited| waited >= limits.idle_timeout)
                    {
                        // HTTP/2 flow control lets a client stall an answer without filling the
                        // socket: one that has not let an answer move for a whole idle timeout
                        // is cut off the same way.
                        tracing::debug!(%peer, "connection cut off: no room given for answers");
                        break;
                    }
                    if closing_since.is_some() {
                        continue;
                    }
                    let now = registry.now();
                    if tracked.moved.swap(false, Ordering::Relaxed) {
                        // Unless close_idlest already picked it (u64::MAX).
                        let _ = tracked.last_active.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            |last| (last != u64::MAX).then_some(now),
                        );
                    }
                    let idle_for = if tracked.busy.load(Ordering::Acquire) == 0 {
                        now.saturating_sub(tracked.last_active.load(Ordering::Relaxed))
                    } else {
                        0
                    };
                    let limit = if draining_since.is_some() { DRAIN_IDLE } else { limits.idle_timeout };
                    if u128::from(idle_for) >= limit.as_millis() {
                        served.as_mut().graceful_shutdown();
                        closing_since = Some(Instant::now());
                    }
                }
            }
        }
        registry.remove(id);
    }
}

/// Counts one request as being handled while it lives.
struct Busy(Arc<Tracked>);

impl Busy {
    fn start(tracked: Arc<Tracked>) -> Self {
        tracked.busy.fetch_add(1, Ordering::AcqRel);
        tracked.started.fetch_add(1, Ordering::AcqRel);
        Self(tracked)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        // The idle clock starts again from a request's end, whatever is left to write.
        self.0.moved.store(true, Ordering::Relaxed);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project! {
    /// The body of an answer on an HTTP/2 connection, noting while hyper holds a frame of it
    /// that the client has not given room for: hyper asks for the next frame only once the
    /// client's flow-control window lets the last one go. A new answer counts as waiting until
    /// hyper asks for its first frame.
    struct RoomWatched<B> {
        #[pin]
        inner: B,
        tracked: Arc<Tracked>,
        number: u64,
        waiting: bool,
    }

    impl<B> PinnedDrop for RoomWatched<B> {
        fn drop(this: Pin<&mut Self>) {
            if this.waiting {
                this.tracked.awaiting_room().remove(&this.number);
            }
        }
    }
}

impl<B> RoomWatched<B> {
    fn new(inner: B, tracked: Arc<Tracked>) -> Self {
        let number = tracked.answers.fetch_add(1, Ordering::Relaxed);
        tracked.awaiting_room().insert(number, Instant::now());
        Self {
            inner,
            tracked,
            number,
            waiting: true,
        }
    }
}

impl<B: http_body::Body> http_body::Body for RoomWatched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        // Each frame handed over starts a new wait; the body's own pauses (a stream with
        // nothing to send yet) are not the client's doing.
        if let Poll::Ready(Some(Ok(_))) = polled {
            let now = Instant::now();
            this.tracked.awaiting_room().insert(*this.number, now);
            *this.waiting = true;
        } else if *this.waiting {
            this.tracked.awaiting_room().remove(this.number);
            *this.waiting = false;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// How an HTTP/2 connection opens. All of it is matched, as hyper does before it speaks HTTP/2:
/// `PRI / HTTP/1.1` is an HTTP/1 request, whose headers are timed like any other.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A socket that notes when it moved a byte (for the idle check), when it read one between
/// requests (for the headers' deadline), and whether it speaks HTTP/2.
struct Watched {
    inner: TcpStream,
    tracked: Arc<Tracked>,
    /// How much of [`HTTP2_PREFACE`] the connection opened with, until that is settled.
    preface_seen: Option<usize>,
}

impl Watched {
    fn moved(&self, bytes: usize) {
        if bytes > 0 {
            self.tracked.moved.store(true, Ordering::Relaxed);
        }
    }

    fn written(&self, polled: &Poll<std::io::Result<usize>>, offered: usize) {
        let written = match polled {
            Poll::Ready(Ok(written)) => *written,
            // The task's turn ran out before the socket was tried (tokio's cooperative budget):
            // that says nothing of the client. A socket's own `Pending` gives the budget back.
            Poll::Pending if !tokio::task::coop::has_budget_remaining() => return,
            Poll::Pending => 0,
            Poll::Ready(Err(_)) => return,
        };
        let blocked = written < offered;
        self.tracked.blocked.store(blocked, Ordering::Relaxed);
        if blocked {
            self.tracked.held_up.store(true, Ordering::Relaxed);
        }
        if self.tracked.busy.load(Ordering::Acquire) > 0 {
            self.moved(written);
        }
    }

    fn read(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let tracked = &self.tracked;
        // An HTTP/2 client can send frames (PING, WINDOW_UPDATE, SETTINGS) forever without a
        // request: only its requests, and the answers moving, keep it from being idle.
        if !tracked.http2.load(Ordering::Relaxed) {
            self.moved(bytes.len());
        }
        if tracked.busy.load(Ordering::Acquire) == 0 {
            let started = tracked.started.load(Ordering::Acquire);
            tracked.read_after.store(started + 1, Ordering::Release);
        }
        if let Some(seen) = self.preface_seen {
            let rest = &HTTP2_PREFACE[seen..];
            let compared = rest.len().min(bytes.len());
            self.preface_seen = if bytes[..compared] != rest[..compared] {
                None
            } else if compared == rest.len() {
                tracked.http2.store(true, Ordering::Relaxed);
                None
            } else {
                Some(seen + compared)
            };
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.written(&polled, buf.len());
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.written(&polled, bufs.iter().map(|buf| buf.len()).sum());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that tokio puts off because the task has used up its turn is not the client's
    /// doing: it must not count as held up, or a busy connection could be cut off as a slow
    /// reader.
    #[tokio::test]
    async fn a_write_put_off_by_the_tasks_budget_is_not_held_up() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a port");
        let address = listener.local_addr().expect("its address");
        let _client = TcpStream::connect(address).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let tracked = Arc::new(Tracked::default());
        let mut watched = Watched {
            inner: server,
            tracked: tracked.clone(),
            preface_seen: None,
        };
        std::future::poll_fn(|cx| {
            // Spends the task's budget, as a task that did much work in one turn would.
            while let Poll::Ready(progress) = tokio::task::coop::poll_proceed(cx) {
                progress.made_progress();
            }
            let polled = Pin::new(&mut watched).poll_write(cx, b"an answer");
            assert!(polled.is_pending(), "the spent budget puts the write off");
            Poll::Ready(())
        })
        .await;
        assert!(!tracked.held_up.load(Ordering::Relaxed));
        assert!(!tracked.blocked.load(Ordering::Relaxed));

        // With a turn to spare, the socket takes the write whole: not held up either.
        let written = std::future::poll_fn(|cx| Pin::new(&mut watched).poll_write(cx, b"x")).await;
        assert_eq!(written.expect("the write"), 1);
        assert!(!tracked.held_up.load(Ordering::Relaxed));
    }
}
