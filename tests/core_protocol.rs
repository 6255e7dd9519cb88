//! The core of the 2026-07-28 wire, tested the way a client sees it: real HTTP against an
//! in-process server. MRTR rounds and the refusals of `requestState`, header and `_meta`
//! validation, caching hints, SSE progress and logging, cancellation when a stream closes,
//! `subscriptions/listen`, and notifications. Every message the server sends is checked against
//! the official schema by the support client.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use support::{
    LISTED_TOOLS, META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION,
    META_SUBSCRIPTION_ID, PROTOCOL_VERSION, Reply, ServerOptions, TestServer, accept,
};

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

// ---------------------------------------------------------------------------------------------
// 1-3. MRTR rounds
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn two_round_call_asks_then_completes_with_the_answer() {
    let server = TestServer::start().await;
    let client = server.client();

    let first = client.call_tool("greet", json!({})).await;
    assert_eq!(first.status.as_u16(), 200);
    assert_eq!(first.result_type(), "input_required");
    let requests = first.input_requests();
    assert_eq!(
        requests.keys().collect::<Vec<_>>(),
        ["user_name"],
        "one question"
    );
    let question = &requests["user_name"];
    assert_eq!(question["method"], "elicitation/create");
    assert_eq!(question["params"]["message"], "What is your name?");
    assert_eq!(
        question["params"]["requestedSchema"]["required"],
        json!(["name"])
    );
    let state = first.request_state();
    assert!(!state.is_empty(), "requestState is a non-empty string");
    assert_eq!(first.response()["id"], first.request_id.clone().unwrap());

    let second = client
        .retry("greet", json!({}), alice(), Some(&state))
        .await;
    assert_ne!(
        second.request_id, first.request_id,
        "a retry is a new request"
    );
    assert_eq!(second.response()["id"], second.request_id.clone().unwrap());
    assert_eq!(second.result_type(), "complete");
    assert_eq!(second.text(), "Hello, Alice!");
}

#[tokio::test]
async fn three_round_call_asks_each_question_in_turn_with_distinct_states() {
    let server = TestServer::start().await;
    let client = server.client();

    let first = client.call_tool("three_questions", json!({})).await;
    assert_eq!(first.result_type(), "input_required");
    assert_eq!(first.input_requests().keys().collect::<Vec<_>>(), ["step1"]);
    let state1 = first.request_state();

    let second = client
        .retry(
            "three_questions",
            json!({}),
            json!({"step1": accept(json!({"name": "Alice"}))}),
            Some(&state1),
        )
        .await;
    assert_eq!(second.result_type(), "input_required");
    assert_eq!(
        second.input_requests().keys().collect::<Vec<_>>(),
        ["step2"],
        "round 2 asks only the next question"
    );
    assert_eq!(
        second.input_requests()["step2"]["params"]["message"],
        "What is your favourite colour?"
    );
    let state2 = second.request_state();

    // Round 3 answers only step2: step1's answer travels in the server's continuation.
    let third = client
        .retry(
            "three_questions",
            json!({}),
            json!({"step2": accept(json!({"color": "blue"}))}),
            Some(&state2),
        )
        .await;
    assert_eq!(third.result_type(), "input_required");
    assert_eq!(third.input_requests().keys().collect::<Vec<_>>(), ["step3"]);
    let state3 = third.request_state();

    assert_ne!(state1, state2);
    assert_ne!(state2, state3);
    assert_ne!(state1, state3);

    let last = client
        .retry(
            "three_questions",
            json!({}),
            json!({"step3": accept(json!({"food": "pizza"}))}),
            Some(&state3),
        )
        .await;
    assert_eq!(last.result_type(), "complete");
    assert_eq!(last.text(), "Alice likes blue and pizza");
}

#[tokio::test]
async fn client_without_form_elicitation_gets_the_fallback_at_once() {
    let server = TestServer::start().await;
    let client = server.client();

    for capabilities in [
        json!({}),
        json!({"sampling": {}, "roots": {}}),
        json!({"elicitation": {"url": {}}}),
    ] {
        let reply = client
            .request("tools/call")
            .params(json!({"name": "greet", "arguments": {}}))
            .capabilities(capabilities.clone())
            .send()
            .await;
        assert_eq!(
            reply.result_type(),
            "complete",
            "no input_required for capabilities {capabilities}"
        );
        assert!(reply.result().get("inputRequests").is_none());
        assert_eq!(reply.text(), "Hello, stranger!", "with {capabilities}");
    }
    assert_eq!(server.probes.greet_runs(), 3);
}

