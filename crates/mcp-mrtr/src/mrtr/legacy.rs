//! The 2025-11-25 era of the same handler API: under a legacy session, a question becomes a real
//! server-initiated request (`elicitation/create`, `sampling/createMessage`, `roots/list`) sent on
//! the call's SSE stream, and the handler waits for the client's answer, POSTed back as a JSON-RPC
//! response, up to a timeout. No answer, an error answer, or a timeout all end in the handler's
//! fallback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::oneshot;

use super::ask::{Answer, Answers, Asker, supports};
use super::error::HandlerError;
use super::notify::Notifier;
use super::seal::{StateSealer, VOUCH_TAG_LEN, VOUCH_UNIQUE_LEN};
use crate::protocol::error::excerpt;
use crate::protocol::input::{Elicitation, InputRequest, Roots, Sampling};
use crate::protocol::{ClientCapabilities, RequestId};

/// How a server-initiated request ended: the client's `result`, or its `error` object.
pub type ClientAnswer = Result<Value, Value>;

/// Largest answer to one question that is relayed to the other replicas: a form's content or a
/// completion fits many times over, and every replica receives each relayed answer.
pub(crate) const MAX_RELAYED_ANSWER_BYTES: usize = 64 * 1024;

/// What a question id's tag is for, so tags the keys make for other purposes never pass for one.
const QUESTION_ID_CONTEXT: &[u8] = b"mcp-mrtr/legacy-question-id/v1\0";

/// The ids of one legacy session's questions: `server-<key>-<64 hex digits>`, a fresh random
/// value and a tag by which the deployment's sealing keys vouch for the session, the input key and
/// that value. Any replica can tell an answer to a question really asked in this session from
/// one to a made-up id (or to another session's question), and takes or relays only the former.
#[derive(Clone)]
pub struct QuestionIds {
    sealer: Arc<StateSealer>,
    session: String,
}

impl QuestionIds {
    /// The question ids of `session`, vouched for by `sealer`'s keys.
    pub fn new(sealer: Arc<StateSealer>, session: &str) -> Self {
        Self {
            sealer,
            session: session.to_owned(),
        }
    }

    /// What the tag vouches for: its purpose, the session (its length first, so no session and
    /// key can pass for another pair) and the input key.
    fn message(&self, key: &str) -> Vec<u8> {
        let session = self.session.as_bytes();
        let length = u32::try_from(session.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes();
        [QUESTION_ID_CONTEXT, &length, session, key.as_bytes()].concat()
    }

    /// The id of a fresh question asked for input `key`.
    fn fresh(&self, key: &str) -> String {
        let (unique, tag) = self.sealer.vouch(&self.message(key));
        format!("server-{key}-{}{}", hex::encode(unique), hex::encode(tag))
    }

    /// Whether `id` is the id of a question asked in this session.
    pub fn asked(&self, id: &str) -> bool {
        let Some((key, vouched)) = id
            .strip_prefix("server-")
            .and_then(|rest| rest.rsplit_once('-'))
        else {
            return false;
        };
        let mut raw = [0u8; VOUCH_UNIQUE_LEN + VOUCH_TAG_LEN];
        // Lower case only, as made: an id has one spelling, the one its call waits under.
        if vouched.bytes().any(|b| b.is_ascii_uppercase())
            || hex::decode_to_slice(vouched, &mut raw).is_err()
        {
            return false;
        }
        let (unique, tag) = raw.split_at(VOUCH_UNIQUE_LEN);
        match (
            <&[u8; VOUCH_UNIQUE_LEN]>::try_from(unique),
            <&[u8; VOUCH_TAG_LEN]>::try_from(tag),
        ) {
            (Ok(unique), Ok(tag)) => self.sealer.vouches(unique, &self.message(key), tag),
            _ => false,
        }
    }
}

/// Calls waiting for the client's answer to a server-initiated request, by request id.
#[derive(Default)]
pub struct PendingAnswers {
    waiting: Mutex<HashMap<String, oneshot::Sender<ClientAnswer>>>,
}

impl PendingAnswers {
    /// Hands an answer to the call waiting for `id`; `false` if no call here waits for it.
    pub fn deliver(&self, id: &str, answer: ClientAnswer) -> bool {
        let waiting = self.lock().remove(id);
        waiting.is_some_and(|sender| sender.send(answer).is_ok())
    }

