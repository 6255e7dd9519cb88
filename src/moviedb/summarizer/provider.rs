//! The LLM provider: any OpenAI-compatible chat-completions endpoint (OpenAI, a local Ollama or
//! vLLM, a gateway), called with `async-openai` with the prompt of [`super::prompt`]. Bounds what
//! it reads, and tells the provider's failures (worth falling back on) from our own mistakes (to
//! be reported).

use std::time::Duration;

use anyhow::Context as _;
use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::types::chat::{
    ChatCompletionRequestSystemMessage, ChatCompletionRequestUserMessage,
    CreateChatCompletionRequest,
};
use serde::Deserialize;

use super::SummaryText;
use super::config::ProviderConfig;
use super::prompt::{INSTRUCTIONS, PROMPT_VERSION, parse_answer, prompt};
use crate::bounded::read_at_most;
use crate::moviedb::model::Review;

/// How long a summary waits for one of the provider calls allowed at once before it is written
/// by the server instead: a user is waiting, and the server's words are ready at once.
const CALL_WAIT: Duration = Duration::from_secs(2);
/// Longest provider message repeated in the log, in characters.
const LOGGED_MESSAGE_LIMIT: usize = 200;
/// Largest answer read from the provider, in bytes. A summary is a few hundred bytes; without a
/// bound a provider (or whatever answers at its address) could make the server hold anything.
const MOST_ANSWER_BYTES: usize = 1024 * 1024;

/// Why the provider gave no summary. Each of these means: answer with the server-side summary.
#[derive(Debug, thiserror::Error)]
pub enum ProviderFailure {
    #[error("no answer within {} s", .0.as_secs())]
    TimedOut(Duration),
    #[error("HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("refused: {0}")]
    Refused(String),
    #[error("unreadable answer: {0}")]
    Unreadable(String),
    #[error("an answer larger than {} KiB", MOST_ANSWER_BYTES / 1024)]
    TooLarge,
    #[error("the answer was cut short at the token budget ({0} tokens; see --llm-max-tokens)")]
    CutShort(u32),
    #[error("busy: all {0} calls allowed at once stayed in flight for {wait} s", wait = CALL_WAIT.as_secs())]
    Busy(usize),
}

impl ProviderFailure {
    /// The kind of failure, as a metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::TimedOut(_) => "timed_out",
            Self::Status { .. } => "http_status",
            Self::Unreachable(_) => "unreachable",
            Self::Refused(_) => "refused",
            Self::Unreadable(_) => "unreadable",
            Self::TooLarge => "too_large",
            Self::CutShort(_) => "cut_short",
            Self::Busy(_) => "busy",
        }
    }
}

/// A provider call that produced no summary.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider failed; the caller falls back.
    #[error(transparent)]
    Failed(#[from] ProviderFailure),
    /// A mistake of ours (e.g. a request we could not build); not to be hidden by a fallback.
    #[error(transparent)]
    Internal(anyhow::Error),
}

/// The subset of a chat completion this server reads. Lenient on purpose: providers differ in
/// the fields they add and in their `finish_reason` values.
#[derive(Debug, Deserialize)]
struct ChatReply {
    #[serde(default)]
    choices: Vec<ChatReplyChoice>,
    #[serde(default)]
    usage: Option<ChatUsage>,
}

/// The tokens a call took, when the provider says.
#[derive(Debug, Deserialize)]
struct ChatUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ChatReplyChoice {
    #[serde(default)]
    message: ChatReplyMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct ChatReplyMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
}

pub struct Provider {
    client: Client<OpenAIConfig>,
    model: String,
    /// What decides this provider's words besides the reviews, as the summary cache keys them.
    writer: String,
    max_tokens: u32,
    timeout: Duration,
    /// One per call in flight: however many summaries are asked for at once (one per movie and
    /// review set, the cache shares the rest), the provider sees at most this many calls.
    calls: tokio::sync::Semaphore,
    max_concurrent: usize,
    /// Kept to scrub it from anything the provider says back before it is logged.
    api_key: Option<String>,
}