// ---------------------------------------------------------------------------------------------
// 4-5. requestState refusals
// ---------------------------------------------------------------------------------------------

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
    let alice_client = server.client().as_user("alice");
    let state = greet_round_one(&alice_client, json!({})).await;

    let bob = server
        .client()
        .as_user("bob")
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

// ---------------------------------------------------------------------------------------------
// 6-7. Remembered work, malformed and extra answers
// ---------------------------------------------------------------------------------------------

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

    // Round 1, then a malformed retry: refused, and the state is still good afterwards.
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

// ---------------------------------------------------------------------------------------------
// 8. Header and _meta validation
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn protocol_version_and_meta_errors_have_their_codes_and_statuses() {
    let server = TestServer::start().await;
    let client = server.client();

    let no_version_header = client
        .request("tools/list")
        .without_header("MCP-Protocol-Version")
        .send()
        .await;
    no_version_header.assert_error(400, -32020);

    let no_meta = client.request("tools/list").without_meta().send().await;
    no_meta.assert_error(400, -32602);

    let no_meta_version = client
        .request("tools/list")
        .without_meta_key(META_PROTOCOL_VERSION)
        .send()
        .await;
    no_meta_version.assert_error(400, -32602);

    let no_capabilities = client
        .request("tools/list")
        .without_meta_key(META_CLIENT_CAPABILITIES)
        .send()
        .await;
    no_capabilities.assert_error(400, -32602);

    let no_client_info = client
        .request("tools/list")
        .without_meta_key(META_CLIENT_INFO)
        .send()
        .await;
    assert_eq!(
        no_client_info.status.as_u16(),
        200,
        "clientInfo is optional"
    );
    assert_eq!(no_client_info.result_type(), "complete");

    let mismatch = client
        .request("tools/list")
        .meta(META_PROTOCOL_VERSION, json!("v999.0.0"))
        .send()
        .await;
    mismatch.assert_error(400, -32020);

    let unsupported = client
        .request("tools/list")
        .header("MCP-Protocol-Version", "v999.0.0")
        .meta(META_PROTOCOL_VERSION, json!("v999.0.0"))
        .send()
        .await;
    unsupported.assert_error(400, -32022);
    let data = &unsupported.error()["data"];
    assert_eq!(data["requested"], "v999.0.0");
    let supported = data["supported"].as_array().expect("data.supported array");
    assert!(supported.contains(&json!(PROTOCOL_VERSION)), "{data}");

    let discover = client.request("server/discover").send().await;
    let advertised = discover.result()["supportedVersions"]
        .as_array()
        .expect("supportedVersions")
        .clone();
    for version in supported {
        assert!(
            advertised.contains(version),
            "{version} is also in server/discover"
        );
    }
}

#[tokio::test]
async fn routing_header_errors_are_header_mismatch_with_400() {
    let server = TestServer::start().await;
    let client = server.client();
    let simple = json!({"name": "simple_text", "arguments": {}});
    let static_text = json!({"uri": "test://static-text"});

    // (method, params, header to set or — with None — remove)
    let cases: [(&str, Value, &str, Option<&str>); 9] = [
        ("tools/list", json!({}), "Mcp-Method", None),
        ("tools/list", json!({}), "Mcp-Method", Some("prompts/list")),
        // Header values are case-sensitive.
        ("tools/list", json!({}), "Mcp-Method", Some("TOOLS/LIST")),
        ("tools/call", simple.clone(), "Mcp-Name", None),
        (
            "tools/call",
            simple.clone(),
            "Mcp-Name",
            Some("wrong_tool_name"),
        ),
        // Invalid Base64 padding inside the sentinel.
        (
            "tools/call",
            simple.clone(),
            "Mcp-Name",
            Some("=?base64?c2ltcGxlX3RleHQ?="),
        ),
        // Without the closing `?=` the value is taken literally, and so does not match.
        (
            "tools/call",
            simple.clone(),
            "Mcp-Name",
            Some("=?base64?c2ltcGxlX3RleHQ="),
        ),
        (
            "tools/call",
            simple,
            "Mcp-Name",
            Some("=?base64?c2ltc!!!GxlX3RleHQ=?="),
        ),
        (
            "resources/read",
            static_text,
            "Mcp-Name",
            Some("test://other"),
        ),
    ];
    for (method, params, header, value) in cases {
        let request = client.request(method).params(params);
        let request = match value {
            Some(value) => request.header(header, value),
            None => request.without_header(header),
        };
        request.send().await.assert_error(400, -32020);
    }
}

