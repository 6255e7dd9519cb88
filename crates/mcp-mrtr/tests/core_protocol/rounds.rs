//! MRTR rounds: a call asks, the retry with the answer completes; several questions in turn; a
//! client without form elicitation gets the fallback at once.

use serde_json::{Value, json};

use super::{alice, keeping_no_tasks};
use crate::support::{TestServer, accept};

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

#[tokio::test]
async fn a_url_question_names_its_page_and_the_retry_says_what_the_user_did() {
    let server = TestServer::start().await;
    let client = server.client();
    let opens_urls = json!({"elicitation": {"url": {}}});
    // A round of open_link from a client that opens URLs: the first call with no answers.
    let round = |answers: Option<(Value, String)>| {
        let params = match answers {
            None => json!({"name": "open_link", "arguments": {}}),
            Some((answer, state)) => json!({"name": "open_link", "arguments": {},
                "inputResponses": {"open_page": answer}, "requestState": state}),
        };
        client
            .request("tools/call")
            .params(params)
            .capabilities(opens_urls.clone())
            .send()
    };

    let first = round(None).await;
    assert_eq!(first.result_type(), "input_required");
    let question = &first.input_requests()["open_page"];
    assert_eq!(question["method"], "elicitation/create");
    assert_eq!(question["params"]["mode"], "url");
    assert_eq!(
        question["params"]["url"],
        "https://catalogue.example/connect?session=7"
    );
    assert!(
        question["params"].get("requestedSchema").is_none(),
        "{question}"
    );
    let opened = round(Some((json!({"action": "accept"}), first.request_state()))).await;
    assert_eq!(opened.result_type(), "complete");
    assert_eq!(opened.text(), "opened");

    let second = round(None).await;
    let declined = round(Some((json!({"action": "decline"}), second.request_state()))).await;
    assert_eq!(declined.text(), "declined");

    let form_only = client.call_tool("open_link", json!({})).await;
    assert_eq!(
        form_only.text(),
        "not asked",
        "a client that declared only form mode is not sent a URL"
    );
}

#[tokio::test]
async fn a_question_no_client_may_be_sent_fails_the_call_and_asks_nothing() {
    let server = TestServer::start().await;
    let client = server.client();
    let reply = client.call_tool("nested_form", json!({})).await;
    assert_eq!(reply.status.as_u16(), 500);
    assert_eq!(reply.error_code(), -32603, "{}", reply.response());
    assert!(reply.response().get("result").is_none(), "nothing asked");
    assert!(
        !reply.error_message().contains("address"),
        "a handler's bug is logged, not told: {}",
        reply.error_message()
    );
}

#[tokio::test]
async fn work_that_needs_a_task_on_a_server_that_keeps_none_is_not_blamed_on_the_client() {
    let (server, capabilities) = keeping_no_tasks().await;
    let client = server.client();
    for capabilities in capabilities {
        let reply = client
            .request("tools/call")
            .params(json!({"name": "only_as_a_task", "arguments": {}}))
            .capabilities(capabilities.clone())
            .send()
            .await;
        assert_eq!(
            reply.error_code(),
            -32603,
            "declaring the extension would not help ({capabilities}): {}",
            reply.response()
        );
        assert!(
            reply.error().get("data").is_none(),
            "no capability is named: {}",
            reply.response()
        );
    }

    // Where tasks are kept, the client that did not declare the extension is told to.
    let offering = TestServer::start().await;
    let undeclared = offering
        .client()
        .call_tool("only_as_a_task", json!({}))
        .await;
    assert_eq!(undeclared.error_code(), -32021, "{}", undeclared.response());
    assert_eq!(
        undeclared.error()["data"]["requiredCapabilities"],
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}})
    );
}
