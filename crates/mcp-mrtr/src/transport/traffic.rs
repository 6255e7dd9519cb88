//! What a connection's traffic tells of its client, for the accept loop's rules
//! ([`super::listen`]): each connection's [`Tracked`] state, filled in by its socket
//! ([`Watched`]: bytes moved, bytes read between requests, writes the client held up, whether it
//! speaks HTTP/2), by its requests ([`Busy`]) and by its HTTP/2 answers ([`RoomWatched`]: those
//! waiting for the client's flow control to give them room). The socket reads no clock: it sets
//! flags that the connection's periodic check reads and clears.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// One open connection, as the accept loop sees it.
#[derive(Default)]
pub(super) struct Tracked {
    /// Milliseconds since the registry's clock started, at the last check that found bytes
    /// moved (checks run every quarter of the idle timeout, at most every second).
    pub(super) last_active: AtomicU64,
    /// Set when a byte is read, or written while a request is in flight, and when a request ends;
    /// cleared by the next check: no clock read per I/O. Bytes written after the last request
    /// ended do not count, so a client too slow to read its answers is not kept open by them.
    pub(super) moved: AtomicBool,
    /// Requests being handled (from their headers until their response body is sent).
    pub(super) busy: AtomicUsize,
    /// Requests begun since the connection opened.
    pub(super) started: AtomicU64,
    /// One more than `started` was when bytes were last read with no request in flight (the start
    /// of the next request's headers), 0 before that.
    pub(super) read_after: AtomicU64,
    /// Whether the connection speaks HTTP/2, which idles between streams with no headers due.
    pub(super) http2: AtomicBool,
    /// Set when a write could not be made whole (the client is not reading fast enough to make
    /// room), cleared by the next check.
    pub(super) held_up: AtomicBool,
    /// Whether the last write could not be made whole: the connection is waiting for room, and
    /// may wait long (the kernel wakes a writer only once a good part of its buffer is free).
    pub(super) blocked: AtomicBool,
    /// Asks the connection to close once its current request, if any, is answered.
    pub(super) close: Notify,
    /// HTTP/2 only: the answers hyper holds a frame of until the client gives it room (flow
    /// control), by number, with when each began to wait.
    awaiting_room: Mutex<HashMap<u64, Instant>>,
    /// HTTP/2 answers numbered so far.
    answers: AtomicU64,
}

impl Tracked {
    /// A connection opened `now` (milliseconds on the registry's clock).
    pub(super) fn opened_at(now: u64) -> Self {
        Self {
            last_active: AtomicU64::new(now),
            ..Self::default()
        }
    }

    fn awaiting_room(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.awaiting_room.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long the answer that has waited the longest for the client to give it room has
    /// waited, if one is waiting (only HTTP/2 answers wait for room).
    pub(super) fn longest_wait_for_room(&self) -> Option<Duration> {
        if !self.http2.load(Ordering::Relaxed) {
            return None;
        }
        let waiting = self.awaiting_room();
        waiting.values().min().map(Instant::elapsed)
    }

    /// Whether the connection owes a request's headers: an HTTP/1 connection with no request in
    /// flight that has had no request yet, or has read bytes since its last request began.
    pub(super) fn awaits_headers(&self) -> bool {
        if self.http2.load(Ordering::Relaxed) || self.busy.load(Ordering::Acquire) > 0 {
            return false;
        }
        let started = self.started.load(Ordering::Acquire);
        started == 0 || self.read_after.load(Ordering::Acquire) == started + 1
    }
}

/// Counts one request as being handled while it lives.
pub(super) struct Busy(Arc<Tracked>);

impl Busy {
    pub(super) fn start(tracked: Arc<Tracked>) -> Self {
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
    pub(super) struct RoomWatched<B> {
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
    pub(super) fn new(inner: B, tracked: Arc<Tracked>) -> Self {
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
pub(super) struct Watched {
    inner: TcpStream,
    tracked: Arc<Tracked>,
    /// How much of [`HTTP2_PREFACE`] the connection opened with, until that is settled.
    preface_seen: Option<usize>,
}

impl Watched {
    /// `stream` from its opening, noting into `tracked`.
    pub(super) fn new(inner: TcpStream, tracked: Arc<Tracked>) -> Self {
        Self {
            inner,
            tracked,
            preface_seen: Some(0),
        }
    }

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
