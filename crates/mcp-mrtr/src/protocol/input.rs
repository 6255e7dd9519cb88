//! MRTR input requests (what a server asks the client for inside an `input_required` result) and
//! input responses (the client's answers on the retry), with their validation.

use serde::{Serialize, Serializer, ser::SerializeMap};
use serde_json::{Map, Value, json};

use super::error::{ProtocolError, excerpt};

/// Most answers one retry may carry. A round asks a handful of questions; a client sending
/// thousands is not answering them.
pub const MAX_INPUT_RESPONSES: usize = 64;

/// One question a server puts to the client: an elicitation, a sampling request or a roots listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "method", content = "params")]
pub enum InputRequest {
    /// `elicitation/create`: ask the user to fill in a form or open a URL.
    #[serde(rename = "elicitation/create")]
    Elicit(ElicitParams),
    /// `sampling/createMessage`: ask the client's model for a completion.
    #[serde(rename = "sampling/createMessage")]
    Sample(SamplingParams),
    /// `roots/list`: ask which filesystem roots the client exposes.
    #[serde(rename = "roots/list")]
    ListRoots(EmptyParams),
}

impl InputRequest {
    /// Why the spec does not let a server send this question, if it does not: a form whose
    /// requested schema is not flat (see [`form::not_a_form`](super::form::not_a_form)), or a
    /// URL that is not absolute.
    pub fn malformed(&self) -> Option<String> {
        match self {
            Self::Elicit(ElicitParams::Form {
                requested_schema, ..
            }) => super::form::not_a_form(requested_schema),
            Self::Elicit(ElicitParams::Url { url, .. }) => {
                // The url crate forgives spaces and control characters (it trims or encodes
                // them); a client reading the text as sent might not.
                let why = if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    Some("it holds spaces or control characters".to_owned())
                } else {
                    url::Url::parse(url).err().map(|e| e.to_string())
                };
                why.map(|why| {
                    format!(
                        "the URL to open, {}, is not an absolute URL: {why}",
                        excerpt(url)
                    )
                })
            }
            Self::Sample(_) | Self::ListRoots(_) => None,
        }
    }
}

/// Params of a request that takes none; serializes as `{}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EmptyParams {}

/// `elicitation/create` params: a form (a flat JSON schema) or a URL to open.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum ElicitParams {
    /// `"mode": "form"`: the client shows a form built from a flat JSON schema.
    Form {
        /// What to tell the user about why the input is needed.
        message: String,
        /// The flat JSON schema (object of primitive properties) the form is built from.
        #[serde(rename = "requestedSchema")]
        requested_schema: Value,
    },
    /// `"mode": "url"`: the client offers the user a URL to open, out of band.
    Url {
        /// What to tell the user about why they should open the URL.
        message: String,
        /// The URL to open.
        url: String,
    },
}

/// `sampling/createMessage` params.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SamplingParams {
    /// The conversation to complete, oldest first.
    pub messages: Vec<SamplingMessage>,
    /// An optional system prompt; the client may ignore or change it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The most tokens the completion may use.
    pub max_tokens: u32,
    /// Sampling temperature, if the server has a preference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
}

impl SamplingParams {
    /// One user message asking for a completion of at most `max_tokens`.
    pub fn user_text(text: impl Into<String>, max_tokens: u32) -> Self {
        Self {
            messages: vec![SamplingMessage::user_text(text)],
            system_prompt: None,
            max_tokens,
            temperature: None,
        }
    }

    /// Adds a system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }
}

/// One message of the conversation sent in a sampling request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SamplingMessage {
    /// Who speaks the message: `"user"` or `"assistant"`.
    pub role: &'static str,
    /// The message's content block, such as `{"type": "text", "text": …}`.
    pub content: Value,
}

impl SamplingMessage {
    /// A text message spoken by the user.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self {
            role: "user",
            content: json!({ "type": "text", "text": text.into() }),
        }
    }
}

/// The questions of one round, serialized as an `InputRequests` map in the order they were asked
/// (clients and the conformance suite read the first key first).
pub struct OrderedRequests<'a>(pub &'a [(String, InputRequest)]);

impl Serialize for OrderedRequests<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, request) in self.0 {
            map.serialize_entry(key, request)?;
        }
        map.end()
    }
}

/// The user's answer to an elicitation.
#[derive(Debug, Clone, PartialEq)]
pub enum Elicitation {
    /// The user accepted; holds the submitted form content (empty if none was sent, as for URLs).
    Accepted(Map<String, Value>),
    /// The user explicitly declined to give the input.
    Declined,
    /// The user dismissed the request without choosing.
    Cancelled,
    /// The client did not declare the elicitation mode asked for, so the user was never asked.
    Unsupported,
}

