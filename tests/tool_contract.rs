//! The tool contract, held still: `tests/contract/tools.json` is the `tools/list` answer (names,
//! titles, descriptions, annotations, input and output schemas) as clients were told it. A rename,
//! a reworded description or a schema change fails here until the snapshot is updated on purpose:
//!
//! ```text
//! UPDATE_CONTRACT=1 cargo test --test tool_contract
//! ```
//!
//! The same answer is also checked against what every client and model provider can read:
//! self-contained schemas (no `$ref`/`$defs`) and nullable fields as `anyOf` of single types.
//! And `server/discover` declares what the server offers, nothing more.

mod support;

use std::path::PathBuf;

use serde_json::{Value, json};
use support::movies::{Backend, MovieServer};

fn snapshot_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/contract/tools.json")
}

async fn live_tools() -> Value {
    let server = MovieServer::start(Backend::Sqlite).await;
    let reply = server.anonymous().request("tools/list").send().await;
    reply.result()["tools"].clone()
}

#[tokio::test]
async fn tools_list_matches_the_checked_in_contract() {
    let live = live_tools().await;
    let path = snapshot_path();
    if std::env::var_os("UPDATE_CONTRACT").is_some() {
        let text = serde_json::to_string_pretty(&live).expect("tools serialize") + "\n";
        std::fs::write(&path, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e} (UPDATE_CONTRACT=1 writes it)",
            path.display()
        )
    });
    let saved: Value = serde_json::from_str(&text).expect("the contract is JSON");
    let names = |tools: &Value| -> Vec<String> {
        tools
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| t["name"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(names(&live), names(&saved), "the tools and their order");
    for (live_tool, saved_tool) in live
        .as_array()
        .into_iter()
        .flatten()
        .zip(saved.as_array().into_iter().flatten())
    {
        assert_eq!(
            live_tool,
            saved_tool,
            "{} changed from the contract in {}; if on purpose, run UPDATE_CONTRACT=1 cargo test --test tool_contract",
            live_tool["name"],
            path.display()
        );
    }
}

/// Every subschema of a schema, depth first (a `properties` map is a map of schemas, not one).
fn subschemas(schema: &Value) -> Vec<&Value> {
    let mut found = vec![schema];
    match schema {
        Value::Array(items) => items.iter().for_each(|v| found.extend(subschemas(v))),
        Value::Object(object) => {
            for (key, value) in object {
                match (key.as_str(), value) {
                    ("properties", Value::Object(properties)) => properties
                        .values()
                        .for_each(|v| found.extend(subschemas(v))),
                    _ => found.extend(subschemas(value)),
                }
            }
        }
        _ => {}
    }
    found
}

#[tokio::test]
async fn every_schema_is_self_contained_with_single_types() {
    let live = live_tools().await;
    for tool in live.as_array().expect("tools is an array") {
        let name = &tool["name"];
        for key in ["inputSchema", "outputSchema"] {
            let schema = &tool[key];
            assert_eq!(schema["type"], "object", "{name} {key}: {schema}");
            for node in subschemas(schema) {
                let Some(object) = node.as_object() else {
                    continue;
                };
                assert!(
                    !object.contains_key("$ref") && !object.contains_key("$defs"),
                    "{name} {key} uses a reference: {node}"
                );
                if let Some(kind) = object.get("type") {
                    assert!(kind.is_string(), "{name} {key}: a type array in {node}");
                }
            }
        }
        let annotations = &tool["annotations"];
        for hint in [
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        ] {
            assert!(
                annotations[hint].is_boolean(),
                "{name} declares {hint}: {annotations}"
            );
        }
    }
}

/// `server/discover` declares what the movie server offers and nothing more: its tools, and no
/// prompts, so no completions either (there are no prompt arguments to complete), and
/// `completion/complete` is not a method it has.
#[tokio::test]
async fn discover_declares_only_what_the_server_offers() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let client = server.anonymous();
    let discover = client.request("server/discover").send().await;
    let capabilities = &discover.result()["capabilities"];
    assert!(capabilities["tools"].is_object(), "{capabilities}");
    for absent in ["prompts", "completions"] {
        assert!(
            capabilities.get(absent).is_none(),
            "{absent} declared: {capabilities}"
        );
    }
    let complete = client
        .request("completion/complete")
        .params(json!({
            "ref": {"type": "ref/prompt", "name": "recommend"},
            "argument": {"name": "mood", "value": "CO"}
        }))
        .send()
        .await;
    complete.assert_error(404, -32601);
}
