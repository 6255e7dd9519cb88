//! A 2025-11-25 client over reqwest, the way the TypeScript and Java SDKs drive a session:
//! `initialize` without `_meta`, the `Mcp-Session-Id` header afterwards, tool calls read as SSE
//! streams on which the server may send its own requests, and answers POSTed back. Every message
//! the server sends is validated against the 2025-11-25 schema.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::schema::{LEGACY, check_in};

pub const SESSION_HEADER: &str = "mcp-session-id";

/// Panics unless `message` fits the 2025-11-25 definition `name`.
pub fn assert_legacy_valid(name: &str, message: &Value) {
    if let Err(e) = check_in(LEGACY, name, message) {
        panic!("2025-11-25 schema violation: {e}");
    }
}

/// The schema definition of a server-initiated request.
fn server_request_def(method: &str) -> &'static str {
    match method {
        "elicitation/create" => "ElicitRequest",
        "sampling/createMessage" => "CreateMessageRequest",
        "roots/list" => "ListRootsRequest",
        "ping" => "PingRequest",
        other => panic!("unexpected server request {other}"),
    }
}

fn result_def(method: &str) -> Option<&'static str> {
    Some(match method {
        "initialize" => "InitializeResult",
        "tools/call" => "CallToolResult",
        "tools/list" => "ListToolsResult",
        "prompts/get" => "GetPromptResult",
        "resources/read" => "ReadResourceResult",
        _ => return None,
    })
}

/// Checks one message the server sent in answer to `method`.
pub fn validate(method: &str, message: &Value) {
    if message.get("method").is_some() && message.get("id").is_some() {
        let request_method = message["method"].as_str().unwrap_or_default();
        assert_legacy_valid(server_request_def(request_method), message);
    } else if message.get("method").is_some() {
        assert_legacy_valid("JSONRPCNotification", message);
    } else if message.get("error").is_some() {
        assert_legacy_valid("JSONRPCErrorResponse", message);
    } else {
        assert_legacy_valid("JSONRPCResultResponse", message);
        for modern_only in ["resultType", "ttlMs", "cacheScope"] {
            assert!(
                message["result"].get(modern_only).is_none(),
                "a 2025-11-25 result carries {modern_only}: {message}"
            );
        }
        if let Some(def) = result_def(method) {
            assert_legacy_valid(def, &message["result"]);
        }
    }
}

/// One HTTP answer: status, session header, and the messages of its JSON or SSE body.
pub struct LegacyReply {
    pub status: u16,
    pub session_id: Option<String>,
    pub content_type: String,
    pub messages: Vec<Value>,
}

impl LegacyReply {
    pub fn result(&self) -> &Value {
        let last = self
            .messages
            .last()
            .unwrap_or_else(|| panic!("no message in the reply (HTTP {})", self.status));
        last.get("result")
            .unwrap_or_else(|| panic!("not a result: {last}"))
    }

    pub fn error_code(&self) -> Option<i64> {
        self.messages
            .last()
            .and_then(|m| m.get("error"))
            .and_then(|e| e["code"].as_i64())
    }
}

/// A signed-in (or anonymous) legacy client bound to one endpoint.
#[derive(Clone)]
pub struct LegacyClient {
    http: reqwest::Client,
    pub url: String,
    token: Option<String>,
    pub session_id: Option<String>,
    /// The revision the session agreed on, named in every request's `MCP-Protocol-Version`.
    revision: &'static str,
    next_id: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// Each listed tool's `outputSchema`, read from `tools/list` before the first tool call.
    output_schemas: std::sync::Arc<tokio::sync::OnceCell<std::collections::HashMap<String, Value>>>,
}

