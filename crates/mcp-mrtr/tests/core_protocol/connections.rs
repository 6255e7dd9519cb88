//! Connection bounds given to the library directly: a zero idle timeout, which would close every
//! kept-alive connection at its first check, is served as the shortest one allowed.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use mcp_mrtr::transport::{ConnectionLimits, Drain, MIN_IDLE_TIMEOUT, serve};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::PATIENCE;

/// Sends one GET on `stream` and returns the response's head and body.
async fn get_on(stream: &mut TcpStream, address: SocketAddr) -> String {
    let request = format!("GET /hello HTTP/1.1\r\nhost: {address}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("the request is written");
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
