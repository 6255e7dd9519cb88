//! The 2025-11-25 era of the same handler API: under a legacy session, a question becomes a real
//! server-initiated request (`elicitation/create`, `sampling/createMessage`, `roots/list`) sent on
//! the call's SSE stream, and the handler waits for the client's answer, POSTed back as a JSON-RPC
//! response, up to a timeout. No answer, an error answer, or a timeout all end in the handler's
//! fallback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::ask::{Answer, Answers, Asker, supports};
use super::error::HandlerError;
use super::notify::Notifier;
use super::seal::{StateSealer, VOUCH_TAG_LEN, VOUCH_UNIQUE_LEN};
use crate::log_budget::LogBudget;
use crate::protocol::error::excerpt;
use crate::protocol::input::{ElicitParams, Elicitation, InputRequest, Roots, Sampling};
use crate::protocol::jsonrpc::notification_bytes;
use crate::protocol::{ClientCapabilities, RequestId};

/// How a server-initiated request ended: the client's `result`, or its `error` object.
pub type ClientAnswer = Result<Value, Value>;

/// What a question id's tag is for, so tags the keys make for other purposes never pass for one.
const QUESTION_ID_CONTEXT: &[u8] = b"mcp-mrtr/legacy-question-id/v2\0";
/// How long past its question's deadline an id is still good, as replicas' clocks differ a little.
const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5);
/// Bytes of a question id's deadline (seconds since the Unix epoch, big-endian).
const DEADLINE_LEN: usize = 8;
/// The latest deadline an id carries (about 34,000 years from 1970), whatever the wait: any
/// later and the time it stands for could not be worked out.
const LATEST_DEADLINE: u64 = 1 << 40;

/// The ids of one legacy session's questions: `server-<key>-<80 hex digits>`, the question's
/// deadline, a fresh random value and a tag by which the deployment's sealing keys vouch for the
/// session, the input key, the deadline and that value. Any replica can tell an answer to a
/// question asked in this session, and not yet given up on, from one to a made-up id, to another
/// session's question or to a question long past: a replica takes an answer only to one of the
/// session's questions, and relays it only while its wait may still be on.
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
    /// key can pass for another pair), the deadline and the input key.
    fn message(&self, key: &str, deadline: [u8; DEADLINE_LEN]) -> Vec<u8> {
        let session = self.session.as_bytes();
        let length = u32::try_from(session.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes();
        [
            QUESTION_ID_CONTEXT,
            &length,
            session,
            &deadline,
            key.as_bytes(),
        ]
        .concat()
    }

    /// The id of a fresh question asked for input `key`, waiting up to `wait` for its answer.
    fn fresh(&self, key: &str, wait: Duration) -> String {
        let deadline = SystemTime::now()
            .checked_add(wait)
            .and_then(|end| end.duration_since(UNIX_EPOCH).ok())
            // Rounded up: the id outlives the wait, never the other way round.
            .map_or(LATEST_DEADLINE, |end| {
                end.as_secs() + u64::from(end.subsec_nanos() > 0)
            })
            .min(LATEST_DEADLINE)
            .to_be_bytes();
        let (unique, tag) = self.sealer.vouch(&self.message(key, deadline));
        format!(
            "server-{key}-{}{}{}",
            hex::encode(deadline),
            hex::encode(unique),
            hex::encode(tag)
        )
    }

    /// If `id` is the id of a question asked in this session, the time after which nobody waits
    /// for its answer any more (its deadline, plus a few seconds for replicas' clocks); `None`
    /// for any other id.
    pub fn answer_deadline(&self, id: &str) -> Option<SystemTime> {
        let (key, vouched) = id.strip_prefix("server-")?.rsplit_once('-')?;
        let mut raw = [0u8; DEADLINE_LEN + VOUCH_UNIQUE_LEN + VOUCH_TAG_LEN];
        // Lower case only, as made: an id has one spelling, the one its call waits under.
        if vouched.bytes().any(|b| b.is_ascii_uppercase())
            || hex::decode_to_slice(vouched, &mut raw).is_err()
        {
            return None;
        }
        let (deadline, rest) = raw.split_at(DEADLINE_LEN);
        let (unique, tag) = rest.split_at(VOUCH_UNIQUE_LEN);
        let deadline = <[u8; DEADLINE_LEN]>::try_from(deadline).ok()?;
        let vouched = self.sealer.vouches(
            <&[u8; VOUCH_UNIQUE_LEN]>::try_from(unique).ok()?,
            &self.message(key, deadline),
            <&[u8; VOUCH_TAG_LEN]>::try_from(tag).ok()?,
        );
        let seconds = u64::from_be_bytes(deadline).min(LATEST_DEADLINE);
        vouched.then(|| UNIX_EPOCH + Duration::from_secs(seconds) + CLOCK_SKEW_ALLOWANCE)
    }
}

