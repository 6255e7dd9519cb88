//! Draining, as a balancer sees it: a request it already sent on a connection that was still
//! waiting in the server's listen queue when the server began to drain is answered (with
//! `Connection: close`), not reset; a balancer does not retry a POST it sent, so a reset would
//! reach its client as a 502.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use mcp_mrtr::transport::{ConnectionLimits, Drain, serve};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::PATIENCE;

const QUEUED: usize = 8;

#[tokio::test]
async fn requests_on_connections_still_queued_when_draining_begins_are_answered() {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind 127.0.0.1:0");
    let address = listener.local_addr().expect("local address");

    // The kernel completes these handshakes while nobody accepts: they wait in the queue, each
    // with a request already written, the way a balancer's new upstream connections do.
    let mut queued = Vec::new();
    for n in 0..QUEUED {
        let mut stream = TcpStream::connect(address)
            .await
            .expect("the kernel queues the connection");
        let body = format!("request {n}");
        let request = format!(
            "POST /echo HTTP/1.1\r\nhost: {address}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .expect("the request is written");
        queued.push((stream, body));
    }

    let drain = Drain::default();
    drain.begin();
    let router = Router::new().route("/echo", post(|body: String| async move { body }));
    let limits = ConnectionLimits {
        max_connections: 64,
        header_read_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(30),
        shutdown_grace: Duration::from_secs(10),
    };
    let server = tokio::spawn(serve(listener, router, limits, drain));

    for (mut stream, body) in queued {
        let mut response = String::new();
        tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response))
            .await
            .expect("the response comes in time")
            .unwrap_or_else(|error| panic!("the connection carrying {body:?} was reset: {error}"));
        let lowercase = response.to_ascii_lowercase();
        assert!(
            response.starts_with("HTTP/1.1 200 OK"),
            "{body:?} is served: {response}"
        );
        assert!(
            lowercase.contains("\r\nconnection: close\r\n"),
            "the draining server closes the connection after answering: {response}"
        );
        assert!(
            response.ends_with(&format!("\r\n\r\n{body}")),
            "the answer is the one to {body:?}: {response}"
        );
    }

    tokio::time::timeout(PATIENCE, server)
        .await
        .expect("the server finishes draining once its connections are answered")
        .expect("the server task does not panic");
    assert!(
        TcpStream::connect(address).await.is_err(),
        "the drained server's port refuses new connections"
    );
}