#[tokio::test]
async fn well_formed_routing_header_variants_are_accepted() {
    let server = TestServer::start().await;
    let client = server.client();
    let simple = json!({"name": "simple_text", "arguments": {}});

    let lowercase = client
        .request("tools/list")
        .lowercase_header_names()
        .send()
        .await;
    assert_eq!(
        lowercase.status.as_u16(),
        200,
        "header names are case-insensitive"
    );
    assert_eq!(lowercase.result_type(), "complete");

    let spaced = client
        .request("tools/call")
        .params(simple.clone())
        .header("Mcp-Name", "  simple_text  ")
        .send()
        .await;
    assert_eq!(spaced.status.as_u16(), 200, "{}", spaced.body_text());
    assert_eq!(spaced.text(), "simple text");

    let encoded = format!("=?base64?{}?=", STANDARD.encode("simple_text"));
    let sentinel = client
        .request("tools/call")
        .params(simple.clone())
        .header("Mcp-Name", encoded)
        .send()
        .await;
    assert_eq!(sentinel.status.as_u16(), 200, "{}", sentinel.body_text());
    assert_eq!(sentinel.text(), "simple text");
}

#[tokio::test]
async fn x_mcp_header_parameters_must_be_mirrored_exactly() {
    let server = TestServer::start().await;
    let client = server.client();
    let call = || {
        client
            .request("tools/call")
            .params(json!({"name": "regional", "arguments": {"region": "eu-west"}}))
    };

    let listed = client.request("tools/list").send().await;
    let regional = listed.result()["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "regional")
        .expect("regional is listed")
        .clone();
    assert_eq!(
        regional["inputSchema"]["properties"]["region"]["x-mcp-header"],
        "Region"
    );

    call().send().await.assert_error(400, -32020);
    call()
        .header("Mcp-Param-Region", "us-east")
        .send()
        .await
        .assert_error(400, -32020);
    call()
        .header("Mcp-Param-Region", "=?base64?ZXUtd2VzdA?=")
        .send()
        .await
        .assert_error(400, -32020);

    let matching = call().header("Mcp-Param-Region", "eu-west").send().await;
    assert_eq!(matching.status.as_u16(), 200, "{}", matching.body_text());
    assert_eq!(matching.text(), "Region: eu-west");

    let encoded = format!("=?base64?{}?=", STANDARD.encode("eu-west"));
    let sentinel = call().header("Mcp-Param-Region", encoded).send().await;
    assert_eq!(sentinel.status.as_u16(), 200, "{}", sentinel.body_text());
    assert_eq!(sentinel.text(), "Region: eu-west");
}

#[tokio::test]
async fn unknown_and_removed_methods_are_not_found_with_404() {
    let server = TestServer::start().await;
    let client = server.client();
    let probes = [
        ("unknown/method", json!({})),
        (
            "initialize",
            json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}
            }),
        ),
        ("ping", json!({})),
        ("logging/setLevel", json!({"level": "info"})),
        ("resources/subscribe", json!({"uri": "test://static-text"})),
        (
            "resources/unsubscribe",
            json!({"uri": "test://static-text"}),
        ),
    ];
    for (method, params) in probes {
        let reply = client.request(method).params(params).send().await;
        reply.assert_error(404, -32601);
    }
}

#[tokio::test]
async fn tool_needing_an_undeclared_capability_is_refused_with_32021() {
    let server = TestServer::start().await;
    let client = server.client();

    let refused = client
        .request("tools/call")
        .params(json!({"name": "needs_sampling", "arguments": {}}))
        .capabilities(json!({"elicitation": {"form": {}}}))
        .send()
        .await;
    refused.assert_error(400, -32021);
    assert!(
        refused.error()["data"]["requiredCapabilities"]["sampling"].is_object(),
        "requiredCapabilities is a ClientCapabilities object: {}",
        refused.error()
    );

    let declared = client.call_tool("needs_sampling", json!({})).await;
    assert_eq!(declared.text(), "sampling available");
}

#[tokio::test]
async fn undeclared_capability_is_refused_with_400_even_when_progress_is_requested() {
    let server = TestServer::start().await;
    let refused = server
        .client()
        .request("tools/call")
        .params(json!({"name": "needs_sampling", "arguments": {}}))
        .capabilities(json!({}))
        .progress_token(json!("p"))
        .send()
        .await;
    refused.assert_error(400, -32021);
}

#[tokio::test]
async fn fractional_request_ids_are_invalid_requests() {
    let server = TestServer::start().await;
    let client = server.client();
    let body = json!({
        "jsonrpc": "2.0",
        "id": 1.5,
        "method": "tools/list",
        "params": {"_meta": {
            META_PROTOCOL_VERSION: PROTOCOL_VERSION,
            META_CLIENT_CAPABILITIES: {}
        }}
    });
    // The support client validates the reply: an echoed `"id": 1.5` fails the schema.
    let reply = client
        .request("tools/list")
        .raw_body(body.to_string())
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 400, "{}", reply.body_text());
    assert_eq!(reply.error_code(), -32600);
}

