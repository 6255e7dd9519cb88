//! Legacy clients' answers on their way between replicas (feature `legacy`). A legacy client may
//! POST its answer to any replica; one with no call waiting for it publishes it to every replica
//! sharing Redis, and the replica whose call waits takes it. Its `notifications/cancelled` travels
//! the same way, to every replica running a call under the id it names (one, unless the client
//! reused the id), and so does a session's end (DELETE), to every replica running a call of the
//! session.
//!
//! An answer is relayed only while its question's wait may still be on, and each question's
//! answer at most once: this replica remembers the ids of the answers it took or relayed, and a
//! marker in Redis, kept until the question's deadline, stops every other replica from relaying
//! it again. A client sending one answer over and over cannot make every replica read each copy,
//! nor crowd other clients' answers out of the outbox.
//!
//! Cancellations have an outbox of their own, small, whose overflow is dropped: a client
//! flooding them costs other clients' answers nothing. A replica relays each (session, request)
//! cancellation once a minute at most; every replica reads each one relayed.
//!
//! The price: pub/sub keeps nothing, so an answer published while the asking replica was
//! resubscribing is lost, and the same answer sent again is not relayed; its call takes its
//! fallback. A relay that fails gives its claim back, so the answer sent again can go (a replica
//! that found the marker asks Redis again a second later); and a publish that reached Redis but
//! timed out here lets a second copy through.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hashlink::LruCache;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::running_calls::RunningCalls;
use super::session_streams::SessionStreams;
use crate::log_budget::LogBudget;
use crate::mrtr::{ClientAnswer, PendingAnswers};
use crate::protocol::error::excerpt;
use crate::store::{RedisEventRelay, RelayPublisher, StoreError};

/// Largest answer to one question that is relayed: a form's content or a completion fits many
/// times over, and every replica receives each relayed answer.
const MAX_RELAYED_ANSWER_BYTES: usize = 64 * 1024;
/// Largest cancellation relayed: a session id and a request id of any sensible length.
const MAX_RELAYED_CANCELLATION_BYTES: usize = 1024;
/// Answers waiting to be published; past that, answers are dropped (and their calls fall back).
const OUTBOX: usize = 256;
/// Cancellations waiting to be published; past that, they are dropped (their calls run on).
const CANCELLATION_OUTBOX: usize = 32;
/// How long a replica refuses to relay the same cancellation again.
const CANCELLATION_REPEAT: Duration = Duration::from_secs(60);
/// Ids this replica remembers; the oldest are forgotten first, and only the Redis marker then
/// stops a copy of theirs.
const REMEMBERED: usize = 4096;
/// How long a copy found marked in Redis is refused here before Redis is asked again: a claim can
/// be given back (its relay failed), and copies of a marked answer then cost one check a second.
const MARKED_RECHECK: Duration = Duration::from_secs(1);

/// This replica's end of the answer relay.
pub(super) struct AnswerRelay {
    outbox: mpsc::Sender<Outgoing>,
    seen: Arc<SeenIds>,
    /// Cancellations on their way out: each as it is remembered, and as sent.
    cancellations: mpsc::Sender<(String, Vec<u8>)>,
    /// The cancellations relayed from here lately.
    cancelled: Arc<SeenIds>,
}

/// What travels between replicas: a cancellation (told apart by its `cancel` field), a
/// session's end (by its `ended` field, the session's id), or an answer. (A replica from before
/// session ends were relayed ignores them as unreadable.)
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Relayed {
    Cancellation { cancel: CancelledCall },
    SessionEnded { ended: String },
    Answer(RelayedAnswer),
}

/// A client's `notifications/cancelled`: its session, and the id of the request it cancels.
#[derive(Serialize, Deserialize)]
struct CancelledCall {
    session: String,
    #[serde(rename = "requestId")]
    request_id: Value,
}

