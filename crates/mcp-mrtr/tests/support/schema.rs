//! Validation of everything the server sends against the official JSON schema of its revision.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};

/// The revision most tests speak.
pub const MODERN: &str = "2026-07-28";
/// The revision of legacy (initialize) sessions.
pub const LEGACY: &str = "2025-11-25";
/// The Tasks extension's schema (`io.modelcontextprotocol/tasks`), kept beside the revisions'.
pub const TASKS: &str = "ext-tasks";

/// The official schema of `revision`, kept in the repository's `spec-compat/schema/` (found from
/// any package of the workspace).
pub fn schema_path_of(revision: &str) -> PathBuf {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let schemas = package
        .ancestors()
        .map(|dir| dir.join("spec-compat/schema"))
        .find(|schemas| schemas.is_dir())
        .unwrap_or_else(|| panic!("no spec-compat/schema/ in {} or above", package.display()));
    schemas.join(revision).join("schema.json")
}

pub fn schema_path() -> PathBuf {
    schema_path_of(MODERN)
}

fn defs(revision: &str) -> &'static Value {
    static DEFS: OnceLock<Mutex<HashMap<String, &'static Value>>> = OnceLock::new();
    let cache = DEFS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    cache.entry(revision.to_owned()).or_insert_with(|| {
        let path = schema_path_of(revision);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read the MCP schema at {}: {e}", path.display()));
        let schema: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the MCP schema at {} is not JSON: {e}", path.display()));
        let defs = schema
            .get("$defs")
            .or_else(|| schema.get("definitions"))
            .cloned()
            .unwrap_or_else(|| panic!("the MCP schema at {} has no $defs", path.display()));
        Box::leak(Box::new(defs))
    })
}

/// Whether the schema defines `name`.
pub fn has_def(name: &str) -> bool {
    defs(MODERN).get(name).is_some()
}

/// The compiled validator for one definition of one revision, built once.
fn validator(revision: &str, name: &str) -> Arc<jsonschema::Validator> {
    static VALIDATORS: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> =
        OnceLock::new();
    let cache = VALIDATORS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    let cache_key = format!("{revision}/{name}");
    if let Some(validator) = cache.get(&cache_key) {
        return validator.clone();
    }
    let defs = defs(revision);
    assert!(
        defs.get(name).is_some(),
        "the {revision} MCP schema has no definition {name}"
    );
    let wrapped = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/$defs/{name}"),
        "$defs": defs,
    });
    let validator = Arc::new(
        jsonschema::validator_for(&wrapped)
            .unwrap_or_else(|e| panic!("cannot compile the schema for {name}: {e}")),
    );
    cache.insert(cache_key, validator.clone());
    validator
}

/// Validates `instance` against the definition `name` of `revision`.
pub fn check_in(revision: &str, name: &str, instance: &Value) -> Result<(), String> {
    let validator = validator(revision, name);
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("  - at {}: {e}", e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "does not match {revision} {name}:\n{}\nmessage: {instance}",
            errors.join("\n")
        ))
    }
}

/// Validates `instance` against the definition `name` of the modern schema.
pub fn check(name: &str, instance: &Value) -> Result<(), String> {
    check_in(MODERN, name, instance)
}

/// Panics unless `instance` matches the definition `name`.
pub fn assert_valid(name: &str, instance: &Value) {
    if let Err(e) = check(name, instance) {
        panic!("schema violation: {e}");
    }
}

/// The typed result definition of a request method.
pub fn result_def(method: &str) -> &'static str {
    match method {
        "server/discover" => "DiscoverResult",
        "tools/list" => "ListToolsResult",
        "tools/call" => "CallToolResult",
        "prompts/list" => "ListPromptsResult",
        "prompts/get" => "GetPromptResult",
        "resources/list" => "ListResourcesResult",
        "resources/read" => "ReadResourceResult",
        "resources/templates/list" => "ListResourceTemplatesResult",
        "completion/complete" => "CompleteResult",
        "subscriptions/listen" => "SubscriptionsListenResult",
        _ => "Result",
    }
}