#[tokio::test]
async fn origin_content_type_and_size_are_checked_at_the_http_level() {
    let server = TestServer::start_with(ServerOptions {
        max_body_bytes: 4096,
        ..ServerOptions::default()
    })
    .await;
    let client = server.client();

    let evil = client
        .request("server/discover")
        .header("Origin", "http://evil.example.com")
        .send()
        .await;
    assert_eq!(evil.status.as_u16(), 403, "{}", evil.body_text());

    let local = client
        .request("server/discover")
        .header("Origin", "http://localhost:1234")
        .send()
        .await;
    assert_eq!(local.status.as_u16(), 200, "{}", local.body_text());
    assert_eq!(local.result_type(), "complete");

    let rebound_host = client
        .request("server/discover")
        .header("Host", "evil.example.com")
        .send()
        .await;
    assert_eq!(
        rebound_host.status.as_u16(),
        403,
        "a loopback server refuses a foreign Host (DNS rebinding): {}",
        rebound_host.body_text()
    );

    let with_charset = client
        .request("server/discover")
        .header("Content-Type", "application/json; charset=utf-8")
        .send()
        .await;
    assert_eq!(
        with_charset.status.as_u16(),
        200,
        "{}",
        with_charset.body_text()
    );

    let text_plain = client
        .request("server/discover")
        .header("Content-Type", "text/plain")
        .send()
        .await;
    assert_eq!(
        text_plain.status.as_u16(),
        415,
        "{}",
        text_plain.body_text()
    );

    let padding = "x".repeat(8192);
    let too_large = client
        .request("tools/call")
        .params(json!({"name": "simple_text", "arguments": {"padding": padding}}))
        .send()
        .await;
    assert_eq!(too_large.status.as_u16(), 413, "{}", too_large.body_text());

    let fits = client.call_tool("simple_text", json!({})).await;
    assert_eq!(fits.text(), "simple text", "a small request still passes");
}

#[tokio::test]
async fn unparsable_json_is_a_parse_error_without_an_id() {
    let server = TestServer::start().await;
    let reply = server
        .client()
        .request("tools/list")
        .raw_body(r#"{"jsonrpc": "2.0", "id": 7, "method": "tools/list""#)
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 400);
    assert_eq!(reply.error_code(), -32700);
    assert!(
        reply.response().get("id").is_none(),
        "no id can be read from unparsable JSON, and null is not a valid id: {}",
        reply.body_text()
    );
}

/// A modern-only server has no GET stream and no sessions to delete (with the `legacy` feature,
/// GET and DELETE belong to 2025-11-25 sessions; see tests/legacy.rs).
#[cfg(not(feature = "legacy"))]
#[tokio::test]
async fn get_and_delete_are_method_not_allowed() {
    let server = TestServer::start().await;
    let client = server.client();
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let response = client
            .http()
            .request(method.clone(), client.url())
            .header("Accept", "text/event-stream")
            .header("MCP-Protocol-Version", PROTOCOL_VERSION)
            .timeout(support::REQUEST_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} failed: {e}"));
        assert_eq!(response.status().as_u16(), 405, "{method}");
        assert_eq!(
            response
                .headers()
                .get("allow")
                .and_then(|v| v.to_str().ok()),
            Some("POST"),
            "{method} names the allowed method"
        );
    }
}

