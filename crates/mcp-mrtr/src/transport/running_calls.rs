//! The streamed calls of 2025-11-25 sessions running on this replica, so that a client's
//! `notifications/cancelled` stops the one it names: the handler is dropped and its stream ends
//! without a response, as the spec asks of the receiver of a cancellation. A session's end
//! (DELETE) stops all of its calls, those whose names a later call took over (a client reusing
//! an id) and those starting as it ends included. A cancellation or an end POSTed to another
//! replica reaches this one through the answer relay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::claims::{Claim, Claims};
use crate::protocol::RequestId;

/// A call's name: its session, and its JSON-RPC id as written (so `1` and `"1"` differ).
type CallName = (String, String);

/// The cancellable calls running here; clones share them.
#[derive(Default, Clone)]
pub(super) struct RunningCalls {
    calls: Arc<Claims<CallName, CancellationToken>>,
    /// Per session with calls running here: what ends them all, and how many there are.
    sessions: Arc<Mutex<HashMap<String, SessionCalls>>>,
}

/// The calls of one session running here: each one's token is a child of `ended`.
struct SessionCalls {
    ended: CancellationToken,
    running: usize,
}

impl RunningCalls {
    /// Registers call `id` of `session_id` until the returned guard is dropped. A second call
    /// with the same id (a client's mistake) takes the name over: a cancellation reaches it (the
    /// session's end reaches both).
    pub(super) fn start(&self, session_id: &str, id: &RequestId) -> RunningCall {
        let token = {
            let mut sessions = self.sessions();
            let calls = sessions
                .entry(session_id.to_owned())
                .or_insert_with(|| SessionCalls {
                    ended: CancellationToken::new(),
                    running: 0,
                });
            calls.running += 1;
            // Cancelled at once if the session ended while others of its calls still run.
            calls.ended.child_token()
        };
        let name = (session_id.to_owned(), id.as_value().to_string());
        let (claim, _) = self.calls.claim(name, token.clone());
        RunningCall {
            _claim: claim,
            token,
            _counted: Counted {
                sessions: self.sessions.clone(),
                session_id: session_id.to_owned(),
            },
        }
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, SessionCalls>> {
        lock(&self.sessions)
    }

    /// Cancels the call of `session_id` whose id is `request_id`; `false` if it does not run
    /// here.
    pub(super) fn cancel(&self, session_id: &str, request_id: &Value) -> bool {
        let name = (session_id.to_owned(), request_id.to_string());
        self.calls.with(&name, CancellationToken::cancel)
    }

    /// Cancels every call of `session_id` running here (the session ended), and any that
    /// starts while one of them still runs.
    pub(super) fn cancel_session(&self, session_id: &str) {
        if let Some(calls) = self.sessions().get(session_id) {
            calls.ended.cancel();
        }
    }
}

fn lock(
    sessions: &Mutex<HashMap<String, SessionCalls>>,
) -> MutexGuard<'_, HashMap<String, SessionCalls>> {
    sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running call's registration, removed when it is dropped.
pub(super) struct RunningCall {
    _claim: Claim<CallName, CancellationToken>,
    token: CancellationToken,
    _counted: Counted,
}

/// A call counted among its session's; the session is forgotten with its last call.
struct Counted {
    sessions: Arc<Mutex<HashMap<String, SessionCalls>>>,
    session_id: String,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut sessions = lock(&self.sessions);
        if let Some(calls) = sessions.get_mut(&self.session_id) {
            calls.running -= 1;
            if calls.running == 0 {
                sessions.remove(&self.session_id);
            }
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
        assert!(calls.cancel("s1", &Value::from(1)));
        assert!(!calls.cancel("s3", &Value::from(1)), "no such call here");
        assert!(first.token.is_cancelled());
        assert!(!same_id_as_text.token.is_cancelled());
        assert!(!other_session.token.is_cancelled());
        drop((first, same_id_as_text, other_session));
        assert_eq!(calls.calls.in_force(), 0, "finished calls are let go");
    }

    #[test]
    fn a_sessions_end_cancels_its_calls_only_and_those_starting_as_it_ends() {
        let calls = RunningCalls::default();
        let id = |value: Value| RequestId::from_value(value).expect("an id");
        let ending = [
            calls.start("s1", &id(Value::from(1))),
            calls.start("s1", &id(Value::from("two"))),
            // The same id again: it takes the name over, and the session's end still reaches
            // the call before it.
            calls.start("s1", &id(Value::from(1))),
        ];
        let other_session = calls.start("s2", &id(Value::from(1)));
        calls.cancel_session("s1");
        assert!(ending.iter().all(|call| call.token.is_cancelled()));
        assert!(!other_session.token.is_cancelled());
        let late = calls.start("s1", &id(Value::from(3)));
        assert!(late.token.is_cancelled(), "started as the session ended");
        drop((ending, late, other_session));
        assert!(calls.sessions().is_empty(), "sessions go with their calls");
        assert_eq!(calls.calls.in_force(), 0);
        let next = calls.start("s1", &id(Value::from(4)));
        assert!(
            !next.token.is_cancelled(),
            "a session's calls are counted afresh"
        );
    }
}
