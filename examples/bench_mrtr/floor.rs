//! The floor: an axum server with no MCP logic at all, answering with fixed bytes. The two
//! requests of a round trip get answers shaped like the conformance example's (`input_required`
//! with a 150-character `requestState`, then `complete`, chosen by whether the body carries a
//! `requestState`); a single call of `recommendMoviesForMood` or `summarizeMovieReviews` gets an
//! answer shaped and sized like the movie server's (20 movies; a summary with themes). Each
//! result names its server in `_meta`, as the servers' 2026-07-28 results do. Served like ours:
//! axum over hyper, Nagle's algorithm off, the default runtime.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::json;

use crate::client::ELICITATION_REPLY;

/// The answers, built once.
#[derive(Clone)]
struct Replies {
    input_required: Bytes,
    complete: Bytes,
    recommendations: Bytes,
    summary: Bytes,
}

/// The `_meta` of a result from the conformance example. Its version is this package's, which
/// `mcp-mrtr` shares.
const CONFORMANCE_META: &str = concat!(
    r#""_meta":{"io.modelcontextprotocol/serverInfo":{"name":"mcp-mrtr-conformance","version":""#,
    env!("CARGO_PKG_VERSION"),
    r#""}}"#
);

impl Replies {
    fn new() -> Self {
        let state = "A".repeat(150);
        let input_required = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","inputRequests":{{"user_name":{{"method":"elicitation/create","params":{{"mode":"form","message":"What is your name?","requestedSchema":{{"properties":{{"name":{{"description":"Your name","type":"string"}}}},"required":["name"],"type":"object"}}}}}}}},"requestState":"{state}",{CONFORMANCE_META}}}}}"#
        );
        let complete = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"text":"{ELICITATION_REPLY}","type":"text"}}],"resultType":"complete",{CONFORMANCE_META}}}}}"#
        );
        let movies: Vec<_> = (1..=20)
            .map(|n| {
                json!({"id": format!("{n}"), "title": format!("A Placeholder Feature, Part {n}"),
                       "releaseYear": 1990 + n, "genre": "Drama", "rating": 9.0 - f64::from(n) / 10.0})
            })
            .collect();
        let summary = json!({
            "movieId": "42", "reviewCount": 12, "averageScore": 7.4,
            "summary": "Reviewers praise the performances and the score, though several find the middle act slow.",
            "themes": ["performances", "score", "pacing", "cinematography"]
        });
        Self {
            input_required: input_required.into(),
            complete: complete.into(),
            recommendations: structured(&json!({ "movies": movies })),
            summary: structured(&summary),
        }
    }
}

/// A `complete` tool result carrying `content` as text and as structured content, as the movie
/// tools answer.
fn structured(content: &serde_json::Value) -> Bytes {
    let reply = json!({"jsonrpc": "2.0", "id": 1, "result": {
        "content": [{"type": "text", "text": content.to_string()}],
        "structuredContent": content,
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": {
            "name": "moviedb-mcp", "version": env!("CARGO_PKG_VERSION")
        }}
    }});
    reply.to_string().into()
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
    let holds = |needle: &[u8]| body.windows(needle.len()).any(|window| window == needle);
    let reply = if holds(b"\"recommendMoviesForMood\"") {
        replies.recommendations
    } else if holds(b"\"summarizeMovieReviews\"") {
        replies.summary
    } else if holds(b"\"requestState\"") {
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
