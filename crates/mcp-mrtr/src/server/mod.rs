//! The protocol server: method dispatch for the 2026-07-28 wire over a [`Registry`], with the MRTR
//! [`Engine`] for the methods that may ask for input. It turns requests into results or JSON-RPC
//! errors and knows nothing about HTTP.

pub mod events;
mod reply;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tracing::Instrument as _;

pub use events::{Events, ServerEvent, Subscription, WeakEvents};
pub use reply::{Handled, Reply, ResultMeta};
use reply::{decorate, finish};

use crate::auth::Principal;
use crate::drain::Drain;
use crate::mrtr::{Asker, Call, Engine, Notifier, Outcome, TaskMode};
use crate::observe;
use crate::protocol::error::{INVALID_PARAMS, LEGACY_RESOURCE_NOT_FOUND, excerpt};
use crate::protocol::input::parse_input_responses;
use crate::protocol::jsonrpc::success_bytes;
use crate::protocol::version::{self, TASKS_EXTENSION};
use crate::protocol::{Method, ProtocolError, RequestMeta};
use crate::registry::Registry;
use crate::store::{Owner, TaskStore};
use crate::tasks::{TaskSettings, Tasks, WeakTasks};
use crate::trace_context;

/// At shutdown, how long the announcements of the tasks' last changes may take to reach the
/// other replicas before the server exits.
const LAST_ANNOUNCEMENTS: Duration = Duration::from_secs(2);

/// The identity a server reports in `server/discover`, and by name and version in every result of
/// the 2026-07-28 wire.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// The server's name, reported in `serverInfo`.
    pub name: String,
    /// The server's version, reported in `serverInfo`.
    pub version: String,
    /// Guidance for the client or model on how to use the server, sent as `instructions`.
    pub instructions: Option<String>,
}

/// Freshness hints on cacheable results (`ttlMs`), set with [`Settings::cache`](crate::service::Settings::cache).
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    /// `ttlMs` on `server/discover` results.
    pub discover_ttl_ms: u64,
    /// `ttlMs` on `tools/list`, `prompts/list`, `resources/list` and `resources/templates/list`.
    pub list_ttl_ms: u64,
    /// `ttlMs` on `resources/read` results, which are scoped private to the caller.
    pub read_ttl_ms: u64,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            discover_ttl_ms: 3_600_000,
            list_ttl_ms: 300_000,
            read_ttl_ms: 60_000,
        }
    }
}

/// Who asks, with what `_meta`, and where request-scoped notifications go.
pub struct RequestEnv {
    /// Who is calling.
    pub principal: Principal,
    /// Whose share of the continuation store the call's rounds count against.
    pub owner: Owner,
    /// The request's `_meta` (or, for a legacy session, one built from the session).
    pub meta: RequestMeta,
    /// Where progress and log notifications go; `None` when the reply is not a stream.
    pub notifier: Option<Notifier>,
    /// Which wire the request came in on, and so how results are shaped and questions asked.
    pub era: Era,
}

/// Which protocol era a request is served in.
#[derive(Clone)]
pub enum Era {
    /// 2026-07-28: stateless, results carry `resultType`, questions come back as `input_required`.
    Modern,
    /// 2025-11-25 under a session: plain results, questions sent to the client and awaited by
    /// its live asker.
    Legacy(Arc<dyn Asker>),
}

/// A protocol server: one registry, engine and event hub, shared by every request and transport.
pub struct Server {
    registry: Arc<Registry>,
    engine: Engine,
    info: ServerInfo,
    /// What every modern result carries in `_meta`: `info`'s name and version.
    result_meta: ResultMeta,
    events: Events,
    cache: CachePolicy,
    tasks: Option<Tasks>,
}

/// Where a server keeps its tasks, and how it runs them.
pub struct TaskConfig {
    /// The store every replica reads tasks from.
    pub store: Arc<dyn TaskStore>,
    /// Time-to-live, poll interval and lease.
    pub settings: TaskSettings,
    /// Begun when the server shuts down: the tasks running here then get `shutdown_grace` to
    /// finish, and hold the drain open until they have (see [`Drain::released`]).
    pub drain: Drain,
    /// How long running tasks may take to finish once the drain begins.
    pub shutdown_grace: Duration,
}

