//! 2025-11-25 clients (feature `legacy`): the initialize handshake and sessions, and the same tool
//! code asking its questions as real server-initiated requests on the call's SSE stream.
#![cfg(feature = "legacy")]

mod support;

use serde_json::{Value, json};
use support::legacy::{LegacyClient, SESSION_HEADER};
use support::{ServerOptions, TestServer};

fn elicitation() -> Value {
    json!({"elicitation": {}})
}

async fn session(server: &TestServer, capabilities: Value) -> LegacyClient {
    LegacyClient::new(server.url(), None)
        .initialize(capabilities)
        .await
}

fn text_of(response: &Value) -> String {
    response["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {response}"))
        .to_owned()
}

#[tokio::test]
async fn what_a_session_keeps_is_bounded() {
    let server = TestServer::start().await;
    // An 878 KB clientInfo, as an attacker sent by the thousand: refused, no session minted.
    let huge = json!({"name": "x".repeat(878_000), "version": "1"});
    let body = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": huge}
    });
    let refused = LegacyClient::new(server.url(), None)
        .send_raw("initialize", &body, false)
        .await;
    assert_eq!(refused.error_code(), Some(-32602), "{:?}", refused.messages);
    let message = refused.messages[0]["error"]["message"].to_string();
    assert!(
        message.contains("clientInfo") && message.contains("4096"),
        "{message}"
    );
    assert_eq!(
        refused.session_id, None,
        "no session for a refused initialize"
    );

    // Subscriptions per session are capped; unsubscribing makes room again.
    let client = session(&server, json!({})).await;
    for n in 0..128 {
        let reply = client
            .request(
                "resources/subscribe",
                json!({"uri": format!("test://item/{n}")}),
            )
            .await;
        assert_empty_result(&reply, &format!("subscription {n}"));
    }
    let over = client
        .request("resources/subscribe", json!({"uri": "test://item/128"}))
        .await;
    assert_eq!(over.error_code(), Some(-32602), "{:?}", over.messages);
    assert!(
        over.messages[0]["error"]["message"]
            .to_string()
            .contains("128")
    );
    let freed = client
        .request("resources/unsubscribe", json!({"uri": "test://item/0"}))
        .await;
    assert_empty_result(&freed, "the unsubscription");
    let again = client
        .request("resources/subscribe", json!({"uri": "test://item/128"}))
        .await;
    assert_empty_result(&again, "the subscription after it");
}

/// Subscriptions sent at once, half to each of two replicas sharing Redis, all stay: a change is
/// written only over the session it was made to, so none is lost to another written meanwhile.
#[tokio::test]
async fn subscriptions_sent_at_once_to_two_replicas_all_stay() {
    let keys = mcp_mrtr::mrtr::StateSealer::generate_spec("shared");
    let replica = || {
        TestServer::start_with(ServerOptions {
            redis_url: Some(support::net::shared_redis_url()),
            state_keys: Some(keys.clone()),
            ..ServerOptions::default()
        })
    };
    let (first, second) = (replica().await, replica().await);
    let client = session(&first, json!({})).await;
    let elsewhere = client.at(second.url());
    for wave in 0..16 {
        let subscribing = (0..8).map(|n| {
            let number = wave * 8 + n;
            let via = if number % 2 == 0 { &client } else { &elsewhere };
            let uri = format!("test://item/{number}");
            async move {
                let reply = via
                    .request("resources/subscribe", json!({"uri": uri}))
                    .await;
                (number, reply)
            }
        });
        for (number, reply) in futures::future::join_all(subscribing).await {
            assert_empty_result(&reply, &format!("subscription {number}"));
        }
    }
    // All 128 count: the session is at its cap.
    let over = client
        .request("resources/subscribe", json!({"uri": "test://item/128"}))
        .await;
    assert_eq!(
        over.error_code(),
        Some(-32602),
        "the cap of 128 is reached: {:?}",
        over.messages
    );
}

/// On Redis, the sessions a caller ended give their places in its share back at once, and past
/// its share the session it left idle the longest goes, not the one it is using.
#[tokio::test]
async fn on_redis_a_callers_share_of_sessions_counts_only_those_it_holds() {
    let server = TestServer::start_with(ServerOptions {
        redis_url: Some(support::net::shared_redis_url()),
        // A share of two for the anonymous caller every test here is: keys of its own.
        redis_prefix: Some(format!("mcp-test-{}:", support::net::random_hex(6))),
        share_per_owner: 2,
        ..ServerOptions::default()
    })
    .await;
    let status = |client: &LegacyClient| {
        let client = client.clone();
        async move { client.request("tools/list", json!({})).await.status }
    };
    let in_use = session(&server, json!({})).await;
    for _ in 0..3 {
        let ended = session(&server, json!({})).await;
        let deleted = ended.delete_session().await;
        assert_eq!(deleted, 200, "DELETE answered {deleted}");
    }
    let idle = session(&server, json!({})).await;
    assert_eq!(
        status(&in_use).await,
        200,
        "the ended sessions held no place"
    );
    let newest = session(&server, json!({})).await;
    assert_eq!(status(&in_use).await, 200, "the session in use stays");
    assert_eq!(status(&idle).await, 404, "the one idle the longest went");
    assert_eq!(status(&newest).await, 200);
}

/// `reply` is a success with an empty result, as `resources/subscribe` and `unsubscribe` answer.
fn assert_empty_result(reply: &support::legacy::LegacyReply, what: &str) {
    assert_eq!(reply.status, 200, "{what}: {:?}", reply.messages);
    assert_eq!(
        reply.messages.first().map(|m| &m["result"]),
        Some(&json!({})),
        "{what}: {:?}",
        reply.messages
    );
}

#[tokio::test]
async fn initialize_opens_a_session_whose_results_are_plain_2025_results() {
    let server = TestServer::start().await;
    let client = session(&server, elicitation()).await;

    let listed = client.request("tools/list", json!({})).await;
    assert_eq!(listed.status, 200);
    let names: Vec<&str> = listed.result()["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"greet"), "{names:?}");

    let pong = client.request("ping", json!({})).await;
    assert_eq!(pong.result(), &json!({}), "ping answers exactly {{}}");
    let level = client
        .request("logging/setLevel", json!({"level": "info"}))
        .await;
    assert_eq!(
        level.result(),
        &json!({}),
        "logging/setLevel answers exactly {{}}"
    );
    let subscribed = client
        .request("resources/subscribe", json!({"uri": "test://item/1"}))
        .await;
    assert_eq!(subscribed.result(), &json!({}));

    let discover = client.request("server/discover", json!({})).await;
    assert_eq!(
        discover.error_code(),
        Some(-32601),
        "2026-only methods do not exist in a legacy session"
    );
}

/// A client is agreed with on a revision whose wire the server follows; one asking for
/// 2025-03-26 (which obliges a server to take JSON-RPC batches) or 2024-11-05 (before Streamable
/// HTTP) is offered 2025-11-25 instead.
#[tokio::test]
async fn initialize_agrees_only_on_revisions_whose_wire_the_server_follows() {
    let server = TestServer::start().await;
    for (asked, agreed) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
    ] {
        let hello = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": asked, "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}});
        let reply = LegacyClient::new(server.url(), None)
            .send_raw("initialize", &hello, false)
            .await;
        assert_eq!(reply.status, 200, "{asked}: {:?}", reply.messages);
        assert_eq!(reply.result()["protocolVersion"], agreed, "asked {asked}");
    }
}

#[tokio::test]
async fn an_initialize_with_a_meta_of_its_own_opens_a_session_and_a_modern_meta_does_not() {
    let server = TestServer::start().await;
    let client = LegacyClient::new(server.url(), None);
    let initialize = |meta: Value| {
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "legacy-with-meta", "version": "1.0.0"},
                "_meta": meta,
            }
        })
    };

    // 2025-11-25 lets any request carry `_meta`: a progress token, a vendor's keys.
    let legacy = client
        .send_raw(
            "initialize",
            &initialize(json!({"progressToken": "p-1", "com.example/trace": "t-1"})),
            false,
        )
        .await;
    assert_eq!(legacy.status, 200, "{:?}", legacy.messages);
    assert_eq!(legacy.result()["protocolVersion"], "2025-11-25");
    assert!(legacy.session_id.is_some(), "a session is opened");

    // A modern `_meta` makes the request modern, whatever its method: no session.
    let modern = reqwest::Client::new()
        .post(server.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(
            initialize(json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            }))
            .to_string(),
        )
        .send()
        .await
        .expect("POST");
    assert_eq!(modern.status(), 400);
    assert!(modern.headers().get(SESSION_HEADER).is_none(), "no session");
    let refusal: Value = modern.json().await.expect("a JSON-RPC error");
    assert_eq!(
        refusal["error"]["code"], -32020,
        "the modern wire's missing-header error: {refusal}"
    );
}

