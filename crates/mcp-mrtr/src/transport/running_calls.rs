//! The streamed calls of 2025-11-25 sessions running on this replica, so that a client's
//! `notifications/cancelled` stops the one it names: the handler is dropped and its stream ends
//! without a response, as the spec asks of the receiver of a cancellation. A client that reuses
//! an id while its first call runs (the spec says it must not) has both stopped by a
//! cancellation naming it. A session's end (DELETE) stops all of its calls, those starting as it
//! ends or just after (their requests read the session before it ended) included. A
//! cancellation or an end POSTed to another replica reaches this one through the answer relay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashlink::LinkedHashSet;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::protocol::RequestId;

/// How many of the sessions that ended last are remembered: a request reads its session, then
/// starts its call, with no wait between but for its turn on the CPU, so a session's end is
/// stale long before this many more have ended.
const REMEMBERED_ENDS: usize = 1024;

/// The cancellable calls running here; clones share them.
#[derive(Default, Clone)]
pub(super) struct RunningCalls {
    sessions: Arc<Mutex<Sessions>>,
}

/// The sessions with calls running here, and those that ended last.
#[derive(Default)]
struct Sessions {
    /// Per session with calls running here: what ends them all, and the calls.
    running: HashMap<String, SessionCalls>,
    /// The last [`REMEMBERED_ENDS`] sessions ended, oldest first.
    ended: LinkedHashSet<String>,
    /// Numbers the calls, so that each finds its own entry under a reused id.
    started: u64,
}

impl Sessions {
    fn remember_end(&mut self, session_id: &str) {
        self.ended.insert(session_id.to_owned());
        if self.ended.len() > REMEMBERED_ENDS {
            self.ended.pop_front();
        }
    }
}

/// The calls of one session running here: each one's token is a child of `ended`.
struct SessionCalls {
    ended: CancellationToken,
    /// Per JSON-RPC id as written (so `1` and `"1"` differ), its calls by number: one, unless
    /// the client reused the id.
    by_id: HashMap<String, Vec<(u64, CancellationToken)>>,
}

impl RunningCalls {
    /// Registers call `id` of `session_id` until the returned guard is dropped. A call of a
    /// session that ended lately (one of the last [`REMEMBERED_ENDS`]) is cancelled at once.
    pub(super) fn start(&self, session_id: &str, id: &RequestId) -> RunningCall {
        let id = id.as_value().to_string();
        let mut sessions = self.sessions();
        sessions.started += 1;
        let number = sessions.started;
        let has_ended = sessions.ended.contains(session_id);
        let calls = sessions
            .running
            .entry(session_id.to_owned())
            .or_insert_with(|| SessionCalls {
                ended: CancellationToken::new(),
                by_id: HashMap::new(),
            });
        if has_ended {
            calls.ended.cancel();
        }
        // Cancelled at once if the session ended while others of its calls still run, or lately.
        let token = calls.ended.child_token();
        calls
            .by_id
            .entry(id.clone())
            .or_default()
            .push((number, token.clone()));
        RunningCall {
            sessions: self.sessions.clone(),
            session_id: session_id.to_owned(),
            id,
            number,
            token,
        }
    }

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        lock(&self.sessions)
    }

    /// Cancels the calls of `session_id` whose id is `request_id` running here, if any.
    pub(super) fn cancel(&self, session_id: &str, request_id: &Value) {
        let sessions = self.sessions();
        let named = sessions
            .running
            .get(session_id)
            .and_then(|calls| calls.by_id.get(&request_id.to_string()));
        for (_, token) in named.into_iter().flatten() {
            token.cancel();
        }
    }

    /// Cancels every call of `session_id` running here (the session ended), and any that
    /// starts while it is among the last [`REMEMBERED_ENDS`] ended.
    pub(super) fn cancel_session(&self, session_id: &str) {
        let mut sessions = self.sessions();
        if let Some(calls) = sessions.running.get(session_id) {
            calls.ended.cancel();
        }
        sessions.remember_end(session_id);
    }
}

fn lock(sessions: &Mutex<Sessions>) -> MutexGuard<'_, Sessions> {
    sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running call's registration, removed when it is dropped; the session is forgotten with