impl Elicitation {
    /// Reads an `ElicitResult`.
    pub fn from_response(key: &str, value: &Value) -> Result<Self, ProtocolError> {
        let invalid = |why: &str| {
            ProtocolError::invalid_params(format!(
                "inputResponses.{key} is not a valid elicitation result: {why}"
            ))
        };
        let object = value
            .as_object()
            .ok_or_else(|| invalid("expected an object"))?;
        match object.get("action").and_then(Value::as_str) {
            Some("accept") => match object.get("content") {
                None | Some(Value::Null) => Ok(Self::Accepted(Map::new())),
                Some(Value::Object(content)) => Ok(Self::Accepted(content.clone())),
                Some(_) => Err(invalid("content must be an object")),
            },
            Some("decline") => Ok(Self::Declined),
            Some("cancel") => Ok(Self::Cancelled),
            Some(other) => Err(invalid(&format!("unknown action {other:?}"))),
            None => Err(invalid("missing action")),
        }
    }

    /// The answer, unless it accepts a form with a value that does not fit the form's requested
    /// schema (see [`form`](super::form)): -32602 naming the property.
    pub fn fitting(self, key: &str, asked: &ElicitParams) -> Result<Self, ProtocolError> {
        match asked {
            ElicitParams::Form {
                requested_schema, ..
            } => self.fitting_form(key, requested_schema),
            ElicitParams::Url { .. } => Ok(self),
        }
    }

    /// [`fitting`](Self::fitting), for a form asked with `schema`. A whole number sent for an
    /// integer property (`30.0`) comes back as an integer.
    pub fn fitting_form(mut self, key: &str, schema: &Value) -> Result<Self, ProtocolError> {
        if let Self::Accepted(content) = &mut self {
            if let Some(why) = super::form::misfit(schema, content) {
                return Err(ProtocolError::invalid_params(format!(
                    "inputResponses.{key} does not fit the requested form: {why}"
                )));
            }
            super::form::integers_as_integers(schema, content);
        }
        Ok(self)
    }

    /// The accepted form content, if the user accepted.
    pub fn content(&self) -> Option<&Map<String, Value>> {
        match self {
            Self::Accepted(content) => Some(content),
            _ => None,
        }
    }

    /// One field of the accepted form as text (a string as it is, any other value as JSON);
    /// `None` unless the user accepted and filled it.
    pub fn text(&self, field: &str) -> Option<String> {
        let value = self.content()?.get(field)?;
        Some(
            value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned),
        )
    }
}

/// The client's answer to a sampling request.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// The client's completion.
    Reply(SamplingReply),
    /// The client did not declare sampling.
    Unsupported,
    /// The client was asked but gave no reply: it refused, failed or did not answer in time.
    Failed(String),
}

/// A completion returned by the client, reduced to what tools use.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingReply {
    /// The name of the model that produced the completion, empty if not given.
    pub model: String,
    /// The text blocks of the completion, joined by newlines.
    pub text: String,
    /// Why generation stopped (such as `endTurn` or `maxTokens`), if given.
    pub stop_reason: Option<String>,
}

impl Sampling {
    /// Reads a `CreateMessageResult`, keeping the text of its content.
    pub fn from_response(key: &str, value: &Value) -> Result<Self, ProtocolError> {
        let invalid = |why: &str| {
            ProtocolError::invalid_params(format!(
                "inputResponses.{key} is not a valid sampling result: {why}"
            ))
        };
        let object = value
            .as_object()
            .ok_or_else(|| invalid("expected an object"))?;
        if object.get("role").and_then(Value::as_str).is_none() {
            return Err(invalid("missing role"));
        }
        let content = object
            .get("content")
            .ok_or_else(|| invalid("missing content"))?;
        let blocks: Vec<&Value> = match content {
            Value::Array(blocks) => blocks.iter().collect(),
            Value::Object(_) => vec![content],
            _ => {
                return Err(invalid(
                    "content must be a content block or an array of them",
                ));
            }
        };
        let text = blocks
            .iter()
            .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|block| block.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n");
        Ok(Self::Reply(SamplingReply {
            model: object
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            text,
            stop_reason: object
                .get("stopReason")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }))
    }
}

/// A root the client exposes.
#[derive(Debug, Clone, PartialEq)]
pub struct Root {
    /// The root's URI, usually a `file://` URI.
    pub uri: String,
    /// A display name for the root, if the client gave one.
    pub name: Option<String>,
}