#[tokio::test]
async fn an_accepted_elicitation_reaches_the_tool() {
    let server = TestServer::start().await;
    let client = session(&server, elicitation()).await;
    let mut call = client.start_call("greet", json!({})).await;
    assert!(call.content_type.starts_with("text/event-stream"));
    let request = call.next_server_request().await;
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "What is your name?");
    assert_eq!(
        client
            .answer(
                &request["id"],
                json!({"action": "accept", "content": {"name": "Ada"}})
            )
            .await,
        202
    );
    assert_eq!(text_of(&call.response().await), "Hello, Ada!");
}

#[tokio::test]
async fn declined_refused_cancelled_and_unanswered_elicitations_take_the_fallback() {
    let server = TestServer::start_with(ServerOptions {
        legacy_request_timeout_secs: 1,
        ..ServerOptions::default()
    })
    .await;
    let client = session(&server, elicitation()).await;

    let mut declined = client.start_call("greet", json!({})).await;
    let request = declined.next_server_request().await;
    client
        .answer(&request["id"], json!({"action": "decline"}))
        .await;
    assert_eq!(text_of(&declined.response().await), "Hello, anonymous!");

    let mut cancelled = client.start_call("greet", json!({})).await;
    let request = cancelled.next_server_request().await;
    client
        .answer(&request["id"], json!({"action": "cancel"}))
        .await;
    assert_eq!(text_of(&cancelled.response().await), "Hello, anonymous!");

    let mut refused = client.start_call("greet", json!({})).await;
    let request = refused.next_server_request().await;
    client.refuse(&request["id"], -1, "User rejected").await;
    assert_eq!(text_of(&refused.response().await), "Hello, anonymous!");

    let mut unanswered = client.start_call("greet", json!({})).await;
    let request = unanswered.next_server_request().await;
    // The server stops waiting after 1 s and says so, so the client can take the form down.
    let cancelled = unanswered.next_message().await;
    assert_eq!(
        cancelled["method"], "notifications/cancelled",
        "{cancelled}"
    );
    assert_eq!(
        cancelled["params"]["requestId"], request["id"],
        "{cancelled}"
    );
    assert_eq!(
        text_of(&unanswered.response().await),
        "Hello, anonymous!",
        "after the 1 s timeout"
    );
}

/// A client's `notifications/cancelled` stops the call it names: its stream ends without a
/// response. Another session cannot cancel it.
#[tokio::test]
async fn a_cancelled_call_stops_without_a_response() {
    let server = TestServer::start().await;
    let client = session(&server, elicitation()).await;
    let stranger = session(&server, elicitation()).await;
    let mut call = client.start_call("greet", json!({})).await;
    call.next_server_request().await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": call.id, "reason": "the user gave up"}});
    let elsewhere = stranger
        .send_raw("notifications/cancelled", &cancel, false)
        .await;
    assert_eq!(elsewhere.status, 202);
    let not_yet = tokio::time::timeout(std::time::Duration::from_millis(300), call.rest()).await;
    assert!(
        not_yet.is_err(),
        "another session's cancellation is ignored"
    );

    let cancelled = client
        .send_raw("notifications/cancelled", &cancel, false)
        .await;
    assert_eq!(cancelled.status, 202);
    let rest = call.rest().await;
    assert!(
        rest.iter()
            .all(|message| message.get("id") != Some(&call.id)),
        "no response after the cancellation: {rest:?}"
    );
    let still = client.request("tools/list", json!({})).await;
    assert_eq!(still.status, 200, "the session goes on");
}

/// A client that reuses the id of a call still running (the spec says it must not) and then
/// cancels that id stops both calls, not only the later one.
#[tokio::test]
async fn a_cancellation_stops_every_call_under_a_reused_id() {
    let server = TestServer::start().await;
    let client = session(&server, elicitation()).await;
    let mut first = client
        .start_call_as(json!("again"), "greet", json!({}))
        .await;
    first.next_server_request().await;
    let mut second = client
        .start_call_as(json!("again"), "greet", json!({}))
        .await;
    second.next_server_request().await;
    let mut other = client.start_call("greet", json!({})).await;
    let question = other.next_server_request().await;

    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": "again"}});
    let cancelled = client
        .send_raw("notifications/cancelled", &cancel, false)
        .await;
    assert_eq!(cancelled.status, 202);
    for (n, call) in [&mut first, &mut second].into_iter().enumerate() {
        let rest = call.rest().await;
        assert!(
            rest.iter()
                .all(|message| message.get("id") != Some(&json!("again"))),
            "call {n}: no response after the cancellation: {rest:?}"
        );
    }
    client
        .answer(
            &question["id"],
            json!({"action": "accept", "content": {"name": "Ada"}}),
        )
        .await;
    assert_eq!(
        text_of(&other.response().await),
        "Hello, Ada!",
        "a call under another id runs on"
    );
}

/// The lifecycle's rule: no server request before the client's `notifications/initialized`.
/// Until then a tool is served as to a client that cannot be asked; after it, the same session
/// is asked.
#[tokio::test]
async fn a_session_is_asked_nothing_before_it_says_initialized() {
    let server = TestServer::start().await;
    let client = LegacyClient::new(server.url(), None)
        .open(elicitation())
        .await;
    let mut early = client.start_call("greet", json!({})).await;
    let response = early.response().await;
    assert_eq!(text_of(&response), "Hello, stranger!", "not asked");

    assert_eq!(client.notify("notifications/initialized").await, 202);
    let mut call = client.start_call("greet", json!({})).await;
    let request = call.next_server_request().await;
    assert_eq!(request["method"], "elicitation/create");
    client
        .answer(
            &request["id"],
            json!({"action": "accept", "content": {"name": "Ada"}}),
        )
        .await;
    assert_eq!(text_of(&call.response().await), "Hello, Ada!");
}

#[tokio::test]
async fn a_client_without_elicitation_is_never_asked() {
    let server = TestServer::start().await;
    let client = session(&server, json!({})).await;
    let mut call = client.start_call("greet", json!({})).await;
    let response = call.response().await;
    assert_eq!(text_of(&response), "Hello, stranger!");
}

#[tokio::test]
async fn sampling_is_answered_refused_or_timed_out() {
    let server = TestServer::start_with(ServerOptions {
        legacy_request_timeout_secs: 1,
        ..ServerOptions::default()
    })
    .await;
    let client = session(&server, json!({"sampling": {}})).await;

    let mut answered = client.start_call("ask_model", json!({})).await;
    let request = answered.next_server_request().await;
    assert_eq!(request["method"], "sampling/createMessage");
    assert_eq!(request["params"]["maxTokens"], 50);
    let reply = json!({"role": "assistant", "content": {"type": "text", "text": "A classic."}, "model": "test-model", "stopReason": "endTurn"});
    client.answer(&request["id"], reply).await;
    assert_eq!(
        text_of(&answered.response().await),
        "model said: A classic."
    );

    let mut refused = client.start_call("ask_model", json!({})).await;
    let request = refused.next_server_request().await;
    client
        .refuse(&request["id"], -1, "User rejected sampling")
        .await;
    let text = text_of(&refused.response().await);
    assert!(
        text.starts_with("no model: User rejected sampling"),
        "{text}"
    );

    let mut unanswered = client.start_call("ask_model", json!({})).await;
    unanswered.next_server_request().await;
    let text = text_of(&unanswered.response().await);
    assert!(text.starts_with("no model: no answer within"), "{text}");

    let without = session(&server, json!({})).await;
    let mut call = without.start_call("ask_model", json!({})).await;
    assert_eq!(
        text_of(&call.response().await),
        "no model: sampling not declared"
    );
}

#[tokio::test]
async fn log_messages_follow_the_session_level() {
    let server = TestServer::start().await;
    let client = session(&server, json!({})).await;
    client
        .request("logging/setLevel", json!({"level": "info"}))
        .await;
    let reply = client
        .request("tools/call", json!({"name": "chatty", "arguments": {}}))
        .await;
    let levels: Vec<&str> = reply
        .messages
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        .filter_map(|m| m["params"]["level"].as_str())
        .collect();
    assert_eq!(levels, ["info", "error"]);
    assert_eq!(
        text_of(reply.messages.last().expect("a response")),
        "logged"
    );
}

