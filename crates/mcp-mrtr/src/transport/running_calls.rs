//! The streamed calls of 2025-11-25 sessions running on this replica, so that a client's
//! `notifications/cancelled` stops the one it names: the handler is dropped and its stream ends
//! without a response, as the spec asks of the receiver of a cancellation. A session's end
//! (DELETE) stops all of its calls. A cancellation or an end POSTed to another replica reaches
//! this one through the answer relay.

use std::sync::Arc;

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
}

impl RunningCalls {
    /// Registers call `id` of `session_id` until the returned guard is dropped. A second call
    /// with the same id (a client's mistake) takes the name over: a cancellation reaches it.
    pub(super) fn start(&self, session_id: &str, id: &RequestId) -> RunningCall {
        let name = (session_id.to_owned(), id.as_value().to_string());
        let token = CancellationToken::new();
        let (claim, _) = self.calls.claim(name, token.clone());
        RunningCall {
            _claim: claim,
            token,
        }
    }

    /// Cancels the call of `session_id` whose id is `request_id`; `false` if it does not run
    /// here.
    pub(super) fn cancel(&self, session_id: &str, request_id: &Value) -> bool {
        let name = (session_id.to_owned(), request_id.to_string());
        self.calls.with(&name, CancellationToken::cancel)
    }

    /// Cancels every call of `session_id` running here (the session ended).
    pub(super) fn cancel_session(&self, session_id: &str) {
        self.calls.for_each(|(session, _), token| {
            if session == session_id {
                token.cancel();
            }
        });
    }
}

/// A running call's registration, removed when it is dropped.
pub(super) struct RunningCall {
    _claim: Claim<CallName, CancellationToken>,
    token: CancellationToken,
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
    fn a_sessions_end_cancels_its_calls_only() {
        let calls = RunningCalls::default();
        let id = |value: Value| RequestId::from_value(value).expect("an id");
        let ending = [
            calls.start("s1", &id(Value::from(1))),
            calls.start("s1", &id(Value::from("two"))),
        ];
        let other_session = calls.start("s2", &id(Value::from(1)));
        calls.cancel_session("s1");
        assert!(ending.iter().all(|call| call.token.is_cancelled()));
        assert!(!other_session.token.is_cancelled());
    }
}
