//! Connection bounds given to the library directly: a zero idle timeout, which would close every
//! kept-alive connection at its first check, is served as the shortest one allowed; at the cap, a
//! new connection is served once one of the others is idle, which is closed for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use mcp_mrtr::transport::{ConnectionLimits, Drain, MIN_IDLE_TIMEOUT, serve};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::PATIENCE;

/// Sends one GET on `stream` and returns the response's head and body.
async fn get_on(stream: &mut TcpStream, address: SocketAddr) -> String {
    send_get(stream, address, "/hello").await;
    read_hello(stream).await
}

async fn send_get(stream: &mut TcpStream, address: SocketAddr, path: &str) {
    let request = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("the request is written");
}

/// Reads a response whose body is "hello".
async fn read_hello(stream: &mut TcpStream) -> String {
    let mut response = Vec::new();
    let mut buffer = [0u8; 1024];
    // The body is "hello": the response is whole once it ends with it.
    while !response.ends_with(b"hello") {
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buffer))
            .await
            .expect("the response comes in time")
            .expect("the connection is not reset");
        assert!(read > 0, "the connection closed before answering");
        response.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn a_zero_idle_timeout_keeps_connections_open_for_the_shortest_one_allowed() {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind 127.0.0.1:0");
    let address = listener.local_addr().expect("local address");
    let router = Router::new().route("/hello", get(|| async { "hello" }));
    let limits = ConnectionLimits {
        max_connections: 16,
        header_read_timeout: Duration::from_secs(5),
        idle_timeout: Duration::ZERO,
        shutdown_grace: Duration::from_secs(5),
    };
    let drain = Drain::default();
    let server = tokio::spawn(serve(listener, router, limits, drain.clone()));

    let mut stream = TcpStream::connect(address).await.expect("connect");
    let first = get_on(&mut stream, address).await;
    assert!(first.starts_with("HTTP/1.1 200 OK"), "{first}");
    // Several checks run in this pause (every 50 ms at the shortest).
    tokio::time::sleep(MIN_IDLE_TIMEOUT / 2).await;
    let second = get_on(&mut stream, address).await;
    assert!(
        second.starts_with("HTTP/1.1 200 OK"),
        "the kept-alive connection still carries a request: {second}"
    );
    // Left idle, it is closed all the same: the timeout is short, not off.
    let mut rest = [0u8; 64];
    let closed = tokio::time::timeout(MIN_IDLE_TIMEOUT * 4, stream.read(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "the idle connection is closed after the shortest timeout: {closed:?}"
    );

    drain.begin();
    drop(stream);
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the server drains")
        .expect("the server task does not panic");
}

/// A router answering "hello" on `/hello` at once, and on `/held/a` and `/held/b` once the test
/// lets the matching gate go; each held request adds a permit to `started` as it begins.
fn held_router(a: Arc<Semaphore>, b: Arc<Semaphore>, started: Arc<Semaphore>) -> Router {
    let held = move |gate: Arc<Semaphore>, started: Arc<Semaphore>| async move {
        started.add_permits(1);
        let _let_go = gate.acquire().await;
        "hello"
    };
    let other = started.clone();
    Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/held/a", get(move || held(a.clone(), started.clone())))
        .route("/held/b", get(move || held(b.clone(), other.clone())))
}

#[tokio::test]
async fn at_the_cap_a_new_connection_is_served_once_another_goes_idle() {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind 127.0.0.1:0");
    let address = listener.local_addr().expect("local address");
    let (gate_a, gate_b) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let limits = ConnectionLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(60),
        // Far longer than the test: no connection is closed for idleness.
        idle_timeout: Duration::from_secs(600),
        shutdown_grace: Duration::from_secs(5),
    };
    let drain = Drain::default();
    let started = Arc::new(Semaphore::new(0));
    let router = held_router(gate_a.clone(), gate_b.clone(), started.clone());
    let server = tokio::spawn(serve(listener, router, limits, drain.clone()));

    // Both places taken by connections with a request in flight.
    let mut a = TcpStream::connect(address).await.expect("connect a");
    send_get(&mut a, address, "/held/a").await;
    let mut b = TcpStream::connect(address).await.expect("connect b");
    send_get(&mut b, address, "/held/b").await;
    let both = tokio::time::timeout(PATIENCE, started.acquire_many(2)).await;
    assert!(matches!(both, Ok(Ok(_))), "both requests are in flight");
    // The third waits: neither of the others may be closed while it works.
    let mut c = TcpStream::connect(address).await.expect("connect c");
    send_get(&mut c, address, "/hello").await;
    let mut early = [0u8; 64];
    assert!(
        tokio::time::timeout(Duration::from_secs(1), c.read(&mut early))
            .await
            .is_err(),
        "nothing is closed, and so nothing is answered, while both others are busy"
    );

    // `b` answers and, kept alive, goes idle: it makes room for `c`.
    gate_b.add_permits(1);
    let from_b = read_hello(&mut b).await;
    assert!(from_b.starts_with("HTTP/1.1 200 OK"), "{from_b}");
    let from_c = read_hello(&mut c).await;
    assert!(
        from_c.starts_with("HTTP/1.1 200 OK"),
        "the waiting connection is served: {from_c}"
    );
    let mut rest = [0u8; 64];
    let closed = tokio::time::timeout(PATIENCE, b.read(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "the idle one was closed to make room: {closed:?}"
    );
    gate_a.add_permits(1);
    let from_a = read_hello(&mut a).await;
    assert!(
        from_a.starts_with("HTTP/1.1 200 OK"),
        "the busy one was left alone: {from_a}"
    );

    drain.begin();
    drop((a, c));
    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the server drains")
        .expect("the server task does not panic");
}