impl LegacyClient {
    pub fn new(url: String, token: Option<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            url,
            token,
            session_id: None,
            revision: LEGACY,
            next_id: Default::default(),
            output_schemas: Default::default(),
        }
    }

    /// The same session, talking to another endpoint (another replica).
    pub fn at(&self, url: String) -> Self {
        Self {
            url,
            ..self.clone()
        }
    }

    /// The same session, with someone else's credentials.
    pub fn with_token(&self, token: Option<String>) -> Self {
        Self {
            token,
            ..self.clone()
        }
    }

    fn post(&self, body: &Value, accept_sse: bool) -> reqwest::RequestBuilder {
        let accept = if accept_sse {
            "application/json, text/event-stream"
        } else {
            "application/json"
        };
        let mut request = self
            .http
            .post(&self.url)
            .header("Content-Type", "application/json")
            .header("Accept", accept)
            .body(body.to_string());
        if let Some(session) = &self.session_id {
            request = request
                .header(SESSION_HEADER, session)
                .header("MCP-Protocol-Version", self.revision);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request
    }

    /// `initialize` then `notifications/initialized`, declaring `capabilities`.
    pub async fn initialize(self, capabilities: Value) -> Self {
        self.initialize_at(LEGACY, capabilities).await
    }

    /// The same, asking for `revision` (which the server must agree on).
    pub async fn initialize_at(self, revision: &'static str, capabilities: Value) -> Self {
        let opened = self.open_at(revision, capabilities).await;
        let initialized = opened.notify("notifications/initialized").await;
        assert_eq!(initialized, 202);
        opened
    }

    /// `initialize` alone, declaring `capabilities`: a session whose client has not yet said
    /// `notifications/initialized`.
    pub async fn open(self, capabilities: Value) -> Self {
        self.open_at(LEGACY, capabilities).await
    }

    async fn open_at(mut self, revision: &'static str, capabilities: Value) -> Self {
        let body = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": revision, "capabilities": capabilities, "clientInfo": {"name": "legacy-test-client", "version": "1.0.0"}}
        });
        let reply = self.send_raw("initialize", &body, false).await;
        assert_eq!(reply.status, 200, "initialize: {:?}", reply.messages);
        assert_eq!(reply.result()["protocolVersion"], revision);
        self.revision = revision;
        let session = reply
            .session_id
            .clone()
            .expect("initialize returns an Mcp-Session-Id");
        assert!(
            session.bytes().all(|b| (0x21..=0x7e).contains(&b)),
            "session id is visible ASCII"
        );
        self.session_id = Some(session);
        self
    }

    pub async fn notify(&self, method: &str) -> u16 {
        let body = json!({"jsonrpc": "2.0", "method": method});
        self.post(&body, false)
            .send()
            .await
            .expect("POST")
            .status()
            .as_u16()
    }

    /// A request, read to its end (JSON or the whole SSE stream).
    pub async fn request(&self, method: &str, params: Value) -> LegacyReply {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(method, &body, true).await
    }

    pub async fn send_raw(&self, method: &str, body: &Value, accept_sse: bool) -> LegacyReply {
        let response = self.post(body, accept_sse).send().await.expect("POST");
        let status = response.status().as_u16();
        let session_id = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let text = response.text().await.expect("body");
        let messages = parse_body(&content_type, &text);
        for message in &messages {
            validate(method, message);
        }
        LegacyReply {
            status,
            session_id,
            content_type,
            messages,
        }
    }

    /// The `outputSchema` `tool` declares in `tools/list`, if any (listed once per session).
    async fn output_schema(&self, tool: &str) -> Option<Value> {
        let schemas = self
            .output_schemas
            .get_or_init(|| async {
                let list = Box::pin(self.send_raw(
                    "tools/list",
                    &json!({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"}),
                    false,
                ))
                .await;
                // A session the test means to be refused lists nothing: then nothing is checked.
                list.messages
                    .last()
                    .and_then(|m| m["result"]["tools"].as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|t| {
                        Some((
                            t["name"].as_str()?.to_owned(),
                            t.get("outputSchema")?.clone(),
                        ))
                    })
                    .collect()
            })
            .await;
        schemas.get(tool).cloned()
    }

    /// Starts a tool call and returns its open stream, to read the server's requests as they come.
    pub async fn start_call(&self, name: &str, arguments: Value) -> LegacyCall {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        self.start_call_as(json!(id), name, arguments).await
    }

    /// Starts a tool call under the JSON-RPC id given (a client reusing one makes a mistake
    /// the server has to survive).
    pub async fn start_call_as(&self, id: Value, name: &str, arguments: Value) -> LegacyCall {
        let output_schema = self.output_schema(name).await;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
        let response = self
            .post(&body, true)
            .send()
            .await
            .expect("POST tools/call");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        LegacyCall {
            id,
            status,
            content_type,
            body: Box::pin(response.bytes_stream()),
            buffer: String::new(),
            tool: name.to_owned(),
            output_schema,
        }
    }

    /// POSTs the answer to a server-initiated request.
    pub async fn answer(&self, request_id: &Value, result: Value) -> u16 {
        let body = json!({"jsonrpc": "2.0", "id": request_id, "result": result});
        self.post(&body, false)
            .send()
            .await
            .expect("POST answer")
            .status()
            .as_u16()
    }

    /// POSTs an error answer (a user refusal is code -1).
    pub async fn refuse(&self, request_id: &Value, code: i64, message: &str) -> u16 {
        let body = json!({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}});
        self.post(&body, false)
            .send()
            .await
            .expect("POST error")
            .status()
            .as_u16()
    }

    pub async fn delete_session(&self) -> u16 {
        let mut request = self.http.delete(&self.url);
        if let Some(session) = &self.session_id {
            request = request
                .header(SESSION_HEADER, session)
                .header("MCP-Protocol-Version", self.revision);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        request.send().await.expect("DELETE").status().as_u16()
    }
}

fn parse_body(content_type: &str, text: &str) -> Vec<Value> {
    if content_type.starts_with("text/event-stream") {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .filter(|data| !data.is_empty())
            .map(|data| {
                serde_json::from_str(data)
                    .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {data}"))
            })
            .collect()
    } else if text.trim().is_empty() {
        Vec::new()
    } else {
        vec![
            serde_json::from_str(text).unwrap_or_else(|e| panic!("body is not JSON ({e}): {text}")),
        ]
    }
}

type ByteStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// A tool call in progress on a legacy session.
pub struct LegacyCall {
    /// The call's JSON-RPC id.
    pub id: Value,
    pub status: u16,
    pub content_type: String,
    body: ByteStream,
    buffer: String,
    tool: String,
    /// What the tool's `structuredContent` must fit.
    output_schema: Option<Value>,
}

impl LegacyCall {
    /// The next message on the call's stream (bounded wait, so a broken server cannot hang a test).
    pub async fn next_message(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim)
                    .collect();
                if data.is_empty() {
                    continue;
                }
                let message: Value =
                    serde_json::from_str(&data.join("")).expect("SSE data is JSON");
                validate("tools/call", &message);
                return message;
            }
            if !self.content_type.starts_with("text/event-stream") && !self.buffer.is_empty() {
                let message: Value =
                    serde_json::from_str(&std::mem::take(&mut self.buffer)).expect("JSON body");
                validate("tools/call", &message);
                return message;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.body.next())
                .await
                .expect("the server sends the next message within 30 s");
            match chunk {
                Some(Ok(bytes)) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                Some(Err(e)) => panic!("stream broke: {e}"),
                None if self.buffer.trim().is_empty() => {
                    panic!("the stream ended without a response")
                }
                None => self.buffer.push_str("\n\n"),
            }
        }
    }

    /// Every message still to come on the call's stream, once the server ends it (bounded wait).
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut text = std::mem::take(&mut self.buffer);
        let read_all = async {
            while let Some(chunk) = self.body.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.expect("stream bytes")));
            }
        };
        tokio::time::timeout(Duration::from_secs(30), read_all)
            .await
            .expect("the server ends the stream within 30 s");
        parse_body(&self.content_type, &text)
    }

    /// Reads until the server's next request (skipping notifications) and returns it.
    pub async fn next_server_request(&mut self) -> Value {
        loop {
            let message = self.next_message().await;
            if message.get("method").is_some() && message.get("id").is_some() {
                return message;
            }
            assert!(
                message.get("method").is_some(),
                "expected a server request, got the response: {message}"
            );
        }
    }

    /// Reads until the call's own response; a successful structured result must fit the tool's
    /// declared `outputSchema`.
    pub async fn response(&mut self) -> Value {
        loop {
            let message = self.next_message().await;
            if message.get("method").is_none() {
                let result = &message["result"];
                if let (Some(declared), Some(structured)) =
                    (&self.output_schema, result.get("structuredContent"))
                    && result.get("isError") != Some(&json!(true))
                {
                    super::assert_structured_fits(&self.tool, declared, structured);
                }
                return message;
            }
            assert!(
                message.get("id").is_none(),
                "unanswered server request: {message}"
            );
        }
    }
}