/// Calls waiting for the client's answer to a server-initiated request, by request id.
#[derive(Default)]
pub struct PendingAnswers {
    waiting: Mutex<HashMap<String, oneshot::Sender<ClientAnswer>>>,
}

impl PendingAnswers {
    /// Hands an answer to the call waiting for `id`; gives it back if no call here waits for it.
    pub fn deliver(&self, id: &str, answer: ClientAnswer) -> Result<(), ClientAnswer> {
        match self.lock().remove(id) {
            Some(waiting) => waiting.send(answer),
            None => Err(answer),
        }
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
    /// Whether the session speaks 2025-06-18, whose forms know choices only as `enum`.
    enum_names_only: bool,
}

/// The revision whose forms offer choices only as `enum` (titled by `enumNames`), and whose
/// `elicitation/create` has no `mode`.
const ENUM_NAMES_REVISION: &str = "2025-06-18";

impl LegacyPeer {
    /// A peer that registers its questions, under `ids`, in `pending` and waits up to `timeout`
    /// for each answer.
    pub fn new(pending: Arc<PendingAnswers>, ids: QuestionIds, timeout: Duration) -> Self {
        Self {
            pending,
            ids,
            timeout,
            enum_names_only: false,
        }
    }

    /// The same peer for a session that agreed on `revision`: its questions are written the
    /// way that revision says them.
    pub fn speaking(mut self, revision: &str) -> Self {
        self.enum_names_only = revision == ENUM_NAMES_REVISION;
        self
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
        let id_text = self.ids.fresh(key, self.timeout);
        let id = RequestId::from_value(Value::String(id_text.clone()))
            .unwrap_or_else(|| unreachable!("a string id"));
        // The wire form of a question is `{method, params}`; a request adds the envelope.
        let mut message = serde_json::to_value(request).map_err(|e| error_value(&e.to_string()))?;
        if let InputRequest::Elicit(ElicitParams::Url { .. }) = request {
            // 2025-11-25 requires an id unique within the server for each URL elicitation; the
            // request's own id is one. (Nothing here sends its completion notice: the handler
            // does not see the id.)
            message["params"]["elicitationId"] = id.as_value().clone();
        }
        if self.enum_names_only {
            as_2025_06_18(&mut message)?;
        }
        message["jsonrpc"] = Value::from("2.0");
        message["id"] = id.as_value().clone();
        let message = serde_json::to_vec(&message).map_err(|e| error_value(&e.to_string()))?;
        let (_registration, answer) = self.pending.register(id_text);
        // Sending counts against the wait too, so the wait never outlasts the id's deadline.
        let asked_and_answered = async {
            if !notifier.send_raw(message).await {
                return Err(error_value("the client closed the stream"));
            }
            answer
                .await
                .unwrap_or_else(|_| Err(error_value("the wait for the answer was abandoned")))
        };
        if let Ok(answer) = tokio::time::timeout(self.timeout, asked_and_answered).await {
            return answer;
        }
        let reason = format!("no answer within {} s", self.timeout.as_secs_f32());
        // The client may still be showing the question: it is told the server stopped waiting,
        // as a sender that times out should. Briefly: a client that reads nothing gets no more.
        let cancelled = notification_bytes(
            "notifications/cancelled",
            &json!({"requestId": id.as_value(), "reason": reason}),
        );
        let _ = tokio::time::timeout(CANCEL_NOTICE_WAIT, notifier.send_raw(cancelled)).await;
        Err(error_value(&reason))
    }
}

/// Writes a form question (`{method, params}`) the way 2025-06-18 says it: without `mode`, and
/// each single choice of strings given as `oneOf` (`const`, with a `title` or not) as `enum`
/// with `enumNames`, which that revision's forms show as choices (they would take the `oneOf`
/// for free text). A form with a field it has no words for (several choices at once) cannot be
/// put to such a client: answered as an error, it leads to the tool's fallback. The answer is
/// still checked against the question as the tool asked it, which answers to the rewritten form
/// fit.
fn as_2025_06_18(message: &mut Value) -> Result<(), Value> {
    if message.get("method").and_then(Value::as_str) != Some("elicitation/create") {
        return Ok(());
    }
    let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    params.remove("mode");
    let properties = params
        .get_mut("requestedSchema")
        .and_then(|schema| schema.get_mut("properties"))
        .and_then(Value::as_object_mut);
    for property in properties.into_iter().flat_map(|p| p.values_mut()) {
        let Some(property) = property.as_object_mut() else {
            continue;
        };
        match property.get("type").and_then(Value::as_str) {
            Some("string") => {}
            Some("array") => {
                return Err(error_value(
                    "a 2025-06-18 client cannot be asked for several choices at once",
                ));
            }
            _ => continue,
        }
        let choices: Option<(Vec<Value>, Vec<Value>)> = property
            .get("oneOf")
            .and_then(Value::as_array)
            .and_then(|choices| {
                choices
                    .iter()
                    .map(|choice| {
                        let value = choice.get("const").filter(|v| v.is_string())?;
                        let title = choice.get("title").filter(|t| t.is_string());
                        Some((value.clone(), title.unwrap_or(value).clone()))
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .map(|choices| choices.into_iter().unzip());
        if let Some((values, titles)) = choices {
            property.remove("oneOf");
            property.insert("enum".into(), Value::Array(values));
            property.insert("enumNames".into(), Value::Array(titles));
        }
    }
    Ok(())
}

/// How long a timed-out question's cancellation may wait for room on the call's stream.
const CANCEL_NOTICE_WAIT: Duration = Duration::from_secs(1);

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

/// Log lines every client can cause at will, one per question it leaves unanswered or answers
/// wrong.
static UNUSABLE_ANSWERS: LogBudget = LogBudget::new("legacy_answer_unusable");
static UNANSWERED: LogBudget = LogBudget::new("legacy_question_unanswered");

/// Turns a legacy answer into the handler's view. Errors never fail the call: a refusal (code -1)
/// is a decline, anything else a cancellation (elicitation) or a failure (sampling, roots). The
/// call cannot ask again, so a form answer that does not fit the form counts as cancelled too.
fn interpret(key: &str, request: &InputRequest, answer: ClientAnswer) -> Answer {
    match (request, answer) {
        (InputRequest::Elicit(asked), Ok(result)) => match Elicitation::from_response(key, &result)
            .and_then(|elicitation| elicitation.fitting(key, asked))
        {
            Ok(elicitation) => Answer::Elicitation(elicitation),
            Err(e) => {
                if let Some(held_back) = UNUSABLE_ANSWERS.take() {
                    tracing::warn!(key, held_back, "unusable elicitation answer: {}", e.message);
                }
                Answer::Elicitation(Elicitation::Cancelled)
            }
        },
        (InputRequest::Elicit(_), Err(error)) => {
            if let Some(held_back) = UNANSWERED.take() {
                tracing::info!(
                    key,
                    held_back,
                    "elicitation not answered: {}",
                    reason(&error)
                );
            }
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

    const WAIT: Duration = Duration::from_secs(60);

    #[test]
    fn a_2025_06_18_form_offers_titled_choices_as_enum_names_and_has_no_mode() {
        let mut asked = json!({"method": "elicitation/create", "params": {
            "mode": "form", "message": "Watched it?",
            "requestedSchema": {"type": "object", "required": ["status"], "properties": {
                "status": {"type": "string", "title": "Status", "oneOf": [
                    {"const": "WANT_TO_WATCH", "title": "Want to watch"},
                    {"const": "WATCHED", "title": "Already watched"}]},
                "size": {"type": "string", "oneOf": [{"const": "S"}, {"const": "L", "title": "Large"}]},
                "note": {"type": "string", "maxLength": 20}}}}});
        as_2025_06_18(&mut asked).expect("a form 2025-06-18 can say");
        assert_eq!(
            asked,
            json!({"method": "elicitation/create", "params": {
                "message": "Watched it?",
                "requestedSchema": {"type": "object", "required": ["status"], "properties": {
                    "status": {"type": "string", "title": "Status",
                               "enum": ["WANT_TO_WATCH", "WATCHED"],
                               "enumNames": ["Want to watch", "Already watched"]},
                    "size": {"type": "string", "enum": ["S", "L"], "enumNames": ["S", "Large"]},
                    "note": {"type": "string", "maxLength": 20}}}}})
        );
        let mut several = json!({"method": "elicitation/create", "params": {
            "mode": "form", "message": "Tags?", "requestedSchema": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}]}}}}}});
        assert!(
            as_2025_06_18(&mut several).is_err(),
            "several choices at once"
        );
        let sampling = json!({"method": "sampling/createMessage", "params": {"mode": "x"}});
        let mut unchanged = sampling.clone();
        as_2025_06_18(&mut unchanged).expect("not a form");
        assert_eq!(unchanged, sampling, "only forms are rewritten");
    }

    #[test]
    fn a_form_answer_that_does_not_fit_counts_as_cancelled() {
        let asked = InputRequest::Elicit(ElicitParams::Form {
            message: "Watched it?".into(),
            requested_schema: serde_json::json!({"type": "object", "properties": {
                "status": {"type": "string", "enum": ["WATCHED", "WANT_TO_WATCH"]}}}),
        });
        let answer = |status: &str| {
            let result = serde_json::json!({"action": "accept", "content": {"status": status}});
            match interpret("status", &asked, Ok(result)) {
                Answer::Elicitation(elicitation) => elicitation,
                other => panic!("an elicitation answer, not {other:?}"),
            }
        };
        assert_eq!(answer("MAYBE"), Elicitation::Cancelled);
        assert_eq!(answer("WATCHED").text("status").as_deref(), Some("WATCHED"));
    }

    #[test]
    fn only_ids_of_questions_asked_in_the_session_are_taken_for_answers() {
        let sealer = Arc::new(StateSealer::generate());
        let ids = QuestionIds::new(sealer.clone(), "session-a");
        let asked = ids.fresh("watched", WAIT);
        assert!(ids.answer_deadline(&asked).is_some(), "{asked}");
        assert!(
            ids.answer_deadline(&ids.fresh("with-dashes-in-it", WAIT))
                .is_some()
        );
        assert_ne!(asked, ids.fresh("watched", WAIT), "fresh each time");
        // Another replica with the same keys takes it; another session or deployment does not.
        let replica = StateSealer::from_spec(&StateSealer::generate_spec("x")).expect("a key");
        let taken = |ids: QuestionIds| ids.answer_deadline(&asked).is_some();
        assert!(taken(QuestionIds::new(sealer.clone(), "session-a")));
        assert!(!taken(QuestionIds::new(sealer, "session-b")));
        assert!(!taken(QuestionIds::new(Arc::new(replica), "session-a")));
        let tail = asked
            .rsplit_once('-')
            .map(|(_, tail)| tail)
            .unwrap_or_default();
        // The same random value and tag under a deadline an hour later: the tag vouches for the
        // first.
        let deadline = u64::from_str_radix(&tail[..16], 16).expect("a hex deadline");
        let later = format!("{:016x}{}", deadline + 3600, &tail[16..]);
        for stray in [
            "1".to_owned(),
            "server-".to_owned(),
            "server-watched".to_owned(),
            format!("server-status-{tail}"),
            format!("client-watched-{tail}"),
            format!("server-watched-{}", tail.to_uppercase()),
            format!("server-watched-{}", &tail[1..]),
            format!("server-watched-{tail}0"),
            format!("server-watched-{}", "0".repeat(80)),
            format!("server-watched-{later}"),
        ] {
            assert!(ids.answer_deadline(&stray).is_none(), "{stray}");
        }
    }

    #[test]
    fn an_id_carries_the_end_of_its_questions_wait_and_a_little_more() {
        let ids = QuestionIds::new(Arc::new(StateSealer::generate()), "session-a");
        for wait in [WAIT, Duration::from_millis(1_500)] {
            let asked_at = SystemTime::now();
            let deadline = ids
                .answer_deadline(&ids.fresh("watched", wait))
                .expect("one of the session's ids");
            assert!(
                deadline >= asked_at + wait + CLOCK_SKEW_ALLOWANCE,
                "{wait:?}"
            );
            assert!(deadline <= asked_at + wait + CLOCK_SKEW_ALLOWANCE + Duration::from_secs(2));
        }
        // A wait too long to write down still makes an id, good for as long as can be said.
        let endless = ids.fresh("watched", Duration::MAX);
        assert_eq!(
            ids.answer_deadline(&endless),
            Some(UNIX_EPOCH + Duration::from_secs(LATEST_DEADLINE) + CLOCK_SKEW_ALLOWANCE)
        );
    }

    #[tokio::test]
    async fn a_question_its_client_does_not_read_is_given_up_within_the_wait() {
        // A stream with room for one message, already taken: the question cannot go out.
        let (stream, _unread) = tokio::sync::mpsc::channel(1);
        let notifier = Notifier::new(stream);
        assert!(notifier.send_raw(b"earlier".to_vec()).await);
        let ids = QuestionIds::new(Arc::new(StateSealer::generate()), "session-a");
        let peer = LegacyPeer::new(Arc::default(), ids, Duration::from_millis(200));
        let capabilities = ClientCapabilities {
            elicitation_form: true,
            ..ClientCapabilities::default()
        };
        let question = InputRequest::Elicit(ElicitParams::Form {
            message: "Watched it?".into(),
            requested_schema: serde_json::json!({"type": "object", "properties": {}}),
        });
        let asked = peer.ask(
            &capabilities,
            Some(&notifier),
            vec![("watched".into(), question)],
        );
        let answers = tokio::time::timeout(Duration::from_secs(5), asked)
            .await
            .expect("the wait covers sending the question")
            .expect("answers");
        assert_eq!(
            answers.elicitation("watched"),
            Some(&Elicitation::Cancelled),
            "no answer: the handler's fallback"
        );
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
