//! Shared support for the integration tests: an in-process server on a real socket with test
//! tools, a JSON-RPC client that speaks the 2026-07-28 Streamable HTTP wire over reqwest, and a
//! validator that checks every message the server sends against the official JSON schema.
//!
//! Each test file that uses it declares `mod support;`; not every file uses every helper.
#![allow(dead_code)]

pub mod cluster;
pub mod legacy;
pub mod movies;
pub mod openai;
pub mod postgres;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use moviedb_mcp::app;
use moviedb_mcp::auth::{AuthError, Authenticator, Principal};
use moviedb_mcp::config::ServeArgs;
use moviedb_mcp::mrtr::{HandlerError, RequestContext, StateSealer};
use moviedb_mcp::protocol::LogLevel;
use moviedb_mcp::protocol::content::{
    CallToolResult, Content, GetPromptResult, PromptMessage, ReadResourceResult, ResourceContents,
};
use moviedb_mcp::protocol::input::{Elicitation, Sampling, SamplingParams};
use moviedb_mcp::registry::{NoArguments, Prompt, Registry, Resource, ResourceTemplate, Tool};
use moviedb_mcp::server::{Events, ServerEvent, ServerInfo};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

/// The protocol revision the tests speak.
pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// Upper bound for any single HTTP exchange, so a broken server fails a test instead of hanging it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The tools `tools/list` shows, in registration order (hidden trigger tools are not listed).
pub const LISTED_TOOLS: [&str; 10] = [
    "simple_text",
    "greet",
    "three_questions",
    "remembered_lookup",
    "progress_steps",
    "chatty",
    "slow_progress",
    "needs_sampling",
    "ask_model",
    "regional",
];

// ---------------------------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------------------------

/// Resolves the caller from an `X-Test-User` header; without it the caller is anonymous.
pub struct TestUserAuthenticator;

impl Authenticator for TestUserAuthenticator {
    fn authenticate(&self, headers: &axum::http::HeaderMap) -> Result<Principal, AuthError> {
        match headers.get("x-test-user") {
            None => Ok(Principal::Anonymous),
            Some(value) => match value.to_str() {
                Ok(name) if !name.trim().is_empty() => Ok(Principal::User(name.trim().to_owned())),
                _ => Err(AuthError("X-Test-User must be a non-empty name".into())),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The server under test
// ---------------------------------------------------------------------------------------------

/// Settings a test may change; everything else is the server's ordinary configuration.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub state_ttl_secs: u64,
    pub max_body_bytes: usize,
    pub allowed_origins: Vec<String>,
    pub keepalive_secs: u64,
    /// Shared continuation store; in memory when `None`.
    pub redis_url: Option<String>,
    /// Sealing keys; a fresh key per server when `None`.
    pub state_keys: Option<String>,
    /// How long a legacy call waits for the client's answer.
    pub legacy_request_timeout_secs: u64,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            state_ttl_secs: 600,
            max_body_bytes: 1024 * 1024,
            allowed_origins: Vec::new(),
            keepalive_secs: 15,
            redis_url: None,
            state_keys: None,
            legacy_request_timeout_secs: 20,
        }
    }
}

/// What the test tools record about their own execution, so tests can tell what really ran.
#[derive(Debug, Default)]
pub struct Probes {
    /// Times the `greet` handler started (any round).
    pub greet_runs: AtomicUsize,
    /// Times the work `remembered_lookup` remembers actually ran.
    pub lookup_work_runs: AtomicUsize,
    /// `slow_progress` started its work.
    pub slow_started: AtomicBool,
    /// `slow_progress` reached its end.
    pub slow_finished: AtomicBool,
    /// `slow_progress`'s future was dropped before it reached its end (it was cancelled).
    pub slow_dropped_early: AtomicBool,
}

impl Probes {
    pub fn greet_runs(&self) -> usize {
        self.greet_runs.load(Ordering::SeqCst)
    }

    pub fn lookup_work_runs(&self) -> usize {
        self.lookup_work_runs.load(Ordering::SeqCst)
    }
}

/// A server started in-process from the library, listening on 127.0.0.1 on a free port.
pub struct TestServer {
    addr: SocketAddr,
    pub probes: Arc<Probes>,
    pub events: Events,
    shutdown: Option<oneshot::Sender<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(ServerOptions::default()).await
    }