#[tokio::test]
async fn a_request_with_modern_meta_is_served_statelessly_even_with_a_session_id() {
    let server = TestServer::start().await;
    let legacy = session(&server, json!({})).await;
    let live = legacy.session_id.clone().expect("a session");
    let client = server.client();
    // A dual-era client may keep sending the header it was given: the request's `_meta` decides.
    for session_id in [live.as_str(), "no-such-session"] {
        let discover = client
            .request("server/discover")
            .header(SESSION_HEADER, session_id)
            .send()
            .await;
        assert_eq!(discover.status.as_u16(), 200, "{}", discover.body_text());
        assert_eq!(discover.result_type(), "complete");
        assert!(discover.result()["supportedVersions"].is_array());
        assert!(
            discover.headers.get(SESSION_HEADER).is_none(),
            "no session id is echoed"
        );
        let tools = client
            .request("tools/list")
            .header(SESSION_HEADER, session_id)
            .send()
            .await;
        assert_eq!(tools.result_type(), "complete", "{}", tools.body_text());
        assert!(
            tools.result()["ttlMs"].is_u64(),
            "a modern result, with its caching hints: {}",
            tools.body_text()
        );
    }
    let still = legacy.request("tools/list", json!({})).await;
    assert_eq!(
        still.status, 200,
        "the session goes on: {:?}",
        still.messages
    );
    // Within the session, a `_meta` with another of the spec's keys (a 2025-11-25 task's) but no
    // protocol version is the session's.
    let related = json!({"_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-1"}}});
    let in_session = legacy.request("tools/list", related).await;
    assert_eq!(in_session.status, 200, "{:?}", in_session.messages);
    assert!(in_session.result()["tools"].is_array());
    assert!(
        in_session.result().get("resultType").is_none(),
        "a 2025-11-25 result: {:?}",
        in_session.messages
    );
}

#[tokio::test]
async fn sessions_are_checked_and_end_with_delete() {
    let server = TestServer::start().await;
    let anonymous = LegacyClient::new(server.url(), None);
    let no_session = anonymous.request("tools/list", json!({})).await;
    assert_eq!(no_session.status, 400, "a request without a session");

    let mut unknown = anonymous.clone();
    unknown.session_id = Some("no-such-session".into());
    let body = json!({"jsonrpc": "2.0", "id": 4242, "method": "tools/list", "params": {}});
    let gone = unknown.send_raw("tools/list", &body, true).await;
    assert_eq!(gone.status, 404);
    let refusal = gone.messages.first().expect("a JSON-RPC error");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert_eq!(
        refusal["id"], 4242,
        "the error answers the request by its id: {refusal}"
    );

    let client = session(&server, json!({})).await;
    // A GET or DELETE with over 64 KiB of headers gets the same JSON-RPC 431 as a POST.
    let session_id = client.session_id.clone().expect("a session");
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let padded = reqwest::Client::new()
            .request(method.clone(), server.url())
            .header(SESSION_HEADER, &session_id)
            .header("accept", "text/event-stream")
            .header("x-padding", "p".repeat(100_000))
            .send()
            .await
            .expect("an answer");
        assert_eq!(padded.status().as_u16(), 431, "{method}");
        let answer: Value = padded.json().await.expect("a JSON-RPC answer");
        assert_eq!(answer["error"]["code"], -32600, "{method}: {answer}");
    }
    assert_eq!(client.delete_session().await, 200);
    assert_eq!(
        client.request("tools/list", json!({})).await.status,
        404,
        "an ended session is gone"
    );
    assert_eq!(client.delete_session().await, 404);
}

/// Within a session, an `MCP-Protocol-Version` naming a revision the server does not serve gets
/// 400 on POST, GET and DELETE (both revisions require it), and the session goes on; a modern
/// version in that header makes the request a modern one, whatever session id comes with it. A
/// session header sent twice gets 400 too, with the legacy revision's own error code.
#[tokio::test]
async fn a_session_request_naming_a_revision_not_served_gets_400() {
    let server = TestServer::start().await;
    let legacy = session(&server, json!({})).await;
    let session_id = legacy.session_id.clone().expect("a session");
    let http = reqwest::Client::new();
    let with_version = |method: reqwest::Method, version: &str| {
        http.request(method, server.url())
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header(SESSION_HEADER, &session_id)
            .header("MCP-Protocol-Version", version)
    };
    let ping = json!({"jsonrpc": "2.0", "id": 9, "method": "ping"}).to_string();
    let posted = with_version(reqwest::Method::POST, "1999-01-01")
        .body(ping.clone())
        .send()
        .await
        .expect("POST");
    assert_eq!(posted.status().as_u16(), 400);
    let refusal: Value = posted.json().await.expect("a JSON-RPC error");
    assert_eq!(refusal["error"]["code"], -32022, "{refusal}");
    assert_eq!(refusal["id"], 9, "{refusal}");
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let refused = with_version(method.clone(), "nonsense")
            .send()
            .await
            .expect("an answer");
        assert_eq!(refused.status().as_u16(), 400, "{method}");
        let refusal: Value = refused.json().await.expect("a JSON-RPC error");
        assert_eq!(refusal["error"]["code"], -32022, "{method}: {refusal}");
        assert_eq!(refusal["error"]["data"]["requested"], "nonsense");
    }
    // Nor is a legacy revision `initialize` does not agree on.
    let earlier = with_version(reqwest::Method::POST, "2025-03-26")
        .body(json!({"jsonrpc": "2.0", "id": 10, "method": "ping"}).to_string())
        .send();
    for refused in [
        earlier.await,
        with_version(reqwest::Method::GET, "2024-11-05")
            .send()
            .await,
    ] {
        let refused = refused.expect("an answer");
        assert_eq!(refused.status().as_u16(), 400);
        let refusal: Value = refused.json().await.expect("a JSON-RPC error");
        assert_eq!(refusal["error"]["code"], -32022, "{refusal}");
        assert_eq!(
            refusal["error"]["data"]["supported"],
            json!(["2025-11-25", "2025-06-18"]),
            "{refusal}"
        );
    }
    // Nor is any other message of that revision: a notification is not silently dropped.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 1}});
    let notice = with_version(reqwest::Method::POST, "1999-01-01")
        .body(cancel.to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(notice.status().as_u16(), 400);
    // A version header sent twice is not a legacy one, whatever its first line says.
    let twice = with_version(reqwest::Method::GET, "2025-11-25")
        .header("MCP-Protocol-Version", "2026-07-28")
        .send()
        .await
        .expect("an answer");
    assert_eq!(twice.status().as_u16(), 400);
    let refusal: Value = twice.json().await.expect("a JSON-RPC error");
    assert_eq!(refusal["error"]["code"], -32020, "{refusal}");
    // A session header sent twice is a legacy request's mistake: 400 with 2025-11-25's
    // invalid request (that revision has no -32020), on POST, GET and DELETE alike.
    let session_twice = |method: reqwest::Method| {
        with_version(method, "2025-11-25").header(SESSION_HEADER, "another-session")
    };
    let posted_twice = session_twice(reqwest::Method::POST)
        .body(json!({"jsonrpc": "2.0", "id": 11, "method": "ping"}).to_string())
        .send();
    let refusals = [
        posted_twice.await,
        session_twice(reqwest::Method::GET).send().await,
        session_twice(reqwest::Method::DELETE).send().await,
    ];
    for (refused, id) in refusals
        .into_iter()
        .zip([json!(11), Value::Null, Value::Null])
    {
        let refused = refused.expect("an answer");
        assert_eq!(refused.status().as_u16(), 400);
        let refusal: Value = refused.json().await.expect("a JSON-RPC error");
        assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
        assert_eq!(refusal["id"], id, "the POST's own id: {refusal}");
        let message = refusal["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("more than once"), "{refusal}");
    }
    let still = legacy.request("tools/list", json!({})).await;
    assert_eq!(
        still.status, 200,
        "the session goes on: {:?}",
        still.messages
    );
    let served = with_version(reqwest::Method::POST, "2025-11-25")
        .body(ping)
        .send()
        .await
        .expect("POST");
    assert_eq!(served.status().as_u16(), 200, "the session's own revision");

    // A modern request with a malformed `_meta` is refused as one (400, -32602), not sent to
    // the session it names (which is gone: 404 would tell the client to start a new one).
    let modern = json!({"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": {
        "_meta": {"io.modelcontextprotocol/clientCapabilities": {}}}});
    let stale = http
        .post(server.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header(SESSION_HEADER, "no-such-session")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/list")
        .body(modern.to_string())
        .send()
        .await
        .expect("POST");
    assert_eq!(stale.status().as_u16(), 400);
    let refusal: Value = stale.json().await.expect("a JSON-RPC error");
    assert_eq!(refusal["error"]["code"], -32602, "{refusal}");
}

/// A session's errors travel with HTTP 200 whether the client takes a stream or not: a 404
/// would tell its client that the session is gone, a 400 that the transport failed.
#[tokio::test]
async fn a_session_error_comes_with_200_on_a_stream_as_in_plain_json() {
    let server = TestServer::start().await;
    let legacy = session(&server, json!({})).await;
    for accept_sse in [true, false] {
        let call = json!({"jsonrpc": "2.0", "id": 31, "method": "tools/call",
                          "params": {"name": "noSuchTool", "arguments": {}}});
        let reply = legacy.send_raw("tools/call", &call, accept_sse).await;
        assert_eq!(reply.status, 200, "SSE accepted: {accept_sse}");
        assert_eq!(
            reply.error_code(),
            Some(-32602),
            "SSE accepted: {accept_sse}: {:?}",
            reply.messages
        );
    }
}

/// An unknown resource is -32002 in a session, as 2025-11-25 names it (2026-07-28 says -32602),
/// with the URI in its data.
#[tokio::test]
async fn an_unknown_resource_is_minus_32002_in_a_session() {
    let server = TestServer::start().await;
    let legacy = session(&server, json!({})).await;
    let reply = legacy
        .request("resources/read", json!({"uri": "test://no-such-item"}))
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.error_code(), Some(-32002), "{:?}", reply.messages);
    assert_eq!(
        reply.messages[0]["error"]["data"]["uri"],
        "test://no-such-item"
    );
    let modern = server
        .client()
        .request("resources/read")
        .params(json!({"uri": "test://no-such-item"}))
        .send()
        .await;
    assert_eq!(modern.error_code(), -32602, "{}", modern.body_text());
}

/// The id of a 2025-11-25 session that `user` (the test authenticator's `X-Test-User`) opens.
async fn session_of(http: &reqwest::Client, server: &TestServer, user: &str) -> String {
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let open = http
        .post(server.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("X-Test-User", user)
        .body(initialize.to_string())
        .send()
        .await
        .expect("initialize");
    open.headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .expect("a session id")
        .to_owned()
}

#[tokio::test]
async fn a_session_belongs_to_the_user_who_opened_it() {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    let session = session_of(&http, &server, "alice").await;
    let list = |user: &'static str| {
        http.post(server.url())
            .header("Content-Type", "application/json")
            .header(SESSION_HEADER, &session)
            .header("X-Test-User", user)
            .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
            .send()
    };
    assert_eq!(list("alice").await.expect("alice").status(), 200);
    assert_eq!(list("bob").await.expect("bob").status(), 403);
}

type TextStream = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<String>> + Send>>;

/// The body of a GET stream, as text.
fn text_of_stream(stream: reqwest::Response) -> TextStream {
    Box::pin(futures::StreamExt::map(stream.bytes_stream(), |chunk| {
        chunk.map(|b| String::from_utf8_lossy(&b).into_owned())
    }))
}

/// A request for the stream of `client`'s session, by `method` (GET opens it).
fn stream_request(
    server: &TestServer,
    client: &LegacyClient,
    method: reqwest::Method,
) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method, server.url())
        .header("Accept", "text/event-stream")
        .header(
            SESSION_HEADER,
            client.session_id.as_deref().expect("session"),
        )
}

