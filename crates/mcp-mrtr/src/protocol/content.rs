//! Results that carry content: content blocks, tool results, prompt messages and resource contents.

use serde::Serialize;
use serde_json::Value;

/// A content block in a tool result or a prompt message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum Content {
    Text { text: String },
    Image { data: String, mime_type: String },
    Audio { data: String, mime_type: String },
    Resource { resource: ResourceContents },
}

impl Content {
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    pub fn image(base64: impl Into<String>, mime_type: impl Into<String>) -> Self {
        Self::Image {
            data: base64.into(),
            mime_type: mime_type.into(),
        }
    }

    pub fn audio(base64: impl Into<String>, mime_type: impl Into<String>) -> Self {
        Self::Audio {
            data: base64.into(),
            mime_type: mime_type.into(),
        }
    }

    pub fn resource(resource: ResourceContents) -> Self {
        Self::Resource { resource }
    }
}

/// The contents of one resource, as text or as base64 bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceContents {
    pub uri: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
}

impl ResourceContents {
    pub fn text(
        uri: impl Into<String>,
        mime_type: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Self {
            uri: uri.into(),
            mime_type: Some(mime_type.into()),
            text: Some(text.into()),
            blob: None,
        }
    }

    pub fn blob(
        uri: impl Into<String>,
        mime_type: impl Into<String>,
        base64: impl Into<String>,
    ) -> Self {
        Self {
            uri: uri.into(),
            mime_type: Some(mime_type.into()),
            text: None,
            blob: Some(base64.into()),
        }
    }
}

/// The result of `tools/call`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallToolResult {
    pub content: Vec<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl CallToolResult {
    pub fn content(content: Vec<Content>) -> Self {
        Self {
            content,
            structured_content: None,
            is_error: false,
        }
    }

    pub fn text(text: impl Into<String>) -> Self {
        Self::content(vec![Content::text(text)])
    }

    /// A tool-level failure the model can read and act on (`isError: true`).
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            content: vec![Content::text(text)],
            structured_content: None,
            is_error: true,
        }
    }

    /// Structured content, mirrored as JSON text for clients that only read `content`.
    pub fn structured<T: Serialize>(value: &T) -> Self {
        let structured = serde_json::to_value(value).unwrap_or(Value::Null);
        Self {
            content: vec![Content::text(structured.to_string())],
            structured_content: Some(structured),
            is_error: false,
        }
    }
}

/// A message of a prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptMessage {
    pub role: &'static str,
    pub content: Content,
}

impl PromptMessage {
    pub fn user(content: Content) -> Self {
        Self {
            role: "user",
            content,
        }
    }
}

/// The result of `prompts/get`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GetPromptResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub messages: Vec<PromptMessage>,
}

/// The result of `resources/read`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadResourceResult {
    pub contents: Vec<ResourceContents>,
}