impl Server {
    /// A server over `registry` that runs MRTR handlers with `engine`, reports `info` in discovery,
    /// publishes change events through `events` and marks cacheable results as `cache` says.
    /// With `tasks`, it offers the Tasks extension.
    pub fn new(
        registry: Registry,
        engine: Engine,
        info: ServerInfo,
        events: Events,
        cache: CachePolicy,
        tasks: Option<TaskConfig>,
    ) -> Arc<Self> {
        let registry = Arc::new(registry);
        let tasks = tasks.map(|config| {
            let announcer = events.clone();
            let announce = Arc::new(move |id: &str| {
                announcer.notify(ServerEvent::TaskChanged(id.to_owned()));
            });
            let tasks = Tasks::new(config.store, config.settings, registry.clone(), announce);
            tokio::spawn(hear_task_changes(tasks.downgrade(), events.subscribe()));
            let relayed = events.downgrade();
            tasks.wind_down_on(config.drain, config.shutdown_grace, move || async move {
                if let Some(events) = relayed.upgrade() {
                    events.published(LAST_ANNOUNCEMENTS).await;
                }
            });
            tasks
        });
        Arc::new(Self {
            registry,
            engine,
            result_meta: ResultMeta::new(&info.name, &info.version),
            info,
            events,
            cache,
            tasks,
        })
    }

    /// The server's tasks, when it offers the Tasks extension.
    pub fn tasks(&self) -> Option<&Tasks> {
        self.tasks.as_ref()
    }

    /// What the server offers.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The identity reported in discovery and, for legacy sessions, in `initialize`.
    pub fn info(&self) -> &ServerInfo {
        &self.info
    }

    /// The MRTR engine: sealing keys, continuation store, state lifetime.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The hub of change events that `subscriptions/listen` streams carry.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// The response that ends `subscription` gracefully when the server tears it down (on
    /// shutdown): a complete result tagged with the subscription's id, naming the server.
    pub fn subscription_ended(&self, subscription: &Subscription) -> Option<Vec<u8>> {
        let id = subscription.id.as_ref()?;
        let mut result = Map::new();
        result.insert("resultType".into(), json!("complete"));
        result.insert("_meta".into(), subscription.meta());
        self.result_meta.add_to(&mut result);
        Some(success_bytes(id, &result))
    }

    /// Whether `method` exists on this server's 2026-07-28 wire (others get -32601 / HTTP 404):
    /// a method of an area (tools, prompts, resources) only when the registry offers that area,
    /// and `completion/complete` only with prompts to complete the arguments of.
    pub fn implements(&self, method: Method) -> bool {
        if method.is_task_method() {
            return self.tasks.is_some();
        }
        method.is_modern()
            && match method.area() {
                Some("tools") => self.registry.has_tools(),
                Some("prompts") => self.registry.has_prompts(),
                Some("resources") => self.registry.has_resources(),
                // Only a prompt's arguments have values to offer.
                Some("completion") => self.registry.has_prompts(),
                _ => true,
            }
    }

    /// The capabilities declared in `server/discover` (with the Tasks extension when the server
    /// keeps tasks).
    pub fn capabilities(&self) -> Value {
        let mut caps = Map::new();
        if self.registry.has_tools() {
            caps.insert("tools".into(), json!({ "listChanged": true }));
        }
        if self.registry.has_prompts() {
            caps.insert("prompts".into(), json!({ "listChanged": true }));
        }
        if self.registry.has_resources() {
            caps.insert(
                "resources".into(),
                json!({ "listChanged": true, "subscribe": true }),
            );
        }
        if self.registry.has_prompts() {
            caps.insert("completions".into(), json!({}));
        }
        caps.insert("logging".into(), json!({}));
        if self.tasks.is_some() {
            caps.insert("extensions".into(), json!({ TASKS_EXTENSION: {} }));
        }
        Value::Object(caps)
    }

