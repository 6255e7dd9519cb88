//! Asking the client: the [`Asker`] a [`RequestContext`](super::RequestContext) sends its
//! questions to, and the [`Answers`] that come back.
//!
//! The handler API is the same in both eras; only the asker differs. Under 2026-07-28 the
//! rounds asker (the engine's own) ends the call with `input_required` and finds the
//! answers on the retry; under a 2025-11-25 session a live peer (in the `legacy` module) sends
//! each question as a server-initiated request and waits for the answer.

use async_trait::async_trait;

use super::error::HandlerError;
use super::notify::Notifier;
use crate::protocol::ClientCapabilities;
use crate::protocol::input::{ElicitParams, Elicitation, InputRequest, Roots, Sampling};

/// Who answers a handler's questions.
#[async_trait]
pub trait Asker: Send + Sync + 'static {
    /// Answers `questions`; those the client did not declare a capability for come back
    /// unsupported. An asker that cannot answer now ends the call with
    /// [`HandlerError::InputRequired`].
    async fn ask(
        &self,
        capabilities: &ClientCapabilities,
        notifier: Option<&Notifier>,
        questions: Vec<(String, InputRequest)>,
    ) -> Result<Answers, HandlerError>;

    /// Whether answers come while the call waits (a live peer) rather than in a later round.
    fn answers_live(&self) -> bool;
}

/// One answer, of the kind its question asked for.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The user's answer to an `elicitation/create` question.
    Elicitation(Elicitation),
    /// The client's answer to a `sampling/createMessage` question.
    Sampling(Sampling),
    /// The client's answer to a `roots/list` question.
    Roots(Roots),
}

impl Answer {
    /// The answer to `request` from a client that cannot take it.
    pub fn unsupported(request: &InputRequest) -> Self {
        match request {
            InputRequest::Elicit(_) => Self::Elicitation(Elicitation::Unsupported),
            InputRequest::Sample(_) => Self::Sampling(Sampling::Unsupported),
            InputRequest::ListRoots(_) => Self::Roots(Roots::Unsupported),
        }
    }
}

/// The answers of one round, by key.
#[derive(Debug, Default)]
pub struct Answers(Vec<(String, Answer)>);

impl Answers {
    pub(crate) fn insert(&mut self, key: String, answer: Answer) {
        self.0.push((key, answer));
    }

    fn get(&self, key: &str) -> Option<&Answer> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, a)| a)
    }

    /// The answer to the form or URL elicitation asked under `key`.
    pub fn elicitation(&self, key: &str) -> Option<&Elicitation> {
        match self.get(key)? {
            Answer::Elicitation(answer) => Some(answer),
            _ => None,
        }
    }

    /// The answer to the sampling request asked under `key`.
    pub fn sampling(&self, key: &str) -> Option<&Sampling> {
        match self.get(key)? {
            Answer::Sampling(answer) => Some(answer),
            _ => None,
        }
    }

    /// The answer to the roots request asked under `key`.
    pub fn roots(&self, key: &str) -> Option<&Roots> {
        match self.get(key)? {
            Answer::Roots(answer) => Some(answer),
            _ => None,
        }
    }
}

impl FromIterator<(String, Answer)> for Answers {
    fn from_iter<I: IntoIterator<Item = (String, Answer)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// Whether the client declared what `request` needs.
pub(crate) fn supports(capabilities: &ClientCapabilities, request: &InputRequest) -> bool {
    match request {
        InputRequest::Elicit(ElicitParams::Form { .. }) => capabilities.elicitation_form,
        InputRequest::Elicit(ElicitParams::Url { .. }) => capabilities.elicitation_url,
        InputRequest::Sample(_) => capabilities.sampling,
        InputRequest::ListRoots(_) => capabilities.roots,
    }
}