/// The typed definition of a server notification.
pub fn notification_def(method: &str) -> &'static str {
    match method {
        "notifications/progress" => "ProgressNotification",
        "notifications/message" => "LoggingMessageNotification",
        "notifications/cancelled" => "CancelledNotification",
        "notifications/subscriptions/acknowledged" => "SubscriptionsAcknowledgedNotification",
        "notifications/tools/list_changed" => "ToolListChangedNotification",
        "notifications/prompts/list_changed" => "PromptListChangedNotification",
        "notifications/resources/list_changed" => "ResourceListChangedNotification",
        "notifications/resources/updated" => "ResourceUpdatedNotification",
        // Anything else must still be some server notification; this fails for unknown ones.
        _ => "ServerNotification",
    }
}

/// The typed definitions of an error response with this code (envelope, then error object).
fn error_defs(code: i64) -> Vec<(&'static str, bool)> {
    // (definition, applies to the whole response rather than to `error`)
    let mut defs = vec![("JSONRPCErrorResponse", true)];
    match code {
        -32020 => defs.push(("HeaderMismatchError", true)),
        -32021 => defs.push(("MissingRequiredClientCapabilityError", true)),
        -32022 => defs.push(("UnsupportedProtocolVersionError", true)),
        -32700 => defs.push(("ParseError", false)),
        -32600 => defs.push(("InvalidRequestError", false)),
        -32601 => defs.push(("MethodNotFoundError", false)),
        -32602 => defs.push(("InvalidParamsError", false)),
        -32603 => defs.push(("InternalError", false)),
        _ => {}
    }
    defs
}

/// Validates one message the server sent in answer to a request for `request_method`.
/// Panics with every violation found.
pub fn validate_server_message(request_method: &str, message: &Value) {
    let mut failures = Vec::new();
    let mut unnamed = None;
    let mut run = |name: &str, instance: &Value| {
        if let Err(e) = check(name, instance) {
            failures.push(e);
        }
    };
    let has = |key: &str| message.get(key).is_some();
    if has("method") {
        assert!(
            !has("id"),
            "the server sent a request ({message}) on a 2026-07-28 response stream; it must not"
        );
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        run("JSONRPCNotification", message);
        if method == "notifications/tasks" {
            if let Err(e) = check_in(TASKS, "TaskStatusNotification", message) {
                failures.push(e);
            }
        } else {
            run(notification_def(method), message);
        }
    } else if let Some(error) = message.get("error") {
        let code = error
            .get("code")
            .and_then(Value::as_i64)
            .unwrap_or_default();
        for (name, whole) in error_defs(code) {
            run(name, if whole { message } else { error });
        }
    } else if let Some(result) = message.get("result") {
        run("JSONRPCResultResponse", message);
        // The spec's per-response field: every result SHOULD name the server.
        let server_info = &result["_meta"]["io.modelcontextprotocol/serverInfo"];
        if !(server_info["name"].is_string() && server_info["version"].is_string()) {
            unnamed = Some(format!(
                "the result does not name the server in _meta (io.modelcontextprotocol/serverInfo): {result}"
            ));
        }
        let tasks_def = match request_method {
            "tasks/get" => Some("GetTaskResult"),
            "tasks/update" => Some("UpdateTaskResult"),
            "tasks/cancel" => Some("CancelTaskResult"),
            _ => None,
        };
        match result.get("resultType").and_then(Value::as_str) {
            Some("input_required") => run("InputRequiredResult", result),
            Some("task") => {
                if let Err(e) = check_in(TASKS, "CreateTaskResult", result) {
                    failures.push(e);
                }
            }
            _ => match tasks_def {
                Some(name) => {
                    if let Err(e) = check_in(TASKS, name, result) {
                        failures.push(e);
                    }
                }
                None => run(result_def(request_method), result),
            },
        }
    } else {
        failures.push(format!(
            "neither a notification, a result nor an error: {message}"
        ));
    }
    failures.extend(unnamed);
    if !failures.is_empty() {
        panic!(
            "the server sent a message that violates the MCP 2026-07-28 schema (request method {request_method}):\n{}",
            failures.join("\n")
        );
    }
}
