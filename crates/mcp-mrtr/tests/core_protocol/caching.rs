//! Caching hints on cacheable results, a stable `tools/list` order, and none on `input_required`.

use mcp_mrtr::server::CachePolicy;
use serde_json::json;

use crate::support::{LISTED_TOOLS, Reply, ServerOptions, TestServer};

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
async fn the_servers_cache_policy_sets_each_kind_of_results_ttl() {
    let cache = CachePolicy {
        discover_ttl_ms: 1_234,
        list_ttl_ms: 5_678,
        read_ttl_ms: 9,
    };
    let server = TestServer::start_with(ServerOptions {
        cache,
        ..ServerOptions::default()
    })
    .await;
    let client = server.client();
    let ttl = |reply: &Reply| reply.result()["ttlMs"].as_u64();
    assert_eq!(
        ttl(&client.request("server/discover").send().await),
        Some(1_234)
    );
    for method in [
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    ] {
        assert_eq!(
            ttl(&client.request(method).send().await),
            Some(5_678),
            "{method}"
        );
    }
    let read = client
        .request("resources/read")
        .params(json!({"uri": "test://static-text"}))
        .send()
        .await;
    assert_eq!(ttl(&read), Some(9));
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