    pub async fn start_with(options: ServerOptions) -> Self {
        let probes = Arc::new(Probes::default());
        let events = Events::new();
        let registry = test_registry(&probes, &events);
        let args = ServeArgs {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_keys: Some(
                options
                    .state_keys
                    .unwrap_or_else(|| StateSealer::generate_spec("test")),
            ),
            state_ttl_secs: options.state_ttl_secs,
            continuation_capacity: 10_000,
            allowed_origins: options.allowed_origins,
            max_body_bytes: options.max_body_bytes,
            keepalive_secs: options.keepalive_secs,
            redis_url: options.redis_url,
            redis_prefix: format!("moviedb-test-{}:", std::process::id()),
            redis_timeout_ms: 1000,
            legacy_request_timeout_secs: options.legacy_request_timeout_secs,
            legacy_session_ttl_secs: 3600,
        };
        let info = ServerInfo {
            name: "moviedb-mcp-tests".into(),
            version: "0.0.0-test".into(),
            instructions: Some("Test server".into()),
        };
        let router = app::router(
            &args,
            registry,
            info,
            events.clone(),
            Arc::new(TestUserAuthenticator),
        )
        .await
        .expect("the router builds");
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let (shutdown, stop) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.await;
            };
            if let Err(e) = moviedb_mcp::transport::serve(listener, router, stopped).await {
                eprintln!("test server stopped with an error: {e}");
            }
        });
        Self {
            addr,
            probes,
            events,
            shutdown: Some(shutdown),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, app::MCP_PATH)
    }

    /// An anonymous client of this server.
    pub fn client(&self) -> Client {
        Client::new(self.url())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

type ToolOutcome = Result<CallToolResult, HandlerError>;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct GreetArgs {
    /// The greeting to use, "Hello" by default.
    #[serde(default)]
    greeting: Option<String>,
}

fn name_form() -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"type": "string", "description": "Your name"}},
        "required": ["name"]
    })
}

fn text_form(field: &str) -> Value {
    json!({
        "type": "object",
        "properties": {field: {"type": "string"}},
        "required": [field]
    })
}

fn accepted(answer: &Elicitation, field: &str) -> Option<String> {
    answer
        .content()?
        .get(field)
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
}

