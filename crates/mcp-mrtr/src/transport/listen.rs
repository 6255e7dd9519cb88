//! Accepting connections: the accept loop behind [`serve`](super::serve), and the hygiene that
//! keeps one client's sockets from starving everybody else's.
//!
//! Open connections are capped below the process's open-file limit; a connection that arrives
//! at the cap closes the one idle the longest to make room (while none is idle it waits, and the
//! others are looked at again every [`ROOM_RECHECK`]), and a failing `accept` (out of file
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
//! connection waits for its next request and would close it long before the idle timeout; what
//! they read of each connection is gathered by [`super::traffic`]. Each request carries its
//! peer's address as [`ConnectInfo`].
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, header};
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use super::Drain;
use super::MAX_HEAD_BYTES;
use super::traffic::{Busy, RoomWatched, Tracked, Watched};

/// File descriptors kept free of connections, for the stores, the database, logs and the listener.
pub const RESERVED_DESCRIPTORS: u64 = 128;
/// The most connections one process is ever given, however high its open-file limit.
const CONNECTIONS_CEILING: usize = 1_000_000;
/// The fewest connections a server holds: one for a long-lived stream, one for requests.
const MIN_CONNECTIONS: usize = 2;
/// Largest HTTP/2 header list taken (h2 counts 32 bytes more per field than the front door's
/// bound does).
const HEADER_LIST_BYTES: u32 = 2 * MAX_HEAD_BYTES as u32;
/// Most streams open at once on one HTTP/2 connection: the least RFC 9113 recommends, so that
/// one connection's header lists stay within about 13 MiB.
const HTTP2_STREAMS: u32 = 100;

/// While draining, how long a connection with nothing to do stays open: longer than a balancer
/// keeps an unused pooled connection (nginx's `keepalive_timeout` in `deploy/nginx.conf` is 4 s),
/// so the balancer closes it first and never sends a request into a closing connection.
pub const DRAIN_IDLE: Duration = Duration::from_secs(5);
/// The shortest idle timeout served: a zero one would close every connection at its first check
/// and cut off any answer bigger than the socket's buffers.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long accept waits after failing (for instance out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How often a connection waiting at the cap looks again for one idle to close.
const ROOM_RECHECK: Duration = Duration::from_millis(500);

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

/// The most connections this process can hold: `wanted` when given, otherwise 10,000; always
/// below the open-file limit (raised to its hard maximum first) less [`RESERVED_DESCRIPTORS`],
/// and at least two, so that a long-lived stream leaves a connection for requests.
pub fn max_connections(wanted: Option<usize>) -> usize {
    let limit = raise_open_file_limit();
    let fits = usize::try_from(limit.saturating_sub(RESERVED_DESCRIPTORS))
        .unwrap_or(usize::MAX)
        .clamp(MIN_CONNECTIONS, CONNECTIONS_CEILING);
    match wanted {
        Some(wanted) if wanted > fits => {
            // Said once: the stream cap is worked out from the connection cap too.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    wanted,
                    fits,
                    open_file_limit = limit,
                    "connection cap lowered to fit the open-file limit"
                );
            });
            fits
        }
        Some(wanted) => wanted.max(MIN_CONNECTIONS),
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
        let tracked = Arc::new(Tracked::opened_at(self.now()));
        self.lock().insert(id, tracked.clone());
        (id, tracked)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Tracked>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the connection idle the longest, if one is idle; returns which.
    fn close_idlest(&self) -> Option<u64> {
        let open = self.lock();
        let idlest = open
            .iter()
            .filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
            // One that moved bytes since its last check is not idle, whatever its stamp says.
            .min_by_key(|(_, c)| {
                (
                    c.moved.load(Ordering::Relaxed),
                    c.last_active.load(Ordering::Relaxed),
                )
            });
        let (id, connection) = idlest?;
        // Seen as active from now on, so the next call picks another one.
        connection.last_active.store(u64::MAX, Ordering::Relaxed);
        connection.close.notify_one();
        Some(*id)
    }

    /// Whether connection `id` is still open with no request in flight: closing, when it was
    /// asked to close, and not to be replaced by another one yet.
    fn still_closing_idle(&self, id: u64) -> bool {
        self.lock()
            .get(&id)
            .is_some_and(|c| c.busy.load(Ordering::Acquire) == 0)
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
    'serving: loop {
        let accepted = tokio::select! {
            // Draining wins over a ready accept: the queue is emptied below, in one go.
            biased;
            () = &mut shutdown => break 'serving,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Logged at most once a second: a full descriptor table fails every accept.
                if last_accept_error.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                    tracing::warn!(%error, "accept failed; closing an idle connection and retrying");
                    last_accept_error = Some(Instant::now());
                }
                registry.close_idlest();
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let permit = match registry.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            // At the cap, room is made for a client that came (not ahead of one), and the
            // connection just accepted is not registered yet: it cannot be the one closed.
            Err(_) => {
                let mut closing: Option<(u64, Instant)> = None;
                loop {
                    // One closed for this newcomer at a time: another once that one has gone,
                    // took a request as it was asked to close, or is slow to go (an HTTP/2
                    // client that does not acknowledge the close, one halfway through a
                    // request's headers).
                    let another = closing.is_none_or(|(id, asked)| {
                        !registry.still_closing_idle(id) || asked.elapsed() >= ROOM_RECHECK * 2
                    });
                    if another {
                        closing = registry.close_idlest().map(|id| (id, Instant::now()));
                    }
                    tokio::select! {
                        permit = registry.permits.clone().acquire_owned() => match permit {
                            Ok(permit) => break permit,
                            Err(_) => break 'serving,
                        },
                        // None idle yet, or the one closed took a request just then.
                        () = tokio::time::sleep(ROOM_RECHECK) => {}
                        () = &mut shutdown => break 'serving,
                    }
                }
            }
        };
        spawn_connection(stream, peer, permit, &served_with);
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
        let io = TokioIo::new(Watched::new(stream, tracked.clone()));
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
        // Past h2's own bound (16 KiB by default) a header list gets an empty 431: the front
        // door's bound answers instead.
        builder.http2().max_header_list_size(HEADER_LIST_BYTES);
        // Each open stream may hold a header list that large: fewer streams than hyper's 200.
        builder.http2().max_concurrent_streams(HTTP2_STREAMS);
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
