//! `subscriptions/listen`: the acknowledgement, opted-in change notifications, keep-alives.

use std::time::Duration;

use serde_json::json;

use super::{PATIENCE, keeping_no_tasks};
use crate::support::fixtures::FLOOD_HALF;
use crate::support::{META_SUBSCRIPTION_ID, TestServer};

#[tokio::test]
async fn listen_streams_acknowledge_then_deliver_only_the_events_they_asked_for() {
    let server = TestServer::start().await;
    let client = server.client();

    let mut tools_stream = client
        .request("subscriptions/listen")
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .open_stream()
        .await;
    let mut prompts_stream = client
        .request("subscriptions/listen")
        .params(json!({"notifications": {"promptsListChanged": true}}))
        .open_stream()
        .await;
    for stream in [&tools_stream, &prompts_stream] {
        assert_eq!(stream.status.as_u16(), 200);
        assert!(stream.content_type().starts_with("text/event-stream"));
    }

    let tools_id = tools_stream.request_id.clone().expect("id");
    let prompts_id = prompts_stream.request_id.clone().expect("id");

    let ack = tools_stream.expect_message(PATIENCE).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"][META_SUBSCRIPTION_ID], tools_id);
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true})
    );
    let ack = prompts_stream.expect_message(PATIENCE).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["_meta"][META_SUBSCRIPTION_ID], prompts_id);
    assert_eq!(
        ack["params"]["notifications"],
        json!({"promptsListChanged": true})
    );

    // Events go out in this order: tools, prompts, tools. Each stream's next messages show what
    // it received, so a leaked event would come before the expected one.
    for trigger in [
        "trigger_tools_changed",
        "trigger_prompts_changed",
        "trigger_tools_changed",
    ] {
        let reply = client.call_tool(trigger, json!({})).await;
        assert_eq!(reply.result_type(), "complete");
    }

    for _ in 0..2 {
        let event = tools_stream.expect_message(PATIENCE).await;
        assert_eq!(
            event["method"], "notifications/tools/list_changed",
            "the tools stream gets only tool changes"
        );
        assert_eq!(event["params"]["_meta"][META_SUBSCRIPTION_ID], tools_id);
    }
    let event = prompts_stream.expect_message(PATIENCE).await;
    assert_eq!(
        event["method"], "notifications/prompts/list_changed",
        "the prompts stream skipped the tool change sent before it"
    );
    assert_eq!(event["params"]["_meta"][META_SUBSCRIPTION_ID], prompts_id);
    let leaked = prompts_stream
        .next_message(Duration::from_millis(500))
        .await;
    assert!(
        leaked.is_none(),
        "nothing more on the prompts stream: {leaked:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fell_behind_is_sent_again_what_it_may_have_missed() {
    let server = TestServer::start().await;
    let client = server.client();
    let mut stream = client
        .request("subscriptions/listen")
        .params(json!({"notifications": {
            "promptsListChanged": true,
            "resourceSubscriptions": ["test://static-text"],
        }}))
        .open_stream()
        .await;
    let ack = stream.expect_message(PATIENCE).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    // Not read while the changes are announced: the stream falls behind, and the resource's
    // update, in the middle of the flood, is among the notices it misses.
    let reply = client.call_tool("flood_of_changes", json!({})).await;
    assert_eq!(reply.result_type(), "complete");
    // Read until the update comes (a stall of a loaded machine must not end the wait), then until
    // the flood's last notices are in, to see that the stream did fall behind.
    let (mut prompt_changes, mut resource_updates) = (0, 0);
    loop {
        let patience = if resource_updates == 0 {
            PATIENCE
        } else {
            Duration::from_secs(2)
        };
        let Some(message) = stream.next_message(patience).await else {
            break;
        };
        match message["method"].as_str() {
            Some("notifications/prompts/list_changed") => prompt_changes += 1,
            Some("notifications/resources/updated") => {
                assert_eq!(message["params"]["uri"], "test://static-text");
                resource_updates += 1;
            }
            other => panic!("an unexpected message: {other:?}"),
        }
    }
    assert!(
        resource_updates >= 1,
        "the resource's update reached the stream after all ({prompt_changes} prompt-list \
         changes did)"
    );
    assert!(
        prompt_changes < 2 * FLOOD_HALF,
        "the stream fell behind: {prompt_changes} prompt-list changes reached it"
    );
}

/// `Accept` read as RFC 9110 has it: a list split over two lines names both types, `q=0` refuses
/// a type, and the most specific range naming a type decides.
#[tokio::test]
async fn accept_lists_are_read_whole_with_their_refusals() {
    let server = TestServer::start().await;
    let client = server.client();
    let listen = || {
        client
            .request("subscriptions/listen")
            .params(json!({"notifications": {"toolsListChanged": true}}))
    };
    let mut split = listen()
        .header("accept", "application/json")
        .extra_header_line("accept", "text/event-stream")
        .open_stream()
        .await;
    assert_eq!(split.status.as_u16(), 200);
    let ack = split.expect_message(PATIENCE).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");

    for refusing in [
        "application/json, text/event-stream;q=0",
        "*/*, text/event-stream; q=0.000",
        "application/json, text/*;q=0",
    ] {
        listen()
            .header("accept", refusing)
            .send()
            .await
            .assert_error(406, -32600);
    }
    let neither = client
        .request("tools/list")
        .header("accept", "application/json;q=0, text/event-stream;q=0")
        .send()
        .await;
    // Refused at the door, before the body (and its id) is read.
    assert_eq!(neither.status.as_u16(), 406, "{}", neither.body_text());
    assert_eq!(neither.error_code(), -32600, "{}", neither.body_text());
    let wildcard_kept = client
        .request("tools/list")
        .header("accept", "*/*;q=0.1, text/event-stream;q=0")
        .send()
        .await;
    assert_eq!(
        wildcard_kept.status.as_u16(),
        200,
        "JSON is still acceptable through */*: {}",
        wildcard_kept.body_text()
    );
}

#[tokio::test]
async fn a_listen_request_that_cannot_take_an_event_stream_gets_406() {
    let server = TestServer::start().await;
    let refused = server
        .client()
        .request("subscriptions/listen")
        .params(json!({"notifications": {"toolsListChanged": true}}))
        .header("accept", "application/json")
        .send()
        .await;
    refused.assert_error(406, -32600);
    assert!(
        refused.error_message().contains("text/event-stream"),
        "{}",
        refused.error_message()
    );
}

#[tokio::test]
async fn a_server_that_keeps_no_tasks_drops_task_ids_from_a_listen_instead_of_refusing_it() {
    let (server, capabilities) = keeping_no_tasks().await;
    let client = server.client();
    for capabilities in capabilities {
        let mut stream = client
            .request("subscriptions/listen")
            .params(json!({"notifications": {"toolsListChanged": true, "taskIds": ["t-1"]}}))
            .capabilities(capabilities.clone())
            .open_stream()
            .await;
        assert_eq!(stream.status.as_u16(), 200, "with {capabilities}");
        let ack = stream.expect_message(PATIENCE).await;
        assert_eq!(
            ack["params"]["notifications"],
            json!({"toolsListChanged": true}),
            "no task is followed here, whatever the client declares ({capabilities})"
        );
    }
}
