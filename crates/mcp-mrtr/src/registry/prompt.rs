//! Prompts: a definition with its arguments, a handler that builds the messages, and optional
//! argument completion.

use std::future::Future;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::BoxFuture;
use crate::mrtr::{HandlerError, RequestContext};
use crate::protocol::content::GetPromptResult;

type PromptHandler = dyn Fn(RequestContext, Map<String, Value>) -> BoxFuture<Result<GetPromptResult, HandlerError>>
    + Send
    + Sync;
type Completer = dyn Fn(&str, &str) -> Vec<String> + Send + Sync;

/// An argument a prompt takes, as listed in its definition.
#[derive(Debug, Clone)]
pub struct PromptArgument {
    /// The argument's name, the key it has in `prompts/get` `arguments`.
    pub name: String,
    /// What the argument means, shown to the user filling it in.
    pub description: String,
    /// Whether `prompts/get` must supply it; missing required arguments give -32602.
    pub required: bool,
}

impl PromptArgument {
    /// An argument `prompts/get` must supply.
    pub fn required(name: &str, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            required: true,
        }
    }

    /// An argument `prompts/get` may leave out.
    pub fn optional(name: &str, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            required: false,
        }
    }
}

/// A prompt template: its `prompts/list` definition and the handler that renders it.
pub struct Prompt {
    /// The unique name `prompts/get` asks for.
    pub name: String,
    /// A human-friendly display name, if different from `name`.
    pub title: Option<String>,
    /// What the prompt is for.
    pub description: String,
    /// The arguments it takes, in the order listed.
    pub arguments: Vec<PromptArgument>,
    handler: Arc<PromptHandler>,
    completer: Option<Arc<Completer>>,
}

impl Prompt {
    /// A prompt called `name` rendered by `handler`, which gets the request's `arguments` object.
    pub fn new<F, Fut>(name: &str, description: &str, handler: F) -> Self
    where
        F: Fn(RequestContext, Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<GetPromptResult, HandlerError>> + Send + 'static,
    {
        Self {
            name: name.to_owned(),
            title: None,
            description: description.to_owned(),
            arguments: Vec::new(),
            handler: Arc::new(move |ctx, args| Box::pin(handler(ctx, args))),
            completer: None,
        }
    }

    /// Sets the display title.
    pub fn title(mut self, title: &str) -> Self {
        self.title = Some(title.to_owned());
        self
    }

    /// Adds an argument to the definition.
    pub fn argument(mut self, argument: PromptArgument) -> Self {
        self.arguments.push(argument);
        self
    }

    /// Suggests values for an argument: `(argument name, typed prefix) -> candidates`.
    pub fn completer(
        mut self,
        completer: impl Fn(&str, &str) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.completer = Some(Arc::new(completer));
        self
    }

    /// Renders the prompt with `arguments`; the handler may ask the client for input via `ctx`.
    pub fn get(
        &self,
        ctx: RequestContext,
        arguments: Map<String, Value>,
    ) -> BoxFuture<Result<GetPromptResult, HandlerError>> {
        (self.handler)(ctx, arguments)
    }

    /// Completion candidates for `argument` starting from `prefix`; none without a completer.
    pub fn complete(&self, argument: &str, prefix: &str) -> Vec<String> {
        self.completer
            .as_ref()
            .map(|complete| complete(argument, prefix))
            .unwrap_or_default()
    }

    /// Names of required arguments missing from `arguments`.
    pub fn missing_arguments(&self, arguments: &Map<String, Value>) -> Vec<&str> {
        self.arguments
            .iter()
            .filter(|a| a.required && !arguments.contains_key(&a.name))
            .map(|a| a.name.as_str())
            .collect()
    }

    /// The definition shown in `prompts/list`.
    pub fn definition(&self) -> Value {
        let mut def = json!({ "name": self.name, "description": self.description });
        if let Some(title) = &self.title {
            def["title"] = json!(title);
        }
        if !self.arguments.is_empty() {
            def["arguments"] = self
                .arguments
                .iter()
                .map(|a| json!({ "name": a.name, "description": a.description, "required": a.required }))
                .collect();
        }
        def
    }
}