impl Provider {
    /// Fails when no HTTP client can be set up (e.g. the system has no CA certificates).
    pub fn new(config: ProviderConfig) -> anyhow::Result<Self> {
        // Every field is set, so the OPENAI_* variables the crate reads by itself never add to or
        // replace what was configured.
        let openai = OpenAIConfig::new()
            .with_api_base(&config.base_url)
            .with_api_key(config.api_key.clone().unwrap_or_default())
            .with_org_id("")
            .with_project_id("");
        let http = reqwest::Client::builder()
            .build()
            .context("setting up the HTTP client for the LLM provider")?;
        // No retry layer: a user is waiting, and the fallback answers at once; the provider is
        // asked again once the fallback's short cache life is over.
        let client = Client::build(http.clone(), openai).with_http_service(CappedAnswers { http });
        let writer = format!(
            "{}|{}|{}|prompt {PROMPT_VERSION}",
            config.base_url, config.model, config.max_tokens
        );
        Ok(Self {
            client,
            writer,
            model: config.model,
            max_tokens: config.max_tokens,
            timeout: config.timeout,
            calls: tokio::sync::Semaphore::new(config.max_concurrent.max(1)),
            max_concurrent: config.max_concurrent.max(1),
            api_key: config.api_key,
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Who writes this provider's summaries, for the cache's keys: the provider's address, the
    /// model, its token budget and the prompt's version. A summary cached by another provider,
    /// model, budget or prompt (in a Redis shared across deployments) is not served as this
    /// one's.
    pub fn writer(&self) -> &str {
        &self.writer
    }

    /// Asks the model to summarize `reviews` of `movie_id`. Dropping the returned future drops
    /// the HTTP request.
    pub async fn summarize(
        &self,
        movie_id: i64,
        reviews: &[Review],
    ) -> Result<SummaryText, ProviderError> {
        let request = CreateChatCompletionRequest {
            model: self.model.clone(),
            messages: vec![
                ChatCompletionRequestSystemMessage::from(INSTRUCTIONS).into(),
                ChatCompletionRequestUserMessage::from(prompt(movie_id, reviews)).into(),
            ],
            max_completion_tokens: Some(self.max_tokens),
            ..Default::default()
        };
        let Ok(Ok(_call)) = tokio::time::timeout(CALL_WAIT, self.calls.acquire()).await else {
            return Err(ProviderFailure::Busy(self.max_concurrent).into());
        };
        let chat = self.client.chat();
        let call = chat.create_byot::<_, ChatReply>(request);
        let reply = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => return Err(ProviderFailure::TimedOut(self.timeout).into()),
            Ok(Err(e)) => return Err(self.classify(e)),
            Ok(Ok(reply)) => reply,
        };
        if let Some(usage) = &reply.usage {
            // Recorded on the caller's span (`llm.summarize`), which declares these fields.
            let span = tracing::Span::current();
            if let Some(tokens) = usage.prompt_tokens {
                span.record("gen_ai.usage.input_tokens", tokens);
            }
            if let Some(tokens) = usage.completion_tokens {
                span.record("gen_ai.usage.output_tokens", tokens);
            }
        }
        let Some(choice) = reply.choices.into_iter().next() else {
            return Err(ProviderFailure::Refused("the answer has no choices".into()).into());
        };
        match choice.finish_reason.as_deref() {
            Some("content_filter") => {
                return Err(
                    ProviderFailure::Refused("stopped by the content filter".into()).into(),
                );
            }
            // Half a sentence, or themes cut off, would be served for the summary's whole life.
            Some("length") => return Err(ProviderFailure::CutShort(self.max_tokens).into()),
            _ => {}
        }
        if let Some(refusal) = choice.message.refusal.filter(|r| !r.trim().is_empty()) {
            return Err(ProviderFailure::Refused(self.loggable(&refusal)).into());
        }
        match choice.message.content.filter(|c| !c.trim().is_empty()) {
            Some(content) => Ok(parse_answer(&content)),
            None => Err(ProviderFailure::Refused("an empty answer".into()).into()),
        }
    }

    /// Sorts an error of the client into the provider's failures and our own mistakes.
    fn classify(&self, error: OpenAIError) -> ProviderError {
        match error {
            OpenAIError::ApiError(response) => ProviderFailure::Status {
                status: response.status_code.as_u16(),
                message: self.loggable(&response.api_error.to_string()),
            }
            .into(),
            OpenAIError::Reqwest(e) if e.is_builder() => {
                ProviderError::Internal(anyhow::Error::new(e).context("building the LLM request"))
            }
            OpenAIError::Reqwest(e) => {
                ProviderFailure::Unreachable(self.loggable(&chain(&e))).into()
            }
            OpenAIError::Boxed(e) if e.is::<AnswerTooLarge>() => ProviderFailure::TooLarge.into(),
            OpenAIError::JSONDeserialize(e, body) => ProviderFailure::Unreadable(
                self.loggable(&format!("{e}; the answer began {body:?}")),
            )
            .into(),
            other => ProviderError::Internal(
                anyhow::Error::new(other).context("calling the LLM provider"),
            ),
        }
    }

    /// `text` on one line, shortened, and without the API key should the provider echo it.
    fn loggable(&self, text: &str) -> String {
        let mut text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(key) = &self.api_key {
            text = text.replace(key.as_str(), "***");
        }
        if text.chars().count() > LOGGED_MESSAGE_LIMIT {
            text = text.chars().take(LOGGED_MESSAGE_LIMIT).collect::<String>() + "…";
        }
        text
    }
}

/// Sends the client's requests and reads each answer whole, refusing one larger than
/// [`MOST_ANSWER_BYTES`] (the client itself would read any size). Only for calls answered in
/// one piece: a streamed answer would be read whole, and cut off at that size.
#[derive(Clone)]
struct CappedAnswers {
    http: reqwest::Client,
}

/// The provider's answer was larger than [`MOST_ANSWER_BYTES`].
#[derive(Debug, thiserror::Error)]
#[error("the answer is larger than {MOST_ANSWER_BYTES} bytes")]
struct AnswerTooLarge;

impl tower::Service<HttpRequestFactory> for CappedAnswers {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = futures::future::BoxFuture<'static, Result<reqwest::Response, OpenAIError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), OpenAIError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: HttpRequestFactory) -> Self::Future {
        let http = self.http.clone();
        Box::pin(async move {
            let request = request.build().await?;
            let response = http.execute(request).await.map_err(OpenAIError::Reqwest)?;
            read_capped(response, MOST_ANSWER_BYTES).await
        })
    }
}

/// `response` with its body read into memory, unless it is larger than `most` bytes. An error
/// answer that large keeps its status, with a short error of ours as its body.
async fn read_capped(
    mut response: reqwest::Response,
    most: usize,
) -> Result<reqwest::Response, OpenAIError> {
    let body = match read_at_most(&mut response, most)
        .await
        .map_err(OpenAIError::Reqwest)?
    {
        Some(body) => body,
        None if response.status().is_success() => {
            return Err(OpenAIError::Boxed(Box::new(AnswerTooLarge)));
        }
        None => {
            response
                .headers_mut()
                .remove(reqwest::header::CONTENT_LENGTH);
            let message = format!("an error page larger than {} KiB", most / 1024);
            // The client reads a server error's body as its message, any other's as JSON.
            if response.status().is_server_error() {
                message.into_bytes()
            } else {
                serde_json::to_vec(&serde_json::json!({"error": {"message": message}}))
                    .unwrap_or_default()
            }
        }
    };
    let mut whole = http::Response::new(body);
    *whole.status_mut() = response.status();
    *whole.version_mut() = response.version();
    *whole.headers_mut() = std::mem::take(response.headers_mut());
    Ok(reqwest::Response::from(whole))
}

/// An error and its causes, on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use async_openai::error::{ApiError, ApiErrorResponse};
    use axum::http::StatusCode;

