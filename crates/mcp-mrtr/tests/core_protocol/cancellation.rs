//! Cancellation: closing a streamed call's stream stops its handler (on 2025-11-25 it does not,
//! but what the call asks after the close is given up).

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::PATIENCE;
use crate::support::TestServer;

#[tokio::test]
async fn closing_the_stream_cancels_the_running_tool() {
    let server = TestServer::start().await;
    let client = server.client();

    let mut stream = client
        .request("tools/call")
        .params(json!({"name": "slow_progress", "arguments": {}}))
        .progress_token(json!(42))
        .open_stream()
        .await;
    assert_eq!(stream.status.as_u16(), 200);
    assert!(stream.content_type().starts_with("text/event-stream"));
    let first = stream.expect_message(PATIENCE).await;
    assert_eq!(first["method"], "notifications/progress");
    assert_eq!(first["params"]["progressToken"], 42);
    assert!(server.probes.slow_started.load(Ordering::SeqCst));

    drop(stream);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !server.probes.slow_dropped_early.load(Ordering::SeqCst)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        server.probes.slow_dropped_early.load(Ordering::SeqCst),
        "the tool's future was dropped after the client closed the stream"
    );
    assert!(
        !server.probes.slow_finished.load(Ordering::SeqCst),
        "the tool never completed"
    );
}

/// On 2025-11-25 a closed stream is no cancellation: the call runs on, but a question it asks
/// after the close has no stream to go on, so it is given up at once (the tool's fallback), not
/// after the wait for an answer.
#[cfg(feature = "legacy")]
#[tokio::test]
async fn a_legacy_question_asked_after_its_stream_closed_is_given_up_at_once() {
    use crate::support::ServerOptions;

    let server = TestServer::start_with(ServerOptions {
        legacy_request_timeout_secs: 600,
        ..ServerOptions::default()
    })
    .await;
    let http = reqwest::Client::new();
    let url = server.url();
    let post = |session: Option<&str>, message: serde_json::Value| {
        crate::support::legacy_post(&http, &url, session, &message).send()
    };
    let opened = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {"form": {}}},
            "clientInfo": {"name": "closing-client", "version": "1"}
        }}),
    )
    .await
    .expect("initialize");
    assert_eq!(opened.status().as_u16(), 200);
    let session = opened
        .headers()
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .expect("a session id")
        .to_owned();
    let ready = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .expect("initialized");
    assert_eq!(ready.status().as_u16(), 202);
    let call = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "asks_when_let_go", "arguments": {}}})
    };

    // Its stream open, the call asks on it, and the answer POSTed reaches the tool.
    server.probes.ask_gate.notify_one();
    let mut open = post(Some(&session), call(2)).await.expect("a call");
    let question = first_event(&mut open).await;
    assert_eq!(question["method"], "elicitation/create", "{question}");
    let answer = json!({"jsonrpc": "2.0", "id": question["id"], "result": {"action": "decline"}});
    let answered = post(Some(&session), answer).await.expect("the answer");
    assert_eq!(answered.status().as_u16(), 202);
    assert_eq!(late_answer(&server).await.as_deref(), Some("Declined"));
    drop(open);
    *server
        .probes
        .late_answer
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    server.probes.ask_waiting.store(false, Ordering::SeqCst);

    // The call's answer starts with its first frame, the question: until the tool asks, the
    // client waits for the response head, and gives up (the connection closes) before it does.
    let waiting = async {
        while !server.probes.ask_waiting.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        answered = post(Some(&session), call(3)) => {
            panic!("the call answered before its tool asked: {answered:?}")
        }
        () = waiting => {}
    }
    // Closed: dropping the request drops its connection. Let the server see it first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.probes.ask_gate.notify_one();
    assert_eq!(
        late_answer(&server).await.as_deref(),
        Some("Cancelled"),
        "the call ran on and its question was given up at once (the wait for an answer is 600 s)"
    );
}

/// The first event with data on an SSE response, as JSON.
#[cfg(feature = "legacy")]
async fn first_event(response: &mut reqwest::Response) -> serde_json::Value {
    let mut text = String::new();
    loop {
        let chunk = tokio::time::timeout(PATIENCE, response.chunk())
            .await
            .expect("an event in time")
            .expect("the stream reads")
            .expect("the stream goes on");
        text.push_str(&String::from_utf8_lossy(&chunk));
        let complete = text.rsplit_once("\n\n").map_or("", |(events, _)| events);
        let data = complete
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .find(|data| !data.is_empty());
        if let Some(data) = data {
            return serde_json::from_str(data).expect("an event's data is JSON");
        }
    }
}

/// What `asks_when_let_go` got for its question, once it got it (`None` if not within
/// [`PATIENCE`]).
#[cfg(feature = "legacy")]
async fn late_answer(server: &TestServer) -> Option<String> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let answer = server
            .probes
            .late_answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if answer.is_some() || tokio::time::Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