fn no_args<F, Fut>(name: &str, description: &str, handler: F) -> Tool
where
    F: Fn(RequestContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ToolOutcome> + Send + 'static,
{
    Tool::new(name, description, move |ctx, _: NoArguments| handler(ctx))
}

/// Marks `slow_progress` as dropped early when its future goes away before it finished.
struct DropProbe(Arc<Probes>);

impl Drop for DropProbe {
    fn drop(&mut self) {
        if !self.0.slow_finished.load(Ordering::SeqCst) {
            self.0.slow_dropped_early.store(true, Ordering::SeqCst);
        }
    }
}

/// The tools, prompt and resources the tests use.
fn test_registry(probes: &Arc<Probes>, events: &Events) -> Registry {
    let mut registry = Registry::new();

    registry.add_tool(no_args("simple_text", "Returns a fixed text", |_| async {
        Ok(CallToolResult::text("simple text"))
    }));

    let greet_probes = probes.clone();
    registry.add_tool(Tool::new(
        "greet",
        "Asks the user's name (key user_name), then greets them; without form elicitation it greets a stranger",
        move |ctx, args: GreetArgs| {
            let probes = greet_probes.clone();
            async move {
                probes.greet_runs.fetch_add(1, Ordering::SeqCst);
                let greeting = args.greeting.unwrap_or_else(|| "Hello".into());
                let answer = ctx
                    .elicit("user_name", "What is your name?", name_form())
                    .await?;
                let name = match &answer {
                    Elicitation::Unsupported => "stranger".to_owned(),
                    other => accepted(other, "name").unwrap_or_else(|| "anonymous".into()),
                };
                Ok(CallToolResult::text(format!("{greeting}, {name}!")))
            }
        },
    ));

    registry.add_tool(no_args(
        "three_questions",
        "Asks name, colour and food in three rounds",
        |ctx| async move {
            let first = ctx
                .elicit("step1", "What is your name?", text_form("name"))
                .await?;
            let name = accepted(&first, "name").unwrap_or_default();
            let second = ctx
                .elicit(
                    "step2",
                    "What is your favourite colour?",
                    text_form("color"),
                )
                .await?;
            let color = accepted(&second, "color").unwrap_or_default();
            let third = ctx
                .elicit("step3", "What is your favourite food?", text_form("food"))
                .await?;
            let food = accepted(&third, "food").unwrap_or_default();
            Ok(CallToolResult::text(format!(
                "{name} likes {color} and {food}"
            )))
        },
    ));

    let lookup_probes = probes.clone();
    registry.add_tool(no_args(
        "remembered_lookup",
        "Does an expensive lookup once, then asks for a rating",
        move |ctx| {
            let probes = lookup_probes.clone();
            async move {
                let lookup: String = ctx
                    .remember("lookup", || async {
                        let run = probes.lookup_work_runs.fetch_add(1, Ordering::SeqCst) + 1;
                        Ok(format!("lookup #{run}"))
                    })
                    .await?;
                let form = json!({
                    "type": "object",
                    "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}},
                    "required": ["stars"]
                });
                let answer = ctx.elicit("rating", "How many stars?", form).await?;
                let stars = accepted(&answer, "stars").unwrap_or_else(|| "no".into());
                Ok(CallToolResult::text(format!(
                    "{lookup}: rated {stars} stars"
                )))
            }
        },
    ));

    registry.add_tool(no_args(
        "progress_steps",
        "Reports progress 1, 2 and 3 of 3",
        |ctx| async move {
            for step in 1..=3 {
                ctx.progress(f64::from(step), Some(3.0), Some(&format!("step {step}")))
                    .await;
            }
            Ok(CallToolResult::text("three steps done"))
        },
    ));

    registry.add_tool(no_args(
        "chatty",
        "Logs at debug, info and error",
        |ctx| async move {
            ctx.log(LogLevel::Debug, "tests", json!("debug detail"))
                .await;
            ctx.log(LogLevel::Info, "tests", json!("info message"))
                .await;
            ctx.log(LogLevel::Error, "tests", json!("error message"))
                .await;
            Ok(CallToolResult::text("logged"))
        },
    ));

    let slow_probes = probes.clone();
    registry.add_tool(no_args(
        "slow_progress",
        "Reports progress, then works for a minute",
        move |ctx| {
            let probes = slow_probes.clone();
            async move {
                let _probe = DropProbe(probes.clone());
                probes.slow_started.store(true, Ordering::SeqCst);
                ctx.progress(1.0, Some(100.0), Some("started")).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
                probes.slow_finished.store(true, Ordering::SeqCst);
                Ok(CallToolResult::text("slow done"))
            }
        },
    ));

    registry.add_tool(no_args(
        "needs_sampling",
        "Cannot work without the sampling capability",
        |ctx| async move {
            ctx.require("sampling")?;
            Ok(CallToolResult::text("sampling available"))
        },
    ));

    registry.add_tool(no_args(
        "ask_model",
        "Asks the client's model for a one-line verdict; says why when there is none",
        |ctx| async move {
            let question = SamplingParams::user_text("Give a one-line verdict on Casablanca.", 50);
            Ok(CallToolResult::text(
                match ctx.sample("verdict", question).await? {
                    Sampling::Reply(reply) => format!("model said: {}", reply.text),
                    Sampling::Unsupported => "no model: sampling not declared".to_owned(),
                    Sampling::Failed(why) => format!("no model: {why}"),
                },
            ))
        },
    ));

    registry.add_tool(Tool::with_raw_schema(
        "regional",
        "Echoes its region, which is mirrored in the Mcp-Param-Region header",
        json!({
            "type": "object",
            "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
            "required": ["region"]
        }),
        |_, args| async move {
            let region = args
                .get("region")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            Ok(CallToolResult::text(format!("Region: {region}")))
        },
    ));

    let tools_changed = events.clone();
    registry.add_tool(
        no_args(
            "trigger_tools_changed",
            "Announces a change of the tool list",
            move |_| {
                let events = tools_changed.clone();
                async move {
                    events.notify(ServerEvent::ToolsListChanged);
                    Ok(CallToolResult::text("tools changed"))
                }
            },
        )
        .hidden(),
    );

    let prompts_changed = events.clone();
    registry.add_tool(
        no_args(
            "trigger_prompts_changed",
            "Announces a change of the prompt list",
            move |_| {
                let events = prompts_changed.clone();
                async move {
                    events.notify(ServerEvent::PromptsListChanged);
                    Ok(CallToolResult::text("prompts changed"))
                }
            },
        )
        .hidden(),
    );

    registry.add_prompt(Prompt::new(
        "simple_prompt",
        "A prompt without arguments",
        |_, _| async {
            Ok(GetPromptResult {
                description: None,
                messages: vec![PromptMessage::user(Content::text("A simple prompt."))],
            })
        },
    ));

    registry.add_resource(
        Resource::new("test://static-text", "static-text", |_, uri| async move {
            Ok(ReadResourceResult {
                contents: vec![ResourceContents::text(uri, "text/plain", "Static text.")],
            })
        })
        .mime_type("text/plain"),
    );

    registry.add_template(ResourceTemplate::new(
        "test://items/{id}",
        "item",
        |_, uri, vars| async move {
            let id = vars
                .iter()
                .find(|(name, _)| name == "id")
                .map(|(_, value)| value.clone())
                .unwrap_or_default();
            Ok(ReadResourceResult {
                contents: vec![ResourceContents::text(
                    uri,
                    "text/plain",
                    format!("Item {id}"),
                )],
            })
        },
    ));

    registry
}

// ---------------------------------------------------------------------------------------------
// Schema validation of everything the server sends
// ---------------------------------------------------------------------------------------------

pub mod schema {
    use super::*;

    /// The revision most tests speak.
    pub const MODERN: &str = "2026-07-28";
    /// The revision of legacy (initialize) sessions.
    pub const LEGACY: &str = "2025-11-25";

    /// Where CI places the spec: `shared/` next to the repository.
    pub fn schema_path_of(revision: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/spec")
            .join(revision)
            .join("schema.json")
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
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("cannot read the MCP schema at {}: {e}", path.display())
            });
            let schema: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("the MCP schema at {} is not JSON: {e}", path.display())
            });
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
            run(notification_def(method), message);
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
            if result.get("resultType").and_then(Value::as_str) == Some("input_required") {
                run("InputRequiredResult", result);
            } else {
                run(result_def(request_method), result);
            }
        } else {
            failures.push(format!(
                "neither a notification, a result nor an error: {message}"
            ));
        }
        if !failures.is_empty() {
            panic!(
                "the server sent a message that violates the MCP 2026-07-28 schema (request method {request_method}):\n{}",
                failures.join("\n")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

static NEXT_ID: AtomicI64 = AtomicI64::new(1);

/// Panics unless `structured`, the `structuredContent` of a result of `tool`, fits `declared`,
/// the `outputSchema` the tool declares.
pub fn assert_structured_fits(tool: &str, declared: &Value, structured: &Value) {
    let validator = jsonschema::validator_for(declared)
        .unwrap_or_else(|e| panic!("the outputSchema of {tool} does not compile: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(structured)
        .map(|e| format!("  - at {}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "structuredContent of {tool} does not fit its outputSchema:\n{}\nstructuredContent: {structured}",
        errors.join("\n")
    );
}

/// A fresh numeric JSON-RPC id, unique within the test binary.
pub fn fresh_id() -> Value {
    json!(NEXT_ID.fetch_add(1, Ordering::SeqCst))
}

/// The capabilities a full client declares by default (those of the conformance harness).
pub fn default_capabilities() -> Value {
    json!({"sampling": {}, "elicitation": {"form": {}}, "roots": {"listChanged": true}})
}

/// An `ElicitResult` accepting `content`.
pub fn accept(content: Value) -> Value {
    json!({"action": "accept", "content": content})
}

/// A 2026-07-28 client over reqwest. Cloning shares the connection pools.
#[derive(Clone)]
pub struct Client {
    url: String,
    /// Sends header names in title case (`Mcp-Method`), as many clients do.
    http: reqwest::Client,
    /// Sends header names in lower case (`mcp-method`), as HTTP/2-minded clients do.
    lowercase_http: reqwest::Client,
    user: Option<String>,
    /// Each listed tool's `outputSchema`, read from `tools/list` on the first structured result.
    output_schemas: Arc<tokio::sync::OnceCell<HashMap<String, Value>>>,
}

impl Client {
    pub fn new(url: String) -> Self {
        let http = reqwest::Client::builder()
            .no_proxy()
            .http1_title_case_headers()
            .build()
            .expect("reqwest client");
        let lowercase_http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("reqwest client");
        Self {
            url,
            http,
            lowercase_http,
            user: None,
            output_schemas: Arc::default(),
        }
    }

    /// The same client, authenticated as `name` (an `X-Test-User` header on every request).
    pub fn as_user(&self, name: &str) -> Self {
        Self {
            user: Some(name.to_owned()),
            ..self.clone()
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The underlying HTTP client, for requests that are not JSON-RPC POSTs (GET, DELETE).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Starts a request for `method` with a fresh id, full `_meta` and the standard headers.
    pub fn request(&self, method: &str) -> RpcRequest<'_> {
        RpcRequest {
            client: self,
            method: method.to_owned(),
            params: Map::new(),
            id: Some(fresh_id()),
            capabilities: default_capabilities(),
            meta_extra: Vec::new(),
            meta_removed: Vec::new(),
            omit_meta: false,
            header_overrides: Vec::new(),
            raw_body: None,
            lowercase_header_names: false,
        }
    }

    /// The `outputSchema` `tool` declares, if it is listed with one. The list is read once per
    /// client, before its first tool call, so it never lands between the rounds a test counts.
    async fn output_schema(&self, tool: &str) -> Option<Value> {
        let schemas = self
            .output_schemas
            .get_or_init(|| async {
                // Read directly rather than through `send`, which is what called us.
                let body: Value = self
                    .request("tools/list")
                    .response(REQUEST_TIMEOUT)
                    .await
                    .json()
                    .await
                    .unwrap_or_else(|e| panic!("tools/list did not answer JSON: {e}"));
                body["result"]["tools"]
                    .as_array()
                    .unwrap_or_else(|| panic!("tools/list without tools: {body}"))
                    .iter()
                    .filter_map(|tool| {
                        let name = tool.get("name")?.as_str()?.to_owned();
                        Some((name, tool.get("outputSchema")?.clone()))
                    })
                    .collect()
            })
            .await;
        schemas.get(tool).cloned()
    }

    /// `tools/call` of `name` with `arguments`: the first round of an MRTR call.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Reply {
        self.request("tools/call")
            .params(json!({"name": name, "arguments": arguments}))
            .send()
            .await
    }

    /// A retry of `tools/call`: a new request (new id) with the answers and the state, if any.
    pub async fn retry(
        &self,
        name: &str,
        arguments: Value,
        input_responses: Value,
        request_state: Option<&str>,
    ) -> Reply {
        self.retry_request(name, arguments, input_responses, request_state)
            .send()
            .await
    }

    /// The retry as a request builder, for retries that need more options.
    pub fn retry_request(
        &self,
        name: &str,
        arguments: Value,
        input_responses: Value,
        request_state: Option<&str>,
    ) -> RpcRequest<'_> {
        let mut params = json!({
            "name": name,
            "arguments": arguments,
            "inputResponses": input_responses,
        });
        if let Some(state) = request_state {
            params["requestState"] = json!(state);
        }
        self.request("tools/call").params(params)
    }
}

/// One JSON-RPC POST being built. Every option has a default that makes a valid request.
pub struct RpcRequest<'c> {
    client: &'c Client,
    method: String,
    params: Map<String, Value>,
    id: Option<Value>,
    capabilities: Value,
    meta_extra: Vec<(String, Value)>,
    meta_removed: Vec<String>,
    omit_meta: bool,
    header_overrides: Vec<(String, Option<String>)>,
    raw_body: Option<Vec<u8>>,
    lowercase_header_names: bool,
}

impl RpcRequest<'_> {
    /// The params (an object), without `_meta`, which is added unless omitted.
    pub fn params(mut self, params: Value) -> Self {
        self.params = match params {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => panic!("params must be an object, got {other}"),
        };
        self
    }

    pub fn id(mut self, id: Value) -> Self {
        self.id = Some(id);
        self
    }

    /// Sends a notification: no id.
    pub fn notification(mut self) -> Self {
        self.id = None;
        self
    }

    /// The `clientCapabilities` declared in `_meta`.
    pub fn capabilities(mut self, capabilities: Value) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Adds or replaces a `_meta` key (e.g. `progressToken`, `io.modelcontextprotocol/logLevel`).
    pub fn meta(mut self, key: &str, value: Value) -> Self {
        self.meta_extra.push((key.to_owned(), value));
        self
    }

    pub fn progress_token(self, token: Value) -> Self {
        self.meta("progressToken", token)
    }

    pub fn log_level(self, level: &str) -> Self {
        self.meta(META_LOG_LEVEL, json!(level))
    }

    /// Leaves one key out of `_meta`.
    pub fn without_meta_key(mut self, key: &str) -> Self {
        self.meta_removed.push(key.to_owned());
        self
    }

    /// Leaves `_meta` out entirely.
    pub fn without_meta(mut self) -> Self {
        self.omit_meta = true;
        self
    }

    /// Sets a header, replacing the default of the same name (names are case-insensitive).
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.header_overrides
            .push((name.to_ascii_lowercase(), Some(value.into())));
        self
    }

    /// Leaves a default header out.
    pub fn without_header(mut self, name: &str) -> Self {
        self.header_overrides
            .push((name.to_ascii_lowercase(), None));
        self
    }

    /// Sends `body` as is instead of the JSON-RPC message.
    pub fn raw_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.raw_body = Some(body.into());
        self
    }

    /// Sends header names in lower case on the wire instead of title case.
    pub fn lowercase_header_names(mut self) -> Self {
        self.lowercase_header_names = true;
        self
    }

    /// The id this request carries (None for a notification).
    pub fn request_id(&self) -> Option<&Value> {
        self.id.as_ref()
    }

    fn full_meta(&self) -> Map<String, Value> {
        let mut meta = Map::new();
        meta.insert(META_PROTOCOL_VERSION.into(), json!(PROTOCOL_VERSION));
        meta.insert(
            META_CLIENT_INFO.into(),
            json!({"name": "moviedb-mcp-tests", "version": "1.0.0"}),
        );
        meta.insert(META_CLIENT_CAPABILITIES.into(), self.capabilities.clone());
        for (key, value) in &self.meta_extra {
            meta.insert(key.clone(), value.clone());
        }
        for key in &self.meta_removed {
            meta.remove(key);
        }
        meta
    }

    fn body(&self) -> Vec<u8> {
        if let Some(raw) = &self.raw_body {
            return raw.clone();
        }
        let mut params = self.params.clone();
        if !self.omit_meta {
            params.insert("_meta".into(), Value::Object(self.full_meta()));
        }
        let mut message = json!({"jsonrpc": "2.0", "method": self.method, "params": params});
        if let Some(id) = &self.id {
            message["id"] = id.clone();
        }
        serde_json::to_vec(&message).expect("a JSON value serializes")
    }

    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let mut set = |name: &str, value: &str| {
            headers.insert(
                HeaderName::from_bytes(name.as_bytes()).expect("valid header name"),
                HeaderValue::from_str(value).expect("valid header value"),
            );
        };
        set("content-type", "application/json");
        set("accept", "application/json, text/event-stream");
        set("mcp-protocol-version", PROTOCOL_VERSION);
        set("mcp-method", &self.method);
        let name_field = match self.method.as_str() {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            _ => None,
        };
        if let Some(value) = name_field
            .and_then(|field| self.params.get(field))
            .and_then(Value::as_str)
        {
            set("mcp-name", value);
        }
        if let Some(user) = &self.client.user {
            set("x-test-user", user);
        }
        for (name, value) in &self.header_overrides {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("valid header name");
            match value {
                Some(value) => {
                    headers.insert(
                        name,
                        HeaderValue::from_str(value).expect("valid header value"),
                    );
                }
                None => {
                    headers.remove(name);
                }
            }
        }
        headers
    }

    async fn response(&self, timeout: Duration) -> reqwest::Response {
        let http = if self.lowercase_header_names {
            &self.client.lowercase_http
        } else {
            &self.client.http
        };
        http.post(&self.client.url)
            .headers(self.headers())
            .body(self.body())
            .timeout(timeout)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {} {} failed: {e}", self.client.url, self.method))
    }

    /// Sends the request and reads the whole response. Every message in it is validated against
    /// the schema.
    pub async fn send(self) -> Reply {
        let tool = match self.method.as_str() {
            "tools/call" => self.params.get("name").and_then(Value::as_str),
            _ => None,
        };
        let output_schema = match tool {
            Some(tool) => self.client.output_schema(tool).await.map(|s| (tool, s)),
            None => None,
        };
        let response = self.response(REQUEST_TIMEOUT).await;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .unwrap_or_else(|e| panic!("reading the response to {} failed: {e}", self.method));
        let content_type = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase();
        let messages = if content_type.starts_with("text/event-stream") {
            let mut parser = SseParser::default();
            let mut messages = parser.push(&body);
            messages.extend(parser.finish());
            messages
        } else if body.is_empty() {
            Vec::new()
        } else if content_type.starts_with("application/json") {
            vec![serde_json::from_slice(&body).unwrap_or_else(|e| {
                panic!(
                    "the server's application/json body is not JSON ({e}): {}",
                    String::from_utf8_lossy(&body)
                )
            })]
        } else {
            Vec::new()
        };
        for message in &messages {
            schema::validate_server_message(&self.method, message);
        }
        // A successful structured result must fit the tool's declared outputSchema.
        let result = messages.iter().find_map(|m| m.get("result"));
        if let (Some((tool, declared)), Some(result)) = (&output_schema, result)
            && let Some(structured) = result.get("structuredContent")
            && result.get("isError") != Some(&json!(true))
        {
            assert_structured_fits(tool, declared, structured);
        }
        Reply {
            method: self.method,
            request_id: self.id,
            status,
            headers,
            body,
            messages,
        }
    }

    /// Sends the request and returns the response as a stream of messages, read as they come.
    pub async fn open_stream(self) -> EventStream {
        let response = self.response(Duration::from_secs(120)).await;
        EventStream {
            method: self.method,
            request_id: self.id,
            status: response.status(),
            headers: response.headers().clone(),
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::default(),
            pending: VecDeque::new(),
        }
    }
}