/// The GET stream of `client`'s session, opened.
async fn open_get_stream(server: &TestServer, client: &LegacyClient) -> reqwest::Response {
    let stream = stream_request(server, client, reqwest::Method::GET)
        .send()
        .await
        .expect("GET");
    assert_eq!(stream.status(), 200);
    stream
}

/// Has the fixture server announce that its tool list changed.
async fn change_the_tools(client: &LegacyClient) {
    client
        .request(
            "tools/call",
            json!({"name": "trigger_tools_changed", "arguments": {}}),
        )
        .await;
}

/// Reads `body` until it carries the tool list's change (10 s at most).
async fn hear_the_tools_change(body: &mut TextStream) {
    let mut seen = String::new();
    while !seen.contains("notifications/tools/list_changed") {
        let chunk = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            futures::StreamExt::next(body),
        )
        .await
        .expect("a notification arrives")
        .expect("the stream stays open")
        .expect("bytes");
        seen.push_str(&chunk);
    }
}

#[tokio::test]
async fn the_get_stream_delivers_list_changes() {
    let server = TestServer::start().await;
    let client = session(&server, json!({})).await;
    let stream = open_get_stream(&server, &client).await;
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("text/event-stream")
    );
    let mut body = text_of_stream(stream);
    // The stream is subscribed to changes before its response headers are sent.
    change_the_tools(&client).await;
    hear_the_tools_change(&mut body).await;
    let without_session = reqwest::Client::new()
        .get(server.url())
        .header("Accept", "text/event-stream")
        .send()
        .await
        .expect("GET");
    assert_eq!(without_session.status(), 400);
}

/// HEAD is not a GET whose body is dropped: it is refused with 405, and the session's stream
/// (which a GET would have taken over) goes on carrying its notices.
#[tokio::test]
async fn head_is_refused_and_leaves_the_sessions_stream_open() {
    let server = TestServer::start().await;
    let client = session(&server, json!({})).await;
    let mut body = text_of_stream(open_get_stream(&server, &client).await);
    let head = stream_request(&server, &client, reqwest::Method::HEAD)
        .send()
        .await
        .expect("HEAD");
    assert_eq!(head.status().as_u16(), 405);
    assert_eq!(
        head.headers()
            .get("allow")
            .and_then(|allow| allow.to_str().ok()),
        Some("GET, POST, DELETE")
    );
    change_the_tools(&client).await;
    hear_the_tools_change(&mut body).await;
}

/// Each notice goes on one stream only: a session's second GET takes its notices over and the
/// first ends; and a session that ends (DELETE) ends its stream.
#[tokio::test]
async fn a_sessions_notices_go_to_its_latest_stream_only_and_end_with_it() {
    let server = TestServer::start().await;
    let client = session(&server, json!({})).await;
    let session_id = client.session_id.clone().expect("session");
    let open = || {
        reqwest::Client::new()
            .get(server.url())
            .header("Accept", "text/event-stream")
            .header(SESSION_HEADER, &session_id)
            .send()
    };
    let first = open().await.expect("GET");
    let second = open().await.expect("GET");
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), first.text()).await;
    assert!(ended.is_ok(), "the first stream ends once the second opens");

    let mut body = text_of_stream(second);
    change_the_tools(&client).await;
    hear_the_tools_change(&mut body).await;

    assert_eq!(client.delete_session().await, 200);
    // The stream ends with its session, with no notice to wait for.
    let rest = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut rest = String::new();
        while let Some(chunk) = futures::StreamExt::next(&mut body).await {
            rest.push_str(&chunk.unwrap_or_default());
        }
        rest
    })
    .await
    .expect("the stream of an ended session ends");
    assert!(
        !rest.contains("list_changed"),
        "nothing more after the notice it heard: {rest}"
    );
}

/// Two replicas of one deployment on the shared Redis, under keys of their own: no other test's
/// change may reach their streams.
async fn two_replicas() -> (TestServer, TestServer) {
    let keys = mcp_mrtr::mrtr::StateSealer::generate_spec("shared");
    let prefix = format!("mcp-test-{}:", support::net::random_hex(6));
    let replica = || {
        TestServer::start_with(ServerOptions {
            redis_url: Some(support::net::shared_redis_url()),
            redis_prefix: Some(prefix.clone()),
            state_keys: Some(keys.clone()),
            ..ServerOptions::default()
        })
    };
    (replica().await, replica().await)
}

/// A session's notices go to its latest stream whichever replica holds it: a stream left open on
/// another replica (a client that reconnected elsewhere) ends at the next notice without it.
#[tokio::test]
async fn a_stream_left_open_on_another_replica_ends_without_the_notices() {
    let (first, second) = two_replicas().await;
    let client = session(&first, json!({})).await;
    let left_open = open_get_stream(&first, &client).await;
    let mut latest = text_of_stream(open_get_stream(&second, &client).await);

    change_the_tools(&client).await;
    hear_the_tools_change(&mut latest).await;
    let heard_elsewhere =
        tokio::time::timeout(std::time::Duration::from_secs(10), left_open.text())
            .await
            .expect("the stream left open ends")
            .unwrap_or_default();
    assert!(
        !heard_elsewhere.contains("list_changed"),
        "each notice goes on one stream: {heard_elsewhere}"
    );
}

