//! The core of the 2026-07-28 wire, tested the way a client sees it: real HTTP against an
//! in-process server. MRTR rounds and the refusals of `requestState`, header and `_meta`
//! validation, caching hints, connection bounds, draining, SSE progress and logging, cancellation
//! when a stream closes, `subscriptions/listen`, and notifications. Every message the server
//! sends is checked against the official schema by the support client.

#[path = "../support/mod.rs"]
mod support;

mod answers;
mod caching;
mod cancellation;
mod connections;
mod draining;
mod health;
mod http_layers;
mod notifications;
mod request_state;
mod rounds;
mod schema;
mod streaming;
mod subscriptions;
mod validation;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Reply, ServerOptions, TestServer, accept};

/// Long enough for anything that should arrive; only a broken server ever waits this long.
const PATIENCE: Duration = Duration::from_secs(10);

/// The distinguishing part of each `requestState` refusal message.
const REFUSALS: [&str; 5] = [
    "integrity",
    "already been used",
    "expired",
    "another principal",
    "different request",
];

/// Asserts a -32602 refusal whose message names `reason` and none of the other refusals.
fn assert_refusal(reply: &Reply, reason: &str) {
    assert_eq!(
        reply.error_code(),
        -32602,
        "refusal code (body {})",
        reply.body_text()
    );
    assert_eq!(
        reply.response().get("id"),
        reply.request_id.as_ref(),
        "the refusal echoes the request id"
    );
    let message = reply.error_message();
    assert!(
        message.contains(reason),
        "the refusal should say {reason:?}: {message}"
    );
    for other in REFUSALS.iter().filter(|other| **other != reason) {
        assert!(
            !message.contains(other),
            "the {reason:?} refusal must be distinguishable from {other:?}: {message}"
        );
    }
}

/// Round 1 of `greet`: returns the state after checking the result asks for `user_name`.
async fn greet_round_one(client: &support::Client, arguments: Value) -> String {
    let first = client.call_tool("greet", arguments).await;
    assert_eq!(first.result_type(), "input_required");
    assert!(first.input_requests().contains_key("user_name"));
    first.request_state()
}

fn alice() -> Value {
    json!({"user_name": accept(json!({"name": "Alice"}))})
}

/// A server that offers no tasks, and the capabilities of a client without the Tasks extension
/// and of one with it: on such a server, declaring it must change nothing.
async fn keeping_no_tasks() -> (TestServer, [Value; 2]) {
    let server = TestServer::start_with(ServerOptions {
        offer_tasks: false,
        ..ServerOptions::default()
    })
    .await;
    let capabilities = [
        json!({}),
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
    ];
    (server, capabilities)
}
