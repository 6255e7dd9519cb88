//! Cancellation: closing a streamed call's stream stops its handler.

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
