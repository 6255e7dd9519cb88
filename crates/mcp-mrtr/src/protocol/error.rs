//! JSON-RPC errors as MCP defines them: the standard codes, the MCP-reserved codes with their typed
//! `data`, and the HTTP status each one travels with on Streamable HTTP.

use std::borrow::Cow;

use serde_json::{Value, json};

/// The most characters of a client-supplied value (a header, a name, a method) an error message
/// or a log line repeats: enough to recognise it, never enough to amplify it.
pub const ECHO_LIMIT: usize = 64;
/// The longest error message sent, whatever it quotes.
pub const MESSAGE_LIMIT: usize = 1024;

/// `text` cut to at most `limit` bytes (at a character boundary), marked when it was cut.
pub fn shortened(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let end = (0..=limit)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text.truncate(end);
        text.push('…');
    }
    text
}

/// `text` as it may be repeated back: whole when short, else its first [`ECHO_LIMIT`]
/// characters and how long it really was.
pub fn excerpt(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(ECHO_LIMIT) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len())),
    }
}

/// JSON-RPC: the body is not valid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: the JSON is not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: the method does not exist or is not available on this wire.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: the method's params are missing or malformed.
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC: the server failed while handling the request.
pub const INTERNAL_ERROR: i64 = -32603;
/// MCP: an `Mcp-*` HTTP header is missing, unreadable, or disagrees with the JSON-RPC body.
pub const HEADER_MISMATCH: i64 = -32020;
/// MCP: the request needs a client capability it did not declare; `data` lists which.
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// MCP: the requested protocol revision is not served; `data` lists the supported ones.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
/// "Resource not found" as 2025-11-25 names it; 2026-07-28 uses [`INVALID_PARAMS`].
pub const LEGACY_RESOURCE_NOT_FOUND: i64 = -32002;

/// A JSON-RPC error object, plus the HTTP status it is sent with.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolError {
    /// The JSON-RPC error code, one of the constants in this module or another application code.
    pub code: i64,
    /// A short human-readable description of the error.
    pub message: String,
    /// Structured detail sent as the error's `data` member, if any.
    pub data: Option<Value>,
    /// Set when the status differs from the one the code implies (a `_meta` error is -32602 but 400).
    status_override: Option<u16>,
    /// Seconds to wait before trying again (`Retry-After`), when the error passes.
    retry_after_secs: Option<u32>,
}

impl ProtocolError {
    /// An error with `code` and `message`, no data, sent with the status its code implies.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: shortened(message.into(), MESSAGE_LIMIT),
            data: None,
            status_override: None,
            retry_after_secs: None,
        }
    }

    /// Attaches `data`, sent as the error object's `data` member.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Sends the error with HTTP `status` instead of the one its code implies.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status_override = Some(status);
        self
    }

    /// Says to try again after `seconds` (`Retry-After`); an error sent with HTTP 503 says 1 s
    /// unless told otherwise.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after_secs = Some(seconds);
        self
    }

    /// Seconds to wait before trying again, when said.
    pub fn retry_after_secs(&self) -> Option<u32> {
        self.retry_after_secs
    }

    /// A body that is not valid JSON: -32700 with HTTP 400.
    pub fn parse_error(detail: impl std::fmt::Display) -> Self {
        Self::new(PARSE_ERROR, format!("Parse error: {detail}")).with_status(400)
    }

    /// A message that is not a valid JSON-RPC request: -32600 with HTTP 400.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, message).with_status(400)
    }

    /// An unknown method: -32601, sent with HTTP 404 when it is the whole response.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            METHOD_NOT_FOUND,
            format!("Method not found: {}", excerpt(method)),
        )
    }

    /// Params that are missing or malformed: -32602.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    /// A request whose `_meta` is missing or malformed: -32602 with HTTP 400.
    pub fn invalid_meta(message: impl Into<String>) -> Self {
        Self::invalid_params(message).with_status(400)
    }

    /// A failure inside the server: -32603, sent with HTTP 500 when it is the whole response.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, message)
    }

    /// A missing, unreadable or mismatched `Mcp-*` header: -32020 with HTTP 400.
    pub fn header_mismatch(message: impl Into<String>) -> Self {
        Self::new(HEADER_MISMATCH, message)
    }

    /// The request needs client capabilities it did not declare; `required` is a
    /// `ClientCapabilities` object such as `{"sampling":{}}`.
    pub fn missing_capability(required: Value) -> Self {
        let names: Vec<String> = required
            .as_object()
            .map(|caps| caps.keys().cloned().collect())
            .unwrap_or_default();
        Self::new(
            MISSING_REQUIRED_CLIENT_CAPABILITY,
            format!("Missing required client capability: {}", names.join(", ")),
        )
        .with_data(json!({ "requiredCapabilities": required }))
    }

    /// A revision this server does not serve: -32022, with `data` naming the `supported` ones.
    pub fn unsupported_version(requested: &str, supported: &[&str]) -> Self {
        Self::new(
            UNSUPPORTED_PROTOCOL_VERSION,
            format!("Unsupported protocol version: {}", excerpt(requested)),
        )
        .with_data(json!({ "supported": supported, "requested": requested }))
    }

    /// The HTTP status this error is sent with when it is the whole response.
    pub fn http_status(&self) -> u16 {
        if let Some(status) = self.status_override {
            return status;
        }
        match self.code {
            PARSE_ERROR
            | INVALID_REQUEST
            | HEADER_MISMATCH
            | MISSING_REQUIRED_CLIENT_CAPABILITY
            | UNSUPPORTED_PROTOCOL_VERSION => 400,
            METHOD_NOT_FOUND => 404,
            INTERNAL_ERROR => 500,
            _ => 200,
        }
    }

    /// The `error` member of a JSON-RPC error response.
    pub fn to_json(&self) -> Value {
        let mut error = json!({ "code": self.code, "message": self.message });
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        error
    }
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ProtocolError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoed_values_and_messages_are_bounded() {
        assert_eq!(excerpt("tools/call"), "tools/call");
        let long = "é".repeat(1000);
        let cut = excerpt(&long);
        assert!(
            cut.starts_with(&"é".repeat(ECHO_LIMIT)) && cut.ends_with("… (2000 bytes)"),
            "{cut}"
        );
        let message = ProtocolError::invalid_params("x".repeat(50_000)).message;
        assert!(message.len() <= MESSAGE_LIMIT + '…'.len_utf8() && message.ends_with('…'));
        assert_eq!(
            shortened("é".repeat(3), 3),
            "é…",
            "cut at a character boundary"
        );
    }
}
