//! The refusals of `requestState`: tampered, expired, another principal's, another request's,
//! replayed, raced; none runs the tool. And a refusal the client can mend keeps the state.

use std::time::Duration;

use serde_json::json;

use super::{alice, assert_refusal, greet_round_one};
use crate::support::{ServerOptions, TestServer, accept};

#[tokio::test]
async fn tampered_request_state_is_refused_without_running_the_tool() {
    let server = TestServer::start().await;
    let client = server.client();
    let state = greet_round_one(&client, json!({})).await;
    assert_eq!(server.probes.greet_runs(), 1);

    let suffixed = client
        .retry(
            "greet",
            json!({}),
            alice(),
            Some(&format!("{state}-TAMPERED")),
        )
        .await;
    assert_refusal(&suffixed, "integrity");

    let mut flipped = state.clone().into_bytes();
    let middle = flipped.len() / 2;
    flipped[middle] = if flipped[middle] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).expect("ASCII state");
    let altered = client
        .retry("greet", json!({}), alice(), Some(&flipped))
        .await;
    assert_refusal(&altered, "integrity");

    let garbage = client
        .retry("greet", json!({}), alice(), Some("not a state at all"))
        .await;
    assert_refusal(&garbage, "integrity");

    assert_eq!(
        server.probes.greet_runs(),
        1,
        "no refused retry ran the tool"
    );

    // Forgeries do not burn the genuine state.
    let genuine = client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_eq!(genuine.text(), "Hello, Alice!");
}

#[tokio::test]
async fn expired_request_state_is_refused_without_running_the_tool() {
    let server = TestServer::start_with(ServerOptions {
        state_ttl_secs: 1,
        ..ServerOptions::default()
    })
    .await;
    let client = server.client();
    let state = greet_round_one(&client, json!({})).await;

    // Expiry has one-second resolution: after 2.2 s a 1 s state is past its expiry second.
    tokio::time::sleep(Duration::from_millis(2200)).await;

    let late = client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_refusal(&late, "expired");
    assert_eq!(
        server.probes.greet_runs(),
        1,
        "the refused retry did not run"
    );
}

#[tokio::test]
async fn request_state_of_another_principal_is_refused_without_running_the_tool() {
    let server = TestServer::start().await;
    let alice_client = server.client().with_header("x-test-user", "alice");
    let state = greet_round_one(&alice_client, json!({})).await;

    let bob = server
        .client()
        .with_header("x-test-user", "bob")
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_refusal(&bob, "another principal");

    let anonymous = server
        .client()
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_refusal(&anonymous, "another principal");

    assert_eq!(
        server.probes.greet_runs(),
        1,
        "no refused retry ran the tool"
    );

    let owner = alice_client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_eq!(
        owner.text(),
        "Hello, Alice!",
        "the owner can still finish after others were refused"
    );
}

#[tokio::test]
async fn request_state_presented_for_a_different_request_is_refused() {
    let server = TestServer::start().await;
    let client = server.client();
    let state = greet_round_one(&client, json!({"greeting": "Hi"})).await;

    let other_arguments = client
        .retry("greet", json!({"greeting": "Bye"}), alice(), Some(&state))
        .await;
    assert_refusal(&other_arguments, "different request");

    let other_tool = client
        .retry("three_questions", json!({}), alice(), Some(&state))
        .await;
    assert_refusal(&other_tool, "different request");

    assert_eq!(
        server.probes.greet_runs(),
        1,
        "no refused retry ran the tool"
    );

    // The genuine request can still finish.
    let same = client
        .retry("greet", json!({"greeting": "Hi"}), alice(), Some(&state))
        .await;
    assert_eq!(same.text(), "Hi, Alice!");
}

#[tokio::test]
async fn used_request_state_cannot_be_replayed() {
    let server = TestServer::start().await;
    let client = server.client();
    let state = greet_round_one(&client, json!({})).await;

    let first = client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_eq!(first.result_type(), "complete");
    assert_eq!(first.text(), "Hello, Alice!");
    assert_eq!(server.probes.greet_runs(), 2);

    let replay = client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_refusal(&replay, "already been used");
    assert_eq!(server.probes.greet_runs(), 2, "the replay did not run");
}

#[tokio::test]
async fn a_retry_refused_for_a_capability_it_lacks_keeps_its_state_for_a_retry_declaring_it() {
    let server = TestServer::start().await;
    let client = server.client();
    let without_sampling = json!({"elicitation": {"form": {}}});
    let first = client
        .request("tools/call")
        .params(json!({"name": "confirm_then_sample", "arguments": {}}))
        .capabilities(without_sampling.clone())
        .send()
        .await;
    assert_eq!(
        first.result_type(),
        "input_required",
        "{}",
        first.response()
    );
    let state = first.request_state();
    let answered = json!({"go_on": accept(json!({"answer": "yes"}))});
    let retry = || {
        client.retry_request(
            "confirm_then_sample",
            json!({}),
            answered.clone(),
            Some(&state),
        )
    };

    let refused = retry().capabilities(without_sampling).send().await;
    refused.assert_error(400, -32021);
    let declared = retry()
        .capabilities(json!({"elicitation": {"form": {}}, "sampling": {}}))
        .send()
        .await;
    assert_eq!(
        declared.text(),
        "went on, with a model at hand",
        "the same state works once the capability is declared: {}",
        declared.response()
    );
    assert_refusal(&retry().send().await, "already been used");
}

#[tokio::test]
async fn concurrent_retries_with_one_state_complete_exactly_once() {
    let server = TestServer::start().await;
    let client = server.client();
    let state = greet_round_one(&client, json!({})).await;

    let (a, b) = tokio::join!(
        client.retry("greet", json!({}), alice(), Some(&state)),
        client.retry("greet", json!({}), alice(), Some(&state)),
    );
    let (winner, loser) = if a.response().get("result").is_some() {
        (a, b)
    } else {
        (b, a)
    };
    assert_eq!(winner.result_type(), "complete");
    assert_eq!(winner.text(), "Hello, Alice!");
    assert_refusal(&loser, "already been used");
    assert_eq!(
        server.probes.greet_runs(),
        2,
        "round 1 plus exactly one retry ran"
    );
}