/// The client's answer to a roots listing.
#[derive(Debug, Clone, PartialEq)]
pub enum Roots {
    /// The roots the client listed.
    Listed(Vec<Root>),
    /// The client did not declare roots.
    Unsupported,
    /// The client was asked but gave no list: it failed or did not answer in time.
    Failed(String),
}

impl Roots {
    /// Reads a `ListRootsResult`.
    pub fn from_response(key: &str, value: &Value) -> Result<Self, ProtocolError> {
        let invalid = |why: &str| {
            ProtocolError::invalid_params(format!(
                "inputResponses.{key} is not a valid roots result: {why}"
            ))
        };
        let roots = value
            .get("roots")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid("expected an object with a roots array"))?;
        roots
            .iter()
            .map(|root| {
                let uri = root
                    .get("uri")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("a root has no uri"))?;
                Ok(Root {
                    uri: uri.to_owned(),
                    name: root.get("name").and_then(Value::as_str).map(str::to_owned),
                })
            })
            .collect::<Result<_, _>>()
            .map(Self::Listed)
    }
}

/// Reads the `inputResponses` member of a retry: absent, or an object whose values are objects.
pub fn parse_input_responses(
    params: &Map<String, Value>,
) -> Result<Map<String, Value>, ProtocolError> {
    match params.get("inputResponses") {
        None => Ok(Map::new()),
        Some(Value::Object(responses)) => {
            if responses.len() > MAX_INPUT_RESPONSES {
                return Err(ProtocolError::invalid_params(format!(
                    "inputResponses holds {} answers; at most {MAX_INPUT_RESPONSES} are accepted",
                    responses.len()
                )));
            }
            if let Some((key, _)) = responses.iter().find(|(_, v)| !v.is_object()) {
                return Err(ProtocolError::invalid_params(format!(
                    "inputResponses.{} must be an object (an ElicitResult, CreateMessageResult or ListRootsResult)",
                    excerpt(key)
                )));
            }
            Ok(responses.clone())
        }
        Some(_) => Err(ProtocolError::invalid_params(
            "inputResponses must be an object",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(url: &str) -> InputRequest {
        InputRequest::Elicit(ElicitParams::Url {
            message: "Open this".into(),
            url: url.into(),
        })
    }

    #[test]
    fn a_url_to_open_is_absolute_and_written_plainly() {
        for fine in [
            "https://catalogue.example/connect?session=7",
            "http://localhost:8080/",
            "mailto:help@catalogue.example",
        ] {
            assert_eq!(open(fine).malformed(), None, "{fine}");
        }
        for (bad, why) in [
            ("", "relative URL without a base"),
            ("/connect", "relative URL without a base"),
            ("http://", "empty host"),
            (" https://catalogue.example", "spaces or control characters"),
            (
                "https://catalogue.example/a b",
                "spaces or control characters",
            ),
            (
                "https://cata\tlogue.example",
                "spaces or control characters",
            ),
        ] {
            let refused = open(bad)
                .malformed()
                .unwrap_or_else(|| panic!("{bad:?} passed"));
            assert!(refused.contains(why), "{bad:?}: {refused}");
        }
        let nested = InputRequest::Elicit(ElicitParams::Form {
            message: "Where?".into(),
            requested_schema: json!({"type": "object", "properties": {"at": {"type": "object"}}}),
        });
        assert!(nested.malformed().is_some());
        assert_eq!(
            InputRequest::ListRoots(EmptyParams {}).malformed(),
            None,
            "only elicitations carry anything to check"
        );
    }

    fn with_answers(count: usize) -> Map<String, Value> {
        let answers: Map<String, Value> = (0..count)
            .map(|i| (format!("q{i}"), json!({"action": "decline"})))
            .collect();
        let mut params = Map::new();
        params.insert("inputResponses".into(), Value::Object(answers));
        params
    }

    #[test]
    fn a_retry_carries_at_most_its_share_of_answers() {
        let parsed = parse_input_responses(&with_answers(MAX_INPUT_RESPONSES));
        assert_eq!(
            parsed.map(|answers| answers.len()).ok(),
            Some(MAX_INPUT_RESPONSES)
        );
        let refused = parse_input_responses(&with_answers(MAX_INPUT_RESPONSES + 1))
            .expect_err("one answer too many is refused");
        assert_eq!(refused.code, crate::protocol::error::INVALID_PARAMS);
        assert!(
            refused.message.contains("at most 64"),
            "{}",
            refused.message
        );
    }
}
