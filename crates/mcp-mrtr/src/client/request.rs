//! One JSON-RPC POST being built and sent: valid by default (a fresh id, full `_meta`, the
//! routing headers mirrored from the body, `Mcp-Param-*` included), every part overridable to
//! build a request a server must refuse.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::reply::Reply;
use super::sse::{EventStream, SseParser};
use super::{Client, ListedTool, default_capabilities, fresh_id};
use crate::protocol::Method;
use crate::protocol::version::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION, MODERN,
};
use crate::transport::encode_header_value;

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
    /// Header lines sent beside those of the same name.
    extra_header_lines: Vec<(String, String)>,
    raw_body: Option<Vec<u8>>,
    lowercase_header_names: bool,
    /// The `Mcp-Param-*` headers of a tool call, mirrored from its arguments before it is sent.
    mirrored_params: Vec<(String, String)>,
}

impl<'c> RpcRequest<'c> {
    pub(super) fn new(client: &'c Client, method: &str) -> Self {
        Self {
            client,
            method: method.to_owned(),
            params: Map::new(),
            id: Some(fresh_id()),
            capabilities: default_capabilities(),
            meta_extra: Vec::new(),
            meta_removed: Vec::new(),
            omit_meta: false,
            header_overrides: Vec::new(),
            extra_header_lines: Vec::new(),
            raw_body: None,
            lowercase_header_names: false,
            mirrored_params: Vec::new(),
        }
    }

    /// The params (an object), without `_meta`, which is added unless omitted.
    pub fn params(mut self, params: Value) -> Self {
        self.params = match params {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => panic!("params must be an object, got {other}"),
        };
        self
    }

    /// The JSON-RPC id (a fresh integer by default).
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

    /// Asks for progress notifications under `token` (`_meta.progressToken`).
    pub fn progress_token(self, token: Value) -> Self {
        self.meta("progressToken", token)
    }

    /// Asks for log messages at `level` and above (`_meta` `logLevel`).
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

    /// Sends one more line of header `name`, after those already set (a header repeated).
    pub fn extra_header_line(mut self, name: &str, value: impl Into<String>) -> Self {
        self.extra_header_lines
            .push((name.to_ascii_lowercase(), value.into()));
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
        meta.insert(META_PROTOCOL_VERSION.into(), json!(MODERN));
        meta.insert(META_CLIENT_INFO.into(), self.client.client_info.clone());
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
        set("mcp-protocol-version", MODERN);
        set("mcp-method", &self.method);
        let name_field = Method::parse(&self.method).and_then(Method::name_field);
        if let Some(value) = name_field
            .and_then(|field| self.params.get(field))
            .and_then(Value::as_str)
        {
            set("mcp-name", &encode_header_value(value));
        }
        for (name, value) in &self.mirrored_params {
            set(name, value);
        }
        for (name, value) in &self.client.headers {
            set(name, value);
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
        for (name, value) in &self.extra_header_lines {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("valid header name"),
                HeaderValue::from_str(value).expect("valid header value"),
            );
        }
        headers
    }

    pub(super) async fn response(&self, timeout: Duration) -> reqwest::Response {
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

    /// For a tool call, what `tools/list` says of the tool, with the tool's `x-mcp-header`
    /// arguments mirrored into `Mcp-Param-*` headers (a null or absent one is left out).
    async fn look_up_tool(&mut self) -> Option<(String, ListedTool)> {
        if self.method != Method::ToolsCall.as_str() {
            return None;
        }
        let name = self.params.get("name").and_then(Value::as_str)?.to_owned();
        let listed = self.client.listed_tool(&name).await?;
        let arguments = self.params.get("arguments");
        self.mirrored_params = listed
            .header_params
            .iter()
            .filter_map(|param| {
                let value = param
                    .path
                    .iter()
                    .try_fold(arguments?, |value, key| value.get(key))?;
                let text = match value {
                    Value::String(text) => text.clone(),
                    Value::Bool(_) | Value::Number(_) => value.to_string(),
                    _ => return None,
                };
                let header = format!("mcp-param-{}", param.header.to_ascii_lowercase());
                Some((header, encode_header_value(&text).into_owned()))
            })
            .collect();
        Some((name, listed))
    }

    /// Sends the request and reads the whole response. Every message in it goes to the client's
    /// observer ([`Client::observe`](super::Client::observe)), and a tool's structured content is
    /// checked against the tool's `outputSchema`.
    pub async fn send(mut self) -> Reply {
        let tool = self.look_up_tool().await;
        let sent = Bytes::from(self.body());
        let response = self.response(super::REQUEST_TIMEOUT).await;
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
            let messages = parser.push(&body);
            parser.finish();
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
            self.client.observe_message(&self.method, message);
        }
        // A successful structured result must fit the tool's declared outputSchema.
        let result = messages.iter().find_map(|m| m.get("result"));
        if let (Some((tool, listed)), Some(result)) = (&tool, result)
            && let Some(declared) = &listed.output_schema
            && let Some(structured) = result.get("structuredContent")
            && result.get("isError") != Some(&json!(true))
        {
            super::assert_structured_fits(tool, declared, structured);
        }
        Reply {
            method: self.method,
            request_id: self.id,
            sent,
            status,
            headers,
            body,
            messages,
        }
    }

    /// Sends the request and returns the response as a stream of messages, read as they come.
    pub async fn open_stream(mut self) -> EventStream {
        self.look_up_tool().await;
        let response = self.response(Duration::from_secs(120)).await;
        EventStream {
            method: self.method,
            request_id: self.id,
            status: response.status(),
            headers: response.headers().clone(),
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::default(),
            pending: VecDeque::new(),
            client: self.client.clone(),
        }
    }
}