/// A session ended (DELETE) on one replica ends its GET stream on another at once, rather than
/// at that stream's next look at the session's record.
#[tokio::test]
async fn a_session_ended_on_one_replica_ends_its_stream_on_another() {
    let (first, second) = two_replicas().await;
    let client = session(&first, json!({})).await;
    let mut stream = text_of_stream(open_get_stream(&first, &client).await);
    let open = tokio::time::timeout(
        std::time::Duration::from_millis(500),
        futures::StreamExt::next(&mut stream),
    )
    .await;
    assert!(
        open.is_err(),
        "the stream is open before the session ends: {open:?}"
    );
    assert_eq!(client.at(second.url()).delete_session().await, 200);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while futures::StreamExt::next(&mut stream).await.is_some() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the stream on the first replica ends with its session"
    );
}

/// An open GET stream keeps its session alive past the idle time, up to the session's maximum
/// age, when both end.
#[tokio::test]
async fn a_get_stream_keeps_its_session_alive_until_its_maximum_age() {
    let server = TestServer::start_with(ServerOptions {
        legacy_session_idle_secs: 2,
        legacy_session_max_secs: 6,
        ..ServerOptions::default()
    })
    .await;
    // Taken before the session opens, so that what it measures is at least the session's life.
    let opened = std::time::Instant::now();
    let client = session(&server, json!({})).await;
    let stream = open_get_stream(&server, &client).await;
    let mut body = text_of_stream(stream);
    tokio::time::sleep(std::time::Duration::from_millis(3_000)).await;
    let alive = client.request("tools/list", json!({})).await;
    assert_eq!(
        alive.status, 200,
        "3 s in, past its 2 s idle time, the session lives on its stream"
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while futures::StreamExt::next(&mut body).await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the stream ends with the session");
    // Ages are counted in whole seconds from the second the session opened in.
    assert!(
        opened.elapsed() >= std::time::Duration::from_secs(5),
        "not before the session's maximum age: {:?}",
        opened.elapsed()
    );
    let gone = client.request("tools/list", json!({})).await;
    assert_eq!(gone.status, 404, "the session is over");
}

#[tokio::test]
async fn the_get_stream_ends_when_the_credentials_that_opened_it_expire() {
    let server = TestServer::start().await;
    let http = reqwest::Client::new();
    // Two sessions: a session's second stream would end its first.
    let sessions = [
        session_of(&http, &server, "alice").await,
        session_of(&http, &server, "alice").await,
    ];
    let get = |valid_for_ms: Option<&'static str>| {
        let session = &sessions[usize::from(valid_for_ms.is_none())];
        let mut request = http
            .get(server.url())
            .header("Accept", "text/event-stream")
            .header("MCP-Protocol-Version", "2025-11-25")
            .header(SESSION_HEADER, session)
            .header("X-Test-User", "alice");
        if let Some(ms) = valid_for_ms {
            request = request.header("X-Test-Valid-For-Ms", ms);
        }
        request.send()
    };
    let opened = std::time::Instant::now();
    let expiring = get(Some("1000")).await.expect("GET");
    let lasting = get(None).await.expect("GET");
    assert_eq!(
        (expiring.status().as_u16(), lasting.status().as_u16()),
        (200, 200)
    );

    let whole = tokio::time::timeout(std::time::Duration::from_secs(10), expiring.bytes()).await;
    assert!(
        whole.is_ok_and(|body| body.is_ok()),
        "the stream ended, cleanly, once its credentials expired"
    );
    assert!(
        opened.elapsed() >= std::time::Duration::from_millis(900),
        "not before they expired: {:?}",
        opened.elapsed()
    );
    let still_open = tokio::time::timeout(std::time::Duration::from_secs(1), lasting.bytes()).await;
    assert!(
        still_open.is_err(),
        "a stream opened with credentials that do not expire goes on"
    );
}

// ---------------------------------------------------------------------------------------------
// The movie tools under legacy sessions, on replicas of the real binary sharing Redis and
// PostgreSQL
// ---------------------------------------------------------------------------------------------

mod movies {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::support::cluster::{Replicas, SharedSettings};
    use super::support::legacy::{LegacyCall, LegacyClient};
    use super::support::net::shared_redis_url;

    /// Two replicas whose legacy calls wait at most 2 s for an answer.
    async fn replicas() -> Replicas {
        replicas_with(&[]).await
    }

    /// The same, with `extra` settings.
    async fn replicas_with(extra: &[(&str, &str)]) -> Replicas {
        let mut settings = SharedSettings::new(shared_redis_url());
        settings
            .extra_env
            .push(("MOVIEDB_LEGACY_REQUEST_TIMEOUT".into(), "2".into()));
        for (name, value) in extra {
            settings.extra_env.push(((*name).into(), (*value).into()));
        }
        Replicas::start_with(2, settings).await
    }

