//! Validation of what HTTP and `_meta` carry: versions, routing headers, `x-mcp-header`
//! parameters, methods, capabilities, ids, Origin, content type, size, JSON.

use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_PROTOCOL_VERSION, PROTOCOL_VERSION,
    ServerOptions, TestServer,
};

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

    // A later revision's `_meta` is not read by this one's rules: no capabilities, a log level
    // this revision does not name, and the version is still what gets refused.
    for (key, value) in [
        (META_CLIENT_CAPABILITIES, None),
        ("io.modelcontextprotocol/logLevel", Some(json!("verbose"))),
    ] {
        let request = client
            .request("tools/list")
            .header("MCP-Protocol-Version", "2099-01-01")
            .meta(META_PROTOCOL_VERSION, json!("2099-01-01"));
        let later = match value {
            None => request.without_meta_key(key),
            Some(value) => request.meta(key, value),
        }
        .send()
        .await;
        later.assert_error(400, -32022);
        assert_eq!(later.error()["data"]["requested"], "2099-01-01");
    }
    // Named in the header alone, with a `_meta` this revision would call malformed.
    for request in [
        client.request("tools/list").without_meta(),
        client
            .request("tools/list")
            .without_meta_key(META_PROTOCOL_VERSION),
    ] {
        let later = request
            .header("MCP-Protocol-Version", "2099-01-01")
            .send()
            .await;
        later.assert_error(400, -32022);
        assert_eq!(later.error()["data"]["requested"], "2099-01-01");
    }

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
async fn a_list_cursor_the_server_never_gave_is_invalid_params() {
    let server = TestServer::start().await;
    let client = server.client();
    for method in [
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    ] {
        let whole = client.request(method).send().await;
        assert_eq!(whole.result_type(), "complete", "{method}");
        assert!(
            whole.result().get("nextCursor").is_none(),
            "{method}: one page"
        );
        let null = client
            .request(method)
            .params(json!({"cursor": null}))
            .send()
            .await;
        assert_eq!(
            null.result_type(),
            "complete",
            "{method}: a null cursor is none"
        );
        for cursor in [json!("eyJwYWdlIjogMn0="), json!(""), json!(42)] {
            let refused = client
                .request(method)
                .params(json!({"cursor": cursor.clone()}))
                .send()
                .await;
            refused.assert_error(200, -32602);
            assert!(
                refused.error()["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("cursor")),
                "{method} {cursor}: {}",
                refused.body_text()
            );
        }
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

    call()
        .without_header("Mcp-Param-Region")
        .send()
        .await
        .assert_error(400, -32020);
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

    // A header naming a value the body lacks (absent or null) is refused: a proxy routing on it
    // would route a call that runs without it.
    for arguments in [
        json!({"region": "eu-west"}),
        json!({"region": "eu-west", "seats": null}),
    ] {
        client
            .request("tools/call")
            .params(json!({"name": "regional", "arguments": arguments}))
            .header("Mcp-Param-Region", "eu-west")
            .header("Mcp-Param-Seats", "4")
            .send()
            .await
            .assert_error(400, -32020);
    }
}

/// Arguments of a tool with a hand-written schema are checked against it before its handler
/// runs: what does not fit gets a tool error saying where.
#[tokio::test]
async fn raw_schema_arguments_are_checked_before_the_handler_runs() {
    let server = TestServer::start().await;
    let client = server.client();
    let misfits = [
        (json!({"region": "eu-west", "seats": "two"}), "/seats"),
        (json!({"seats": 2}), "region"),
    ];
    for (arguments, named) in misfits {
        // The client mirrors each argument into its header, so only the schema can refuse.
        let reply = client.call_tool("regional", arguments.clone()).await;
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
        assert_eq!(reply.result()["isError"], true, "{}", reply.body_text());
        let text = reply.text();
        assert!(
            text.starts_with("Invalid arguments") && text.contains(named),
            "{arguments}: {text}"
        );
    }
}

/// The client mirrors a tool's `x-mcp-header` arguments and the name it calls in the form the
/// transport gives: plain when they are plain ASCII, else Base64 in the sentinel form. The
/// server decodes each and finds it matches the body.
#[tokio::test]
async fn the_client_mirrors_header_values_in_the_encoded_form_when_needed() {
    let server = TestServer::start().await;
    let client = server.client();
    for region in [
        "eu-west",
        "Zürich",
        " padded ",
        "line1\nline2",
        "=?base64?literal?=",
    ] {
        let reply = client
            .call_tool("regional", json!({"region": region, "seats": -7}))
            .await;
        assert_eq!(
            reply.status.as_u16(),
            200,
            "{region:?}: {}",
            reply.body_text()
        );
        assert_eq!(reply.text(), format!("Region: {region}, seats: -7"));
    }
    // A null parameter has no header: the call passes the header check and meets the schema.
    let null_seats = client
        .call_tool("regional", json!({"region": "eu-west", "seats": null}))
        .await;
    assert_eq!(
        null_seats.status.as_u16(),
        200,
        "{}",
        null_seats.body_text()
    );
    assert_eq!(null_seats.result()["isError"], true);
    assert!(
        null_seats.text().contains("/seats"),
        "{}",
        null_seats.text()
    );

    // A resource URI outside the header-safe set reaches the lookup, which does not find it.
    let unknown = client
        .request("resources/read")
        .params(json!({"uri": "test://café/ münchen"}))
        .send()
        .await;
    unknown.assert_error(200, -32602);
}

/// A routing header sent twice is refused even when its first line matches the body: a proxy
/// may route on the other line, or on both joined.
#[tokio::test]
async fn a_routing_header_sent_twice_is_refused() {
    let server = TestServer::start().await;
    let client = server.client();
    let regional = json!({"name": "regional", "arguments": {"region": "eu-west"}});
    let call = || {
        client
            .request("tools/call")
            .params(regional.clone())
            .header("Mcp-Param-Region", "eu-west")
    };
    let plain = call().send().await;
    assert_eq!(plain.status.as_u16(), 200, "{}", plain.body_text());

    let repeated = [
        ("Mcp-Name", "simple_text"),
        ("Mcp-Method", "tools/list"),
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Param-Region", "us-east"),
    ];
    for (header, other) in repeated {
        let reply = call().extra_header_line(header, other).send().await;
        reply.assert_error(400, -32020);
        assert!(
            reply.error_message().contains("more than once"),
            "{header}: {}",
            reply.body_text()
        );
    }
}

/// Integer parameters are compared exactly: 2^53 + 1 is not 2^53, though they are the same f64.
#[tokio::test]
async fn integer_header_parameters_are_compared_exactly() {
    let server = TestServer::start().await;
    let client = server.client();
    let call = |seats: &str| {
        client
            .request("tools/call")
            .params(json!({"name": "regional", "arguments": {"region": "eu-west", "seats": 9007199254740993_u64}}))
            .header("Mcp-Param-Region", "eu-west")
            .header("Mcp-Param-Seats", seats)
    };
    for near in [
        "9007199254740992",
        "9007199254740992.0",
        "9.007199254740992e15",
    ] {
        call(near).send().await.assert_error(400, -32020);
    }
    let exact = call("9007199254740993").send().await;
    assert_eq!(exact.status.as_u16(), 200, "{}", exact.body_text());
    assert_eq!(exact.text(), "Region: eu-west, seats: 9007199254740993");
}

/// Prompt arguments are strings: another type, or null, is refused with -32602 rather than
/// handed to the prompt (or counted as a required argument given).
#[tokio::test]
async fn prompt_arguments_that_are_not_strings_are_invalid_params() {
    let server = TestServer::start().await;
    let client = server.client();
    let get = |arguments: Value| {
        client
            .request("prompts/get")
            .params(json!({"name": "greeting", "arguments": arguments}))
            .send()
    };
    let greeted = get(json!({"name": "Ada", "tone": "warm"})).await;
    assert_eq!(
        greeted.result()["messages"][0]["content"]["text"],
        "Hello, Ada.",
        "{}",
        greeted.body_text()
    );
    for (arguments, named) in [
        (json!({"name": 5}), "name"),
        (json!({"name": null}), "name"),
        (json!({"name": "Ada", "tone": ["warm"]}), "tone"),
    ] {
        let refused = get(arguments.clone()).await;
        refused.assert_error(200, -32602);
        assert!(
            refused.error_message().contains(named),
            "{arguments}: {}",
            refused.body_text()
        );
    }
    let missing = get(json!({"tone": "warm"})).await;
    missing.assert_error(200, -32602);
    assert!(
        missing.error_message().contains("name"),
        "{}",
        missing.body_text()
    );
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
            .timeout(crate::support::REQUEST_TIMEOUT)
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
        .timeout(crate::support::REQUEST_TIMEOUT)
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

#[tokio::test]
async fn client_supplied_values_are_echoed_only_as_a_short_prefix() {
    let server = TestServer::start().await;
    let client = server.client();
    let long_origin = format!("http://{}.example.com", "o".repeat(60_000));
    let refused = client
        .request("server/discover")
        .header("Origin", long_origin.clone())
        .send()
        .await;
    assert_eq!(refused.status.as_u16(), 403, "a foreign origin is refused");
    let message = refused.error_message();
    assert!(
        message.starts_with("Origin http://ooo")
            && message.contains(&format!("({} bytes)", long_origin.len())),
        "the refusal names the origin by a prefix and its size: {message}"
    );
    println!(
        "60 KB Origin: {} bytes of response body",
        refused.body.len()
    );
    assert!(refused.body.len() < 1024, "{} bytes", refused.body.len());

    // The name goes in Mcp-Name too, within the 64 KiB of headers read.
    let long_name = "t".repeat(40_000);
    let unknown = client
        .request("tools/call")
        .params(json!({"name": long_name, "arguments": {}}))
        .send()
        .await;
    assert_eq!(unknown.error_code(), -32602, "{}", unknown.error_message());
    assert!(unknown.error_message().starts_with("Unknown tool: ttt"));
    // A name too long for a header, in the body alone.
    let huge_name = "t".repeat(500_000);
    let mismatched = client
        .request("tools/call")
        .params(json!({"name": huge_name, "arguments": {}}))
        .header("Mcp-Name", "greet")
        .send()
        .await;
    assert_eq!(mismatched.error_code(), -32020);
    println!(
        "40 KB and 500 KB tool names: {} and {} bytes of response body",
        unknown.body.len(),
        mismatched.body.len()
    );
    for reply in [&unknown, &mismatched] {
        assert!(
            reply.body.len() < 1024,
            "{} bytes: {}",
            reply.body.len(),
            reply.error_message()
        );
    }
}

#[tokio::test]
async fn headers_over_64_kib_are_refused_with_431_however_they_arrive() {
    let server = TestServer::start().await;
    let client = server.client();
    let huge_name = "t".repeat(300_000);
    let refusals = [
        client
            .request("server/discover")
            .header("X-Padding", "p".repeat(300_000))
            .send()
            .await,
        client
            .request("tools/call")
            .params(json!({"name": huge_name, "arguments": {}}))
            .send()
            .await,
    ];
    for refused in refusals {
        assert_eq!(refused.status.as_u16(), 431, "{}", refused.body_text());
        assert_eq!(refused.error_code(), -32600, "{}", refused.body_text());
        assert!(
            refused
                .error_message()
                .starts_with("Request headers over 64 KiB"),
            "{}",
            refused.body_text()
        );
    }

    // The same kind of head, sent in small pieces, gets the same answer.
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}"#;
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Accept: application/json\r\nConnection: close\r\nX-Padding: {}\r\n\
         Content-Length: {}\r\n\r\n",
        server.addr(),
        "p".repeat(300_000),
        body.len()
    );
    let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
    for piece in head.as_bytes().chunks(8 * 1024) {
        if stream.write_all(piece).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _ = stream.write_all(body.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 431") && answer.contains("Request headers over 64 KiB"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_key_given_twice_is_a_parse_error_and_nothing_runs() {
    let server = TestServer::start().await;
    let client = server.client();
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"greet","_meta":{}}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"greet","name":"simple_text","arguments":{}}}"#,
    ] {
        let reply = client
            .request("tools/call")
            .header("Mcp-Name", "greet")
            .raw_body(body)
            .send()
            .await;
        assert_eq!(reply.status.as_u16(), 400, "{}", reply.body_text());
        assert_eq!(reply.error_code(), -32700, "{}", reply.body_text());
        assert!(
            reply.error_message().contains("duplicate"),
            "{}",
            reply.error_message()
        );
    }
    assert_eq!(server.probes.greet_runs(), 0, "no tool ran");
}

