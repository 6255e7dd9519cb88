//! A complete answer to one request: its HTTP status, headers and body, and the JSON-RPC
//! messages it carried. The accessors are a test's assertions: each panics, quoting the body,
//! when the answer is not what it reads.

use bytes::Bytes;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

/// A complete response: status, headers, raw body and the JSON-RPC messages it carried.
pub struct Reply {
    /// The method of the request this answers.
    pub method: String,
    /// The id the request carried.
    pub request_id: Option<Value>,
    /// The body of the request, as sent.
    pub sent: Bytes,
    /// The HTTP status.
    pub status: StatusCode,
    /// The HTTP headers.
    pub headers: HeaderMap,
    /// The raw body.
    pub body: Bytes,
    /// A JSON body's one message, or every `data:` frame of an SSE body, in order.
    pub messages: Vec<Value>,
}

impl Reply {
    /// The body as text.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A response header, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `Content-Type` of the response.
    pub fn content_type(&self) -> &str {
        self.header("content-type").unwrap_or_default()
    }

    /// Whether the server answered with SSE.
    pub fn is_event_stream(&self) -> bool {
        self.content_type().starts_with("text/event-stream")
    }

    /// Whether the server answered with one JSON body.
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

    /// `error.code`.
    pub fn error_code(&self) -> i64 {
        self.error()
            .get("code")
            .and_then(Value::as_i64)
            .expect("error.code is an integer")
    }

    /// `error.message`.
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
