//! Results that carry content: content blocks, tool results, prompt messages and resource contents.

use serde::Serialize;
use serde_json::value::RawValue;

/// A content block in a tool result or a prompt message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum Content {
    /// Plain text (`"type": "text"`).
    Text {
        /// The text itself.
        text: String,
    },
    /// An image (`"type": "image"`).
    Image {
        /// The image bytes, base64-encoded.
        data: String,
        /// The image format, such as `image/png`; sent as `mimeType`.
        mime_type: String,
    },
    /// A sound clip (`"type": "audio"`).
    Audio {
        /// The audio bytes, base64-encoded.
        data: String,
        /// The audio format, such as `audio/wav`; sent as `mimeType`.
        mime_type: String,
    },
    /// A resource's contents embedded in the message (`"type": "resource"`).
    Resource {
        /// The embedded contents.
        resource: ResourceContents,
    },
}

impl Content {
    /// A `text` block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// An `image` block from base64-encoded bytes and their MIME type.
    pub fn image(base64: impl Into<String>, mime_type: impl Into<String>) -> Self {
        Self::Image {
            data: base64.into(),
            mime_type: mime_type.into(),
        }
    }

    /// An `audio` block from base64-encoded bytes and their MIME type.
    pub fn audio(base64: impl Into<String>, mime_type: impl Into<String>) -> Self {
        Self::Audio {
            data: base64.into(),
            mime_type: mime_type.into(),
        }
    }

    /// A `resource` block embedding a resource's contents.
    pub fn resource(resource: ResourceContents) -> Self {
        Self::Resource { resource }
    }
}

/// The contents of one resource, as text or as base64 bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceContents {
    /// The resource's URI, as listed by `resources/list` or matched by a template.
    pub uri: String,
    /// The MIME type of the contents, if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The contents as text, for text resources; exclusive with `blob`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The contents as base64-encoded bytes, for binary resources; exclusive with `text`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
}

impl ResourceContents {
    /// Text contents of the resource at `uri`.
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

    /// Binary contents of the resource at `uri`, already base64-encoded.
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
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallToolResult {
    /// The blocks the model reads as the tool's output.
    pub content: Vec<Content>,
    /// A JSON value matching the tool's output schema, if it declares one. Kept as the JSON text
    /// it is sent as: the same text goes into `content`, and nothing reads it in between.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Box<RawValue>>,
    /// Set when the tool failed in a way the model should see; sent as `isError: true`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl CallToolResult {
    /// A successful result made of `content` blocks.
    pub fn content(content: Vec<Content>) -> Self {
        Self {
            content,
            structured_content: None,
            is_error: false,
        }
    }

    /// A successful result with a single text block.
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

    /// Structured content, mirrored as JSON text for clients that only read `content`. A value
    /// serde_json cannot write (a map with keys that are not strings, a `Serialize` that fails)
    /// is a bug of the tool's: it is logged, and the result is a tool error saying the result
    /// could not be written, rather than content that breaks the tool's `outputSchema`.
    pub fn structured<T: Serialize>(value: &T) -> Self {
        // Written once, as text: building a `Value` tree first and writing it twice cost a
        // result-heavy tool a fifth of its CPU. `to_raw_value` keeps what serde_json wrote
        // without parsing it again (`RawValue::from_string` would: 5 % of a recommend call's CPU).
        let structured = match serde_json::value::to_raw_value(value) {
            Ok(structured) => structured,
            Err(error) => {
                tracing::error!("a tool's structured result cannot be written as JSON: {error}");
                return Self::error("The tool's result could not be written as JSON.");
            }
        };
        Self {
            content: vec![Content::text(structured.get())],
            structured_content: Some(structured),
            is_error: false,
        }
    }
}

/// A message of a prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptMessage {
    /// Who speaks the message: `"user"` or `"assistant"`.
    pub role: &'static str,
    /// What the message says.
    pub content: Content,
}

impl PromptMessage {
    /// A message spoken by the user.
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
    /// A description of the rendered prompt, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The messages the prompt expands to, in order.
    pub messages: Vec<PromptMessage>,
}

/// The result of `resources/read`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadResourceResult {
    /// The resource's contents; a URI may expand to several entries.
    pub contents: Vec<ResourceContents>,
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn a_value_json_cannot_hold_is_a_tool_error_not_null_content() {
        // serde_json writes only strings and numbers as map keys.
        let unwritable: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
        let failed = CallToolResult::structured(&unwritable);
        assert!(failed.is_error);
        assert!(failed.structured_content.is_none());

        let written = CallToolResult::structured(&HashMap::from([("a", 1)]));
        assert!(!written.is_error);
        let text = written.structured_content.as_deref().map(RawValue::get);
        assert_eq!(text, Some(r#"{"a":1}"#));
    }
}
