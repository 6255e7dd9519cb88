//! Tools: a definition with JSON schemas (from schemars or written by hand) and a handler.

use std::future::Future;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::BoxFuture;
use super::header_params::{HeaderParam, header_params};
use super::schema::{input_schema_of, output_schema_of};
use crate::mrtr::{HandlerError, RequestContext};
use crate::protocol::content::CallToolResult;
use crate::protocol::error::{MESSAGE_LIMIT, shortened};

type ToolHandler =
    dyn Fn(RequestContext, Value) -> BoxFuture<Result<CallToolResult, HandlerError>> + Send + Sync;

/// A tool: its `tools/list` definition and the handler `tools/call` runs.
pub struct Tool {
    /// The unique name `tools/call` asks for.
    pub name: String,
    /// A human-friendly display name, if different from `name`.
    pub title: Option<String>,
    /// What the tool does, for the model deciding whether to call it.
    pub description: String,
    /// The JSON schema of the arguments, sent as `inputSchema`.
    pub input_schema: Value,
    /// The JSON schema of `structuredContent`, sent as `outputSchema`, if declared.
    pub output_schema: Option<Value>,
    /// Behaviour hints sent as `annotations`, if any.
    pub annotations: Option<Value>,
    /// Callable but not listed (e.g. test hooks).
    pub hidden: bool,
    /// Parameters the client must mirror into `Mcp-Param-*` headers, found in `input_schema`.
    pub header_params: Vec<HeaderParam>,
    /// The OAuth scope a caller's token must grant to call the tool (HTTP 403 otherwise), for
    /// authenticators whose callers have scopes.
    pub required_scope: Option<String>,
    handler: Arc<ToolHandler>,
}

impl Tool {
    /// A tool whose arguments are `A`: its input schema comes from schemars, and arguments that do
    /// not fit become a tool error, naming where they went wrong, that the model can read and
    /// correct.
    ///
    /// # Panics
    ///
    /// When an `x-mcp-header` annotation in the schema breaks the transport's rules (an empty or
    /// non-token name, one given twice, a parameter that is not a string, integer or boolean, or
    /// one not reached through `properties` alone): clients would drop the tool from their list.
    pub fn new<A, F, Fut>(name: &str, description: &str, handler: F) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(RequestContext, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<CallToolResult, HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let erased = move |ctx: RequestContext,
                           arguments: Value|
              -> BoxFuture<Result<CallToolResult, HandlerError>> {
            match serde_path_to_error::deserialize::<_, A>(arguments) {
                Ok(args) => Box::pin(handler(ctx, args)),
                Err(e) => {
                    let message = argument_error(&e);
                    Box::pin(async move { Ok(CallToolResult::error(message)) })
                }
            }
        };
        Self::with_handler(name, description, input_schema_of::<A>(), Arc::new(erased))
    }

