//! What a request is answered with: a result built as JSON (discovery, lists, completions), a
//! handler's typed result written straight from its type, or an `input_required` round. On the
//! modern wire every result names the server in its `_meta`, and a complete result is marked
//! `resultType: complete` and carries caching hints where its method is cacheable; legacy results
//! go out as they are.

use std::sync::Arc;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::mrtr::{InputRequired, Outcome};
use crate::protocol::ProtocolError;
use crate::protocol::content::{CallToolResult, GetPromptResult, ReadResourceResult};
use crate::protocol::version::META_SERVER_INFO;

/// The `_meta` of every modern result: the server's name and version under
/// `io.modelcontextprotocol/serverInfo` (the spec's per-response protocol field), kept written
/// out for typed results and as a tree for results built as JSON. Both are shared: every reply
/// takes a copy.
#[derive(Debug, Clone)]
pub struct ResultMeta {
    written: Arc<RawValue>,
    tree: Arc<Map<String, Value>>,
}

impl ResultMeta {
    pub(super) fn new(name: &str, version: &str) -> Self {
        let mut tree = Map::new();
        tree.insert(
            META_SERVER_INFO.into(),
            json!({ "name": name, "version": version }),
        );
        let written = Arc::from(
            serde_json::value::to_raw_value(&tree).expect("a map of strings always serializes"),
        );
        Self {
            written,
            tree: Arc::new(tree),
        }
    }

    /// Adds its fields to `result`'s `_meta`, keeping any the result has.
    pub(super) fn add_to(&self, result: &mut Map<String, Value>) {
        let meta = result
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            for (key, value) in self.tree.iter() {
                meta.insert(key.clone(), value.clone());
            }
        }
    }
}

/// A successful answer to a request.
pub enum Reply {
    /// A result built as JSON.
    Complete(Value),
    /// What a tool, prompt or resource handler returned.
    Handled(Handled),
    /// The handler is waiting for answers: an `input_required` result, and its `_meta` on the
    /// modern wire.
    InputRequired(InputRequired, Option<ResultMeta>),
    /// The call continues as a task: a `CreateTaskResult` (`resultType: task`).
    Task(Value),
}

impl Serialize for Reply {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Complete(value) => value.serialize(serializer),
            Self::Handled(handled) => handled.serialize(serializer),
            Self::InputRequired(input, meta) => WithMeta {
                result: input,
                meta: meta.as_ref().map(|meta| &*meta.written),
            }
            .serialize(serializer),
            Self::Task(created) => created.serialize(serializer),
        }
    }
}

/// A handler's result with the members the modern wire adds to it, serialized without building
/// a JSON tree first.
pub struct Handled {
    result: HandlerResult,
    result_type: Option<&'static str>,
    cache: Option<(u64, &'static str)>,
    meta: Option<ResultMeta>,
}

pub(super) enum HandlerResult {
    Tool(CallToolResult),
    Prompt(GetPromptResult),
    Resource(ReadResourceResult),
}

impl From<CallToolResult> for HandlerResult {
    fn from(result: CallToolResult) -> Self {
        Self::Tool(result)
    }
}

impl From<GetPromptResult> for HandlerResult {
    fn from(result: GetPromptResult) -> Self {
        Self::Prompt(result)
    }
}

impl From<ReadResourceResult> for HandlerResult {
    fn from(result: ReadResourceResult) -> Self {
        Self::Resource(result)
    }
}

/// The result's own members, then the added ones.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Decorated<'a, T> {
    #[serde(flatten)]
    result: &'a T,
    #[serde(skip_serializing_if = "Option::is_none")]
    result_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_scope: Option<&'static str>,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<&'a RawValue>,
}

/// A result's own members, then its `_meta`.
#[derive(Serialize)]
struct WithMeta<'a, T> {
    #[serde(flatten)]
    result: &'a T,
    #[serde(rename = "_meta", skip_serializing_if = "Option::is_none")]
    meta: Option<&'a RawValue>,
}