    /// Handles one request of the 2026-07-28 wire (`subscriptions/listen` is the transport's).
    pub async fn handle(
        &self,
        method: Method,
        params: &Map<String, Value>,
        env: RequestEnv,
    ) -> Result<Reply, ProtocolError> {
        let count = observe::RequestCount::start(method);
        let span = tracing::info_span!(
            "mcp.request",
            otel.name = method.as_str(),
            otel.kind = "server",
            rpc.system = "mcp",
            rpc.method = method.as_str(),
        );
        trace_context::adopt(&span, &env.meta.trace);
        let reply = self.dispatch(method, params, env).instrument(span).await;
        let outcome = match &reply {
            Ok(Reply::InputRequired(..)) => "input_required",
            Ok(Reply::Task(_)) => "task",
            Ok(_) => "complete",
            Err(error) => observe::error_outcome(error.code),
        };
        count.ended(outcome);
        reply
    }

    async fn dispatch(
        &self,
        method: Method,
        params: &Map<String, Value>,
        env: RequestEnv,
    ) -> Result<Reply, ProtocolError> {
        let modern = matches!(env.era, Era::Modern).then_some(&self.result_meta);
        if method.is_paginated() {
            one_page(params)?;
        }
        let (result, ttl_ms, scope) = match method {
            Method::ServerDiscover => (self.discover(), Some(self.cache.discover_ttl_ms), "public"),
            Method::ToolsList => {
                let tools: Vec<Value> = self
                    .registry
                    .listed_tools()
                    .map(|t| t.definition())
                    .collect();
                (
                    json!({ "tools": tools }),
                    Some(self.cache.list_ttl_ms),
                    "public",
                )
            }
            Method::PromptsList => {
                let prompts: Vec<Value> = self
                    .registry
                    .prompts()
                    .iter()
                    .map(|p| p.definition())
                    .collect();
                (
                    json!({ "prompts": prompts }),
                    Some(self.cache.list_ttl_ms),
                    "public",
                )
            }
            Method::ResourcesList => {
                let resources: Vec<Value> = self
                    .registry
                    .resources()
                    .iter()
                    .map(|r| r.definition())
                    .collect();
                (
                    json!({ "resources": resources }),
                    Some(self.cache.list_ttl_ms),
                    "public",
                )
            }
            Method::ResourcesTemplatesList => {
                let templates: Vec<Value> = self
                    .registry
                    .templates()
                    .iter()
                    .map(|t| t.definition())
                    .collect();
                (
                    json!({ "resourceTemplates": templates }),
                    Some(self.cache.list_ttl_ms),
                    "public",
                )
            }
            Method::CompletionComplete => (self.complete(params)?, None, ""),
            Method::ToolsCall => {
                return self
                    .call_tool(params, env)
                    .await
                    .map(|r| decorate(r, modern, None));
            }
            Method::TasksGet | Method::TasksUpdate | Method::TasksCancel => {
                let result = self.serve_task(method, params, &env).await?;
                return Ok(decorate(Reply::Complete(result), modern, None));
            }
            Method::PromptsGet => {
                return self
                    .get_prompt(params, env)
                    .await
                    .map(|r| decorate(r, modern, None));
            }
            Method::ResourcesRead => {
                let hints = (self.cache.read_ttl_ms, "private");
                return self
                    .read_resource(params, env)
                    .await
                    .map(|r| decorate(r, modern, Some(hints)));
            }
            other => return Err(ProtocolError::method_not_found(other.as_str())),
        };
        Ok(decorate(
            Reply::Complete(result),
            modern,
            ttl_ms.map(|ttl| (ttl, scope)),
        ))
    }

    fn discover(&self) -> Value {
        let mut result = json!({
            "supportedVersions": version::supported(),
            "capabilities": self.capabilities(),
        });
        if let Some(instructions) = &self.info.instructions {
            result["instructions"] = json!(instructions);
        }
        result
    }