/// A complete response: status, headers, raw body and the JSON-RPC messages it carried.
pub struct Reply {
    pub method: String,
    /// The id the request carried.
    pub request_id: Option<Value>,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// A JSON body's one message, or every `data:` frame of an SSE body, in order.
    pub messages: Vec<Value>,
}

impl Reply {
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or_default()
    }

    pub fn is_event_stream(&self) -> bool {
        self.content_type().starts_with("text/event-stream")
    }

    pub fn is_json(&self) -> bool {
        self.content_type().starts_with("application/json")
    }

    /// The one response message (with `result` or `error`). Panics unless there is exactly one.
    pub fn response(&self) -> &Value {
        let responses: Vec<&Value> = self
            .messages
            .iter()
            .filter(|m| m.get("result").is_some() || m.get("error").is_some())
            .collect();
        assert_eq!(
            responses.len(),
            1,
            "expected exactly one response to {} (HTTP {}): {}",
            self.method,
            self.status,
            self.body_text()
        );
        responses[0]
    }

    /// Notifications that came with the response, in order.
    pub fn notifications(&self) -> Vec<&Value> {
        self.messages
            .iter()
            .filter(|m| m.get("method").is_some())
            .collect()
    }

    /// The result; panics with the body when the server answered with an error.
    pub fn result(&self) -> &Value {
        let response = self.response();
        response.get("result").unwrap_or_else(|| {
            panic!(
                "expected a result for {} but got (HTTP {}): {response}",
                self.method, self.status
            )
        })
    }

    /// The error object; panics when the server answered with a result.
    pub fn error(&self) -> &Value {
        let response = self.response();
        response.get("error").unwrap_or_else(|| {
            panic!(
                "expected an error for {} but got (HTTP {}): {response}",
                self.method, self.status
            )
        })
    }

    pub fn error_code(&self) -> i64 {
        self.error()
            .get("code")
            .and_then(Value::as_i64)
            .expect("error.code is an integer")
    }

    pub fn error_message(&self) -> &str {
        self.error()
            .get("message")
            .and_then(Value::as_str)
            .expect("error.message is a string")
    }

    /// Asserts an error with this HTTP status and JSON-RPC code that echoes the request's id.
    pub fn assert_error(&self, status: u16, code: i64) {
        assert_eq!(
            self.status.as_u16(),
            status,
            "HTTP status for {} (body {})",
            self.method,
            self.body_text()
        );
        assert_eq!(
            self.error_code(),
            code,
            "JSON-RPC error code for {} (body {})",
            self.method,
            self.body_text()
        );
        assert_eq!(
            self.response().get("id"),
            self.request_id.as_ref(),
            "the error response must echo the request id"
        );
    }

    /// `result.resultType`.
    pub fn result_type(&self) -> &str {
        self.result()
            .get("resultType")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("result without resultType: {}", self.result()))
    }

    /// The `requestState` of an `input_required` result.
    pub fn request_state(&self) -> String {
        self.result()
            .get("requestState")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("result without a string requestState: {}", self.result()))
            .to_owned()
    }

    /// The `inputRequests` of an `input_required` result.
    pub fn input_requests(&self) -> &Map<String, Value> {
        self.result()
            .get("inputRequests")
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("result without inputRequests: {}", self.result()))
    }

    /// The text blocks of a `CallToolResult`, joined by newlines.
    pub fn text(&self) -> String {
        self.result()
            .get("content")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("result without content: {}", self.result()))
            .iter()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Splits an SSE body into lines and parses every `data:` line as one JSON message.
