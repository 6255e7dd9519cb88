//! What every HTTP answer carries besides MCP: an `x-request-id`, CORS for browser pages on the
//! allowed origins (and a 403 for preflights from others), and a JSON-RPC error, not a dropped
//! connection, when a handler panics. The request span's life is tested in `request_span.rs`.

use serde_json::json;

use crate::support::{ServerOptions, TestServer};

const ALLOWED: &str = "https://app.example.com";

async fn server() -> TestServer {
    TestServer::start_with(ServerOptions {
        allowed_origins: vec![ALLOWED.to_owned()],
        ..ServerOptions::default()
    })
    .await
}

async fn preflight(server: &TestServer, origin: &str) -> reqwest::Response {
    server
        .client()
        .http()
        .request(reqwest::Method::OPTIONS, server.url())
        .header("Origin", origin)
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type, mcp-protocol-version, mcp-method, mcp-name, mcp-param-region",
        )
        .send()
        .await
        .expect("the preflight is answered")
}

fn header<'r>(response: &'r reqwest::Response, name: &str) -> &'r str {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_browser_preflight_from_an_allowed_origin_is_answered_and_one_from_elsewhere_refused() {
    let server = server().await;
    for origin in [ALLOWED, "http://localhost:5173"] {
        let answer = preflight(&server, origin).await;
        assert!(
            answer.status().is_success(),
            "{origin}: {}",
            answer.status()
        );
        assert_eq!(header(&answer, "access-control-allow-origin"), origin);
        assert!(
            header(&answer, "access-control-allow-methods").contains("POST"),
            "{:?}",
            answer.headers()
        );
        let allowed_headers = header(&answer, "access-control-allow-headers").to_lowercase();
        for wanted in [
            "authorization",
            "mcp-protocol-version",
            "mcp-name",
            "mcp-param-region",
        ] {
            assert!(
                allowed_headers.contains(wanted),
                "{wanted} in {allowed_headers}"
            );
        }
        assert_eq!(header(&answer, "access-control-max-age"), "3600");
    }

    let foreign = preflight(&server, "https://evil.example.com").await;
    assert_eq!(foreign.status().as_u16(), 403);
    assert!(
        foreign
            .headers()
            .get("access-control-allow-origin")
            .is_none(),
        "{:?}",
        foreign.headers()
    );
}

#[tokio::test]
async fn a_browser_page_can_read_the_mcp_headers_of_an_answer() {
    let server = server().await;
    let reply = server
        .client()
        .request("server/discover")
        .header("Origin", ALLOWED)
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
    assert_eq!(reply.header("access-control-allow-origin"), Some(ALLOWED));
    let exposed = reply
        .header("access-control-expose-headers")
        .unwrap_or_default()
        .to_lowercase();
    for wanted in ["mcp-session-id", "x-request-id", "www-authenticate"] {
        assert!(exposed.contains(wanted), "{wanted} in {exposed}");
    }
}

#[tokio::test]
async fn every_answer_carries_a_request_id_and_a_clients_own_is_echoed() {
    let server = server().await;
    let client = server.client();
    let first = client.request("tools/list").send().await;
    let second = client.request("tools/list").send().await;
    let (a, b) = (
        first.header("x-request-id").unwrap_or_default(),
        second.header("x-request-id").unwrap_or_default(),
    );
    assert_eq!(a.len(), 32, "a fresh id: {a:?}");
    assert!(a.bytes().all(|b| b.is_ascii_hexdigit()), "in hex: {a:?}");
    assert_ne!(a, b, "each request has its own");

    let mine = client
        .request("tools/list")
        .header("x-request-id", "client-chosen-42")
        .send()
        .await;
    assert_eq!(mine.header("x-request-id"), Some("client-chosen-42"));
    let health = client
        .http()
        .get(server.url().replace("/mcp", "/healthz"))
        .send()
        .await
        .expect("healthz");
    assert!(health.headers().contains_key("x-request-id"));
}

#[tokio::test]
async fn a_handler_that_panics_gets_a_json_rpc_error_and_the_server_goes_on() {
    let server = server().await;
    let client = server.client();
    let body = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {
            "name": "panics", "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    });
    let answer = client
        .http()
        .post(server.url())
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "panics")
        .json(&body)
        .send()
        .await
        .expect("an answer, not a dropped connection");
    assert_eq!(answer.status().as_u16(), 500);
    assert!(
        answer.headers().contains_key("x-request-id"),
        "the answer to a panic still names its request"
    );
    let error: serde_json::Value = answer.json().await.expect("a JSON-RPC error");
    assert_eq!(error["error"]["code"], -32603, "{error}");

    let after = client.request("tools/list").send().await;
    assert_eq!(after.status.as_u16(), 200, "the server still serves");
}
