//! Per-request `_meta`: the protocol version, client identity and capabilities every 2026-07-28
//! request carries, and the optional log level, progress token and trace context.

use serde_json::{Map, Value};

use super::error::ProtocolError;
use super::version::{
    META_CLIENT_CAPABILITIES, META_CLIENT_INFO, META_LOG_LEVEL, META_PROTOCOL_VERSION,
    TASKS_EXTENSION,
};

/// Whether `params` carry a modern (2026-07-28) request's `_meta`: one with a field under the
/// `io.modelcontextprotocol/` prefix, where the per-request protocol fields live. A 2025-11-25
/// request may have a `_meta` too (a progress token, a vendor's keys) and is not made modern by it.
pub fn is_modern_meta(params: &Map<String, Value>) -> bool {
    params
        .get("_meta")
        .and_then(Value::as_object)
        .is_some_and(|meta| {
            meta.keys()
                .any(|key| key.starts_with("io.modelcontextprotocol/"))
        })
}

/// Whether `params` carry a `_meta` naming the protocol version the request is written for, as
/// every modern request's does and no 2025-11-25 message's.
pub fn names_its_version(params: &Map<String, Value>) -> bool {
    params
        .get("_meta")
        .and_then(Value::as_object)
        .is_some_and(|meta| meta.contains_key(META_PROTOCOL_VERSION))
}

/// The protocol version a request's `_meta` names, read alone: the version decides which
/// revision's rules the rest of `_meta` is read by, so a version this server does not serve is
/// refused as such (-32022), whatever else `_meta` holds. Missing or not a string: -32602.
pub fn requested_version(params: &Map<String, Value>) -> Result<&str, ProtocolError> {
    meta_and_version(params).map(|(_, version)| version)
}

fn meta_and_version(
    params: &Map<String, Value>,
) -> Result<(&Map<String, Value>, &str), ProtocolError> {
    let Some(meta) = params.get("_meta") else {
        return Err(ProtocolError::invalid_meta("Missing params._meta"));
    };
    let Some(meta) = meta.as_object() else {
        return Err(ProtocolError::invalid_meta(
            "params._meta must be an object",
        ));
    };
    match meta.get(META_PROTOCOL_VERSION) {
        Some(Value::String(version)) => Ok((meta, version)),
        Some(_) => Err(ProtocolError::invalid_meta(format!(
            "_meta {META_PROTOCOL_VERSION} must be a string"
        ))),
        None => Err(ProtocolError::invalid_meta(format!(
            "Missing _meta {META_PROTOCOL_VERSION}"
        ))),
    }
}

/// What one request says about itself in `params._meta`.
#[derive(Debug, Clone)]
pub struct RequestMeta {
    /// The revision named by `io.modelcontextprotocol/protocolVersion`.
    pub protocol_version: String,
    /// The client's `Implementation` object (name, version), if it sent one.
    pub client_info: Option<Value>,
    /// What the client can do for this request, such as answering elicitation or sampling.
    pub capabilities: ClientCapabilities,
    /// Least severe level of log messages to send while handling this request; none if absent.
    pub log_level: Option<LogLevel>,
    /// The `progressToken` to tag progress notifications with; absent means send none.
    pub progress_token: Option<Value>,
    /// W3C trace context from `_meta` (`traceparent`, `tracestate`, `baggage`), for continuing
    /// the client's trace.
    pub trace: TraceCarrier,
}

/// W3C trace context as a request carries it: in `_meta`, or in the HTTP headers of the same
/// names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceCarrier {
    /// The parent span: `00-<trace id>-<span id>-<flags>`.
    pub traceparent: Option<String>,
    /// Vendors' trace state, passed on with the trace.
    pub tracestate: Option<String>,
    /// W3C baggage: `key=value` pairs the client wants to travel with the trace.
    pub baggage: Option<String>,
}

impl TraceCarrier {
    /// The three entries, read through `get` (from `_meta`, say).
    pub fn read<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        let text = |key: &str| get(key).map(str::to_owned);
        Self {
            traceparent: text("traceparent"),
            tracestate: text("tracestate"),
            baggage: text("baggage"),
        }
    }
}

