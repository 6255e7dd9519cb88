//! Answers across rounds: remembered work runs once, malformed answers are invalid params, extra
//! ones are ignored, misplaced ones get the question again.

use serde_json::{Value, json};

use super::{alice, greet_round_one};
use crate::support::{TestServer, accept};

#[tokio::test]
async fn remembered_work_runs_once_across_rounds() {
    let server = TestServer::start().await;
    let client = server.client();

    let first = client.call_tool("remembered_lookup", json!({})).await;
    assert_eq!(first.result_type(), "input_required");
    assert!(first.input_requests().contains_key("rating"));
    assert_eq!(server.probes.lookup_work_runs(), 1, "round 1 did the work");

    let second = client
        .retry(
            "remembered_lookup",
            json!({}),
            json!({"rating": accept(json!({"stars": 5}))}),
            Some(&first.request_state()),
        )
        .await;
    assert_eq!(second.result_type(), "complete");
    assert_eq!(
        second.text(),
        "lookup #1: rated 5 stars",
        "round 2 used round 1's result"
    );
    assert_eq!(
        server.probes.lookup_work_runs(),
        1,
        "the work was not redone in round 2"
    );
}

#[tokio::test]
async fn malformed_input_responses_are_invalid_params() {
    let server = TestServer::start().await;
    let client = server.client();

    let null = client.retry("greet", json!({}), Value::Null, None).await;
    assert_eq!(null.error_code(), -32602, "inputResponses: null");
    assert_eq!(null.response()["id"], null.request_id.clone().unwrap());

    let not_an_object = client
        .retry("greet", json!({}), json!({"user_name": 12345}), None)
        .await;
    assert_eq!(not_an_object.error_code(), -32602, "a number as an answer");
    assert!(
        not_an_object.error_message().contains("user_name"),
        "the error names the bad key: {}",
        not_an_object.error_message()
    );

    assert_eq!(
        server.probes.greet_runs(),
        0,
        "answers that are not objects are refused before the tool runs"
    );

    let bad_action = client
        .retry(
            "greet",
            json!({}),
            json!({"user_name": {"action": "shrug"}}),
            None,
        )
        .await;
    assert_eq!(bad_action.error_code(), -32602, "an unknown action");

    // Round 1, then malformed retries: refused, and the state is still good afterwards. An
    // answer that is not an object is refused before the state is opened; one with an unknown
    // action only once the tool reads it, after its continuation was taken.
    let state = greet_round_one(&client, json!({})).await;
    let malformed_retry = client
        .retry(
            "greet",
            json!({}),
            json!({"user_name": 12345}),
            Some(&state),
        )
        .await;
    assert_eq!(malformed_retry.error_code(), -32602);
    for _ in 0..2 {
        let unknown_action = client
            .retry(
                "greet",
                json!({}),
                json!({"user_name": {"action": "shrug"}}),
                Some(&state),
            )
            .await;
        assert_eq!(
            unknown_action.error_code(),
            -32602,
            "an unknown action, with the state"
        );
        assert!(
            unknown_action
                .error_message()
                .contains("elicitation result"),
            "the refusal names the answer: {}",
            unknown_action.error_message()
        );
    }
    let good = client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_eq!(good.text(), "Hello, Alice!");
}

#[tokio::test]
async fn unknown_extra_input_responses_are_ignored() {
    let server = TestServer::start().await;
    let client = server.client();

    let mut responses = alice();
    responses["unknown_extra_key"] = accept(json!({"foo": "bar"}));
    responses["another_unexpected"] = accept(json!({"baz": 123}));

    let direct = client
        .retry("greet", json!({}), responses.clone(), None)
        .await;
    assert_eq!(direct.result_type(), "complete");
    assert_eq!(direct.text(), "Hello, Alice!");

    let state = greet_round_one(&client, json!({})).await;
    let retried = client
        .retry("greet", json!({}), responses, Some(&state))
        .await;
    assert_eq!(retried.result_type(), "complete");
    assert_eq!(retried.text(), "Hello, Alice!");
}

#[tokio::test]
async fn answers_under_the_wrong_key_get_the_question_again() {
    let server = TestServer::start().await;
    let client = server.client();
    let reply = client
        .retry(
            "greet",
            json!({}),
            json!({"wrong_key": accept(json!({"name": "Alice"}))}),
            None,
        )
        .await;
    assert_eq!(reply.result_type(), "input_required");
    assert!(reply.input_requests().contains_key("user_name"));
}

/// The test client's `canned` answers a question it has no answer for with `null`: the server
/// refuses that retry, and the conversation ends with the error, its rounds still readable.
#[tokio::test]
async fn a_canned_conversation_without_an_answer_ends_with_the_refusal() {
    let server = TestServer::start().await;
    let client = server.client();
    let talk = client
        .converse("greet", json!({}), mcp_mrtr::client::canned(json!({})))
        .await;
    assert_eq!(talk.rounds.len(), 2);
    assert_eq!(
        talk.last().error_code(),
        -32602,
        "{}",
        talk.last().body_text()
    );
    assert_eq!(
        talk.questions(),
        [vec!["user_name".to_owned()], Vec::new()],
        "the refused round asked nothing"
    );
}
