//! SSE answers: progress before the final response, log messages at or above the requested level.

use serde_json::json;

use super::PATIENCE;
use crate::support::TestServer;

#[tokio::test]
async fn progress_is_streamed_before_the_final_response() {
    let server = TestServer::start().await;
    let client = server.client();

    let reply = client
        .request("tools/call")
        .params(json!({"name": "progress_steps", "arguments": {}}))
        .progress_token(json!("progress-1"))
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 200);
    assert!(
        reply.is_event_stream(),
        "content type {}",
        reply.content_type()
    );
    assert_eq!(reply.header("x-accel-buffering"), Some("no"));

    let (last, before) = reply.messages.split_last().expect("messages");
    assert_eq!(
        last["id"],
        reply.request_id.clone().unwrap(),
        "the final message is the response"
    );
    assert_eq!(reply.text(), "three steps done");
    assert_eq!(before.len(), 3, "three progress notifications: {before:?}");
    let mut previous = f64::MIN;
    for note in before {
        assert_eq!(note["method"], "notifications/progress");
        assert_eq!(note["params"]["progressToken"], "progress-1");
        let progress = note["params"]["progress"].as_f64().expect("progress");
        assert!(progress >= previous, "progress never goes down");
        previous = progress;
    }
    assert_eq!(previous, 3.0);

    let plain = client.call_tool("progress_steps", json!({})).await;
    assert!(
        plain.is_json(),
        "without a token: application/json, got {}",
        plain.content_type()
    );
    assert_eq!(plain.messages.len(), 1);
    assert_eq!(plain.text(), "three steps done");
}

#[tokio::test]
async fn log_messages_are_sent_only_at_or_above_the_requested_level() {
    let server = TestServer::start().await;
    let client = server.client();

    let cases: [(&str, &[&str]); 5] = [
        ("debug", &["debug", "info", "error"]),
        ("info", &["info", "error"]),
        ("warning", &["error"]),
        ("error", &["error"]),
        ("critical", &[]),
    ];
    for (wanted, expected) in cases {
        let reply = client
            .request("tools/call")
            .params(json!({"name": "chatty", "arguments": {}}))
            .log_level(wanted)
            .send()
            .await;
        // Nothing to stream means a plain JSON answer; anything to stream means SSE.
        assert_eq!(
            reply.is_event_stream(),
            !expected.is_empty(),
            "logLevel {wanted}"
        );
        assert_eq!(reply.text(), "logged");
        let levels: Vec<&str> = reply
            .notifications()
            .iter()
            .map(|n| {
                assert_eq!(n["method"], "notifications/message");
                n["params"]["level"].as_str().expect("level")
            })
            .collect();
        assert_eq!(levels, expected, "logLevel {wanted}");
        let last = reply.messages.last().expect("messages");
        assert!(last.get("result").is_some(), "the response comes last");
    }

    let silent = client.call_tool("chatty", json!({})).await;
    assert!(
        silent.is_json(),
        "without logLevel: application/json, got {}",
        silent.content_type()
    );
    assert!(silent.notifications().is_empty());
    assert_eq!(silent.text(), "logged");
}

/// A call's stream that goes quiet (its tool at work, or a 2025-11-25 question waiting for its
/// user) carries comment lines, so that a proxy does not take it for a dead one.
#[tokio::test]
async fn a_quiet_call_stream_is_kept_alive_with_comments() {
    use crate::support::ServerOptions;

    let server = TestServer::start_with(ServerOptions {
        keepalive_secs: 1,
        ..ServerOptions::default()
    })
    .await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "slow_progress", "arguments": {},
        "_meta": {
            "progressToken": "quiet",
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "quiet-client", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}
        }
    }});
    let mut response = server
        .client()
        .http()
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "slow_progress")
        .json(&body)
        .send()
        .await
        .expect("a call");
    assert_eq!(response.status().as_u16(), 200, "{response:?}");
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !text.contains("\n: keep-alive\n\n") && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    assert!(
        text.starts_with("data: ") && text.contains("notifications/progress"),
        "the progress comes first: {text}"
    );
    assert!(
        text.contains("\n: keep-alive\n\n"),
        "then, while the tool works, comment lines: {text}"
    );
}