    fn register(self: &Arc<Self>, id: String) -> (Registration, oneshot::Receiver<ClientAnswer>) {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id.clone(), tx);
        (
            Registration {
                pending: self.clone(),
                id,
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<ClientAnswer>>> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Removes a waiting entry however the wait ends (answer, timeout, cancelled call).
struct Registration {
    pending: Arc<PendingAnswers>,
    id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.pending.lock().remove(&self.id);
    }
}

/// The client at the other end of a legacy session, as seen by one call.
#[derive(Clone)]
pub struct LegacyPeer {
    pending: Arc<PendingAnswers>,
    ids: QuestionIds,
    timeout: Duration,
}

impl LegacyPeer {
    /// A peer that registers its questions, under `ids`, in `pending` and waits up to `timeout`
    /// for each answer.
    pub fn new(pending: Arc<PendingAnswers>, ids: QuestionIds, timeout: Duration) -> Self {
        Self {
            pending,
            ids,
            timeout,
        }
    }

    /// Sends `request` to the client on `notifier`'s stream and waits for its answer.
    async fn ask_one(
        &self,
        notifier: Option<&Notifier>,
        key: &str,
        request: &InputRequest,
    ) -> ClientAnswer {
        let Some(notifier) = notifier else {
            return Err(error_value(
                "this request cannot carry server-initiated requests",
            ));
        };
        let id_text = self.ids.fresh(key);
        let id = RequestId::from_value(Value::String(id_text.clone()))
            .unwrap_or_else(|| unreachable!("a string id"));
        let (_registration, answer) = self.pending.register(id_text);
        // The wire form of a question is `{method, params}`; a request adds the envelope.
        let mut message = serde_json::to_value(request).map_err(|e| error_value(&e.to_string()))?;
        message["jsonrpc"] = Value::from("2.0");
        message["id"] = id.as_value().clone();
        let message = serde_json::to_vec(&message).map_err(|e| error_value(&e.to_string()))?;
        if !notifier.send_raw(message).await {
            return Err(error_value("the client closed the stream"));
        }
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(error_value("the wait for the answer was abandoned")),
            Err(_) => Err(error_value(&format!(
                "no answer within {} s",
                self.timeout.as_secs_f32()
            ))),
        }
    }
}

fn error_value(message: &str) -> Value {
    serde_json::json!({ "code": -32603, "message": message })
}

/// Why a server-initiated request gave no usable answer, for logs and `Failed` variants: the
/// client's message quoted by its first characters and its size, as any client-supplied text.
fn reason(error: &Value) -> String {
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or("unknown error".into(), excerpt);
    match error.get("code").and_then(Value::as_i64) {
        Some(code) => format!("{message} ({code})"),
        None => message.into_owned(),
    }
}

/// Every supported question is sent at once and awaited; nothing interrupts the call.
#[async_trait]
impl Asker for LegacyPeer {
    async fn ask(
        &self,
        capabilities: &ClientCapabilities,
        notifier: Option<&Notifier>,
        questions: Vec<(String, InputRequest)>,
    ) -> Result<Answers, HandlerError> {
        let asked = questions.into_iter().map(|(key, request)| async move {
            if !supports(capabilities, &request) {
                return (key, Answer::unsupported(&request));
            }
            let answer = self.ask_one(notifier, &key, &request).await;
            let interpreted = interpret(&key, &request, answer);
            (key, interpreted)
        });
        Ok(futures::future::join_all(asked).await.into_iter().collect())
    }