    /// A tool that takes no arguments: its handler gets the request context only.
    pub fn without_arguments<F, Fut>(name: &str, description: &str, handler: F) -> Self
    where
        F: Fn(RequestContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<CallToolResult, HandlerError>> + Send + 'static,
    {
        Self::new(name, description, move |ctx, _: NoArguments| handler(ctx))
    }

    /// A tool with a hand-written input schema and raw JSON arguments. The arguments are checked
    /// against the schema before the handler sees them (the spec has servers validate every tool
    /// input): arguments that do not fit get a tool error (`isError`) naming where, as a typed
    /// tool's do.
    ///
    /// # Panics
    ///
    /// When the schema does not compile as a JSON Schema or its root is not `type: "object"`
    /// (what every `inputSchema` must be), and as [`Tool::new`], for an `x-mcp-header`
    /// annotation that breaks the transport's rules.
    pub fn with_raw_schema<F, Fut>(
        name: &str,
        description: &str,
        input_schema: Value,
        handler: F,
    ) -> Self
    where
        F: Fn(RequestContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<CallToolResult, HandlerError>> + Send + 'static,
    {
        assert!(
            input_schema.get("type") == Some(&json!("object")),
            "tool {name}: its input schema must have type \"object\" at its root"
        );
        let validator = jsonschema::validator_for(&input_schema)
            .unwrap_or_else(|e| panic!("tool {name}: its input schema does not compile: {e}"));
        let boxed = move |ctx, args: Value| -> BoxFuture<_> {
            let misfit = validator
                .iter_errors(&args)
                .next()
                .map(|misfit| schema_misfit(&misfit.instance_path().to_string(), &misfit));
            match misfit {
                None => Box::pin(handler(ctx, args)),
                Some(message) => Box::pin(async move { Ok(CallToolResult::error(message)) }),
            }
        };
        Self::with_handler(name, description, input_schema, Arc::new(boxed))
    }

    fn with_handler(
        name: &str,
        description: &str,
        input_schema: Value,
        handler: Arc<ToolHandler>,
    ) -> Self {
        let header_params = header_params(&input_schema).unwrap_or_else(|why| {
            panic!("tool {name}: {why} (see the transport's x-mcp-header rules)")
        });
        Self {
            name: name.to_owned(),
            title: None,
            description: description.to_owned(),
            input_schema,
            output_schema: None,
            annotations: None,
            hidden: false,
            header_params,
            required_scope: None,
            handler,
        }
    }

    /// Requires `scope` of callers whose tokens carry scopes.
    pub fn requires_scope(mut self, scope: &str) -> Self {
        self.required_scope = Some(scope.to_owned());
        self
    }

    /// Sets the display title.
    pub fn title(mut self, title: &str) -> Self {
        self.title = Some(title.to_owned());
        self
    }

    /// Declares the shape of `structuredContent`.
    pub fn output<O: JsonSchema>(mut self) -> Self {
        self.output_schema = Some(output_schema_of::<O>());
        self
    }

    /// Behaviour hints (`readOnlyHint`, `destructiveHint`, `idempotentHint`, `openWorldHint`).
    pub fn annotations(mut self, annotations: Value) -> Self {
        self.annotations = Some(annotations);
        self
    }

    /// Keeps the tool out of `tools/list`; it can still be called by name.
    pub fn hidden(mut self) -> Self {
        self.hidden = true;
        self
    }

    /// Runs the handler with the raw `arguments`; it may ask the client for input via `ctx`.
    pub fn call(
        &self,
        ctx: RequestContext,
        arguments: Value,
    ) -> BoxFuture<Result<CallToolResult, HandlerError>> {
        (self.handler)(ctx, arguments)
    }

    /// The definition shown in `tools/list`.
    pub fn definition(&self) -> Value {
        let mut def = Map::new();
        def.insert("name".into(), json!(self.name));
        if let Some(title) = &self.title {
            def.insert("title".into(), json!(title));
        }
        def.insert("description".into(), json!(self.description));
        def.insert("inputSchema".into(), self.input_schema.clone());
        if let Some(schema) = &self.output_schema {
            def.insert("outputSchema".into(), schema.clone());
        }
        if let Some(annotations) = &self.annotations {
            def.insert("annotations".into(), annotations.clone());
        }
        Value::Object(def)
    }
}

/// `Invalid arguments: order.count: …`, or without a path when the arguments as a whole
/// do not fit (a missing field, not an object).
fn argument_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let message = if path == "." {
        format!("Invalid arguments: {}", e.inner())
    } else {
        format!("Invalid arguments: {path}: {}", e.inner())
    };
    // The message may quote the offending value, which the client chose the size of.
    shortened(message, MESSAGE_LIMIT)
}

/// What a tool error says of arguments that do not fit a hand-written schema: where (a JSON
/// pointer, empty for the whole) and why.
fn schema_misfit(pointer: &str, why: &impl std::fmt::Display) -> String {
    let message = if pointer.is_empty() {
        format!("Invalid arguments: {why}")
    } else {
        format!("Invalid arguments: {pointer}: {why}")
    };
    // The message may quote the offending value, which the client chose the size of.
    shortened(message, MESSAGE_LIMIT)
}

/// The arguments of a tool that takes none.
#[derive(Debug, Default, serde::Deserialize, JsonSchema)]
pub struct NoArguments {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "tool loose: its input schema must have type \"object\" at its root")]
    fn a_raw_schema_must_describe_an_object() {
        let _ = Tool::with_raw_schema("loose", "Anything.", json!({}), |_, _| async {
            Ok(CallToolResult::text("done"))
        });
    }

    #[test]
    #[should_panic(expected = "tool broken: its input schema does not compile")]
    fn a_raw_schema_must_compile() {
        let schema =
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}});
        let _ = Tool::with_raw_schema("broken", "Broken.", schema, |_, _| async {
            Ok(CallToolResult::text("done"))
        });
    }

    #[test]
    #[should_panic(expected = "tool lookup: x-mcp-header \"Two Words\" at region")]
    fn a_tool_whose_header_annotation_clients_would_drop_is_refused_when_built() {
        let schema = json!({"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Two Words"}}});
        Tool::with_raw_schema("lookup", "Looks up.", schema, |_, _| async {
            Ok(CallToolResult::text("found"))
        });
    }
}