/// An answer as relayed: the JSON-RPC response's `id`, and its `result` or its `error`.
#[derive(Serialize, Deserialize)]
struct RelayedAnswer {
    id: String,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    result: Option<Value>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    error: Option<Value>,
}

/// A field that is there, even as `null`: a client may answer with `"result": null`, and that
/// is an answer to deliver, not a missing one (serde reads `null` into `None` otherwise).
fn present<'de, D: serde::Deserializer<'de>>(field: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(field).map(Some)
}

impl RelayedAnswer {
    fn new(id: &str, answer: ClientAnswer) -> Self {
        let (result, error) = match answer {
            Ok(result) => (Some(result), None),
            Err(error) => (None, Some(error)),
        };
        Self {
            id: id.to_owned(),
            result,
            error,
        }
    }

    /// The answer itself; `None` for a message with neither a result nor an error.
    fn into_answer(self) -> Option<(String, ClientAnswer)> {
        let answer = match (self.result, self.error) {
            (Some(result), _) => Ok(result),
            (None, Some(error)) => Err(error),
            (None, None) => return None,
        };
        Some((self.id, answer))
    }
}

/// An answer on its way out.
struct Outgoing {
    id: String,
    /// When the question's wait is over: the relay's marker lasts until then.
    deadline: SystemTime,
    wire: Vec<u8>,
}

/// Ids of answers taken here or handed to the relay, with their questions' deadlines (or, in a
/// set of their own, cancellations relayed from here, until they may go again).
struct SeenIds(Mutex<LruCache<String, SystemTime>>);