impl Handled {
    fn decorated<'a, T>(&'a self, result: &'a T) -> Decorated<'a, T> {
        Decorated {
            result,
            result_type: self.result_type,
            ttl_ms: self.cache.map(|(ttl_ms, _)| ttl_ms),
            cache_scope: self.cache.map(|(_, scope)| scope),
            meta: self.meta.as_ref().map(|meta| &*meta.written),
        }
    }
}

impl Serialize for Handled {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.result {
            HandlerResult::Tool(result) => self.decorated(result).serialize(serializer),
            HandlerResult::Prompt(result) => self.decorated(result).serialize(serializer),
            HandlerResult::Resource(result) => self.decorated(result).serialize(serializer),
        }
    }
}

/// The reply to one handler round that cannot continue as a task (a prompt or a resource).
pub(super) fn finish<T: Into<HandlerResult>>(outcome: Outcome<T>) -> Result<Reply, ProtocolError> {
    match outcome {
        Outcome::Complete(result) => Ok(Reply::Handled(Handled {
            result: result.into(),
            result_type: None,
            cache: None,
            meta: None,
        })),
        Outcome::InputRequired(input) => Ok(Reply::InputRequired(input, None)),
        Outcome::Task(_) => Err(ProtocolError::internal(
            "a handler asked for a task where none can be created",
        )),
    }
}

/// On the modern wire (`modern` holds the `_meta` every result carries there), names the server
/// in the result's `_meta`, marks a complete result `complete` and adds caching hints where the
/// method is cacheable; legacy results go out as they are.
pub(super) fn decorate(
    reply: Reply,
    modern: Option<&ResultMeta>,
    cache: Option<(u64, &'static str)>,
) -> Reply {
    let Some(meta) = modern else {
        return reply;
    };
    match reply {
        Reply::Complete(result) => Reply::Complete(complete(result, meta, cache)),
        Reply::Handled(handled) => Reply::Handled(Handled {
            result_type: Some("complete"),
            cache,
            meta: Some(meta.clone()),
            ..handled
        }),
        Reply::InputRequired(input, _) => Reply::InputRequired(input, Some(meta.clone())),
        Reply::Task(mut created) => {
            if let Some(object) = created.as_object_mut() {
                meta.add_to(object);
            }
            Reply::Task(created)
        }
    }
}

fn complete(mut result: Value, meta: &ResultMeta, cache: Option<(u64, &str)>) -> Value {
    if let Some(object) = result.as_object_mut() {
        object.insert("resultType".into(), json!("complete"));
        if let Some((ttl_ms, scope)) = cache {
            object.insert("ttlMs".into(), json!(ttl_ms));
            object.insert("cacheScope".into(), json!(scope));
        }
        meta.add_to(object);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::content::Content;

    #[test]
    fn a_typed_result_is_written_as_its_json_tree_would_be() {
        let result = CallToolResult {
            content: vec![Content::text("hi")],
            structured_content: serde_json::value::RawValue::from_string(r#"{"a":1}"#.into()).ok(),
            is_error: true,
        };
        let meta = ResultMeta::new("tests", "1.0.0");
        let tree = complete(
            serde_json::to_value(&result).unwrap(),
            &meta,
            Some((60_000, "private")),
        );
        assert_eq!(
            tree["_meta"][META_SERVER_INFO],
            json!({"name": "tests", "version": "1.0.0"})
        );
        let typed = decorate(
            finish(Outcome::Complete(result.clone())).unwrap(),
            Some(&meta),
            Some((60_000, "private")),
        );
        assert_eq!(serde_json::to_value(&typed).unwrap(), tree);
        let legacy = decorate(
            finish(Outcome::Complete(result.clone())).unwrap(),
            None,
            None,
        );
        assert_eq!(
            serde_json::to_value(&legacy).unwrap(),
            serde_json::to_value(&result).unwrap()
        );
    }
}
