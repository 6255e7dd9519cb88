//! The JSON-RPC 2.0 envelope: parsing one incoming message and writing responses and notifications
//! as compact one-line JSON.

use std::cell::Cell;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::map::Entry;
use serde_json::{Map, Value};

use super::error::ProtocolError;

/// Most JSON values (objects, arrays, strings, numbers…) one message may hold. Parsed values take
/// several times the bytes they are written in, and the spec's own messages hold a few dozen; the
/// cap keeps a body made of tiny objects from costing tens of megabytes to parse. Nesting is
/// capped by the parser itself, at 128 levels.
pub const MAX_VALUES: usize = 10_000;

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

    /// The id as JSON, to echo in a response or match a reply to a server-initiated request.
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
    /// A request the client expects a response to.
    Request {
        /// The id the response must echo.
        id: RequestId,
        /// The JSON-RPC method name, not yet checked against the known methods.
        method: String,
        /// The params object; empty when the message had none.
        params: Map<String, Value>,
    },
    /// A notification, which gets no response.
    Notification {
        /// The JSON-RPC method name, such as `notifications/cancelled`.
        method: String,
        /// The params object; empty when the message had none.
        params: Map<String, Value>,
    },
    /// The client's response to a server-initiated request (legacy wire only).
    Response {
        /// The id of the server-initiated request being answered.
        id: RequestId,
        /// `Ok` with the `result` member, or `Err` with the `error` member.
        outcome: Result<Value, Value>,
    },
}

