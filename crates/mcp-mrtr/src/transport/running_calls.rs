//! The streamed calls of 2025-11-25 sessions running on this replica, so that a client's
//! `notifications/cancelled` stops the one it names: the handler is dropped and its stream ends
//! without a response, as the spec asks of the receiver of a cancellation. A session's end
//! (DELETE) stops all of its calls, those whose names a later call took over (a client reusing
//! an id) and those starting as it ends or just after (their requests read the session before it
//! ended) included. A cancellation or an end POSTed to another replica reaches this one through
//! the answer relay.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashlink::LinkedHashSet;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::claims::{Claim, Claims};
use crate::protocol::RequestId;

/// A call's name: its session, and its JSON-RPC id as written (so `1` and `"1"` differ).
type CallName = (String, String);

/// How many of the sessions that ended last are remembered: a request reads its session, then
/// starts its call, with no wait between but for its turn on the CPU, so a session's end is
/// stale long before this many more have ended.
const REMEMBERED_ENDS: usize = 1024;

/// The cancellable calls running here; clones share them.
#[derive(Default, Clone)]
pub(super) struct RunningCalls {
    calls: Arc<Claims<CallName, CancellationToken>>,
    sessions: Arc<Mutex<Sessions>>,
}

/// The sessions with calls running here, and those that ended last.
#[derive(Default)]
struct Sessions {
    /// Per session with calls running here: what ends them all, and how many there are.
    running: HashMap<String, SessionCalls>,
    /// The last [`REMEMBERED_ENDS`] sessions ended, oldest first.
    ended: LinkedHashSet<String>,
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
    running: usize,
}

impl RunningCalls {
    /// Registers call `id` of `session_id` until the returned guard is dropped. A second call
    /// with the same id (a client's mistake) takes the name over: a cancellation reaches it (the
    /// session's end reaches both). A call of a session that ended lately (one of the last
    /// [`REMEMBERED_ENDS`]) is cancelled at once.
    pub(super) fn start(&self, session_id: &str, id: &RequestId) -> RunningCall {
        let token = {
            let mut sessions = self.sessions();
            let has_ended = sessions.ended.contains(session_id);
            let calls = sessions
                .running
                .entry(session_id.to_owned())
                .or_insert_with(|| SessionCalls {
                    ended: CancellationToken::new(),
                    running: 0,
                });
            calls.running += 1;
            if has_ended {
                calls.ended.cancel();
            }
            // Cancelled at once if the session ended while others of its calls still run, or
            // lately.
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

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        lock(&self.sessions)
    }

    /// Cancels the call of `session_id` whose id is `request_id`; `false` if it does not run
    /// here.
    pub(super) fn cancel(&self, session_id: &str, request_id: &Value) -> bool {
        let name = (session_id.to_owned(), request_id.to_string());
        self.calls.with(&name, CancellationToken::cancel)
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

/// A running call's registration, removed when it is dropped.
pub(super) struct RunningCall {
    _claim: Claim<CallName, CancellationToken>,
    token: CancellationToken,
    _counted: Counted,
}

/// A call counted among its session's; the session is forgotten with its last call.
struct Counted {
    sessions: Arc<Mutex<Sessions>>,
    session_id: String,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut sessions = lock(&self.sessions);
        if let Some(calls) = sessions.running.get_mut(&self.session_id) {
            calls.running -= 1;
            if calls.running == 0 {
                sessions.running.remove(&self.session_id);
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
    fn a_sessions_end_cancels_its_calls_only_and_those_starting_after() {
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
        assert!(
            calls.sessions().running.is_empty(),
            "sessions go with their calls"
        );
        assert_eq!(calls.calls.in_force(), 0);
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
