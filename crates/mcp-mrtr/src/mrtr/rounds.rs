//! The 2026-07-28 asker: answers come in rounds. A question whose answer is not in the request
//! ends the call with `input_required`; the engine parks what was read and asked, and the retry
//! brings the answers.

use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::ask::{Answer, Answers, Asker, supports};
use super::error::{HandlerError, InputPending};
use super::notify::Notifier;
use crate::protocol::ClientCapabilities;
use crate::protocol::input::{Elicitation, InputRequest, Roots, Sampling};

/// What one call carries from round to round, besides remembered work.
#[derive(Debug, Default)]
pub(crate) struct RoundState {
    /// Answers not read yet in this run, by key (earlier rounds' and this retry's).
    pub available: Map<String, Value>,
    /// Answers the handler has read in this run; they go into the next continuation.
    pub used: Map<String, Value>,
    /// Questions of the round being built.
    pub pending: Vec<(String, InputRequest)>,
    /// An answer that was not a valid answer to its question.
    pub refused: Option<RefusedAnswer>,
}

/// An answer refused as not answering its question.
#[derive(Debug)]
pub(crate) struct RefusedAnswer {
    pub key: String,
    /// Whether this run read it for the first time: an answer read before and asked for again
    /// as another kind of question is the handler's mistake, not the client's.
    pub first_read: bool,
}

/// Answers from the request's `inputResponses` and the parked continuation.
#[derive(Debug, Default)]
pub(crate) struct Rounds(Mutex<RoundState>);

impl Rounds {
    pub fn new(state: RoundState) -> Self {
        Self(Mutex::new(state))
    }

    /// What the handler read and asked, for the next continuation.
    pub fn take(&self) -> RoundState {
        std::mem::take(&mut *self.lock())
    }

    /// Whether an answer was refused as not answering its question.
    pub fn refused_answer(&self) -> bool {
        self.lock().refused.is_some()
    }

    fn lock(&self) -> MutexGuard<'_, RoundState> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl Asker for Rounds {
    async fn ask(
        &self,
        capabilities: &ClientCapabilities,
        _: Option<&Notifier>,
        questions: Vec<(String, InputRequest)>,
    ) -> Result<Answers, HandlerError> {
        let mut round = self.lock();
        let mut answers = Answers::default();
        let mut missing = Vec::new();
        // A question already asked in this round, still without its answer.
        let mut unanswered = false;
        for (key, request) in questions {
            if !supports(capabilities, &request) {
                answers.insert(key, Answer::unsupported(&request));
                continue;
            }
            // A read answer moves from `available` to `used`; asking for it again reads it there.
            let (raw, first_read) = match round.available.remove(&key) {
                Some(raw) => (raw, true),
                None => match round.used.get(&key) {
                    Some(raw) => (raw.clone(), false),
                    None => {
                        // Keys are unique in `inputRequests`: a question asked twice in a
                        // round (or again after its handler caught the first ask) is one.
                        let asked = |(k, _): &(String, InputRequest)| *k == key;
                        if let Some((_, first)) =
                            round.pending.iter().chain(&missing).find(|q| asked(q))
                            && *first != request
                        {
                            tracing::warn!(
                                key,
                                "a question asked again under its key with other params: the \
                                 first is sent"
                            );
                        }
                        if round.pending.iter().any(asked) {
                            unanswered = true;
                        } else if !missing.iter().any(asked) {
                            missing.push((key, request));
                        }
                        continue;
                    }
                },
            };
            let answer = match request {
                InputRequest::Elicit(asked) => Elicitation::from_response(&key, &raw)
                    .and_then(|answer| answer.fitting(&key, &asked))
                    .map(Answer::Elicitation),
                InputRequest::Sample(_) => {
                    Sampling::from_response(&key, &raw).map(Answer::Sampling)
                }
                InputRequest::ListRoots(_) => Roots::from_response(&key, &raw).map(Answer::Roots),
            };
            let answer = match answer {
                Ok(answer) => answer,
                Err(refusal) => {
                    round.refused = Some(RefusedAnswer { key, first_read });
                    return Err(refusal.into());
                }
            };
            answers.insert(key.clone(), answer);
            round.used.insert(key, raw);
        }
        if missing.is_empty() && !unanswered {
            return Ok(answers);
        }
        round.pending.extend(missing);
        Err(HandlerError::InputRequired(InputPending::new()))
    }

    fn answers_live(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::protocol::input::ElicitParams;

    fn name_question() -> InputRequest {
        InputRequest::Elicit(ElicitParams::Form {
            message: "Your name?".into(),
            requested_schema: json!({"type": "object", "properties": {"name": {"type": "string"}}}),
        })
    }

    #[tokio::test]
    async fn a_question_asked_twice_in_a_round_is_sent_once() {
        let rounds = Rounds::default();
        let capabilities = ClientCapabilities {
            elicitation_form: true,
            ..ClientCapabilities::default()
        };
        let twice = vec![("name".to_owned(), name_question()); 2];
        let first = rounds.ask(&capabilities, None, twice).await;
        assert!(matches!(first, Err(HandlerError::InputRequired(_))));
        // A handler that caught the first ask's InputRequired and asks again.
        let again = rounds
            .ask(
                &capabilities,
                None,
                vec![("name".to_owned(), name_question())],
            )
            .await;
        assert!(matches!(again, Err(HandlerError::InputRequired(_))));
        let keys: Vec<String> = rounds.take().pending.into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["name"]);
    }
}
