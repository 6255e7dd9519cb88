//! Hostile clients against the real binary: each test replays one attack an attacker can mount
//! without signing in (or signed in as one user), checks the bound that stops it, and prints the
//! figures (resident memory, connections closed and when, whose entries were evicted).
//!
//! Run `cargo test --release --test hardening -- --nocapture --test-threads 1` for the figures
//! of the release build; the README's "Limits" section records them.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::movies::{Backend, Launch, MovieServer};

const MODERN: &str = "2026-07-28";
const MIB: u64 = 1024 * 1024;

/// Resident memory of a process, sampled in the background to catch its peak.
struct Rss {
    pid: u32,
    peak: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Rss {
    fn watch(pid: u32) -> Self {
        let first = resident_bytes(pid);
        assert!(
            first > 0,
            "the resident memory of process {pid} cannot be read"
        );
        let peak = Arc::new(AtomicU64::new(first));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen, stopped) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                seen.fetch_max(resident_bytes(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Self { pid, peak, stop }
    }

    /// The resident memory now, of a process that must still be running.
    fn now(&self) -> u64 {
        let now = resident_bytes(self.pid);
        assert!(
            now > 0,
            "process {} exited, or its memory cannot be read",
            self.pid
        );
        now
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed).max(self.now())
    }

    /// Resident memory once the server has had `pause` to give back what a burst took.
    async fn after(&self, pause: Duration) -> u64 {
        tokio::time::sleep(pause).await;
        self.now()
    }
}

impl Drop for Rss {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `VmRSS` of `pid`, in bytes (0 once it has exited).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(64)
        .build()
        .expect("reqwest client")
}

/// POSTs `body` to the endpoint as a 2026-07-28 (or, without `_meta`, a legacy) client would.
async fn post(http: &reqwest::Client, url: &str, version: &str, body: Vec<u8>) -> (u16, Value) {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .body(body)
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Sends `bodies` with `concurrency` requests in flight, returning each answer's status and code.
async fn flood(
    url: &str,
    version: &str,
    bodies: Vec<Vec<u8>>,
    concurrency: usize,
) -> Vec<(u16, i64)> {
    use futures::StreamExt as _;
    let http = http();
    futures::stream::iter(bodies)
        .map(|body| {
            let (http, url) = (http.clone(), url.to_owned());
            async move {
                let (status, answer) = post(&http, &url, version, body).await;
                (status, answer["error"]["code"].as_i64().unwrap_or(0))
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_heavy_bodies_are_refused_and_memory_comes_back() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let rss = Rss::watch(server.pid());
    let before = rss.now();
    // ~650 KB of tiny objects: 10,000 inputResponses keys, as in the reported attack.
    let answers: serde_json::Map<String, Value> = (0..10_000)
        .map(|i| {
            (
                format!("answer-{i:05}-{}", "x".repeat(24)),
                json!({"action": "accept"}),
            )
        })
        .collect();
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN},
            "name": "addToWatchlist",
            "arguments": {"subject": {"movieId": "6"}},
            "inputResponses": answers,
        }
    });
    let bytes = serde_json::to_vec(&body).expect("serialize");
    let started = Instant::now();
    let answers = flood(server.url(), MODERN, vec![bytes.clone(); 640], 64).await;
    let took = started.elapsed();
    let peak = rss.peak();
    let settled = rss.after(Duration::from_secs(3)).await;
    println!(
        "object-heavy burst: 640 bodies of {} KB over 64 connections in {took:.1?}; RSS {} before, \
         {} at peak, {} 3 s after",
        bytes.len() / 1000,
        mib(before),
        mib(peak),
        mib(settled)
    );
    assert!(
        answers.iter().all(|&answer| answer == (400, -32600)),
        "every body is refused as an invalid request: {:?}",
        &answers[..answers.len().min(5)]
    );
    assert!(
        peak < 512 * MIB,
        "peak RSS {} stays under 512 MiB",
        mib(peak)
    );
    assert!(
        settled < 160 * MIB,
        "RSS settles under 160 MiB: {}",
        mib(settled)
    );
}

/// Opens a connection that sends a request line, then one header line a second.
async fn slow_headers(addr: SocketAddr, opened: Instant) -> Option<Duration> {
    let stream = TcpStream::connect(addr).await.ok()?;
    trickle_headers(stream, b"POST /mcp HTTP/1.1\r\n", opened).await
}

/// Sends `request_line` on `stream`, then one header line a second, for two minutes; how long
/// after `opened` the server closed the connection, or `None` if it never did.
async fn trickle_headers(
    mut stream: TcpStream,
    request_line: &[u8],
    opened: Instant,
) -> Option<Duration> {
    stream.write_all(request_line).await.ok()?;
    let mut buffer = [0u8; 1024];
    for line in 0..120 {
        let header = format!("x-slow-{line}: still typing\r\n");
        if stream.write_all(header.as_bytes()).await.is_err() {
            return Some(opened.elapsed());
        }
        // Closed by the server: the read ends instead of timing out.
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return Some(opened.elapsed()),
            Ok(Ok(_)) => {
                // No response is sent to a late request; should one come, the close follows.
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    stream.read_to_end(&mut Vec::new()),
                )
                .await;
                return Some(opened.elapsed());
            }
            Err(_) => {}
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_slow_to_send_headers_are_closed_and_others_are_served() {
    let launch = Launch::with_args(["--header-read-timeout-secs", "2"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let opened = Instant::now();
    let slow: Vec<_> = (0..200)
        .map(|_| tokio::spawn(slow_headers(addr, opened)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let served = lists_tools(&server).await;
    assert!(
        served,
        "a normal request is served while 200 connections dawdle"
    );
    let mut closed = Vec::new();
    for connection in slow {
        closed.push(connection.await.expect("the slow client ran"));
    }
    let times: Vec<Duration> = closed.iter().flatten().copied().collect();
    let latest = times.iter().max().copied().unwrap_or_default();
    let earliest = times.iter().min().copied().unwrap_or_default();
    println!(
        "slow headers: {} of 200 connections closed by the server, between {earliest:.1?} and \
         {latest:.1?} after opening (header-read timeout 2 s)",
        times.len()
    );
    assert_eq!(times.len(), 200, "every slow connection is closed");
    assert!(
        latest < Duration::from_secs(10),
        "the last slow connection was closed {latest:.1?} after opening, not after minutes"
    );
}

/// A server on SQLite with the given header-read and idle timeouts, in seconds.
async fn with_timeouts(header_read_secs: u32, idle_secs: u32) -> MovieServer {
    let launch = Launch {
        args: vec![
            "--header-read-timeout-secs".to_owned(),
            header_read_secs.to_string(),
            "--idle-timeout-secs".to_owned(),
            idle_secs.to_string(),
        ],
        ..Launch::default()
    };
    MovieServer::start_with(Backend::Sqlite, launch).await
}

/// What arrives on `stream` up to the end of a response's head (or until `read_more` gives up).
async fn response_head(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    while !received.windows(4).any(|w| w == b"\r\n\r\n") {
        if !read_more(stream, &mut received).await {
            break;
        }
    }
    received
}

/// Reads what `stream` sends next onto `received`; false when it closed or sent nothing for 5 s.
async fn read_more(stream: &mut TcpStream, received: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk)).await {
        Ok(Ok(0) | Err(_)) | Err(_) => false,
        Ok(Ok(n)) => {
            received.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

/// The body of a 2026-07-28 `tools/list` request.
fn tools_list_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}
    }}})
    .to_string()
}

/// A 2026-07-28 `tools/list` request to the server at `addr`, as HTTP/1.1 bytes.
fn raw_tools_list(addr: SocketAddr) -> Vec<u8> {
    let body = tools_list_body();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\n\
         Mcp-Method: tools/list\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `request` on `stream` and reads its response whole; the status, or `None` when the
/// connection closed (or nothing came for 5 s) first. Only a response with a `Content-Length`
/// (what the server sends to `tools/list`) is understood.
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> Option<u16> {
    stream.write_all(request).await.ok()?;
    let mut received = Vec::new();
    loop {
        if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())?;
            if received.len() >= end + 4 + length {
                return head.split(' ').nth(1)?.parse().ok();
            }
        }
        if !read_more(stream, &mut received).await {
            return None;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_stays_open_until_the_idle_timeout_not_the_header_timeout() {
    let server = with_timeouts(1, 5).await;
    let addr = address_of(server.url());
    let request = raw_tools_list(addr);
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    assert_eq!(exchange(&mut stream, &request).await, Some(200));
    // Quiet for three times the header-read timeout, well within the idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = exchange(&mut stream, &request).await;
    assert_eq!(
        later,
        Some(200),
        "the same connection serves a request sent 3 s later (header-read timeout 1 s, idle \
         timeout 5 s)"
    );
    let answered = Instant::now();
    let closed = closed_within(stream, answered, Duration::from_secs(15)).await;
    println!(
        "kept-alive connection, header-read timeout 1 s, idle timeout 5 s: served again after 3 s \
         quiet; closed {closed:.1?} after its last answer"
    );
    let closed = closed.expect("the idle connection is closed within 15 s");
    assert!(
        closed >= Duration::from_secs(4),
        "closed by the idle timeout (5 s), not earlier: after {closed:.1?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_slow_to_send_its_next_headers_is_closed() {
    let server = with_timeouts(1, 60).await;
    let addr = address_of(server.url());
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    assert_eq!(
        exchange(&mut stream, &raw_tools_list(addr)).await,
        Some(200)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let began = Instant::now();
    let closed = trickle_headers(stream, b"POST /mcp HTTP/1.1\r\n", began).await;
    println!(
        "second request's headers sent a line a second, header-read timeout 1 s: closed \
         {closed:.1?} after they began"
    );
    let closed = closed.expect("the connection is closed");
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(5)).contains(&closed),
        "the next request's headers are timed from their first byte, not from the last answer, \
         and cut off: closed {closed:.1?} after they began"
    );
}

/// Whether an HTTP/2 (prior knowledge) connection, opened and then quiet for `quiet`, still
/// answers a PING.
async fn http2_answers_ping_after(addr: SocketAddr, quiet: Duration) -> bool {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return false;
    };
    // Held until the end: with no handle left, the client would close the connection itself.
    let Ok((client, mut connection)) = h2::client::handshake(tcp).await else {
        return false;
    };
    let Some(mut pinger) = connection.ping_pong() else {
        return false;
    };
    let driven = tokio::spawn(connection);
    tokio::time::sleep(quiet).await;
    let answered = tokio::time::timeout(Duration::from_secs(5), pinger.ping(h2::Ping::opaque()));
    let answered = matches!(answered.await, Ok(Ok(_)));
    drop(client);
    driven.abort();
    answered
}

/// Guards the server's own telling of HTTP/2 from HTTP/1 (which hyper's header timer did not
/// need): an HTTP/2 connection is never taken for an HTTP/1 one owing headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_may_idle_between_streams_past_the_header_timeout() {
    let server = with_timeouts(1, 60).await;
    let answered = http2_answers_ping_after(address_of(server.url()), Duration::from_secs(3)).await;
    println!("HTTP/2 connection quiet for 3 s, header-read timeout 1 s: answers PING: {answered}");
    assert!(
        answered,
        "HTTP/2 connections owe no headers between streams; only the idle timeout closes them"
    );
}

/// What an HTTP/2 client that never widens its flow-control windows saw.
struct Stalled {
    /// The status of the answer to its `tools/list`, if it sent one and the headers came.
    status: Option<u16>,
    /// How long after its request (or its opening) the server closed the connection, if it did
    /// within the limit.
    closed: Option<Duration>,
}

/// Opens an HTTP/2 connection to `addr` whose streams may receive `window` bytes each (a window
/// the client never widens), sends `tools/list` on it when `request` is set, keeps the answer's
/// stream open and pings the server every quarter second until the server closes the connection
/// or `limit` passes.
async fn http2_never_giving_room(
    addr: SocketAddr,
    window: u32,
    request: bool,
    limit: Duration,
) -> Stalled {
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let (mut client, mut connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("HTTP/2 opening");
    let mut pinger = connection.ping_pong().expect("the connection's pinger");
    let driven = tokio::spawn(connection);
    let started = Instant::now();
    let mut status = None;
    // Held until the end: dropping the answer would reset its stream.
    let mut _answer = None;
    if request {
        let headers = axum::http::Request::post(format!("http://{addr}/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/list")
            .body(())
            .expect("a request");
        let (answer, mut body) = client
            .send_request(headers, false)
            .expect("sends the request");
        body.send_data(tools_list_body().into(), true)
            .expect("sends its body");
        let answer = tokio::time::timeout(Duration::from_secs(5), answer).await;
        if let Ok(Ok(answer)) = answer {
            status = Some(answer.status().as_u16());
            _answer = Some((answer, body));
        }
    }
    let closed = loop {
        if started.elapsed() >= limit {
            break None;
        }
        let ping = tokio::time::timeout(Duration::from_secs(1), pinger.ping(h2::Ping::opaque()));
        if !matches!(ping.await, Ok(Ok(_))) || driven.is_finished() {
            break Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    driven.abort();
    Stalled { status, closed }
}

/// HTTP/2 flow control lets a client stall an answer without filling the socket, so the
/// held-up rule never sees it: an answer whose stream the client gives no room at all waits
/// in the server for good, a request in flight that keeps the connection from ever being idle.
/// One that no answer has moved on for the idle timeout is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_gives_its_answers_no_room_is_cut_off() {
    let launch = Launch::with_args(["--idle-timeout-secs", "2", "--shutdown-grace-secs", "20"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let stalled = http2_never_giving_room(addr, 0, true, Duration::from_secs(15)).await;
    println!(
        "HTTP/2 tools/list, stream window 0, pinging, idle timeout 2 s: status {:?}, closed {:.1?} \
         after the request",
        stalled.status, stalled.closed
    );
    assert_eq!(
        stalled.status,
        Some(200),
        "the answer's headers need no room"
    );
    let closed = stalled.closed.expect("the connection is closed");
    assert!(
        (Duration::from_millis(1500)..Duration::from_secs(6)).contains(&closed),
        "cut off once its answer has waited for room for the 2 s idle timeout: closed {closed:.1?} \
         after the request"
    );
    let mut fresh = TcpStream::connect(addr).await.expect("connects");
    assert_eq!(
        exchange(&mut fresh, &raw_tools_list(addr)).await,
        Some(200),
        "other clients are served"
    );
}

/// An HTTP/2 client can send frames forever without a request (PINGs here): only requests, and
/// answers moving, keep a connection from being idle. One with an answer let through a byte at
/// a time (its stream's window is one byte) goes idle once the answer is handed to HTTP/2, and
/// is closed after the idle timeout and the grace period that lets a closing connection finish
/// what it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_only_pings_is_closed_when_idle() {
    let launch = Launch::with_args(["--idle-timeout-secs", "2", "--shutdown-grace-secs", "2"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let limit = Duration::from_secs(15);
    let (pinging, trickled) = tokio::join!(
        http2_never_giving_room(addr, 0, false, limit),
        http2_never_giving_room(addr, 1, true, limit),
    );
    println!(
        "HTTP/2, idle timeout 2 s, grace 2 s, pinging every 0.25 s: with no request closed \
         {:.1?} after opening; with tools/list on a 1-byte window: status {:?}, closed {:.1?} \
         after the request",
        pinging.closed, trickled.status, trickled.closed
    );
    let closed = pinging
        .closed
        .expect("the connection with no request is closed");
    assert!(
        (Duration::from_millis(1500)..Duration::from_secs(5)).contains(&closed),
        "PINGs do not keep a connection open: closed {closed:.1?} after opening"
    );
    assert_eq!(trickled.status, Some(200));
    let closed = trickled
        .closed
        .expect("the connection with a stalled answer is closed");
    assert!(
        (Duration::from_millis(3500)..Duration::from_secs(9)).contains(&closed),
        "closed after the 2 s idle timeout and the 2 s grace period: {closed:.1?} after the \
         request"
    );
}

/// An HTTP/1 request whose method is `PRI`, like the opening of an HTTP/2 connection, is still
/// an HTTP/1 request: its headers are timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_only_starts_like_http2_still_has_its_headers_timed() {
    let server = with_timeouts(1, 60).await;
    let stream = TcpStream::connect(address_of(server.url()))
        .await
        .expect("connects");
    let opened = Instant::now();
    let closed = trickle_headers(stream, b"PRI / HTTP/1.1\r\n", opened).await;
    println!("`PRI / HTTP/1.1` with headers a line a second: closed {closed:.1?} after opening");
    let closed = closed.expect("the connection is closed");
    assert!(
        closed < Duration::from_secs(5),
        "headers trickled after a `PRI` request line are cut off by the 1 s header-read timeout: \
         closed {closed:.1?} after opening"
    );
}

/// A connection that sends the opening of HTTP/2 a byte at a time never finishes it: it owes its
/// first request's headers all along, and is cut off like any slow HTTP/1 client (before, every
/// byte counted as activity while the server waited to tell the two apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_opening_sent_a_byte_at_a_time_is_cut_off() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let server = with_timeouts(1, 60).await;
    let opened = Instant::now();
    let mut stream = TcpStream::connect(address_of(server.url()))
        .await
        .expect("connects");
    let mut cut_off = None;
    // All but the last byte, one every half second: 11.5 s if the server waits for them all.
    for byte in &PREFACE[..PREFACE.len() - 1] {
        if stream.write_all(&[*byte]).await.is_err() {
            cut_off = Some(opened.elapsed());
            break;
        }
        let mut buffer = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buffer));
        if let Ok(Ok(0) | Err(_)) = read.await {
            cut_off = Some(opened.elapsed());
            break;
        }
    }
    println!(
        "HTTP/2 opening sent a byte every 0.5 s, header-read timeout 1 s: closed {cut_off:.1?}"
    );
    let closed = cut_off.expect("the connection is closed before the opening is complete");
    assert!(
        closed < Duration::from_secs(5),
        "cut off by the 1 s header-read timeout: after {closed:.1?}"
    );
}

/// A client that sends many requests at once and then reads the answers a trickle at a time
/// keeps a request in flight all along, so the idle timeout never starts; once the answers
/// outgrow what the kernel buffers for it, it is cut off for holding up the server's writes for
/// the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_its_answers_a_trickle_at_a_time_is_cut_off() {
    // About 30 MB of answers: far more than the kernel and hyper buffer for one connection, so
    // a request is in flight all along (with fewer, every answer is handed over and the idle
    // timeout applies).
    const REQUESTS: usize = 5_000;
    let launch = Launch::with_args(["--idle-timeout-secs", "2", "--shutdown-grace-secs", "20"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    // A small window, so the answers wait on the server's side rather than in this socket.
    socket
        .set_recv_buffer_size(4096)
        .expect("a small receive buffer");
    let (mut reader, mut writer) = socket.connect(addr).await.expect("connects").into_split();
    let began = Instant::now();
    let request = raw_tools_list(addr);
    // The requests, then one more a second: once the server has closed its end, its kernel
    // answers that with a reset, which ends the reads at once. (A close alone would show only
    // after the answers already in the kernel's buffers had been read at this pace.)
    let sending = tokio::spawn(async move {
        writer.write_all(&request.repeat(REQUESTS)).await?;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            writer.write_all(&request).await?;
        }
        #[allow(unreachable_code)]
        std::io::Result::Ok(())
    });
    let mut received = Vec::new();
    let mut chunk = [0u8; 512];
    let mut closed = None;
    while began.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        match tokio::time::timeout(Duration::from_secs(5), reader.read(&mut chunk)).await {
            Ok(Ok(0) | Err(_)) => {
                closed = Some(began.elapsed());
                break;
            }
            Ok(Ok(n)) => received.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
    sending.abort();
    let answers = received
        .windows(12)
        .filter(|w| w == b"HTTP/1.1 200")
        .count();
    println!(
        "{REQUESTS} pipelined tools/list, 512 bytes read every 0.25 s, idle timeout 2 s: {answers} \
         answers ({} KB) read; closed {closed:.1?} after the requests were sent",
        received.len() / 1024
    );
    let closed = closed.expect("the connection is closed within a minute");
    assert!(
        closed < Duration::from_secs(10),
        "cut off about the idle timeout (2 s) after the writes were first held up: after \
         {closed:.1?}"
    );
}

/// A connection that never sends a byte owes its first request's headers from the opening; it
/// is not kept until the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_by_the_header_timeout() {
    let server = with_timeouts(2, 60).await;
    // Taken before connecting: the server's clock starts when it accepts.
    let opened = Instant::now();
    let stream = TcpStream::connect(address_of(server.url()))
        .await
        .expect("connects");
    let closed = closed_within(stream, opened, Duration::from_secs(30)).await;
    println!("silent connection, header-read timeout 2 s, idle timeout 60 s: closed {closed:.1?}");
    let closed = closed.expect("the silent connection is closed within 30 s");
    assert!(
        (Duration::from_millis(1900)..Duration::from_secs(5)).contains(&closed),
        "closed by the 2 s header-read timeout: after {closed:.1?}"
    );
}

/// Whether a normal client gets the tool list.
async fn lists_tools(server: &MovieServer) -> bool {
    let reply = server.anonymous().request("tools/list").send().await;
    reply.result()["tools"]
        .as_array()
        .is_some_and(|tools| !tools.is_empty())
}

fn address_of(url: &str) -> SocketAddr {
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("an authority");
    authority.parse().expect("a socket address")
}

/// Waits until the server closes `stream`, returning when (or `None` after `limit`).
async fn closed_within(
    mut stream: TcpStream,
    opened: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut buffer = [0u8; 512];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return Some(opened.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_beyond_the_fd_limit_cannot_lock_others_out() {
    let launch = Launch {
        args: ["--idle-timeout-secs", "3", "--body-read-timeout-secs", "2"]
            .map(String::from)
            .to_vec(),
        open_files: Some(1_024),
        ..Launch::default()
    };
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let opened = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..1_100 {
        // Past the server's cap the kernel still completes connections into the backlog.
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await
        {
            idle.push(stream);
        }
    }
    let connected = idle.len();
    // One request whose body never fully arrives.
    let mut short = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: {MODERN}\r\n\
         content-length: 1000\r\n\r\n{{\"jsonrpc\""
    );
    short
        .write_all(head.as_bytes())
        .await
        .expect("send a partial request");
    let short_sent = Instant::now();

    let served = lists_tools(&server).await;
    let served_after = opened.elapsed();
    assert!(
        served,
        "a normal request is served with {connected} idle sockets open"
    );

    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), short.read_to_string(&mut answer)).await;
    let short_answered = short_sent.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "a body that never arrives gets 408: {answer:?}"
    );

    let watching: Vec<_> = idle
        .into_iter()
        .map(|stream| tokio::spawn(closed_within(stream, opened, Duration::from_secs(30))))
        .collect();
    let mut closed = Vec::new();
    for watch in watching {
        closed.push(watch.await.expect("watch ran"));
    }
    let times: Vec<Duration> = closed.iter().flatten().copied().collect();
    let latest = times.iter().max().copied().unwrap_or_default();
    let log = server.log();
    let accept_errors = log.matches("accept failed").count();
    println!(
        "idle sockets at fd limit 1,024: {connected} connected; a normal request served after \
         {served_after:.1?}; the partial body answered 408 after {short_answered:.1?}; {} of \
         {connected} idle sockets closed by the server, the last after {latest:.1?} (idle timeout \
         3 s); {accept_errors} accept-failure log lines",
        times.len()
    );
    assert_eq!(times.len(), connected, "every idle socket is closed");
    assert!(
        latest < Duration::from_secs(25),
        "the idle sockets were closed by {latest:.1?}"
    );
}

/// Bodies that never come hold no turn and none of the budget of body bytes beyond what they
/// sent: with four turns and room for four bodies of the size limit, eight requests declaring
/// such bodies (by length, or chunked) and sending a few bytes of them leave the server serving
/// others, and each is answered 408 at the body-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_never_come_hold_neither_turns_nor_the_budget_of_body_bytes() {
    let launch = Launch::with_args([
        "--max-concurrent-requests",
        "4",
        "--max-buffered-body-bytes",
        "4194304",
        "--body-read-timeout-secs",
        "2",
    ]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let mut stalled = Vec::new();
    for n in 0..8 {
        let (framing, start) = if n % 2 == 0 {
            ("content-length: 1048576", "{\"jsonrpc\"")
        } else {
            ("transfer-encoding: chunked", "a\r\n{\"jsonrpc\"\r\n")
        };
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nmcp-protocol-version: {MODERN}\r\n\
             {framing}\r\n\r\n{start}"
        );
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(head.as_bytes())
            .await
            .expect("send the headers and the start of a body");
        stalled.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        lists_tools(&server).await,
        "another caller is served while eight bodies stall"
    );
    for mut stream in stalled {
        let received = response_head(&mut stream).await;
        let answer = String::from_utf8_lossy(&received);
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "a body that never came is answered 408: {answer:?}"
        );
    }
}

/// Bodies that fill the budget of body bytes between them, each waiting for more of it, do not
/// all fail: one at a time finishes reading past the budget (at most one body more), and the
/// others go on once it gives its bytes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_fill_the_budget_between_them_are_all_served() {
    // A budget of one body of the size limit (1 MiB), the least it may be.
    let launch = Launch::with_args(["--max-buffered-body-bytes", "1048576"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let mut body: Value = serde_json::from_str(&tools_list_body()).expect("a JSON body");
    body["params"]["padding"] = json!("x".repeat(900 * 1024));
    let body = body.to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\n\
         Mcp-Method: tools/list\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (first, rest) = body.split_at(400 * 1024);
    // Three bodies, 400 KiB of each sent, then the rest: more than the budget together, and
    // each waits for more of it. Each sent on its own (a stream whose body waits is not read
    // meanwhile, and its socket may not take all that is sent).
    let sending: Vec<_> = (0..3)
        .map(|_| {
            let (start, rest) = (format!("{head}{first}"), rest.to_owned());
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(addr).await.expect("connect");
                stream
                    .write_all(start.as_bytes())
                    .await
                    .expect("send the headers and the start of the body");
                tokio::time::sleep(Duration::from_millis(100)).await;
                stream
                    .write_all(rest.as_bytes())
                    .await
                    .expect("send the rest of the body");
                stream
            })
        })
        .collect();
    let mut streams = Vec::new();
    for sent in sending {
        streams.push(sent.await.expect("the rest is sent"));
    }
    for (n, mut stream) in streams.into_iter().enumerate() {
        let received = response_head(&mut stream).await;
        let answer = String::from_utf8_lossy(&received);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "body {n} is served: {answer:?}"
        );
    }
}

