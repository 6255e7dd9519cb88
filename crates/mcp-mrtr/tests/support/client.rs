//! A 2026-07-28 client over reqwest for the tests: requests with full `_meta` and the routing
//! headers by default, every option overridable to build bad requests, and replies whose every
//! message is validated against the schema (and a tool's structured result against its declared
//! `outputSchema`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::sse::{EventStream, SseParser};
use super::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION,
    PROTOCOL_VERSION, REQUEST_TIMEOUT, schema,
};

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
