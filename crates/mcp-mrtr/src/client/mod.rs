//! A scripted 2026-07-28 client, for testing MRTR servers (feature `client`).
//!
//! [`Client::converse`] runs a whole MRTR conversation: it calls a tool, answers every
//! `input_required` round with a closure (or [`canned`] answers), calls again with the echoed
//! `requestState`, and keeps every round for assertions:
//!
//! ```no_run
//! # async fn demo() {
//! use mcp_mrtr::client::{Client, accept};
//! use serde_json::json;
//!
//! let client = Client::new("http://127.0.0.1:3000/mcp".into());
//! let talk = client.converse("order", json!({"item": "tea"}), |_, _| accept(json!({"count": 2}))).await;
//! assert_eq!((talk.rounds.len(), talk.last().text()), (2, "Ordered 2 × tea".into()));
//! # }
//! ```
//!
//! For rounds built by hand (a tampered or replayed state, a missing header, a bad `_meta`),
//! [`Client::request`] starts a request that is valid by default and lets a test change any part
//! of it; [`Client::call_tool`] and [`Client::retry`] are the two rounds one at a time.
//!
//! It is a test client: what a server answers is read by accessors that panic, quoting the body,
//! when the answer is not what the test expects, and a server that cannot be reached panics too.
//! A tool call mirrors the tool's `x-mcp-header` parameters into `Mcp-Param-*` headers, and
//! every successful structured tool result is checked against the tool's declared
//! `outputSchema` (both read once from `tools/list`); [`Client::observe`] sees every message.

mod conversation;
mod reply;
mod request;
mod sse;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::registry::{HeaderParam, header_params};

pub use conversation::{Conversation, canned};
pub use reply::Reply;
pub use request::RpcRequest;
pub use sse::EventStream;

/// Upper bound for any single HTTP exchange, so a broken server fails a test instead of hanging
/// it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Tries at reading the tool list (for output schemas) before a client gives up.
const LIST_ATTEMPTS: u32 = 5;

type Observer = Arc<dyn Fn(&str, &Value) + Send + Sync>;

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

/// A fresh numeric JSON-RPC id, unique within the process.
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

/// A tool of a `tools/list` result, by name.
fn listed(tool: &Value) -> Option<(String, ListedTool)> {
    let name = tool.get("name")?.as_str()?.to_owned();
    let header_params = tool
        .get("inputSchema")
        .and_then(|schema| header_params(schema).ok())
        .unwrap_or_default();
    let output_schema = tool.get("outputSchema").cloned();
    Some((
        name,
        ListedTool {
            output_schema,
            header_params,
        },
    ))
}

/// A 2026-07-28 client over reqwest. Cloning shares the connection pools.
#[derive(Clone)]
pub struct Client {
    url: String,
    /// Sends header names in title case (`Mcp-Method`), as many clients do.
    http: reqwest::Client,
    /// Sends header names in lower case (`mcp-method`), as HTTP/2-minded clients do.
    lowercase_http: reqwest::Client,
    /// Sent with every request (credentials, say).
    headers: Vec<(String, String)>,
    /// `_meta` `clientInfo`.
    client_info: Value,
    /// Called with the request's method and each message the server sends.
    observer: Option<Observer>,
    /// What `tools/list` says of each tool, read before the first tool call.
    listed_tools: Arc<tokio::sync::OnceCell<HashMap<String, ListedTool>>>,
}

/// What a client needs to know of a listed tool to call it and check its answers.
#[derive(Clone, Default)]
pub(crate) struct ListedTool {
    /// The `outputSchema` its structured results must fit.
    pub(crate) output_schema: Option<Value>,
    /// The arguments mirrored into `Mcp-Param-*` headers. None when its annotations break the
    /// transport's rules: a real client drops such a tool; this one calls it without them, for
    /// the test to see what the server says.
    pub(crate) header_params: Vec<HeaderParam>,
}

impl Client {
    /// A client of the MCP endpoint at `url`.
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
            headers: Vec::new(),
            client_info: json!({"name": "mcp-mrtr-client", "version": env!("CARGO_PKG_VERSION")}),
            observer: None,
            listed_tools: Arc::default(),
        }
    }

    /// The same client, sending `name: value` with every request (`Authorization`, say).
    pub fn with_header(&self, name: &str, value: &str) -> Self {
        let mut client = self.clone();
        client
            .headers
            .retain(|(known, _)| !known.eq_ignore_ascii_case(name));
        client
            .headers
            .push((name.to_ascii_lowercase(), value.to_owned()));
        client
    }

    /// The same client, signed in with `Authorization: Bearer <token>`.
    pub fn with_bearer(&self, token: &str) -> Self {
        self.with_header("authorization", &format!("Bearer {token}"))
    }

    /// The same client, calling `observer` with the request's method and every message the
    /// server sends (to validate them against a schema, or to log them).
    pub fn observe(&self, observer: impl Fn(&str, &Value) + Send + Sync + 'static) -> Self {
        Self {
            observer: Some(Arc::new(observer)),
            ..self.clone()
        }
    }

    fn observe_message(&self, method: &str, message: &Value) {
        if let Some(observer) = &self.observer {
            observer(method, message);
        }
    }

    /// The endpoint's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The underlying HTTP client, for requests that are not JSON-RPC POSTs (GET, DELETE).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Starts a request for `method` with a fresh id, full `_meta` and the standard headers.
    pub fn request(&self, method: &str) -> RpcRequest<'_> {
        RpcRequest::new(self, method)
    }

    /// What `tools/list` says of `tool`. The list is read once per client, before its first
    /// tool call, so it never lands between the rounds a test counts. A list the server refuses
    /// (a bad token, say) is not kept, and the call goes out unchecked for the test to see what
    /// the server says of it.
    pub(super) async fn listed_tool(&self, tool: &str) -> Option<ListedTool> {
        let listing = self
            .listed_tools
            .get_or_try_init(|| async {
                // Read directly rather than through `send`, which is what called us. A balancer
                // in front of a replica going down may answer a moment with its own error page.
                let mut attempts = 1;
                let body: Value = loop {
                    let answer = self.request("tools/list").response(REQUEST_TIMEOUT).await;
                    if answer.status().is_client_error() {
                        // Refused (a bad token, say): asking again changes nothing.
                        return Err(());
                    }
                    match answer.json().await {
                        Ok(body) => break body,
                        Err(e) if attempts == LIST_ATTEMPTS => {
                            panic!("tools/list did not answer JSON, {attempts} times: {e}")
                        }
                        Err(_) => {
                            attempts += 1;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                };
                let tools = body["result"]["tools"].as_array().ok_or(())?;
                Ok::<_, ()>(tools.iter().filter_map(listed).collect())
            })
            .await
            .ok()?;
        listing.get(tool).cloned()
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
