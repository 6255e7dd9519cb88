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
                        missing.push((key, request));
                        continue;
                    }
                },
            };
            let answer = match request {
                InputRequest::Elicit(_) => {
                    Elicitation::from_response(&key, &raw).map(Answer::Elicitation)
                }
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
        if missing.is_empty() {
            return Ok(answers);
        }
        round.pending.extend(missing);
        Err(HandlerError::InputRequired(InputPending::new()))
    }

    fn answers_live(&self) -> bool {
        false
    }
}