impl RequestMeta {
    /// Reads `_meta` from a request's params. Missing or malformed required keys give -32602
    /// with HTTP 400, as the transport binding requires.
    pub fn from_params(params: &Map<String, Value>) -> Result<Self, ProtocolError> {
        let (meta, protocol_version) = meta_and_version(params)?;
        let protocol_version = protocol_version.to_owned();
        let capabilities = match meta.get(META_CLIENT_CAPABILITIES) {
            Some(Value::Object(caps)) => ClientCapabilities::from_object(caps),
            Some(_) => {
                return Err(ProtocolError::invalid_meta(format!(
                    "_meta {META_CLIENT_CAPABILITIES} must be an object"
                )));
            }
            None => {
                return Err(ProtocolError::invalid_meta(format!(
                    "Missing _meta {META_CLIENT_CAPABILITIES}"
                )));
            }
        };
        let log_level = match meta.get(META_LOG_LEVEL) {
            None | Some(Value::Null) => None,
            Some(Value::String(level)) => Some(LogLevel::parse(level).ok_or_else(|| {
                ProtocolError::invalid_meta(format!(
                    "Unknown log level in _meta {META_LOG_LEVEL}: {level}"
                ))
            })?),
            Some(_) => {
                return Err(ProtocolError::invalid_meta(format!(
                    "_meta {META_LOG_LEVEL} must be a string"
                )));
            }
        };
        let progress_token = match meta.get("progressToken") {
            None | Some(Value::Null) => None,
            Some(token @ (Value::String(_) | Value::Number(_))) => Some(token.clone()),
            Some(_) => {
                return Err(ProtocolError::invalid_meta(
                    "_meta progressToken must be a string or a number",
                ));
            }
        };
        Ok(Self {
            protocol_version,
            client_info: meta.get(META_CLIENT_INFO).cloned(),
            capabilities,
            log_level,
            progress_token,
            trace: TraceCarrier::read(|key| meta.get(key).and_then(Value::as_str)),
        })
    }
}

/// The client capabilities declared on one request. Never carried over between requests (a task
/// keeps those of the request that created it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientCapabilities {
    /// The client can show form-mode elicitations (`elicitation.form`, or an empty `elicitation`).
    pub elicitation_form: bool,
    /// The client can handle URL-mode elicitations (`elicitation.url`).
    pub elicitation_url: bool,
    /// The client can answer `sampling/createMessage` requests.
    pub sampling: bool,
    /// The client can answer `roots/list` requests.
    pub roots: bool,
    /// The client takes part in the Tasks extension (`extensions["io.modelcontextprotocol/tasks"]`).
    #[serde(default)]
    pub tasks: bool,
}

impl ClientCapabilities {
    /// Reads the capabilities from a `ClientCapabilities` JSON object; unknown keys are ignored.
    pub fn from_object(caps: &Map<String, Value>) -> Self {
        let elicitation = caps.get("elicitation").and_then(Value::as_object);
        // An empty `elicitation` object declares form mode, for compatibility with 2025-06-18.
        let elicitation_form = elicitation.is_some_and(|e| e.is_empty() || e.contains_key("form"));
        let elicitation_url = elicitation.is_some_and(|e| e.contains_key("url"));
        Self {
            elicitation_form,
            elicitation_url,
            sampling: caps.get("sampling").is_some_and(Value::is_object),
            roots: caps.get("roots").is_some_and(Value::is_object),
            tasks: caps
                .get("extensions")
                .and_then(Value::as_object)
                .and_then(|extensions| extensions.get(TASKS_EXTENSION))
                .is_some_and(Value::is_object),
        }
    }
}

/// Log severities, in the syslog order MCP uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// `debug`: detailed information for debugging.
    Debug,
    /// `info`: routine operational messages.
    Info,
    /// `notice`: normal but significant events.
    Notice,
    /// `warning`: something unexpected that does not stop the work.
    Warning,
    /// `error`: an operation failed.
    Error,
    /// `critical`: a component is failing.
    Critical,
    /// `alert`: action must be taken immediately.
    Alert,
    /// `emergency`: the system is unusable.
    Emergency,
}

impl LogLevel {
    /// The level with the wire name `name` (such as `"warning"`), if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "debug" => Self::Debug,
            "info" => Self::Info,
            "notice" => Self::Notice,
            "warning" => Self::Warning,
            "error" => Self::Error,
            "critical" => Self::Critical,
            "alert" => Self::Alert,
            "emergency" => Self::Emergency,
            _ => return None,
        })
    }

    /// The level's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Notice => "notice",
            Self::Warning => "warning",
            Self::Error => "error",
            Self::Critical => "critical",
            Self::Alert => "alert",
            Self::Emergency => "emergency",
        }
    }
}
