//! Resources and resource templates: definitions, readers, and the small URI-template matcher
//! (`scheme://path/{var}/more`) that routes a read to its template.

use std::future::Future;
use std::sync::Arc;

use serde_json::{Value, json};

use super::BoxFuture;
use crate::mrtr::{HandlerError, RequestContext};
use crate::protocol::content::ReadResourceResult;

/// Values captured from a URI by a template, by variable name.
pub type TemplateVars = Vec<(String, String)>;

type ResourceReader = dyn Fn(RequestContext, String) -> BoxFuture<Result<ReadResourceResult, HandlerError>>
    + Send
    + Sync;
type TemplateReader = dyn Fn(RequestContext, String, TemplateVars) -> BoxFuture<Result<ReadResourceResult, HandlerError>>
    + Send
    + Sync;

/// A resource at one fixed URI: its `resources/list` definition and the reader that serves it.
pub struct Resource {
    /// The URI `resources/read` asks for.
    pub uri: String,
    /// A human-readable name for the resource.
    pub name: String,
    /// What the resource holds, if described.
    pub description: Option<String>,
    /// The MIME type of its contents, if known.
    pub mime_type: Option<String>,
    reader: Arc<ResourceReader>,
}

impl Resource {
    /// A resource at `uri` called `name`, served by `reader`, which gets the URI.
    pub fn new<F, Fut>(uri: &str, name: &str, reader: F) -> Self
    where
        F: Fn(RequestContext, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ReadResourceResult, HandlerError>> + Send + 'static,
    {
        Self {
            uri: uri.to_owned(),
            name: name.to_owned(),
            description: None,
            mime_type: None,
            reader: Arc::new(move |ctx, uri| Box::pin(reader(ctx, uri))),
        }
    }

    /// Sets the description shown in `resources/list`.
    pub fn description(mut self, description: &str) -> Self {
        self.description = Some(description.to_owned());
        self
    }

    /// Sets the MIME type shown in `resources/list`.
    pub fn mime_type(mut self, mime_type: &str) -> Self {
        self.mime_type = Some(mime_type.to_owned());
        self
    }

    /// Reads the resource; the reader may ask the client for input via `ctx`.
    pub fn read(&self, ctx: RequestContext) -> BoxFuture<Result<ReadResourceResult, HandlerError>> {
        (self.reader)(ctx, self.uri.clone())
    }

    /// The definition shown in `resources/list`.
    pub fn definition(&self) -> Value {
        let mut def = json!({ "uri": self.uri, "name": self.name });
        if let Some(description) = &self.description {
            def["description"] = json!(description);
        }
        if let Some(mime_type) = &self.mime_type {
            def["mimeType"] = json!(mime_type);
        }
        def
    }
}

/// One piece of a parsed URI template.
#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Literal(String),
    Variable(String),
}

/// A family of resources whose URIs match a template such as `note://{id}`.
pub struct ResourceTemplate {
    /// The URI template, with `{name}` variables, shown in `resources/templates/list`.
    pub uri_template: String,
    /// A human-readable name for the family.
    pub name: String,
    /// What the resources hold, if described.
    pub description: Option<String>,
    /// The MIME type of their contents, if known.
    pub mime_type: Option<String>,
    segments: Vec<Segment>,
    reader: Arc<TemplateReader>,
}

impl ResourceTemplate {
    /// A template for `uri_template` called `name`, served by `reader`, which gets the URI read
    /// and the values its variables captured.
    pub fn new<F, Fut>(uri_template: &str, name: &str, reader: F) -> Self
    where
        F: Fn(RequestContext, String, TemplateVars) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ReadResourceResult, HandlerError>> + Send + 'static,
    {
        Self {
            uri_template: uri_template.to_owned(),
            name: name.to_owned(),
            description: None,
            mime_type: None,
            segments: parse_template(uri_template),
            reader: Arc::new(move |ctx, uri, vars| Box::pin(reader(ctx, uri, vars))),
        }
    }

    /// Sets the description shown in `resources/templates/list`.
    pub fn description(mut self, description: &str) -> Self {
        self.description = Some(description.to_owned());
        self
    }

    /// Sets the MIME type shown in `resources/templates/list`.
    pub fn mime_type(mut self, mime_type: &str) -> Self {
        self.mime_type = Some(mime_type.to_owned());
        self
    }

    /// Reads the resource at `uri`, whose variables captured `vars`; the reader may ask for input.
    pub fn read(
        &self,
        ctx: RequestContext,
        uri: String,
        vars: TemplateVars,
    ) -> BoxFuture<Result<ReadResourceResult, HandlerError>> {
        (self.reader)(ctx, uri, vars)
    }

    /// Matches a concrete URI; each variable captures a non-empty run without `/`.
    pub fn matches(&self, uri: &str) -> Option<TemplateVars> {
        let mut rest = uri;
        let mut vars = Vec::new();
        let mut segments = self.segments.iter().peekable();
        while let Some(segment) = segments.next() {
            match segment {
                Segment::Literal(literal) => rest = rest.strip_prefix(literal.as_str())?,
                Segment::Variable(name) => {
                    let end = match segments.peek() {
                        Some(Segment::Literal(next)) => rest.find(next.as_str())?,
                        _ => rest.len(),
                    };
                    let value = &rest[..end];
                    if value.is_empty() || value.contains('/') {
                        return None;
                    }
                    vars.push((name.clone(), value.to_owned()));
                    rest = &rest[end..];
                }
            }
        }
        rest.is_empty().then_some(vars)
    }

    /// The definition shown in `resources/templates/list`.
    pub fn definition(&self) -> Value {
        let mut def = json!({ "uriTemplate": self.uri_template, "name": self.name });
        if let Some(description) = &self.description {
            def["description"] = json!(description);
        }
        if let Some(mime_type) = &self.mime_type {
            def["mimeType"] = json!(mime_type);
        }
        def
    }
}

fn parse_template(template: &str) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else {
            break;
        };
        if open > 0 {
            segments.push(Segment::Literal(rest[..open].to_owned()));
        }
        segments.push(Segment::Variable(rest[open + 1..close].to_owned()));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        segments.push(Segment::Literal(rest.to_owned()));
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::content::ReadResourceResult;

    fn template(pattern: &str) -> ResourceTemplate {
        ResourceTemplate::new(pattern, "t", |_, _, _| async {
            Ok(ReadResourceResult { contents: vec![] })
        })
    }

    #[test]
    fn templates_capture_their_variables() {
        let t = template("test://template/{id}/data");
        assert_eq!(
            t.matches("test://template/123/data"),
            Some(vec![("id".into(), "123".into())])
        );
        assert_eq!(t.matches("test://template//data"), None);
        assert_eq!(t.matches("test://template/1/2/data"), None);
        assert_eq!(t.matches("test://other/123/data"), None);
        let tail = template("note://{id}");
        assert_eq!(
            tail.matches("note://42"),
            Some(vec![("id".into(), "42".into())])
        );
    }
}