#[tokio::test]
async fn requests_beyond_the_concurrency_cap_wait_then_get_503_with_retry_after() {
    let server = TestServer::start_with(ServerOptions {
        max_concurrent_requests: 1,
        ..ServerOptions::default()
    })
    .await;
    let client = server.client();
    // slow_progress without a progress token answers with JSON after a minute: it holds the
    // only turn while it works.
    let slow_client = client.clone();
    let slow = tokio::spawn(async move {
        slow_client
            .request("tools/call")
            .params(json!({"name": "slow_progress", "arguments": {}}))
            .send()
            .await
    });
    let started = tokio::time::Instant::now();
    while !server.probes.slow_started.load(Ordering::SeqCst) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "slow_progress started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = tokio::time::Instant::now();
    let busy = client.call_tool("simple_text", json!({})).await;
    assert_eq!(busy.status.as_u16(), 503, "{}", busy.body_text());
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert_eq!(busy.error_code(), -32603, "{}", busy.body_text());
    assert!(
        asked.elapsed() >= mcp_mrtr::transport::BUSY_WAIT * 9 / 10,
        "the 503 came after waiting for a turn, not at once: {:?}",
        asked.elapsed()
    );

    // A call waiting for its turn gets it when the slow call is gone (its client gave up).
    let queued_client = client.clone();
    let queued =
        tokio::spawn(async move { queued_client.call_tool("simple_text", json!({})).await });
    tokio::time::sleep(mcp_mrtr::transport::BUSY_WAIT / 10).await;
    slow.abort();
    let reply = queued.await.expect("the queued call");
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
    assert_eq!(reply.text(), "simple text");
}