impl SeenIds {
    fn new() -> Self {
        Self(Mutex::new(LruCache::new(REMEMBERED)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, SystemTime>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers `id`; `false` if it is remembered already.
    fn remember(&self, id: &str, deadline: SystemTime) -> bool {
        let mut seen = self.lock();
        let now = SystemTime::now();
        if seen.peek(id).is_some_and(|&until| until > now) {
            return false;
        }
        seen.insert(id.to_owned(), deadline);
        true
    }

    /// Remembers `id` until `until`, remembered already or not.
    fn hold(&self, id: &str, until: SystemTime) {
        self.lock().insert(id.to_owned(), until);
    }

    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// Lines about answers too large to relay, which any client can send.
static TOO_LARGE: LogBudget = LogBudget::new("answer_too_large_to_relay");
/// Lines about the relay failing or backed up, which a flood of answers can cause.
static TROUBLE: LogBudget = LogBudget::new("answer_relay_trouble");

impl AnswerRelay {
    /// Starts relaying: publishing answers handed to [`send`](Self::send), and delivering the
    /// answers other replicas publish to the calls waiting in `pending`.
    /// Cancellations other replicas publish stop the calls of `calls` they name; a session
    /// ended elsewhere stops its calls and ends its stream of `streams` here.
    pub(super) fn start(
        relay: RedisEventRelay,
        pending: Arc<PendingAnswers>,
        calls: RunningCalls,
        streams: SessionStreams,
    ) -> Self {
        let (outbox, outgoing) = mpsc::channel(OUTBOX);
        let (cancellations, cancelling) = mpsc::channel(CANCELLATION_OUTBOX);
        let seen = Arc::new(SeenIds::new());
        let cancelled = Arc::new(SeenIds::new());
        tokio::spawn(publish_cancellations(
            relay.publisher(),
            cancelling,
            cancelled.clone(),
        ));
        // Publishing ends when this relay is dropped; delivering then ends with it.
        let (publishing, publishing_ended) = oneshot::channel();
        tokio::spawn(publish_all(
            relay.publisher(),
            outgoing,
            seen.clone(),
            publishing,
        ));
        tokio::spawn(deliver_all(
            relay,
            pending,
            calls,
            streams,
            publishing_ended,
        ));
        Self {
            outbox,
            seen,
            cancellations,
            cancelled,
        }
    }

    /// Notes that the answer to question `id` was taken here, so that copies sent here again are
    /// not relayed.
    pub(super) fn taken_here(&self, id: &str, deadline: SystemTime) {
        self.seen.remember(id, deadline);
    }

    /// Sends `answer`, to question `id` whose wait ends at `deadline`, to the replica whose call
    /// waits for it; unless that wait is over, the answer went out before, or it is too large to
    /// send every replica.
    pub(super) fn send(&self, id: &str, deadline: SystemTime, answer: ClientAnswer) {
        if deadline <= SystemTime::now() {
            tracing::debug!(id = %excerpt(id), "an answer to a question no longer waited for; dropped");
            return;
        }
        // Before the answer is written out: a copy sent again costs no more than this.
        if !self.seen.remember(id, deadline) {
            tracing::debug!(id = %excerpt(id), "an answer taken or relayed before; dropped");
            return;
        }
        let Ok(wire) = serde_json::to_vec(&RelayedAnswer::new(id, answer)) else {
            return;
        };
        if wire.len() > MAX_RELAYED_ANSWER_BYTES {
            if let Some(held_back) = TOO_LARGE.take() {
                tracing::info!(
                    id = %excerpt(id),
                    bytes = wire.len(),
                    held_back,
                    "an answer too large to relay to the other replicas; dropped"
                );
            }
            return;
        }
        let outgoing = Outgoing {
            id: id.to_owned(),
            deadline,
            wire,
        };
        if self.outbox.try_send(outgoing).is_err() {
            // Not sent: the same answer sent again may be.
            self.seen.forget(id);
            if let Some(held_back) = TROUBLE.take() {
                tracing::warn!(id = %excerpt(id), held_back, "answer relay is backed up; dropped an answer");
            }
        }
    }

    /// Sends the cancellation of call `request_id` of `session` to every replica, for the one
    /// that runs it; unless it is too large to be a real one, or went out from here lately.
    pub(super) fn cancel(&self, session: &str, request_id: &Value) {
        self.send_cancellation(&Relayed::Cancellation {
            cancel: CancelledCall {
                session: session.to_owned(),
                request_id: request_id.clone(),
            },
        });
    }

    /// Tells every replica that `session` ended, so that its calls running there stop. It goes
    /// out as a cancellation does.
    pub(super) fn end_session(&self, session: &str) {
        self.send_cancellation(&Relayed::SessionEnded {
            ended: session.to_owned(),
        });
    }

    fn send_cancellation(&self, cancelled: &Relayed) {
        let Ok(wire) = serde_json::to_vec(cancelled) else {
            return;
        };
        if wire.len() > MAX_RELAYED_CANCELLATION_BYTES {
            tracing::debug!(
                bytes = wire.len(),
                "a cancellation too large to relay; dropped"
            );
            return;
        }
        // Room first: a flood meeting a full outbox leaves what is remembered alone.
        let Ok(room) = self.cancellations.try_reserve() else {
            if let Some(held_back) = TROUBLE.take() {
                tracing::warn!(
                    held_back,
                    "answer relay is backed up; dropped a cancellation"
                );
            }
            return;
        };
        let name = String::from_utf8_lossy(&wire).into_owned();
        if !self
            .cancelled
            .remember(&name, SystemTime::now() + CANCELLATION_REPEAT)
        {
            tracing::debug!("a cancellation relayed lately; dropped");
            return;
        }
        room.send((name, wire));
    }
}

/// Publishes the answers in `outgoing`, each only if no replica relayed it before, until the
/// relay is dropped.
async fn publish_all(
    publisher: RelayPublisher,
    mut outgoing: mpsc::Receiver<Outgoing>,
    seen: Arc<SeenIds>,
    _publishing: oneshot::Sender<()>,
) {
    while let Some(answer) = outgoing.recv().await {
        if let Err(e) = publish_answer(&publisher, &seen, answer).await
            && let Some(held_back) = TROUBLE.take()
        {
            tracing::warn!(
                held_back,
                "could not relay a client's answer to the other replicas: {e}"
            );
        }
    }
}

/// Publishes the cancellations in `outgoing` until the relay is dropped. One that could not go
/// is forgotten, so that the same one sent again may.
async fn publish_cancellations(
    publisher: RelayPublisher,
    mut outgoing: mpsc::Receiver<(String, Vec<u8>)>,
    cancelled: Arc<SeenIds>,
) {
    while let Some((name, wire)) = outgoing.recv().await {
        if let Err(e) = publisher.publish(&wire).await {
            cancelled.forget(&name);
            if let Some(held_back) = TROUBLE.take() {
                tracing::warn!(
                    held_back,
                    "could not relay a client's cancellation to the other replicas: {e}"
                );
            }
        }
    }
}

/// Publishes `answer`, unless a replica relayed it before.
async fn publish_answer(
    publisher: &RelayPublisher,
    seen: &SeenIds,
    answer: Outgoing,
) -> Result<(), StoreError> {
    let Ok(lasting) = answer.deadline.duration_since(SystemTime::now()) else {
        tracing::debug!(id = %excerpt(&answer.id), "an answer whose question's wait ended in the outbox; dropped");
        return Ok(());
    };
    match publisher.first_claim(&answer.id, lasting).await {
        Ok(true) => match publisher.publish(&answer.wire).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // Nothing went out, as far as can be told: let the same answer sent again
                // go, here or elsewhere. (A publish that reached Redis but timed out here
                // makes that copy a second one.)
                seen.forget(&answer.id);
                let _ = publisher.release_claim(&answer.id).await;
                Err(e)
            }
        },
        Ok(false) => {
            // Another replica holds the claim; it gives it back if its relay fails, and a
            // copy sent after that may go.
            let recheck = (SystemTime::now() + MARKED_RECHECK).min(answer.deadline);
            seen.hold(&answer.id, recheck);
            tracing::debug!(id = %excerpt(&answer.id), "an answer another replica relayed; dropped");
            Ok(())
        }
        Err(e) => {
            // A claim that timed out after Redis made it stays until the deadline.
            seen.forget(&answer.id);
            Err(e)
        }
    }
}

/// Hands each answer any replica relays to the call waiting for it here, and each cancellation
/// to the call it names, if there is one, until publishing ends.
async fn deliver_all(
    mut relay: RedisEventRelay,
    pending: Arc<PendingAnswers>,
    calls: RunningCalls,
    streams: SessionStreams,
    mut publishing_ended: oneshot::Receiver<()>,
) {
    loop {
        let payload = tokio::select! {
            payload = relay.next_message() => payload,
            _ = &mut publishing_ended => None,
        };
        let Some(payload) = payload else { return };
        // Every replica hears everything; only the one whose call waits (or runs) takes it.
        match serde_json::from_slice::<Relayed>(&payload) {
            Ok(Relayed::Cancellation { cancel }) => {
                calls.cancel(&cancel.session, &cancel.request_id);
            }
            Ok(Relayed::SessionEnded { ended }) => {
                calls.cancel_session(&ended);
                // Its stream here ends now, not at its next look at the session's record.
                streams.end(&ended);
            }
            Ok(Relayed::Answer(relayed)) => {
                if let Some((id, answer)) = relayed.into_answer() {
                    let _ = pending.deliver(&id, answer);
                }
            }
            Err(_) => {
                if let Some(held_back) = TROUBLE.take() {
                    tracing::warn!(
                        held_back,
                        "ignored an unreadable message from the answer relay"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_answer_reads_back_as_the_answer_it_carries() {
        let read_back = |answer: ClientAnswer| {
            let wire = serde_json::to_vec(&RelayedAnswer::new("server-q-1", answer))
                .expect("an answer serializes");
            serde_json::from_slice::<RelayedAnswer>(&wire)
                .expect("it reads back")
                .into_answer()
        };
        let content = serde_json::json!({"action": "accept", "content": {"seen": true}});
        assert_eq!(
            read_back(Ok(content.clone())),
            Some(("server-q-1".to_owned(), Ok(content)))
        );
        let refusal = serde_json::json!({"code": -32601, "message": "no sampling here"});
        assert_eq!(
            read_back(Err(refusal.clone())),
            Some(("server-q-1".to_owned(), Err(refusal)))
        );
        assert_eq!(
            read_back(Ok(Value::Null)),
            Some(("server-q-1".to_owned(), Ok(Value::Null))),
            "a null result is an answer"
        );
        let empty: RelayedAnswer =
            serde_json::from_str(r#"{"id":"server-q-1"}"#).expect("an id alone reads");
        assert_eq!(empty.into_answer(), None, "neither a result nor an error");
    }

    #[test]
    fn a_cancellation_a_sessions_end_and_an_answer_read_back_as_what_they_are() {
        let cancelled = Relayed::Cancellation {
            cancel: CancelledCall {
                session: "s1".into(),
                request_id: Value::from(7),
            },
        };
        let wire = serde_json::to_vec(&cancelled).expect("a cancellation serializes");
        let Ok(Relayed::Cancellation { cancel }) = serde_json::from_slice::<Relayed>(&wire) else {
            panic!("a cancellation reads back as one");
        };
        assert_eq!(
            (cancel.session.as_str(), cancel.request_id),
            ("s1", Value::from(7))
        );
        let ended = Relayed::SessionEnded { ended: "s1".into() };
        let wire = serde_json::to_vec(&ended).expect("a session's end serializes");
        let Ok(Relayed::SessionEnded { ended }) = serde_json::from_slice::<Relayed>(&wire) else {
            panic!("a session's end reads back as one");
        };
        assert_eq!(ended, "s1");
        let answer = serde_json::json!({"action": "accept", "content": {"cancel": true}});
        let wire = serde_json::to_vec(&RelayedAnswer::new("server-q-1", Ok(answer.clone())))
            .expect("an answer serializes");
        let Ok(Relayed::Answer(relayed)) = serde_json::from_slice::<Relayed>(&wire) else {
            panic!("an answer reads back as one");
        };
        assert_eq!(
            relayed.into_answer(),
            Some(("server-q-1".to_owned(), Ok(answer)))
        );
        let wire = serde_json::to_vec(&RelayedAnswer::new("server-q-2", Ok(Value::Null)))
            .expect("a null answer serializes");
        let Ok(Relayed::Answer(relayed)) = serde_json::from_slice::<Relayed>(&wire) else {
            panic!("a null answer reads back as an answer");
        };
        assert_eq!(
            relayed.into_answer(),
            Some(("server-q-2".to_owned(), Ok(Value::Null))),
            "a null result is an answer through the envelope too"
        );
    }

    #[test]
    fn an_id_is_let_through_once_while_its_question_waits_and_forgotten_oldest_first() {
        let seen = SeenIds::new();
        let waiting = SystemTime::now() + Duration::from_secs(60);
        assert!(seen.remember("a", waiting));
        assert!(!seen.remember("a", waiting), "a copy");
        seen.forget("a");
        assert!(
            seen.remember("a", waiting),
            "forgotten when it did not go out"
        );
        let over = SystemTime::now() - Duration::from_secs(1);
        assert!(seen.remember("b", over));
        assert!(seen.remember("b", waiting), "a stale entry does not count");
        seen.hold("b", over);
        assert!(seen.remember("b", waiting), "held until a time gone by");
        seen.hold("c", waiting);
        assert!(!seen.remember("c", waiting), "held until a time to come");
        for n in 0..REMEMBERED {
            seen.remember(&format!("later-{n}"), waiting);
        }
        assert!(seen.remember("a", waiting), "the oldest went first");
        assert!(
            !seen.remember(&format!("later-{}", REMEMBERED - 1), waiting),
            "the newest stay"
        );
    }
}
