//! The floor: an axum server with no MCP logic at all, answering the two requests of a round trip
//! with fixed bytes shaped like the conformance example's answers (`input_required` with a
//! 150-character `requestState`, then `complete`), chosen by whether the body carries a
//! `requestState`. Served like ours: axum over hyper, Nagle's algorithm off, the default runtime.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;

use crate::client::ELICITATION_REPLY;

/// The two answers, built once.
#[derive(Clone)]
struct Replies {
    input_required: Bytes,
    complete: Bytes,
}

impl Replies {
    fn new() -> Self {
        let state = "A".repeat(150);
        let input_required = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","inputRequests":{{"user_name":{{"method":"elicitation/create","params":{{"mode":"form","message":"What is your name?","requestedSchema":{{"properties":{{"name":{{"description":"Your name","type":"string"}}}},"required":["name"],"type":"object"}}}}}}}},"requestState":"{state}"}}}}"#
        );
        let complete = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"text":"{ELICITATION_REPLY}","type":"text"}}],"resultType":"complete"}}}}"#
        );
        Self {
            input_required: input_required.into(),
            complete: complete.into(),
        }
    }
}

/// Serves the floor on `bind` until the process is stopped.
pub async fn serve(bind: SocketAddr) -> anyhow::Result<()> {
    use axum::serve::ListenerExt;
    let listener = tokio::net::TcpListener::bind(bind).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = Router::new()
        .route("/mcp", post(answer))
        .with_state(Replies::new());
    axum::serve(listener, app).await?;
    Ok(())
}

async fn answer(State(replies): State<Replies>, body: Bytes) -> Response {
    let retry = body
        .windows(b"\"requestState\"".len())
        .any(|window| window == b"\"requestState\"");
    let reply = if retry {
        replies.complete
    } else {
        replies.input_required
    };
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        reply,
    )
        .into_response()
}