    /// `user`'s watch list once it holds `count` items (or what it holds after 15 s).
    async fn watchlist_of(replicas: &Replicas, user: &str, count: usize) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let listed = replicas.session(2, user).watchlist().await;
            if listed.len() >= count || tokio::time::Instant::now() >= deadline {
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn status_of<'a>(listed: &'a [Value], movie: &str) -> Option<&'a Value> {
        listed
            .iter()
            .find(|item| item["content"]["id"].as_str() == Some(movie))
            .map(|item| &item["status"])
    }

    async fn legacy_session(
        replicas: &mut Replicas,
        replica: usize,
        user: &str,
        capabilities: Value,
    ) -> LegacyClient {
        let token = replicas.settings.token(user);
        LegacyClient::new(replicas.replica(replica).url(), Some(token))
            .initialize(capabilities)
            .await
    }

    /// `addToWatchlist` of `movie` started in `client`'s session, once it has asked for the
    /// status: the call, and the question.
    async fn asked_status(client: &LegacyClient, movie: &str) -> (LegacyCall, Value) {
        let mut call = client
            .start_call("addToWatchlist", json!({"subject": {"movieId": movie}}))
            .await;
        let question = call.next_server_request().await;
        assert_eq!(question["method"], "elicitation/create", "{question}");
        (call, question)
    }

    fn structured(response: &Value) -> &Value {
        assert!(
            response["result"]["isError"] != json!(true),
            "tool error: {response}"
        );
        &response["result"]["structuredContent"]
    }

    /// The movie server offers no resources, so a session cannot subscribe to any.
    #[tokio::test]
    async fn a_session_cannot_subscribe_where_no_resources_are_offered() {
        let mut replicas = Replicas::start_with(1, SharedSettings::new(shared_redis_url())).await;
        let client = legacy_session(&mut replicas, 1, "ada", json!({})).await;
        for method in [
            "resources/subscribe",
            "resources/unsubscribe",
            "resources/list",
        ] {
            let reply = client.request(method, json!({"uri": "movie://1"})).await;
            assert_eq!(reply.status, 200, "{method}");
            assert_eq!(
                reply.error_code(),
                Some(-32601),
                "{method}: {:?}",
                reply.messages
            );
        }
    }

    /// The status each answer to the watch-list question leads to, read back from the database.
    #[tokio::test]
    async fn every_answer_to_the_status_question_is_recorded_as_the_spec_says() {
        let mut replicas = replicas().await;
        let client = legacy_session(&mut replicas, 1, "ada", json!({"elicitation": {}})).await;
        let cases: [(i64, Option<Value>, &str); 7] = [
            (
                6,
                Some(json!({"action": "accept", "content": {"status": "WATCHED"}})),
                "WATCHED",
            ),
            (
                7,
                Some(json!({"action": "accept", "content": {"status": "WANT_TO_WATCH"}})),
                "WANT_TO_WATCH",
            ),
            (8, Some(json!({"action": "decline"})), "WANT_TO_WATCH"),
            (9, Some(json!({"action": "cancel"})), "WANT_TO_WATCH"),
            (10, None, "WANT_TO_WATCH"),
            (11, Some(json!("refuse")), "WANT_TO_WATCH"),
            // A status the form does not offer: the call cannot ask again, so it is cancelled.
            (
                12,
                Some(json!({"action": "accept", "content": {"status": "MAYBE"}})),
                "WANT_TO_WATCH",
            ),
        ];
        for (movie, answer, expected) in &cases {
            let mut call = client
                .start_call(
                    "addToWatchlist",
                    json!({"subject": {"movieId": movie.to_string()}}),
                )
                .await;
            let request = call.next_server_request().await;
            assert_eq!(request["method"], "elicitation/create");
            assert_eq!(
                request["params"]["message"],
                "Have you already watched this title, or is it one to watch later?"
            );
            match answer {
                Some(answer) if answer == &json!("refuse") => {
                    assert_eq!(
                        client.refuse(&request["id"], -1, "User rejected").await,
                        202
                    );
                }
                Some(answer) => {
                    assert_eq!(client.answer(&request["id"], answer.clone()).await, 202)
                }
                None => {} // no answer: the call waits 2 s, then takes the fallback
            }
            let saved = call.response().await;
            assert_eq!(structured(&saved)["status"], *expected, "movie {movie}");
        }
        let listed = replicas.session(2, "ada").watchlist().await;
        for (movie, _, expected) in cases {
            let item = listed
                .iter()
                .find(|i| i["content"]["id"].as_str() == Some(movie.to_string().as_str()))
                .unwrap_or_else(|| panic!("movie {movie} saved"));
            assert_eq!(item["status"], expected, "movie {movie} read back");
        }
        assert_eq!(replicas.database.watchlist_rows("ada").await, 7);

        let no_elicitation = legacy_session(&mut replicas, 2, "bob", json!({})).await;
        let mut call = no_elicitation
            .start_call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
            .await;
        assert_eq!(
            structured(&call.response().await)["status"],
            "WANT_TO_WATCH",
            "never asked"
        );
    }

    /// A 2025-06-18 client is asked its status with the choices as that revision's forms offer
    /// them (`enum` titled by `enumNames`, no `mode`), and its answer is saved.
    #[tokio::test]
    async fn a_2025_06_18_session_is_asked_with_choices_its_forms_know() {
        let mut replicas = Replicas::start_with(1, SharedSettings::new(shared_redis_url())).await;
        let token = replicas.settings.token("june");
        let client = LegacyClient::new(replicas.replica(1).url(), Some(token))
            .initialize_at("2025-06-18", json!({"elicitation": {}}))
            .await;
        let mut call = client
            .start_call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
            .await;
        let request = call.next_server_request().await;
        assert_eq!(request["method"], "elicitation/create");
        let params = &request["params"];
        assert!(
            params.get("mode").is_none(),
            "2025-06-18 has no mode: {params}"
        );
        let status = &params["requestedSchema"]["properties"]["status"];
        assert_eq!(
            status["enum"],
            json!(["WANT_TO_WATCH", "WATCHED"]),
            "{status}"
        );
        assert_eq!(
            status["enumNames"],
            json!(["Want to watch", "Already watched"]),
            "{status}"
        );
        assert!(status.get("oneOf").is_none(), "{status}");
        let answer = json!({"action": "accept", "content": {"status": "WATCHED"}});
        assert_eq!(client.answer(&request["id"], answer).await, 202);
        assert_eq!(structured(&call.response().await)["status"], "WATCHED");
        assert_eq!(replicas.database.watchlist_rows("june").await, 1);
    }

    /// A closed stream is no cancellation on 2025-11-25 (a network may drop it; a client cancels
    /// with a notification): the call runs on. An answer POSTed after the stream closed is saved,
    /// and a question left unanswered ends in the fallback, saved all the same.
    #[tokio::test]
    async fn a_call_whose_stream_closed_runs_on_to_its_end() {
        let mut replicas = replicas().await;
        let client = legacy_session(&mut replicas, 1, "eve", json!({"elicitation": {}})).await;
        let (answered, question) = asked_status(&client, "6").await;
        let (unanswered, _) = asked_status(&client, "7").await;
        drop((answered, unanswered));
        // Time for the server to see the streams closed before the answer comes (on a server
        // slower to see it, the test proves less; it does not fail).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let answer = json!({"action": "accept", "content": {"status": "WATCHED"}});
        assert_eq!(client.answer(&question["id"], answer).await, 202);

        let listed = watchlist_of(&replicas, "eve", 2).await;
        assert_eq!(
            status_of(&listed, "6"),
            Some(&json!("WATCHED")),
            "{listed:?}"
        );
        assert_eq!(
            status_of(&listed, "7"),
            Some(&json!("WANT_TO_WATCH")),
            "{listed:?}"
        );
    }

    /// Calls run on after their streams closed only while there is room for them (as many as
    /// requests may be handled at once, here one); past that, a closed stream stops its call.
    #[tokio::test]
    async fn calls_run_on_after_their_streams_closed_only_within_their_room() {
        // A 5 s wait: time enough to see both streams closed before the first call's wait ends.
        let mut replicas = replicas_with(&[
            ("MOVIEDB_MAX_CONCURRENT_REQUESTS", "1"),
            ("MOVIEDB_LEGACY_REQUEST_TIMEOUT", "5"),
        ])
        .await;
        let client = legacy_session(&mut replicas, 1, "fay", json!({"elicitation": {}})).await;
        let (first, _) = asked_status(&client, "6").await;
        let (second, _) = asked_status(&client, "7").await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(second);
        // Unanswered, the call that runs on saves the fallback after its 5 s wait; the other,
        // asked at the same moment, would have saved it by 2 s later.
        let listed = watchlist_of(&replicas, "fay", 1).await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(replicas.database.watchlist_rows("fay").await, 1);
    }

    /// A caller's calls take at most a quarter of the places to run on (here one of four): its
    /// second call whose stream closed stops, while another caller's runs on.
    #[tokio::test]
    async fn a_caller_runs_on_only_its_share_of_calls_whose_streams_closed() {
        let mut replicas = replicas_with(&[
            ("MOVIEDB_MAX_CONCURRENT_REQUESTS", "4"),
            ("MOVIEDB_LEGACY_REQUEST_TIMEOUT", "5"),
        ])
        .await;
        let ivy = legacy_session(&mut replicas, 1, "ivy", json!({"elicitation": {}})).await;
        let jon = legacy_session(&mut replicas, 1, "jon", json!({"elicitation": {}})).await;
        let (first, _) = asked_status(&ivy, "6").await;
        let (second, _) = asked_status(&ivy, "7").await;
        let (other, _) = asked_status(&jon, "6").await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop((second, other));
        // Unanswered, the calls that run on save the fallback after their 5 s wait; ivy's
        // second, asked at about the same moment, would have saved it by 2 s later.
        assert_eq!(watchlist_of(&replicas, "jon", 1).await.len(), 1);
        let listed = watchlist_of(&replicas, "ivy", 1).await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(replicas.database.watchlist_rows("ivy").await, 1);
        assert_eq!(replicas.database.watchlist_rows("jon").await, 1);
    }

    /// A session's end stops its calls, on whichever replica they run, whether their streams are
    /// open (they end without a response) or closed (they run on no further): nothing is saved.
    #[tokio::test]
    async fn ending_a_session_stops_its_calls_on_every_replica() {
        let mut replicas = replicas().await;
        let on_first = legacy_session(&mut replicas, 1, "gil", json!({"elicitation": {}})).await;
        let on_second = on_first.at(replicas.replica(2).url());
        let (mut open, _) = asked_status(&on_first, "6").await;
        let (closed, _) = asked_status(&on_first, "7").await;
        drop(closed);
        assert_eq!(on_second.delete_session().await, 200);
        // Not stopped, each would answer after its 2 s wait, with the fallback saved.
        let rest = open.rest().await;
        assert!(
            rest.iter()
                .all(|message| message.get("id") != Some(&open.id)),
            "no response after the session ended: {rest:?}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            replicas.database.watchlist_rows("gil").await,
            0,
            "nothing saved"
        );
    }

    /// A client's `notifications/cancelled` POSTed to the replica that does not run the call
    /// reaches the one that does: the call stops while it waits for the user, its stream ends
    /// without a response, and nothing is written (the fallback is not taken).
    #[tokio::test]
    async fn a_cancellation_posted_to_another_replica_stops_the_call() {
        let mut replicas = replicas().await;
        let on_first = legacy_session(&mut replicas, 1, "dee", json!({"elicitation": {}})).await;
        let on_second = on_first.at(replicas.replica(2).url());

        let mut call = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
            .await;
        let request = call.next_server_request().await;
        assert_eq!(request["method"], "elicitation/create");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": call.id, "reason": "the user gave up"}});
        let sent = on_second
            .send_raw("notifications/cancelled", &cancel, false)
            .await;
        assert_eq!(sent.status, 202);
        // Not cancelled, the call would answer after its 2 s wait, with the fallback saved.
        let rest = call.rest().await;
        assert!(
            rest.iter()
                .all(|message| message.get("id") != Some(&call.id)),
            "no response after the cancellation: {rest:?}"
        );
        assert_eq!(
            replicas.database.watchlist_rows("dee").await,
            0,
            "nothing saved"
        );
    }

    /// A client that reused a call's id on another replica (the spec says it must not) and
    /// cancels that id where the later call runs stops the earlier one too.
    #[tokio::test]
    async fn a_cancellation_stops_the_calls_under_a_reused_id_on_every_replica() {
        let mut replicas = replicas().await;
        let on_first = legacy_session(&mut replicas, 1, "eli", json!({"elicitation": {}})).await;
        let on_second = on_first.at(replicas.replica(2).url());
        let add = |movie: &str| json!({"subject": {"movieId": movie}});
        let mut first = on_first
            .start_call_as(json!("again"), "addToWatchlist", add("6"))
            .await;
        first.next_server_request().await;
        let mut second = on_second
            .start_call_as(json!("again"), "addToWatchlist", add("7"))
            .await;
        second.next_server_request().await;
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                            "params": {"requestId": "again"}});
        let sent = on_second
            .send_raw("notifications/cancelled", &cancel, false)
            .await;
        assert_eq!(sent.status, 202);
        // Not cancelled, each would answer after its 2 s wait, with the fallback saved.
        for (replica, call) in [(1, &mut first), (2, &mut second)] {
            let rest = call.rest().await;
            assert!(
                rest.iter()
                    .all(|message| message.get("id") != Some(&json!("again"))),
                "the call on replica {replica}: no response after the cancellation: {rest:?}"
            );
        }
        assert_eq!(
            replicas.database.watchlist_rows("eli").await,
            0,
            "nothing saved"
        );
    }

    #[tokio::test]
    async fn an_answer_posted_to_another_replica_reaches_the_waiting_call() {
        let mut replicas = replicas().await;
        let on_first = legacy_session(
            &mut replicas,
            1,
            "cy",
            json!({"elicitation": {}, "sampling": {}}),
        )
        .await;
        let on_second = on_first.at(replicas.replica(2).url());

        let mut call = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
            .await;
        let request = call.next_server_request().await;
        assert_eq!(
            on_second
                .answer(
                    &request["id"],
                    json!({"action": "accept", "content": {"status": "WATCHED"}})
                )
                .await,
            202
        );
        assert_eq!(structured(&call.response().await)["status"], "WATCHED");

        let mut summary = on_first
            .start_call("summarizeMovieReviews", json!({"movieId": "5"}))
            .await;
        let request = summary.next_server_request().await;
        assert_eq!(request["method"], "sampling/createMessage");
        let reply = json!({"role": "assistant", "content": {"type": "text", "text": "SUMMARY: Relayed verdict.\nTHEMES: relay; replicas"}, "model": "client-model"});
        on_second.answer(&request["id"], reply).await;
        let summarized = summary.response().await;
        assert_eq!(structured(&summarized)["summary"], "Relayed verdict.");
        assert_eq!(
            structured(&summarized)["themes"],
            json!(["relay", "replicas"])
        );

        // Refusals travel the same way and lead to the fallbacks.
        let mut declined = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "7"}}))
            .await;
        let request = declined.next_server_request().await;
        assert_eq!(
            on_second
                .answer(&request["id"], json!({"action": "decline"}))
                .await,
            202
        );
        assert_eq!(
            structured(&declined.response().await)["status"],
            "WANT_TO_WATCH"
        );

        let mut refused = on_first
            .start_call("summarizeMovieReviews", json!({"movieId": "6"}))
            .await;
        let request = refused.next_server_request().await;
        assert_eq!(
            on_second
                .refuse(&request["id"], -1, "User rejected sampling")
                .await,
            202
        );
        let fallback = refused.response().await;
        assert!(
            structured(&fallback)["summary"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Reviewers are largely favourable"),
            "{fallback}"
        );
    }

    /// Every message the replicas publish on their answer relay, as Redis delivers it.
    async fn relay_listener(
        replicas: &Replicas,
    ) -> std::pin::Pin<Box<dyn futures::Stream<Item = Value> + Send>> {
        let client = redis::Client::open(shared_redis_url()).expect("the Redis URL");
        let mut pubsub = client.get_async_pubsub().await.expect("a Redis subscriber");
        let channel = format!("{}answers", replicas.settings.redis_prefix);
        pubsub.subscribe(&channel).await.expect("subscribed");
        Box::pin(futures::StreamExt::map(
            pubsub.into_on_message(),
            |message| serde_json::from_slice(message.get_payload_bytes()).expect("a JSON answer"),
        ))
    }

    /// The next answer published on the relay.
    async fn next_relayed(
        relayed: &mut std::pin::Pin<Box<dyn futures::Stream<Item = Value> + Send>>,
    ) -> Value {
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            futures::StreamExt::next(relayed),
        )
        .await
        .expect("an answer was relayed")
        .expect("the subscription is open")
    }

    #[tokio::test]
    async fn only_answers_to_questions_asked_in_their_session_are_relayed() {
        let mut replicas = replicas().await;
        let mut relayed = relay_listener(&replicas).await;
        let on_first = legacy_session(&mut replicas, 1, "dee", json!({"elicitation": {}})).await;
        let on_second = on_first.at(replicas.replica(2).url());
        // Responses to questions nobody asked: taken (202) and dropped, not sent to every replica,
        // whatever their shape (the last has the shape of a real question's id).
        let watched = json!({"action": "accept", "content": {"status": "WATCHED"}});
        let forged = format!("server-watched-{}", "0".repeat(80));
        for stray in [json!("made-up"), json!(42), json!(forged)] {
            assert_eq!(on_second.answer(&stray, watched.clone()).await, 202);
        }
        // An answer to a real question, but larger than any form's: not relayed either, so the
        // call waiting on the first replica takes its fallback when its 2 s are up.
        let mut call = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
            .await;
        let question = call.next_server_request().await;
        let padded = json!({"action": "accept", "content": {"status": "WATCHED", "note": "x".repeat(100_000)}});
        assert_eq!(on_second.answer(&question["id"], padded).await, 202);
        assert_eq!(
            structured(&call.response().await)["status"],
            "WANT_TO_WATCH"
        );

        // A real question's id answered in another session (of the same user): not taken either;
        // the session's own answer, a refusal, is.
        let mut call = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "7"}}))
            .await;
        let question = call.next_server_request().await;
        let other_session =
            legacy_session(&mut replicas, 2, "dee", json!({"elicitation": {}})).await;
        assert_eq!(other_session.answer(&question["id"], watched).await, 202);
        assert_eq!(
            on_second
                .answer(&question["id"], json!({"action": "decline"}))
                .await,
            202
        );
        assert_eq!(
            structured(&call.response().await)["status"],
            "WANT_TO_WATCH"
        );
        // The relay carried that answer, and nothing before it.
        let first_relayed = next_relayed(&mut relayed).await;
        assert_eq!(
            first_relayed["id"], question["id"],
            "the first message on the relay: {first_relayed}"
        );

        // The same answer sent again and again, to either replica, while the question's id is
        // good (2 s of wait and 5 s for clocks): never relayed again.
        let replaying = std::time::Instant::now();
        for _ in 0..20 {
            for replica in [&on_first, &on_second] {
                let again = replica.answer(&question["id"], json!({"action": "decline"}));
                assert_eq!(again.await, 202);
            }
        }
        assert!(
            replaying.elapsed() < std::time::Duration::from_secs(5),
            "the copies went while the id was good, else the check below proves nothing"
        );
        // The next message on the relay is the next question's answer.
        let mut call = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "8"}}))
            .await;
        let next_question = call.next_server_request().await;
        let watched = json!({"action": "accept", "content": {"status": "WATCHED"}});
        let answered = on_second.answer(&next_question["id"], watched);
        assert_eq!(answered.await, 202);
        assert_eq!(structured(&call.response().await)["status"], "WATCHED");
        let second_relayed = next_relayed(&mut relayed).await;
        assert_eq!(
            second_relayed["id"], next_question["id"],
            "the message after the first on the relay: {second_relayed}"
        );
    }

    /// A replica that found an answer claimed by another asks Redis again a second later, so
    /// once a claim is given back (as a replica whose publish failed gives it back), the answer
    /// sent again goes through.
    #[tokio::test]
    async fn an_answer_whose_claim_was_given_back_is_relayed_when_sent_again() {
        let mut settings = SharedSettings::new(shared_redis_url());
        settings
            .extra_env
            .push(("MOVIEDB_LEGACY_REQUEST_TIMEOUT".into(), "20".into()));
        let mut replicas = Replicas::start_with(2, settings).await;
        let mut relayed = relay_listener(&replicas).await;
        let on_first = legacy_session(&mut replicas, 1, "eve", json!({"elicitation": {}})).await;
        let on_second = on_first.at(replicas.replica(2).url());
        let mut call = on_first
            .start_call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
            .await;
        let question = call.next_server_request().await;
        let id = question["id"]
            .as_str()
            .expect("a question's id is a string");

        // Another replica's claim on the answer, as while its relay of it is under way.
        let marker = format!("{}answers:{id}", replicas.settings.redis_prefix);
        let redis = redis::Client::open(shared_redis_url()).expect("the Redis URL");
        let mut redis = redis
            .get_multiplexed_async_connection()
            .await
            .expect("a Redis connection");
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&marker)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut redis)
            .await
            .expect("SET");
        assert!(claimed.is_some(), "the test's claim is the first");
        let watched = json!({"action": "accept", "content": {"status": "WATCHED"}});
        let answered = on_second.answer(&question["id"], watched.clone());
        assert_eq!(answered.await, 202);
        let early = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            futures::StreamExt::next(&mut relayed),
        );
        assert!(
            early.await.is_err(),
            "an answer claimed by another replica is not relayed"
        );

        // The claim given back: the same answer sent again, after the second, is relayed.
        let released: u64 = redis::cmd("DEL")
            .arg(&marker)
            .query_async(&mut redis)
            .await
            .expect("DEL");
        assert_eq!(released, 1, "the claim was still there");
        // Sent until it goes: copies are refused for a second after the marker was found.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let relayed_id = loop {
            assert_eq!(
                on_second.answer(&question["id"], watched.clone()).await,
                202
            );
            let wait = std::time::Duration::from_secs(1);
            match tokio::time::timeout(wait, futures::StreamExt::next(&mut relayed)).await {
                Ok(message) => break message.expect("the subscription is open")["id"].clone(),
                Err(_) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "the answer sent again was never relayed"
                ),
            }
        };
        assert_eq!(relayed_id, question["id"]);
        assert_eq!(structured(&call.response().await)["status"], "WATCHED");
    }

    #[tokio::test]
    async fn an_anonymous_clients_model_is_asked_each_time_as_its_words_are_kept_for_nobody() {
        let mut replicas = replicas().await;
        let anonymous = LegacyClient::new(replicas.replica(1).url(), None)
            .initialize(json!({"sampling": {}}))
            .await;
        for verdict in ["First take.", "Second take."] {
            let mut call = anonymous
                .start_call("summarizeMovieReviews", json!({"movieId": "5"}))
                .await;
            let request = call.next_server_request().await;
            assert_eq!(
                request["method"], "sampling/createMessage",
                "asked again, nothing kept from before: {request}"
            );
            let text = format!("SUMMARY: {verdict}\nTHEMES: takes");
            let reply = json!({"role": "assistant", "content": {"type": "text", "text": text}, "model": "anonymous-model"});
            anonymous.answer(&request["id"], reply).await;
            assert_eq!(structured(&call.response().await)["summary"], verdict);
        }
    }

    #[tokio::test]
    async fn the_summary_borrows_the_clients_model_and_falls_back_without_it() {
        let mut replicas = replicas().await;
        let client = legacy_session(&mut replicas, 1, "di", json!({"sampling": {}})).await;

        let mut answered = client
            .start_call("summarizeMovieReviews", json!({"movieId": "5"}))
            .await;
        let request = answered.next_server_request().await;
        assert_eq!(request["method"], "sampling/createMessage");
        assert_eq!(request["params"]["maxTokens"], 1024);
        assert!(
            request["params"]["systemPrompt"]
                .as_str()
                .unwrap_or_default()
                .contains("SUMMARY:")
        );
        let prompt = request["params"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(prompt.contains("1-10 scale"), "{prompt}");
        let reply = json!({"role": "assistant", "content": {"type": "text", "text": "THEMES: effects; pacing\nSUMMARY: A divisive spectacle."}, "model": "client-model"});
        client.answer(&request["id"], reply).await;
        let summary = answered.response().await;
        assert_eq!(structured(&summary)["summary"], "A divisive spectacle.");
        assert_eq!(structured(&summary)["themes"], json!(["effects", "pacing"]));
        assert_eq!(structured(&summary)["reviewCount"], 26);

        let mut refused = client
            .start_call("summarizeMovieReviews", json!({"movieId": "6"}))
            .await;
        let request = refused.next_server_request().await;
        client
            .refuse(&request["id"], -1, "User rejected sampling")
            .await;
        let fallback = refused.response().await;
        assert!(
            structured(&fallback)["summary"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Reviewers are largely favourable"),
            "{fallback}"
        );

        let mut unanswered = client
            .start_call("summarizeMovieReviews", json!({"movieId": "7"}))
            .await;
        unanswered.next_server_request().await;
        let fallback = unanswered.response().await;
        assert!(
            structured(&fallback)["summary"]
                .as_str()
                .unwrap_or_default()
                .starts_with("Reviewers are largely unfavourable"),
            "{fallback}"
        );

        let mut cached = client
            .start_call("summarizeMovieReviews", json!({"movieId": "5"}))
            .await;
        let again = cached.response().await;
        assert_eq!(
            structured(&again)["summary"],
            "A divisive spectacle.",
            "the client's summary is cached, no second question"
        );

        // Another user's model is asked for its own words: di's are never served to her.
        let other = legacy_session(&mut replicas, 1, "eve", json!({"sampling": {}})).await;
        let mut hers = other
            .start_call("summarizeMovieReviews", json!({"movieId": "5"}))
            .await;
        let request = hers.next_server_request().await;
        assert_eq!(request["method"], "sampling/createMessage", "{request}");
        let reply = json!({"role": "assistant", "content": {"type": "text", "text": "SUMMARY: Eve's own verdict.\nTHEMES: eve"}, "model": "eve-model"});
        other.answer(&request["id"], reply).await;
        let own = hers.response().await;
        assert_eq!(structured(&own)["summary"], "Eve's own verdict.");

        let counts_only = client
            .request(
                "tools/call",
                json!({"name": "summarizeMovieReviews", "arguments": {"movieId": "3"}}),
            )
            .await;
        assert!(
            counts_only
                .messages
                .iter()
                .all(|m| m.get("method").is_none()),
            "no model call for two reviews"
        );
        let response = counts_only
            .messages
            .iter()
            .find(|m| m.get("result").is_some())
            .expect("the call's result");
        assert_eq!(structured(response)["reviewCount"], 2, "{response}");
        assert_eq!(structured(response)["summary"], Value::Null, "{response}");
    }
}

#[tokio::test]
async fn a_url_question_on_a_session_carries_its_elicitation_id() {
    let server = TestServer::start().await;
    let client = session(&server, json!({"elicitation": {"url": {}}})).await;
    let mut first = client.start_call("open_link", json!({})).await;
    let request = first.next_server_request().await;
    assert_eq!(request["params"]["mode"], "url");
    assert_eq!(
        request["params"]["url"],
        "https://catalogue.example/connect?session=7"
    );
    let named = request["params"]["elicitationId"]
        .as_str()
        .unwrap_or_else(|| panic!("2025-11-25 requires an elicitationId: {request}"))
        .to_owned();
    client
        .answer(&request["id"], json!({"action": "accept"}))
        .await;
    assert_eq!(text_of(&first.response().await), "opened");

    let mut second = client.start_call("open_link", json!({})).await;
    let request = second.next_server_request().await;
    assert_ne!(
        request["params"]["elicitationId"], named,
        "each URL elicitation has its own id"
    );
    client
        .answer(&request["id"], json!({"action": "cancel"}))
        .await;
    assert_eq!(text_of(&second.response().await), "cancelled");
}

#[tokio::test]
async fn a_question_no_client_may_be_sent_is_not_sent_on_a_session_either() {
    let server = TestServer::start().await;
    let client = session(&server, elicitation()).await;
    let mut call = client.start_call("nested_form", json!({})).await;
    // `response` fails on any server request met before the call's own answer.
    let answer = call.response().await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
}