/// A caller whose token is refused gets its 401 without waiting for its body, and holds none of
/// the server's turns meanwhile: with a single turn, another caller is served while the refused
/// one trickles its body in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_token_is_refused_before_the_body_arrives() {
    let launch = Launch::with_args(["--max-concurrent-requests", "1"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let addr = address_of(server.url());
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: {MODERN}\r\n\
         authorization: Bearer not-a-jwt\r\ncontent-length: 1000\r\n\r\n{{\"jsonrpc\""
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send the headers and the start of a body");
    // The rest of the body never comes; had the refused request taken the only turn while
    // waiting for it, this one would get 503.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        lists_tools(&server).await,
        "another caller is served meanwhile"
    );
    // Waiting for the body would end in 408 after 30 s; `read_more` gives up after 5 s of
    // silence.
    let received = response_head(&mut stream).await;
    let answer = String::from_utf8_lossy(&received).to_ascii_lowercase();
    assert!(
        answer.starts_with("http/1.1 401"),
        "a bad token is answered without its body: {answer:?}"
    );
    assert!(
        answer.contains("www-authenticate: bearer error=\"invalid_token\""),
        "with its challenge: {answer:?}"
    );
}

/// A refused client that waits for `100 Continue` before sending its body is not asked for it:
/// its first answer is the 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_waiting_to_send_its_body_is_not_asked_for_it() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let addr = address_of(server.url());
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: {MODERN}\r\n\
         authorization: Bearer not-a-jwt\r\nexpect: 100-continue\r\ncontent-length: 1000\r\n\r\n"
    );
    stream
        .write_all(head.as_bytes())
        .await
        .expect("send the headers");
    let received = response_head(&mut stream).await;
    let answer = String::from_utf8_lossy(&received);
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "the refusal comes first, without 100 Continue: {answer:?}"
    );
}