impl Incoming {
    /// Parses a request body. The error carries the id when one could be read, so the reply can
    /// echo it.
    pub fn parse(body: &[u8]) -> Result<Self, (Option<RequestId>, ProtocolError)> {
        let budget = Cell::new(MAX_VALUES);
        let mut reader = serde_json::Deserializer::from_slice(body);
        let parsed = MessageVisitor { budget: &budget }
            .deserialize(&mut reader)
            .and_then(|message| reader.end().map(|()| message));
        let message = match parsed {
            Ok(Message::Object(members)) => members,
            Ok(shape) => {
                let what = if matches!(shape, Message::Array) {
                    "batches are not supported"
                } else {
                    "not an object"
                };
                return Err((
                    None,
                    ProtocolError::invalid_request(format!("Invalid request: {what}")),
                ));
            }
            Err(_) if budget.get() == 0 => {
                return Err((
                    None,
                    ProtocolError::invalid_request(format!(
                        "Invalid request: the message holds more than {MAX_VALUES} JSON values"
                    )),
                ));
            }
            Err(e) => return Err((None, ProtocolError::parse_error(e))),
        };
        let id = match message.id {
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
        if message.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
            return invalid(&id, "jsonrpc must be \"2.0\"");
        }
        match message.method {
            Some(Value::String(method)) => {
                let params = match message.params {
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
                match (message.result, message.error) {
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

/// A message body as parsed: an object's members (without building a map of the envelope), or
/// another kind of JSON value.
enum Message {
    Object(Members),
    Array,
    Other,
}

/// The members of a JSON-RPC object; unknown members are checked and skipped. A member given
/// twice, here or in any object inside `params`, `result` or `error`, makes the message a parse
/// error: a proxy or a log that reads the first value must not see another request than the one
/// that runs.
#[derive(Default)]
struct Members {
    jsonrpc: Option<Value>,
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Value>,
    result: Option<Value>,
    error: Option<Value>,
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Member {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    #[serde(other)]
    Other,
}

impl Member {
    fn name(&self) -> &'static str {
        match self {
            Self::Jsonrpc => "jsonrpc",
            Self::Id => "id",
            Self::Method => "method",
            Self::Params => "params",
            Self::Result => "result",
            Self::Error => "error",
            Self::Other => "other",
        }
    }
}

/// Reads a JSON value with no key repeated in any of its objects, each value taken from the
/// message's budget of [`MAX_VALUES`].
#[derive(Clone, Copy)]
struct Strict<'b> {
    budget: &'b Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        let left = self.budget.get();
        if left == 0 {
            return Err(de::Error::custom("too many values"));
        }
        self.budget.set(left - 1);
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            match object.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(value);
                }
                Entry::Occupied(taken) => {
                    return Err(de::Error::custom(format!(
                        "duplicate key `{}`",
                        super::error::excerpt(taken.key())
                    )));
                }
            }
        }
        Ok(Value::Object(object))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// Reads a [`Message`], its values within `budget`.
struct MessageVisitor<'b> {
    budget: &'b Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for MessageVisitor<'_> {
    type Value = Message;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Message, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessageVisitor<'_> {
    type Value = Message;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
        let mut members = Members::default();
        while let Some(member) = map.next_key::<Member>()? {
            let slot = match member {
                Member::Jsonrpc => &mut members.jsonrpc,
                Member::Id => &mut members.id,
                Member::Method => &mut members.method,
                Member::Params => &mut members.params,
                Member::Result => &mut members.result,
                Member::Error => &mut members.error,
                Member::Other => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            if slot.is_some() {
                return Err(de::Error::custom(format!(
                    "duplicate member `{}`",
                    member.name()
                )));
            }
            *slot = Some(map.next_value_seed(Strict {
                budget: self.budget,
            })?);
        }
        Ok(Message::Object(members))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Message, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Message::Array)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Message, E> {
        Ok(Message::Other)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Message, E> {
        Ok(Message::Other)
    }
}

/// Bytes reserved for a response before writing it.
const RESPONSE_CAPACITY: usize = 512;

/// Writes a success response around an already-serializable result.
pub fn success_bytes<T: Serialize + ?Sized>(id: &RequestId, result: &T) -> Vec<u8> {
    #[derive(Serialize)]
    struct Success<'a, T: ?Sized> {
        jsonrpc: &'static str,
        id: &'a RequestId,
        result: &'a T,
    }
    // Most results fit, so the buffer rarely grows; serializing plain data into it cannot fail.
    let mut out = Vec::with_capacity(RESPONSE_CAPACITY);
    let written = serde_json::to_writer(
        &mut out,
        &Success {
            jsonrpc: "2.0",
            id,
            result,
        },
    );
    if written.is_err() {
        out.clear();
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refusal(body: &str) -> (Option<RequestId>, String) {
        match Incoming::parse(body.as_bytes()) {
            Ok(incoming) => panic!("accepted {body}: {incoming:?}"),
            Err((id, e)) => (id, e.message),
        }
    }

    #[test]
    fn a_request_keeps_its_params_and_skips_unknown_members() {
        let body = r#"{"jsonrpc":"2.0","x":[1,{"y":null}],"method":"ping","id":7,
                       "params":{"_meta":{"k":1}}}"#;
        let Ok(Incoming::Request { id, method, params }) = Incoming::parse(body.as_bytes()) else {
            panic!("not a request");
        };
        assert_eq!(id.as_value(), &json!(7));
        assert_eq!(method, "ping");
        assert_eq!(Value::Object(params), json!({"_meta": {"k": 1}}));
        assert!(matches!(
            Incoming::parse(br#"{"jsonrpc":"2.0","method":"n","params":null}"#),
            Ok(Incoming::Notification { params, .. }) if params.is_empty()
        ));
        assert!(matches!(
            Incoming::parse(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1}}"#),
            Ok(Incoming::Response {
                outcome: Err(_),
                ..
            })
        ));
    }

    #[test]
    fn a_key_given_twice_anywhere_is_a_parse_error() {
        for body in [
            r#"{"jsonrpc":"2.0","id":"a","method":"ping","id":7}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"t","params":{"arguments":[{"k":1,"k":2}]}}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{"action":"accept","action":"decline"}}"#,
        ] {
            let Err((id, error)) = Incoming::parse(body.as_bytes()) else {
                panic!("accepted {body}");
            };
            assert_eq!((error.code, error.http_status()), (-32700, 400), "{body}");
            assert!(
                error.message.contains("duplicate"),
                "{body}: {}",
                error.message
            );
            assert_eq!(id, None, "no id is trusted from such a message");
        }
    }

    #[test]
    fn malformed_messages_are_refused_as_before() {
        assert!(refusal("[1,2]").1.contains("batches are not supported"));
        assert!(refusal("\"x\"").1.contains("not an object"));
        assert!(refusal("null").1.contains("not an object"));
        assert!(refusal("[1,").1.starts_with("Parse error"));
        assert!(
            refusal(r#"{"jsonrpc":"2.0","id":1} x"#)
                .1
                .starts_with("Parse error")
        );
        assert!(
            refusal(r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#)
                .1
                .contains("id must be")
        );
        assert!(
            refusal(r#"{"jsonrpc":"2.0","id":1.5,"method":"m"}"#)
                .1
                .contains("id must be")
        );
        let (id, message) = refusal(r#"{"jsonrpc":"1.0","id":3,"method":"m"}"#);
        assert_eq!(id.map(|id| id.to_string()), Some("3".into()));
        assert!(message.contains("jsonrpc must be"));
        assert!(
            refusal(r#"{"jsonrpc":"2.0","id":1,"method":2}"#)
                .1
                .contains("method must be")
        );
        assert!(
            refusal(r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[]}"#)
                .1
                .contains("params must be")
        );
        assert!(
            refusal(r#"{"jsonrpc":"2.0","params":{}}"#)
                .1
                .contains("needs a method or an id")
        );
        assert!(
            refusal(r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#)
                .1
                .contains("exactly one")
        );
    }
}