    async fn call_tool(
        &self,
        params: &Map<String, Value>,
        env: RequestEnv,
    ) -> Result<Reply, ProtocolError> {
        let name = required_str(params, "name")?;
        let tool = self.registry.tool(name).ok_or_else(|| {
            ProtocolError::invalid_params(format!("Unknown tool: {}", excerpt(name)))
        })?;
        let no_arguments = Value::Object(Map::new());
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => &no_arguments,
            Some(args @ Value::Object(_)) => args,
            Some(_) => return Err(ProtocolError::invalid_params("arguments must be an object")),
        };
        let tasks = match (&self.tasks, &env.era) {
            (Some(tasks), Era::Modern) if env.meta.capabilities.tasks => Some(tasks),
            _ => None,
        };
        // Kept for a call that goes on in its request when no task can be kept for it.
        let notifier = tasks.and_then(|_| env.notifier.clone());
        let offered = self.tasks.is_some() && matches!(env.era, Era::Modern);
        let mut call = engine_call(Method::ToolsCall, name, arguments, params, env);
        call.tasks = match (tasks, offered) {
            (Some(_), _) => TaskMode::Available,
            (None, true) => TaskMode::Undeclared,
            (None, false) => TaskMode::Unavailable,
        };
        let outcome = self
            .engine
            .run(call, |ctx| tool.call(ctx, arguments.clone()))
            .await?;
        let (seed, tasks) = match (outcome, tasks) {
            (Outcome::Task(seed), Some(tasks)) => (seed, tasks),
            (outcome, _) => return finish(outcome),
        };
        let why = match tasks.create(name, arguments, &seed).await {
            Ok(Ok(created)) => {
                seed.answers_taken();
                return Ok(Reply::Task(created));
            }
            Ok(Err(why)) => why,
            Err(error) => {
                self.engine.give_back(*seed).await;
                return Err(error);
            }
        };
        let call = Call {
            method: Method::ToolsCall,
            name,
            arguments,
            params,
            principal: seed.principal.clone(),
            owner: seed.owner.clone(),
            meta: seed.meta.clone(),
            notifier,
            live_asker: None,
            tasks: TaskMode::Unavailable,
        };
        let outcome = self
            .engine
            .continue_untasked(call, *seed, why, |ctx| tool.call(ctx, arguments.clone()))
            .await?;
        finish(outcome)
    }

    /// `tasks/get`, `tasks/update` and `tasks/cancel`, for clients that declared the extension.
    async fn serve_task(
        &self,
        method: Method,
        params: &Map<String, Value>,
        env: &RequestEnv,
    ) -> Result<Value, ProtocolError> {
        let Some(tasks) = &self.tasks else {
            return Err(ProtocolError::method_not_found(method.as_str()));
        };
        if !env.meta.capabilities.tasks {
            return Err(ProtocolError::missing_capability(
                json!({ "extensions": { TASKS_EXTENSION: {} } }),
            ));
        }
        let id = required_str(params, "taskId")?;
        match method {
            Method::TasksGet => tasks.get(&env.principal, id).await,
            Method::TasksUpdate => {
                if !params.contains_key("inputResponses") {
                    return Err(ProtocolError::invalid_params("Missing inputResponses"));
                }
                let responses = parse_input_responses(params)?;
                tasks.update(&env.principal, id, responses).await?;
                Ok(json!({}))
            }
            _ => {
                tasks.cancel(&env.principal, id).await?;
                Ok(json!({}))
            }
        }
    }

    async fn get_prompt(
        &self,
        params: &Map<String, Value>,
        env: RequestEnv,
    ) -> Result<Reply, ProtocolError> {
        let name = required_str(params, "name")?;
        let prompt = self.registry.prompt(name).ok_or_else(|| {
            ProtocolError::invalid_params(format!("Unknown prompt: {}", excerpt(name)))
        })?;
        let arguments = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(args)) => args.clone(),
            Some(_) => return Err(ProtocolError::invalid_params("arguments must be an object")),
        };
        // The schema gives prompt arguments as strings; a handler is never handed another type.
        if let Some((key, _)) = arguments.iter().find(|(_, value)| !value.is_string()) {
            return Err(ProtocolError::invalid_params(format!(
                "Prompt argument {} must be a string",
                excerpt(key)
            )));
        }
        let missing = prompt.missing_arguments(&arguments);
        if !missing.is_empty() {
            return Err(ProtocolError::invalid_params(format!(
                "Missing required arguments: {}",
                missing.join(", ")
            )));
        }
        let bound = Value::Object(arguments.clone());
        let call = engine_call(Method::PromptsGet, name, &bound, params, env);
        let outcome = self
            .engine
            .run(call, |ctx| prompt.get(ctx, arguments))
            .await?;
        finish(outcome)
    }

    async fn read_resource(
        &self,
        params: &Map<String, Value>,
        env: RequestEnv,
    ) -> Result<Reply, ProtocolError> {
        let uri = required_str(params, "uri")?;
        // Each revision's own code for an unknown resource.
        let not_found = match env.era {
            Era::Modern => INVALID_PARAMS,
            Era::Legacy(_) => LEGACY_RESOURCE_NOT_FOUND,
        };
        let call = engine_call(Method::ResourcesRead, uri, &Value::Null, params, env);
        let outcome = if let Some(resource) = self.registry.resource(uri) {
            self.engine.run(call, |ctx| resource.read(ctx)).await?
        } else if let Some((template, vars)) = self.registry.template_for(uri) {
            self.engine
                .run(call, |ctx| template.read(ctx, uri.to_owned(), vars))
                .await?
        } else {
            let message = format!("Resource not found: {}", excerpt(uri));
            return Err(ProtocolError::new(not_found, message).with_data(json!({ "uri": uri })));
        };
        finish(outcome)
    }

    fn complete(&self, params: &Map<String, Value>) -> Result<Value, ProtocolError> {
        let reference = params
            .get("ref")
            .and_then(Value::as_object)
            .ok_or_else(|| ProtocolError::invalid_params("Missing ref"))?;
        let argument = params
            .get("argument")
            .and_then(Value::as_object)
            .ok_or_else(|| ProtocolError::invalid_params("Missing argument"))?;
        let arg_name = required_str(argument, "name")?;
        let prefix = argument
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let values = match reference.get("type").and_then(Value::as_str) {
            Some("ref/prompt") => {
                let name = required_str(reference, "name")?;
                let prompt = self.registry.prompt(name).ok_or_else(|| {
                    ProtocolError::invalid_params(format!("Unknown prompt: {}", excerpt(name)))
                })?;
                prompt.complete(arg_name, prefix)
            }
            Some("ref/resource") => Vec::new(),
            _ => {
                return Err(ProtocolError::invalid_params(
                    "ref.type must be ref/prompt or ref/resource",
                ));
            }
        };
        let total = values.len();
        let shown: Vec<String> = values.into_iter().take(100).collect();
        Ok(json!({ "completion": { "values": shown, "total": total, "hasMore": total > 100 } }))
    }
}