/// A modern-only server answers a legacy `initialize` with the versions it supports, so the
/// client can tell its user why it cannot connect.
#[cfg(not(feature = "legacy"))]
#[tokio::test]
async fn a_modern_only_server_names_its_versions_to_an_initialize() {
    let server = TestServer::start().await;
    let client = server.client();
    let body = json!({
        "jsonrpc": "2.0", "id": 7, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
    });
    let response = client
        .http()
        .post(client.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(body.to_string())
        .timeout(support::REQUEST_TIMEOUT)
        .send()
        .await
        .expect("initialize");
    assert_eq!(response.status().as_u16(), 400);
    let message: Value = response.json().await.expect("a JSON-RPC error");
    assert_eq!(message["id"], 7);
    assert_eq!(message["error"]["code"], -32022);
    assert_eq!(
        message["error"]["data"]["supported"],
        json!([PROTOCOL_VERSION])
    );
    assert_eq!(message["error"]["data"]["requested"], "2025-11-25");
}

// ---------------------------------------------------------------------------------------------
// 9. Caching hints
// ---------------------------------------------------------------------------------------------

fn assert_cache_hints(reply: &Reply) {
    let result = reply.result();
    assert_eq!(result["resultType"], "complete", "{}", reply.method);
    assert!(
        result["ttlMs"].as_u64().is_some(),
        "{}: ttlMs is an integer >= 0: {result}",
        reply.method
    );
    let scope = result["cacheScope"].as_str().unwrap_or_default();
    assert!(
        scope == "public" || scope == "private",
        "{}: cacheScope is public or private: {result}",
        reply.method
    );
}

#[tokio::test]
async fn cacheable_results_carry_ttl_and_scope() {
    let server = TestServer::start().await;
    let client = server.client();

    for method in [
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    ] {
        assert_cache_hints(&client.request(method).send().await);
    }
    for uri in ["test://static-text", "test://items/42"] {
        let read = client
            .request("resources/read")
            .params(json!({"uri": uri}))
            .send()
            .await;
        assert_cache_hints(&read);
        assert_eq!(read.result()["contents"][0]["uri"], uri);
    }
}

#[tokio::test]
async fn tools_list_is_in_registration_order_on_every_call() {
    let server = TestServer::start().await;
    let client = server.client();
    let names = |reply: &Reply| -> Vec<String> {
        reply.result()["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .map(|t| t["name"].as_str().expect("name").to_owned())
            .collect()
    };
    let first = names(&client.request("tools/list").send().await);
    let second = names(&client.request("tools/list").send().await);
    assert_eq!(
        first, LISTED_TOOLS,
        "registration order, hidden tools left out"
    );
    assert_eq!(first, second, "the same order on every call");
}

#[tokio::test]
async fn input_required_results_carry_no_caching_hints() {
    let server = TestServer::start().await;
    let reply = server.client().call_tool("greet", json!({})).await;
    assert_eq!(reply.result_type(), "input_required");
    assert!(reply.result().get("ttlMs").is_none(), "{}", reply.result());
    assert!(
        reply.result().get("cacheScope").is_none(),
        "{}",
        reply.result()
    );
}

// ---------------------------------------------------------------------------------------------
// 10-11. SSE progress and logging
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 12. Cancellation when the client closes the stream
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 13. subscriptions/listen
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// 14. Client notifications
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn posted_notifications_get_202_with_an_empty_body() {
    let server = TestServer::start().await;
    let reply = server
        .client()
        .request("notifications/cancelled")
        .params(json!({"requestId": 1, "reason": "test"}))
        .notification()
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 202);
    assert!(
        reply.body.is_empty(),
        "empty body, got {:?}",
        reply.body_text()
    );
}

// ---------------------------------------------------------------------------------------------
// The schema check every reply goes through
// ---------------------------------------------------------------------------------------------

#[test]
fn the_schema_check_rejects_messages_the_spec_forbids() {
    use support::schema::check;

    // Sanity: well-formed messages pass.
    assert!(
        check(
            "CallToolResult",
            &json!({"resultType": "complete", "content": []})
        )
        .is_ok()
    );
    assert!(
        check(
            "JSONRPCErrorResponse",
            &json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}})
        )
        .is_ok()
    );

    // A 2026 result without resultType.
    assert!(check("CallToolResult", &json!({"content": []})).is_err());
    // A list result without its caching hints.
    assert!(
        check(
            "ListToolsResult",
            &json!({"resultType": "complete", "tools": []})
        )
        .is_err()
    );
    // An error response with a null or fractional id.
    for id in [Value::Null, json!(1.5)] {
        assert!(
            check(
                "JSONRPCErrorResponse",
                &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "bad"}})
            )
            .is_err(),
            "id {id}"
        );
    }
    // -32021 whose requiredCapabilities is an array instead of a ClientCapabilities object.
    assert!(
        check(
            "MissingRequiredClientCapabilityError",
            &json!({"jsonrpc": "2.0", "id": 1, "error": {
                "code": -32021, "message": "m", "data": {"requiredCapabilities": ["sampling"]}
            }})
        )
        .is_err()
    );
    // An input_required result whose requestState is not a string.
    assert!(
        check(
            "InputRequiredResult",
            &json!({"resultType": "input_required", "requestState": 7})
        )
        .is_err()
    );
    // A progress notification without its token.
    assert!(
        check(
            "ProgressNotification",
            &json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}})
        )
        .is_err()
    );
}

#[test]
#[should_panic(expected = "must not")]
fn the_schema_check_refuses_server_requests_on_a_response_stream() {
    support::schema::validate_server_message(
        "tools/call",
        &json!({"jsonrpc": "2.0", "id": 9, "method": "elicitation/create", "params": {}}),
    );
}