#[derive(Default)]
struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    fn push(&mut self, chunk: &[u8]) -> Vec<Value> {
        self.buffer.extend_from_slice(chunk);
        let mut messages = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            if let Some(message) = parse_line(&line) {
                messages.push(message);
            }
        }
        messages
    }

    fn finish(&mut self) -> Vec<Value> {
        let line = std::mem::take(&mut self.buffer);
        parse_line(&line).into_iter().collect()
    }
}

fn parse_line(line: &[u8]) -> Option<Value> {
    let line = String::from_utf8_lossy(line);
    let line = line.trim_end_matches(['\n', '\r']);
    let data = line.strip_prefix("data:")?;
    let data = data.strip_prefix(' ').unwrap_or(data);
    if data.trim().is_empty() {
        return None;
    }
    Some(serde_json::from_str(data).unwrap_or_else(|e| {
        panic!("an SSE data line is not one complete JSON message ({e}): {data}")
    }))
}

/// A response read incrementally (SSE): progress, log messages, subscription events.
pub struct EventStream {
    pub method: String,
    pub request_id: Option<Value>,
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    parser: SseParser,
    pending: VecDeque<Value>,
}

impl EventStream {
    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The next message, validated against the schema; `None` when the stream ended or nothing
    /// arrived within `within`.
    pub async fn next_message(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(message) = self.pending.pop_front() {
                schema::validate_server_message(&self.method, &message);
                return Some(message);
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) | Ok(None) => return None,
                Ok(Some(Err(e))) => panic!("reading the {} stream failed: {e}", self.method),
                Ok(Some(Ok(chunk))) => self.pending.extend(self.parser.push(&chunk)),
            }
        }
    }

    /// The next message; panics when none arrives within `within`.
    pub async fn expect_message(&mut self, within: Duration) -> Value {
        match self.next_message(within).await {
            Some(message) => message,
            None => panic!("no message on the {} stream within {within:?}", self.method),
        }
    }
}