/// its last call.
pub(super) struct RunningCall {
    sessions: Arc<Mutex<Sessions>>,
    session_id: String,
    id: String,
    number: u64,
    token: CancellationToken,
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        let mut sessions = lock(&self.sessions);
        let Some(calls) = sessions.running.get_mut(&self.session_id) else {
            return;
        };
        if let Some(named) = calls.by_id.get_mut(&self.id) {
            named.retain(|(number, _)| *number != self.number);
            if named.is_empty() {
                calls.by_id.remove(&self.id);
            }
        }
        if calls.by_id.is_empty() {
            sessions.running.remove(&self.session_id);
        }
    }
}

impl RunningCall {
    /// Completes when the client cancels the call.
    pub(super) async fn cancelled(&self) {
        self.token.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancellation_reaches_only_the_call_it_names() {
        let calls = RunningCalls::default();
        let id = |value: Value| RequestId::from_value(value).expect("an id");
        let first = calls.start("s1", &id(Value::from(1)));
        let same_id_as_text = calls.start("s1", &id(Value::from("1")));
        let other_session = calls.start("s2", &id(Value::from(1)));
        calls.cancel("s1", &Value::from(1));
        calls.cancel("s3", &Value::from(1));
        assert!(first.token.is_cancelled());
        assert!(!same_id_as_text.token.is_cancelled());
        assert!(!other_session.token.is_cancelled());
        drop((first, same_id_as_text, other_session));
        assert!(
            calls.sessions().running.is_empty(),
            "finished calls are let go"
        );
    }

    #[test]
    fn a_cancellation_reaches_every_call_under_a_reused_id() {
        let calls = RunningCalls::default();
        let id = RequestId::from_value(Value::from(7)).expect("an id");
        let first = calls.start("s1", &id);
        let (second, third) = (calls.start("s1", &id), calls.start("s1", &id));
        // The one started last finishing first leaves the others under the name.
        drop(third);
        calls.cancel("s1", &Value::from(7));
        assert!(first.token.is_cancelled() && second.token.is_cancelled());
        drop(first);
        let again = calls.start("s1", &id);
        drop(second);
        assert!(
            !again.token.is_cancelled(),
            "started after the cancellation"
        );
        calls.cancel("s1", &Value::from(7));
        assert!(again.token.is_cancelled());
        drop(again);
        assert!(calls.sessions().running.is_empty(), "none runs any more");
    }

    #[test]
    fn a_sessions_end_cancels_its_calls_only_and_those_starting_after() {
        let calls = RunningCalls::default();
        let id = |value: Value| RequestId::from_value(value).expect("an id");
        let ending = [
            calls.start("s1", &id(Value::from(1))),
            calls.start("s1", &id(Value::from("two"))),
            // The same id again: the session's end reaches both.
            calls.start("s1", &id(Value::from(1))),
        ];
        let other_session = calls.start("s2", &id(Value::from(1)));
        calls.cancel_session("s1");
        assert!(ending.iter().all(|call| call.token.is_cancelled()));
        assert!(!other_session.token.is_cancelled());
        let late = calls.start("s1", &id(Value::from(3)));
        assert!(late.token.is_cancelled(), "started as the session ended");
        drop((ending, late, other_session));
        assert!(
            calls.sessions().running.is_empty(),
            "sessions go with their calls"
        );
        let after = calls.start("s1", &id(Value::from(4)));
        assert!(
            after.token.is_cancelled(),
            "its request read the session before it ended"
        );
        let other = calls.start("s2", &id(Value::from(2)));
        assert!(!other.token.is_cancelled(), "other sessions' calls run on");
    }

    #[test]
    fn a_session_ended_with_no_call_running_stops_calls_starting_after() {
        let calls = RunningCalls::default();
        let id = RequestId::from_value(Value::from(1)).expect("an id");
        calls.cancel_session("s1");
        calls.cancel_session("s1");
        assert!(calls.start("s1", &id).token.is_cancelled());
        // Only the last ends are kept: an end older than that is long past.
        for n in 0..REMEMBERED_ENDS {
            calls.cancel_session(&format!("later-{n}"));
        }
        assert_eq!(calls.sessions().ended.len(), REMEMBERED_ENDS);
        assert!(!calls.start("s1", &id).token.is_cancelled());
        assert!(calls.start("later-0", &id).token.is_cancelled());
    }
}