/// A client whose token expired as it sent a large request reads its 401, not a broken
/// connection: what it sends is read and dropped before the refusal goes out. (Unread, 12 MiB
/// fill the socket's buffers and the client's write fails before it reads any answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_large_request_gets_its_401_intact() {
    let launch = Launch::with_args(["--max-body-bytes", "16777216"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let padding = "x".repeat(12 * 1024 * 1024);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "recommendMoviesForMood", "arguments": {"mood": "happy", "padding": padding},
        "_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}});
    let http = http();
    for attempt in 0..2 {
        let reply = http
            .post(server.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/call")
            .header("mcp-name", "recommendMoviesForMood")
            .header("authorization", "Bearer not-a-jwt")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("attempt {attempt}: the 401 arrives: {e:?}"));
        assert_eq!(reply.status().as_u16(), 401, "attempt {attempt}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_listen_stream_outlives_the_idle_timeout() {
    let launch = Launch::with_args(["--idle-timeout-secs", "2", "--keepalive-secs", "1"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let mut listen = server.listen_for_tool_changes().await;
    let ended = listen.ends_within(Duration::from_secs(6)).await;
    println!(
        "a listen stream with nothing to say, idle timeout 2 s: still open after 6 s: {}",
        !ended
    );
    assert!(
        !ended,
        "a stream is a request being served, never an idle connection"
    );
}

/// A `subscriptions/listen` request for tool-list changes as `session`, its response opened.
async fn listen_as(session: &support::movies::Session) -> support::EventStream {
    session
        .request("subscriptions/listen")
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .open_stream()
        .await
}

/// The value of the metric line starting with `series` in the server's `/metrics`.
async fn metric(server: &MovieServer, series: &str) -> Option<f64> {
    let url = server.url().replace("/mcp", "/metrics");
    let text = http().get(url).send().await.ok()?.text().await.ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Reads `stream`'s acknowledgement, the first message of a listen stream.
async fn acknowledged(stream: &mut support::EventStream) {
    assert_eq!(stream.status, 200, "a stream opens");
    let first = stream.expect_message(Duration::from_secs(10)).await;
    assert_eq!(
        first["method"], "notifications/subscriptions/acknowledged",
        "{first}"
    );
}

#[tokio::test]
async fn by_default_long_lived_streams_hold_at_most_half_the_connections() {
    let launch = Launch::with_args(["--max-connections", "10"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let ann = server.user("ann");
    let mut held = Vec::new();
    for _ in 0..5 {
        let mut stream = listen_as(&ann).await;
        acknowledged(&mut stream).await;
        held.push(stream);
    }
    let refused = listen_as(&server.user("ben")).await;
    assert_eq!(refused.status, 503, "a sixth stream of ten connections");
    // The other half serves requests.
    let list = ann.request("tools/list").send().await;
    assert!(
        list.result().get("tools").is_some(),
        "requests are served with the streams at their cap: {}",
        list.body_text()
    );
    assert_eq!(metric(&server, "mcp_streams_open ").await, Some(5.0));
    assert_eq!(
        metric(&server, "mcp_streams_replaced_total ")
            .await
            .unwrap_or_default(),
        0.0,
        "none of the five was ended to make room"
    );
    drop(held);
}

/// Lines of `log` saying `what`, and the sum of their `held_back` counts.
fn lines_and_held_back(log: &str, what: &str) -> (u64, u64) {
    let lines: Vec<&str> = log.lines().filter(|line| line.contains(what)).collect();
    let held_back = lines
        .iter()
        .filter_map(|line| line.split("held_back=").nth(1))
        .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .filter_map(|count| count.parse::<u64>().ok())
        .sum();
    (lines.len() as u64, held_back)
}

/// A `tools/list` with a foreign `Origin`, refused with 403.
async fn from_foreign_origin(http: &reqwest::Client, url: &str, n: usize) -> u16 {
    http.post(url)
        .header("origin", format!("http://evil-{n}.example"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/list")
        .body(tools_list_body())
        .send()
        .await
        .map_or(0, |response| response.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refused_origins_writes_a_few_log_lines_that_count_the_rest() {
    use futures::StreamExt as _;
    let server = MovieServer::start(Backend::Sqlite).await;
    let (http, url) = (http(), server.url().to_owned());
    let started = Instant::now();
    let statuses: Vec<u16> = futures::stream::iter(0..2_000)
        .map(|n| {
            let (http, url) = (http.clone(), url.clone());
            async move { from_foreign_origin(&http, &url, n).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let took = started.elapsed();
    assert!(statuses.iter().all(|status| *status == 403), "all refused");
    // A second later, one more: its line counts those held back since the last one written.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(from_foreign_origin(&http, &url, 2_000).await, 403);
    let deadline = Instant::now() + Duration::from_secs(5);
    let (lines, held_back) = loop {
        let (lines, held_back) = lines_and_held_back(&server.log(), "refused request");
        if lines + held_back >= 2_001 || Instant::now() > deadline {
            break (lines, held_back);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "2,001 requests from foreign origins in {took:.1?} (+1 s): {lines} log lines, which \
         count {held_back} more held back"
    );
    assert_eq!(
        lines + held_back,
        2_001,
        "every refusal is written or counted"
    );
    assert!(
        lines <= 5 * (took.as_secs() + 3),
        "at most five lines a second: {lines} in {took:.1?}"
    );
}

/// Starts `count` addToWatchlist conversations as `session`, returning their request states.
async fn first_rounds(session: &support::movies::Session, count: usize) -> Vec<String> {
    let mut states = Vec::new();
    for i in 0..count {
        let movie = (i % 20 + 1).to_string();
        let reply = session
            .call("addToWatchlist", json!({"subject": {"movieId": movie}}))
            .await;
        states.push(reply.request_state());
    }
    states
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_flood_of_open_conversations_evicts_only_their_own() {
    let launch = Launch::with_args([
        "--share-per-caller",
        "50",
        "--continuation-capacity",
        "1000",
    ]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let (alice, mallory) = (server.user("alice"), server.user("mallory"));
    let arguments = json!({"subject": {"movieId": "6"}});
    let alices = alice
        .call("addToWatchlist", arguments.clone())
        .await
        .request_state();
    // Twice the whole store's capacity, from one user.
    let flood = first_rounds(&mallory, 2_000).await;
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let done = alice
        .retry("addToWatchlist", arguments, answer.clone(), &alices)
        .await;
    let alice_finished =
        done.result()["isError"] != json!(true) && done.result().get("resultType").is_some();
    let mut mallory_kept = 0;
    for (i, state) in flood.iter().enumerate() {
        let movie = (i % 20 + 1).to_string();
        let reply = mallory
            .retry(
                "addToWatchlist",
                json!({"subject": {"movieId": movie}}),
                answer.clone(),
                state,
            )
            .await;
        if reply.response().get("result").is_some() {
            mallory_kept += 1;
        }
    }
    println!(
        "continuation flood: mallory opened 2,000 conversations (store capacity 1,000, share 50); \
         {mallory_kept} of hers survived (her newest), {} evicted; alice's one pending \
         conversation {}",
        2_000 - mallory_kept,
        if alice_finished {
            "survived and completed"
        } else {
            "was lost"
        }
    );
    assert!(
        alice_finished,
        "alice's conversation completes: {}",
        done.body_text()
    );
    assert_eq!(
        alice.watchlist().await.len(),
        1,
        "alice's answer was saved once"
    );
    assert_eq!(mallory_kept, 50, "mallory keeps exactly her share");
}

/// A `tools/call` of `name` (in its body and its `Mcp-Name` header) with `origin`, if any: the
/// answer's status and body.
async fn call_named(server: &MovieServer, name: &str, origin: Option<&str>) -> (u16, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {}
            },
            "name": name,
            "arguments": {}
        }
    });
    let mut request = http()
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .json(&body);
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    let answer = request.send().await.expect("the server answers");
    let status = answer.status().as_u16();
    let body = answer
        .text()
        .await
        .expect("the answer's body is read whole");
    (status, body)
}

/// A `tools/list` over HTTP/2 (prior knowledge) to `addr` carrying a header of `padding` bytes:
/// the answer's status and body.
async fn http2_tools_list_padded(addr: SocketAddr, padding: usize) -> (u16, String) {
    http2_tools_list(addr, &addr.to_string(), padding).await
}

/// A `tools/list` over HTTP/2 (prior knowledge) to `addr`, naming `authority` as its host and
/// carrying a header of `padding` bytes: the answer's status and body.
async fn http2_tools_list(addr: SocketAddr, authority: &str, padding: usize) -> (u16, String) {
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 opening");
    let driven = tokio::spawn(connection);
    let mut client = client
        .ready()
        .await
        .expect("the connection takes a request");
    let request = axum::http::Request::post(format!("http://{authority}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/list")
        .header("x-padding", "p".repeat(padding))
        .body(())
        .expect("a request");
    let (answer, mut body) = client
        .send_request(request, false)
        .expect("sends the request");
    // A refusal may come, and end the stream, before the body is sent: the body then has
    // nowhere to go, and the answer says why.
    let _ = body.send_data(tools_list_body().into(), true);
    let answer = tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .expect("answered in time")
        .expect("an answer");
    let status = answer.status().as_u16();
    let mut received = answer.into_body();
    let mut text = Vec::new();
    while let Some(chunk) = received.data().await {
        let chunk = chunk.expect("the answer's body");
        let _ = received.flow_control().release_capacity(chunk.len());
        text.extend_from_slice(&chunk);
    }
    driven.abort();
    (status, String::from_utf8_lossy(&text).into_owned())
}

/// The JSON-RPC error in `body`, checked to be short.
fn short_error(body: &str) -> Value {
    assert!(
        body.len() < 2048,
        "the answer is short: {} bytes",
        body.len()
    );
    let answer: Value = serde_json::from_str(body).expect("a JSON-RPC answer");
    answer["error"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_headers_and_names_are_echoed_only_as_a_prefix() {
    let server = MovieServer::start(Backend::Sqlite).await;
    // Within the 64 KiB of headers read: a 60 KB Origin, a 40 KB tool name.
    let origin = format!("http://{}.example", "o".repeat(60_000));
    let (origin_status, origin_body) = call_named(&server, "x", Some(&origin)).await;
    assert_eq!(origin_status, 403, "a foreign Origin is refused");
    short_error(&origin_body);
    let (name_status, name_body) = call_named(&server, &"n".repeat(40_000), None).await;
    assert_eq!(name_status, 200, "{name_body}");
    let name_error = short_error(&name_body);
    assert_eq!(name_error["code"], -32602, "{name_body}");
    let message = name_error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("Unknown tool: nnn") && message.contains("(40000 bytes)"),
        "the unknown tool is named by a prefix and its size: {message}"
    );
    // Beyond: a foreign Origin is still refused first, as the spec has it; anything else gets
    // 431.
    let huge_origin = format!("http://{}.example", "o".repeat(300_000));
    let (status, body) = call_named(&server, "x", Some(&huge_origin)).await;
    assert_eq!(status, 403, "a 300 KB Origin: {body}");
    short_error(&body);
    let (status, body) = call_named(&server, &"n".repeat(300_000), None).await;
    assert_eq!(status, 431, "a 300 KB tool name: {body}");
    assert!(
        short_error(&body)["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Request headers over 64 KiB")),
        "{body}"
    );
    // The same bound over HTTP/2, whose own (16 KiB) would answer with an empty 431 first.
    let addr = address_of(server.url());
    let (status, body) = http2_tools_list_padded(addr, 40_000).await;
    assert_eq!(status, 200, "a 40 KB header over HTTP/2: {body}");
    let (status, body) = http2_tools_list_padded(addr, 100_000).await;
    assert_eq!(status, 431, "a 100 KB header over HTTP/2: {body}");
    assert!(
        short_error(&body)["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Request headers over 64 KiB")),
        "{body}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let longest_log_line = server.log().lines().map(str::len).max().unwrap_or(0);
    println!(
        "echoes: a 60 KB Origin gets 403 with a {}-byte body; a 40 KB tool name gets a \
         {}-byte answer; a 300 KB Origin gets 403, a 300 KB tool name 431; the longest log line \
         is {longest_log_line} bytes",
        origin_body.len(),
        name_body.len()
    );
    assert!(
        longest_log_line < 4096,
        "no log line echoes the input: {longest_log_line} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_on_loopback_refuses_http2_requests_naming_a_foreign_host() {
    // HTTP/2 names the host in `:authority`, not in a `Host` header: DNS rebinding through a
    // client speaking HTTP/2 is refused as over HTTP/1.
    let server = MovieServer::start(Backend::Sqlite).await;
    let addr = address_of(server.url());
    let (status, body) = http2_tools_list(addr, &format!("localhost:{}", addr.port()), 0).await;
    assert_eq!(status, 200, "a local host: {body}");
    let (status, body) =
        http2_tools_list(addr, &format!("rebound.example.com:{}", addr.port()), 0).await;
    assert_eq!(status, 403, "a foreign host: {body}");
    assert!(
        short_error(&body)["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("Host rebound.example.com")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_given_twice_is_refused_before_anything_runs() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let alice = server.user("alice");
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{{"_meta":{{"io.modelcontextprotocol/protocolVersion":"{MODERN}"}},"name":"addToWatchlist","arguments":{{"subject":{{"movieId":"6"}},"status":"WATCHED"}}}}}}"#
    );
    let token =
        moviedb_mcp::auth::mint_token(server.secret.as_bytes(), "alice", Duration::from_secs(600))
            .expect("a token");
    let response = http()
        .post(server.url())
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "tools/call")
        .header("mcp-name", "addToWatchlist")
        .body(body)
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let answer: Value = response.json().await.expect("a JSON answer");
    println!("duplicate keys: HTTP {status}, {answer}");
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert!(alice.watchlist().await.is_empty(), "nothing ran");
}

/// Checks that the server ended `stream`, `within` from now, with the closing response to its
/// listen request.
async fn ended_by_the_server(stream: &mut support::EventStream, within: Duration) {
    let closing = stream.expect_message(within).await;
    assert_eq!(
        (&closing["id"], &closing["result"]["resultType"]),
        (
            stream.request_id.as_ref().expect("an id"),
            &json!("complete")
        ),
        "the subscription's closing response: {closing}"
    );
    assert!(stream.ends_within(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_stream_ends_when_the_token_that_opened_it_expires() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let now = chrono::Utc::now().timestamp();
    // Accepted until 5 s past its expiry (the development tokens' leeway): 7 s from now.
    let brief = support::movies::sign_token(server.secret.as_bytes(), "ann", now, now + 2);
    let mut expiring = listen_as(&server.with_token(&brief)).await;
    acknowledged(&mut expiring).await;
    let mut lasting = listen_as(&server.user("ann")).await;
    acknowledged(&mut lasting).await;

    ended_by_the_server(&mut expiring, Duration::from_secs(30)).await;
    let ended_at = chrono::Utc::now().timestamp();
    assert!(
        ended_at >= now + 6,
        "not before the token stopped being accepted: {} s after it was signed",
        ended_at - now
    );
    assert!(
        !lasting.ends_within(Duration::from_secs(1)).await,
        "a stream opened with a token still good goes on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_streams_are_bounded_per_caller_and_in_all() {
    let launch = Launch::with_args(["--max-streams", "3", "--max-streams-per-caller", "2"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let anonymous = server.anonymous();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = listen_as(&anonymous).await;
        acknowledged(&mut stream).await;
        held.push(stream);
    }
    // A third from the same address takes the place of the oldest, which is told it ended.
    let mut third = listen_as(&anonymous).await;
    acknowledged(&mut third).await;
    ended_by_the_server(&mut held[0], Duration::from_secs(10)).await;
    held.remove(0);
    held.push(third);
    // Another kind of stream, where the server has one, counts against the same caller's share.
    let fourth = another_anonymous_stream(&server).await;
    ended_by_the_server(&mut held[0], Duration::from_secs(10)).await;
    held.remove(0);

    let mut bobs = listen_as(&server.user("bob")).await;
    acknowledged(&mut bobs).await;
    let carol = server.user("carol");
    let refused = listen_as(&carol).await;
    assert_eq!(refused.status, 503, "past the server's three streams: busy");
    assert_eq!(
        refused
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("5")
    );
    let list = carol.request("tools/list").send().await;
    assert!(
        list.result().get("tools").is_some(),
        "requests are still served while streams are at their cap: {}",
        list.body_text()
    );
    assert_eq!(metric(&server, "mcp_streams_open ").await, Some(3.0));

    // Once one of them ends (its client goes away), carol's stream has room.
    drop(fourth);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut carols = loop {
        let stream = listen_as(&carol).await;
        if stream.status == 200 || Instant::now() > deadline {
            break stream;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    acknowledged(&mut carols).await;
    let replaced = metric(&server, "mcp_streams_replaced_total ").await;
    let refused = metric(&server, "mcp_streams_refused_total ").await;
    println!(
        "listen streams, cap 3 in all and 2 per caller: a caller's oldest ended {} times for its \
         newest; refused past the server's cap {} times (503)",
        replaced.unwrap_or_default(),
        refused.unwrap_or_default()
    );
    assert_eq!(replaced, Some(2.0), "the third stream and the fourth");
    assert!(refused.is_some_and(|refused| refused >= 1.0));
}

/// One more long-lived stream of the anonymous caller at 127.0.0.1: a 2025-11-25 session's GET
/// stream where the server serves such sessions.
#[cfg(feature = "legacy")]
async fn another_anonymous_stream(server: &MovieServer) -> reqwest::Response {
    legacy_sessions::get_stream(server).await
}

/// One more long-lived stream of the anonymous caller at 127.0.0.1: another listen.
#[cfg(not(feature = "legacy"))]
async fn another_anonymous_stream(server: &MovieServer) -> support::EventStream {
    let mut stream = listen_as(&server.anonymous()).await;
    acknowledged(&mut stream).await;
    stream
}

/// Legacy (2025-11-25) sessions under hostile load, and the streams they hold (feature `legacy`).
#[cfg(feature = "legacy")]
mod legacy_sessions {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    const LEGACY: &str = "2025-11-25";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_anonymous_flood_of_huge_legacy_initializes_is_refused_cheaply() {
        let server = MovieServer::start(Backend::Sqlite).await;
        let rss = Rss::watch(server.pid());
        let before = rss.now();
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": LEGACY,
                "capabilities": {},
                "clientInfo": {"name": "flood", "version": "1", "padding": "x".repeat(878_000)},
            }
        });
        let bytes = serde_json::to_vec(&body).expect("serialize");
        let answers = flood(server.url(), LEGACY, vec![bytes; 1_500], 64).await;
        let peak = rss.peak();
        let settled = rss.after(Duration::from_secs(3)).await;
        println!(
            "legacy initialize flood: 1,500 × 878 KB clientInfo; RSS {} before, {} at peak (+{}), {} \
             3 s after",
            mib(before),
            mib(peak),
            mib(peak.saturating_sub(before)),
            mib(settled)
        );
        assert!(
            answers.iter().all(|&(_, code)| code == -32602),
            "every oversized clientInfo is refused with -32602: {:?}",
            &answers[..answers.len().min(5)]
        );
        assert!(
            peak.saturating_sub(before) < 256 * MIB,
            "RSS grows by less than 256 MiB: {} → {}",
            mib(before),
            mib(peak)
        );
    }

    /// The GET stream of a new anonymous session opened from 127.0.0.1.
    pub(super) async fn get_stream(server: &MovieServer) -> reqwest::Response {
        let legacy = open_session(server.url(), IpAddr::V4(Ipv4Addr::LOCALHOST))
            .await
            .expect("a legacy session");
        let get = http()
            .get(server.url())
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &legacy)
            .header("mcp-protocol-version", LEGACY)
            .send()
            .await
            .expect("the server answers");
        assert_eq!(get.status(), 200, "the legacy GET opens");
        get
    }

    /// An anonymous legacy client calling from `local`, as a `POST` of `message` (in `session`).
    async fn legacy_post(
        url: &str,
        local: IpAddr,
        session: Option<&str>,
        message: Value,
    ) -> Option<reqwest::Response> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .local_address(local)
            .build()
            .expect("reqwest client");
        support::legacy_post(&http, url, session, &message)
            .send()
            .await
            .ok()
    }

    /// Opens a legacy session as an anonymous client calling from `local`.
    async fn open_session(url: &str, local: IpAddr) -> Option<String> {
        let initialize = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        });
        let response = legacy_post(url, local, None, initialize).await?;
        response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    /// Whether the session still serves `tools/list`.
    async fn session_serves(url: &str, local: IpAddr, session: &str) -> bool {
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
        legacy_post(url, local, Some(session), list)
            .await
            .expect("the server answers")
            .status()
            .is_success()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_anonymous_flood_of_sessions_from_one_address_spares_other_addresses() {
        let launch = Launch::with_args([
            "--share-per-caller",
            "50",
            "--continuation-capacity",
            "1000",
        ]);
        let server = MovieServer::start_with(Backend::Sqlite, launch).await;
        let url = server.url().to_owned();
        let (flooder, neighbour) = (
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        );
        let kept = open_session(&url, neighbour).await.expect("a session");
        let mut flood = Vec::new();
        for _ in 0..2_000 {
            flood.push(open_session(&url, flooder).await.expect("a session"));
        }
        let neighbour_kept = session_serves(&url, neighbour, &kept).await;
        let mut flooder_kept = 0;
        for session in &flood {
            if session_serves(&url, flooder, session).await {
                flooder_kept += 1;
            }
        }
        println!(
            "session flood: 2,000 anonymous initializes from 127.0.0.1 (store capacity 1,000, share \
             50); {flooder_kept} of them still open; the session from 127.0.0.2 {}",
            if neighbour_kept {
                "survived"
            } else {
                "was evicted"
            }
        );
        assert!(neighbour_kept, "the other address's session survives");
        assert_eq!(
            flooder_kept, 50,
            "the flooding address keeps exactly its share"
        );
    }
}

/// A 2025-11-25 client refusing every question makes one log line per call at most five a
/// second, each counted, and each in its request's span (a streamed call's lines name their
/// request, as those answered in place do).
#[cfg(feature = "legacy")]
#[tokio::test]
async fn questions_refused_in_a_burst_are_logged_within_budget_and_in_their_requests_span() {
    use support::legacy::LegacyClient;
    let server = MovieServer::start(Backend::Sqlite).await;
    let token = moviedb_mcp::auth::mint_token(
        server.secret.as_bytes(),
        "refuser",
        Duration::from_secs(3600),
    )
    .expect("a token");
    let client = LegacyClient::new(server.url().to_owned(), Some(token))
        .initialize(json!({"elicitation": {}}))
        .await;
    let refuse_adding = |movie: u64| {
        let client = client.clone();
        async move {
            let arguments = json!({"subject": {"movieId": movie.to_string()}});
            let mut call = client.start_call("addToWatchlist", arguments).await;
            let question = call.next_server_request().await;
            client.refuse(&question["id"], -1, "User rejected").await;
            call.response().await
        }
    };
    let answers = futures::future::join_all((1..=15).map(refuse_adding)).await;
    for answer in &answers {
        assert_eq!(
            answer["result"]["structuredContent"]["status"], "WANT_TO_WATCH",
            "a refused question records WANT_TO_WATCH: {answer}"
        );
    }
    // A second later, one more: its line counts those held back.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    refuse_adding(16).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let (lines, held_back) = loop {
        let counted = lines_and_held_back(&server.log(), "elicitation not answered");
        if counted.0 + counted.1 >= 16 || Instant::now() > deadline {
            break counted;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lines + held_back, 16, "every refusal written or counted");
    let log = server.log();
    let mut per_second = std::collections::BTreeMap::<&str, u32>::new();
    for line in log
        .lines()
        .filter(|l| l.contains("elicitation not answered"))
    {
        assert!(
            line.contains("request{") && line.contains(" id="),
            "in its request's span: {line}"
        );
        // Lines start with an RFC 3339 time: its first 19 characters name the second.
        *per_second
            .entry(line.get(..19).unwrap_or(line))
            .or_default() += 1;
    }
    assert!(
        per_second.values().all(|lines| *lines <= 5),
        "at most five lines a second: {per_second:?}"
    );
    // The metrics count every line held back, even those no later line reports.
    let metrics = reqwest::get(server.url().replace("/mcp", "/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let series = "mcp_log_lines_held_back_total{kind=\"legacy_question_unanswered\"} ";
    let counted: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix(series))
        .map_or(0, |value| value.parse().expect("a count"));
    assert_eq!(counted, 16 - lines, "lines held back, in the metrics");
}