    use super::*;

    fn provider() -> Provider {
        Provider::new(ProviderConfig {
            base_url: "http://127.0.0.1:9/v1".into(),
            model: "m".into(),
            api_key: Some("sk-secret-key".into()),
            timeout: Duration::from_secs(1),
            max_tokens: 10,
            max_concurrent: 1,
        })
        .expect("an HTTP client")
    }

    fn api_error(status: StatusCode, message: &str) -> OpenAIError {
        OpenAIError::ApiError(ApiErrorResponse {
            status_code: status,
            api_error: ApiError {
                message: message.into(),
                ..ApiError::default()
            },
        })
    }

    #[test]
    fn http_errors_are_provider_failures_with_their_status_and_without_the_key() {
        let failure = provider().classify(api_error(
            StatusCode::UNAUTHORIZED,
            "Incorrect API key provided:\n sk-secret-key",
        ));
        let ProviderError::Failed(ProviderFailure::Status { status, message }) = failure else {
            panic!("a provider failure: {failure:?}");
        };
        assert_eq!(status, 401);
        assert_eq!(message, "Incorrect API key provided: ***");
    }

    #[test]
    fn unreadable_answers_are_provider_failures_and_our_mistakes_are_not() {
        let Err(not_json) = serde_json::from_str::<ChatReply>("<html>") else {
            panic!("<html> is not JSON");
        };
        assert!(matches!(
            provider().classify(OpenAIError::JSONDeserialize(not_json, "<html>".into())),
            ProviderError::Failed(ProviderFailure::Unreadable(_))
        ));
        assert!(matches!(
            provider().classify(OpenAIError::InvalidArgument(
                "a request we built wrong".into()
            )),
            ProviderError::Internal(_)
        ));
    }
}