    fn answers_live(&self) -> bool {
        true
    }
}

/// Turns a legacy answer into the handler's view. Errors never fail the call: a refusal (code -1)
/// is a decline, anything else a cancellation (elicitation) or a failure (sampling, roots).
fn interpret(key: &str, request: &InputRequest, answer: ClientAnswer) -> Answer {
    match (request, answer) {
        (InputRequest::Elicit(_), Ok(result)) => match Elicitation::from_response(key, &result) {
            Ok(elicitation) => Answer::Elicitation(elicitation),
            Err(e) => {
                tracing::warn!(key, "unusable elicitation answer: {}", e.message);
                Answer::Elicitation(Elicitation::Cancelled)
            }
        },
        (InputRequest::Elicit(_), Err(error)) => {
            tracing::info!(key, "elicitation not answered: {}", reason(&error));
            let refused = error.get("code").and_then(Value::as_i64) == Some(-1);
            Answer::Elicitation(if refused {
                Elicitation::Declined
            } else {
                Elicitation::Cancelled
            })
        }
        (InputRequest::Sample(_), Ok(result)) => match Sampling::from_response(key, &result) {
            Ok(sampling) => Answer::Sampling(sampling),
            Err(e) => Answer::Sampling(Sampling::Failed(e.message)),
        },
        (InputRequest::Sample(_), Err(error)) => Answer::Sampling(Sampling::Failed(reason(&error))),
        (InputRequest::ListRoots(_), Ok(result)) => match Roots::from_response(key, &result) {
            Ok(roots) => Answer::Roots(roots),
            Err(e) => Answer::Roots(Roots::Failed(e.message)),
        },
        (InputRequest::ListRoots(_), Err(error)) => Answer::Roots(Roots::Failed(reason(&error))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ids_of_questions_asked_in_the_session_are_taken_for_answers() {
        let sealer = Arc::new(StateSealer::generate());
        let ids = QuestionIds::new(sealer.clone(), "session-a");
        let asked = ids.fresh("watched");
        assert!(ids.asked(&asked), "{asked}");
        assert!(ids.asked(&ids.fresh("with-dashes-in-it")));
        assert_ne!(asked, ids.fresh("watched"), "fresh each time");
        // Another replica with the same keys takes it; another session or deployment does not.
        let replica = StateSealer::from_spec(&StateSealer::generate_spec("x")).expect("a key");
        assert!(QuestionIds::new(sealer.clone(), "session-a").asked(&asked));
        assert!(!QuestionIds::new(sealer, "session-b").asked(&asked));
        assert!(!QuestionIds::new(Arc::new(replica), "session-a").asked(&asked));
        let random = asked
            .rsplit_once('-')
            .map(|(_, tail)| tail)
            .unwrap_or_default();
        for stray in [
            "1".to_owned(),
            "server-".to_owned(),
            "server-watched".to_owned(),
            format!("server-status-{random}"),
            format!("client-watched-{random}"),
            format!("server-watched-{}", random.to_uppercase()),
            format!("server-watched-{}", &random[1..]),
            format!("server-watched-{random}0"),
            format!("server-watched-{}", "0".repeat(64)),
        ] {
            assert!(!ids.asked(&stray), "{stray}");
        }
    }

    #[test]
    fn a_clients_long_refusal_is_quoted_by_a_prefix_and_its_size() {
        let long = "x".repeat(1_000_000);
        let quoted = reason(&serde_json::json!({"code": -1, "message": long}));
        assert!(quoted.starts_with("xxx"), "{quoted}");
        assert!(quoted.ends_with("… (1000000 bytes) (-1)"), "{quoted}");
        assert!(quoted.len() < 200, "{} bytes", quoted.len());
        let short = reason(&serde_json::json!({"code": -1, "message": "User rejected sampling"}));
        assert_eq!(short, "User rejected sampling (-1)");
    }
}
