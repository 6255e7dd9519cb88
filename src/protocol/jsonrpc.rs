//! The JSON-RPC 2.0 envelope: parsing one incoming message and writing responses and notifications
//! as compact one-line JSON.

use serde::Serialize;
use serde_json::{Map, Value};

use super::error::ProtocolError;

/// A request id: a string or a number, echoed unchanged in the response.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct RequestId(Value);

impl RequestId {
    /// Accepts a string or an integer (MCP forbids `null` and fractions).
    pub fn from_value(value: Value) -> Option<Self> {
        match &value {
            Value::String(_) => Some(Self(value)),
            Value::Number(n) if n.is_i64() || n.is_u64() => Some(Self(value)),
            _ => None,
        }
    }

    pub fn as_value(&self) -> &Value {
        &self.0
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Value::String(s) => f.write_str(s),
            other => write!(f, "{other}"),
        }
    }
}

/// One message a client sent: a request (with an id), a notification (without), or, on the legacy
/// wire, a response to a server-initiated request.
#[derive(Debug, Clone)]
pub enum Incoming {
    Request {
        id: RequestId,
        method: String,
        params: Map<String, Value>,
    },
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    Response {
        id: RequestId,
        outcome: Result<Value, Value>,
    },
}

impl Incoming {
    /// Parses a request body. The error carries the id when one could be read, so the reply can
    /// echo it.
    pub fn parse(body: &[u8]) -> Result<Self, (Option<RequestId>, ProtocolError)> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| (None, ProtocolError::parse_error(e)))?;
        let Value::Object(mut message) = value else {
            let what = if value.is_array() {
                "batches are not supported"
            } else {
                "not an object"
            };
            return Err((
                None,
                ProtocolError::invalid_request(format!("Invalid request: {what}")),
            ));
        };
        let id = match message.remove("id") {
            None => None,
            Some(raw) => match RequestId::from_value(raw) {
                Some(id) => Some(id),
                None => {
                    return Err((
                        None,
                        ProtocolError::invalid_request(
                            "Invalid request: id must be a string or an integer",
                        ),
                    ));
                }
            },
        };
        let invalid = |id: &Option<RequestId>, why: &str| {
            Err((
                id.clone(),
                ProtocolError::invalid_request(format!("Invalid request: {why}")),
            ))
        };
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return invalid(&id, "jsonrpc must be \"2.0\"");
        }
        match message.remove("method") {
            Some(Value::String(method)) => {
                let params = match message.remove("params") {
                    None | Some(Value::Null) => Map::new(),
                    Some(Value::Object(params)) => params,
                    Some(_) => return invalid(&id, "params must be an object"),
                };
                Ok(match id {
                    Some(id) => Incoming::Request { id, method, params },
                    None => Incoming::Notification { method, params },
                })
            }
            Some(_) => invalid(&id, "method must be a string"),
            None => {
                let Some(id) = id else {
                    return invalid(&None, "a message needs a method or an id");
                };
                match (message.remove("result"), message.remove("error")) {
                    (Some(result), None) => Ok(Incoming::Response {
                        id,
                        outcome: Ok(result),
                    }),
                    (None, Some(error)) => Ok(Incoming::Response {
                        id,
                        outcome: Err(error),
                    }),
                    _ => invalid(
                        &Some(id),
                        "a response needs exactly one of result and error",
                    ),
                }
            }
        }
    }
}

/// Writes a success response around an already-serializable result.
pub fn success_bytes<T: Serialize + ?Sized>(id: &RequestId, result: &T) -> Vec<u8> {
    #[derive(Serialize)]
    struct Success<'a, T: ?Sized> {
        jsonrpc: &'static str,
        id: &'a RequestId,
        result: &'a T,
    }
    // Serializing plain data into a Vec cannot fail.
    serde_json::to_vec(&Success {
        jsonrpc: "2.0",
        id,
        result,
    })
    .unwrap_or_default()
}

/// Writes an error response; `id` is absent only when the request's id could not be read.
pub fn error_bytes(id: Option<&RequestId>, error: &ProtocolError) -> Vec<u8> {
    let mut response = Map::new();
    response.insert("jsonrpc".into(), Value::from("2.0"));
    if let Some(id) = id {
        response.insert("id".into(), id.as_value().clone());
    }
    response.insert("error".into(), error.to_json());
    serde_json::to_vec(&Value::Object(response)).unwrap_or_default()
}

/// Writes a notification.
pub fn notification_bytes(method: &str, params: &Value) -> Vec<u8> {
    #[derive(Serialize)]
    struct Notification<'a> {
        jsonrpc: &'static str,
        method: &'a str,
        params: &'a Value,
    }
    serde_json::to_vec(&Notification {
        jsonrpc: "2.0",
        method,
        params,
    })
    .unwrap_or_default()
}
