//! What a server offers: tools, prompts, resources and resource templates, each a definition (what
//! `*/list` shows) plus the handler that serves it. Handlers receive a [`RequestContext`] and may
//! ask the client for input through it; the registry itself knows nothing about rounds or HTTP.

mod header_params;
mod prompt;
mod resource;
mod schema;
mod tool;

use std::future::Future;
use std::pin::Pin;

pub use header_params::{HeaderParam, header_params};
pub use prompt::{Prompt, PromptArgument};
pub use resource::{Resource, ResourceTemplate, TemplateVars};
pub use schema::{input_schema_of, output_schema_of};
pub use tool::{NoArguments, Tool};

pub use crate::mrtr::RequestContext;

/// A boxed, sendable future, the shape every stored handler returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Everything a server offers, in the order it was registered (lists are deterministic).
#[derive(Default)]
pub struct Registry {
    tools: Vec<Tool>,
    prompts: Vec<Prompt>,
    resources: Vec<Resource>,
    templates: Vec<ResourceTemplate>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`, replacing any tool of the same name.
    pub fn add_tool(&mut self, tool: Tool) -> &mut Self {
        self.tools.retain(|t| t.name != tool.name);
        self.tools.push(tool);
        self
    }

    /// Adds `prompt`, replacing any prompt of the same name.
    pub fn add_prompt(&mut self, prompt: Prompt) -> &mut Self {
        self.prompts.retain(|p| p.name != prompt.name);
        self.prompts.push(prompt);
        self
    }

    /// Adds `resource`, replacing any resource with the same URI.
    pub fn add_resource(&mut self, resource: Resource) -> &mut Self {
        self.resources.retain(|r| r.uri != resource.uri);
        self.resources.push(resource);
        self
    }

    /// Adds `template`; templates are tried in the order they were added.
    pub fn add_template(&mut self, template: ResourceTemplate) -> &mut Self {
        self.templates.push(template);
        self
    }

    /// The tool called `name`, listed or hidden.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The prompt called `name`.
    pub fn prompt(&self, name: &str) -> Option<&Prompt> {
        self.prompts.iter().find(|p| p.name == name)
    }

    /// The concrete resource at exactly `uri` (templates are matched by `template_for`).
    pub fn resource(&self, uri: &str) -> Option<&Resource> {
        self.resources.iter().find(|r| r.uri == uri)
    }

    /// The first template whose pattern matches `uri`, with the values it captured.
    pub fn template_for(&self, uri: &str) -> Option<(&ResourceTemplate, TemplateVars)> {
        self.templates
            .iter()
            .find_map(|t| t.matches(uri).map(|vars| (t, vars)))
    }

    /// The scopes the tools require, hidden ones' included (a scope may repeat).
    pub fn required_scopes(&self) -> impl Iterator<Item = &str> {
        self.tools
            .iter()
            .filter_map(|t| t.required_scope.as_deref())
    }

    /// Tools shown in `tools/list` (hidden ones are callable but not listed).
    pub fn listed_tools(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(|t| !t.hidden)
    }

    /// Prompts, in registration order, as `prompts/list` shows them.
    pub fn prompts(&self) -> &[Prompt] {
        &self.prompts
    }

    /// Concrete resources, in registration order, as `resources/list` shows them.
    pub fn resources(&self) -> &[Resource] {
        &self.resources
    }

    /// Resource templates, in registration order, as `resources/templates/list` shows them.
    pub fn templates(&self) -> &[ResourceTemplate] {
        &self.templates
    }

    /// Whether any tool is registered; without one the `tools` capability and methods are off.
    pub fn has_tools(&self) -> bool {
        !self.tools.is_empty()
    }

    /// Whether any prompt is registered; without one `prompts` capability and methods are off.
    pub fn has_prompts(&self) -> bool {
        !self.prompts.is_empty()
    }

    /// Whether any resource or template is registered; without one `resources` is off.
    pub fn has_resources(&self) -> bool {
        !self.resources.is_empty() || !self.templates.is_empty()
    }
}