/// The engine's view of a request; the request's caller, `_meta` and notifier move into it.
fn engine_call<'a>(
    method: Method,
    name: &'a str,
    arguments: &'a Value,
    params: &'a Map<String, Value>,
    env: RequestEnv,
) -> Call<'a> {
    Call {
        method,
        name,
        arguments,
        params,
        principal: env.principal,
        owner: env.owner,
        meta: env.meta,
        notifier: env.notifier,
        live_asker: match env.era {
            Era::Legacy(asker) => Some(asker),
            Era::Modern => None,
        },
        tasks: TaskMode::Unavailable,
    }
}

/// Tells the tasks of every task change any replica announced, so a worker running here stops
/// when its task was cancelled elsewhere. Ends when the tasks are gone (the server and every
/// worker it started).
async fn hear_task_changes(tasks: WeakTasks, mut events: broadcast::Receiver<ServerEvent>) {
    loop {
        match events.recv().await {
            Ok(ServerEvent::TaskChanged(id)) => match tasks.upgrade() {
                Some(tasks) => tasks.changed(&id),
                None => return,
            },
            Err(RecvError::Lagged(_)) => match tasks.upgrade() {
                Some(tasks) => tasks.changed_unheard(),
                None => return,
            },
            Ok(_) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

fn required_str<'a>(params: &'a Map<String, Value>, key: &str) -> Result<&'a str, ProtocolError> {
    match params.get(key) {
        Some(Value::String(value)) => Ok(value),
        Some(_) => Err(ProtocolError::invalid_params(format!(
            "{key} must be a string"
        ))),
        None => Err(ProtocolError::invalid_params(format!("Missing {key}"))),
    }
}

/// Checks a list request's `cursor`. Lists come whole, in one page, so this server never gives a
/// cursor, and any cursor a client sends is one it did not give: -32602, as the pagination
/// utility asks for invalid cursors. A null cursor is none.
fn one_page(params: &Map<String, Value>) -> Result<(), ProtocolError> {
    match params.get("cursor") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(_)) => Err(ProtocolError::invalid_params(
            "Invalid cursor: this server gives its lists in one page and no cursors",
        )),
        Some(_) => Err(ProtocolError::invalid_params("cursor must be a string")),
    }
}
