//! A whole MRTR conversation: the first call, each `input_required` round answered and sent
//! again with its `requestState`, until the tool completes.

use serde_json::{Map, Value};

use super::{Client, Reply};

/// Rounds after which a conversation is taken to loop forever.
const MAX_ROUNDS: usize = 16;

/// Every round of one conversation, in order; the last one completed (or failed).
pub struct Conversation {
    /// The server's answer to each round.
    pub rounds: Vec<Reply>,
}

impl Conversation {
    /// The answer that ended the conversation.
    pub fn last(&self) -> &Reply {
        self.rounds
            .last()
            .unwrap_or_else(|| unreachable!("a conversation has at least one round"))
    }

    /// The `inputRequests` keys each round asked, in order (empty for the last, and for a
    /// round answered with an error).
    pub fn questions(&self) -> Vec<Vec<String>> {
        self.rounds
            .iter()
            .map(|reply| {
                let result_type = reply
                    .response()
                    .get("result")
                    .and_then(|r| r.get("resultType"));
                match result_type.and_then(Value::as_str) {
                    Some("input_required") => reply.input_requests().keys().cloned().collect(),
                    _ => Vec::new(),
                }
            })
            .collect()
    }
}

/// Answers from a JSON object of `inputResponses` by key. A question without one is answered
/// with `null`, which is not an answer: the server refuses the retry (-32602), and the
/// conversation ends with that error.
pub fn canned(answers: Value) -> impl FnMut(&str, &Value) -> Value {
    move |key, _| answers.get(key).cloned().unwrap_or(Value::Null)
}

impl Client {
    /// Calls `tool` and answers each `input_required` round with `answer(key, inputRequest)`,
    /// calling again with the answers and the echoed `requestState` until the tool completes or
    /// answers with an error. Panics after 16 rounds.
    pub async fn converse(
        &self,
        tool: &str,
        arguments: Value,
        mut answer: impl FnMut(&str, &Value) -> Value,
    ) -> Conversation {
        let mut rounds = vec![self.call_tool(tool, arguments.clone()).await];
        loop {
            let reply = rounds
                .last()
                .unwrap_or_else(|| unreachable!("one round at least"));
            let asks = reply
                .response()
                .get("result")
                .and_then(|r| r.get("resultType"));
            if asks.and_then(Value::as_str) != Some("input_required") {
                return Conversation { rounds };
            }
            assert!(
                rounds.len() < MAX_ROUNDS,
                "{tool} still asks after {MAX_ROUNDS} rounds: {}",
                reply.body_text()
            );
            let responses: Map<String, Value> = reply
                .input_requests()
                .iter()
                .map(|(key, request)| (key.clone(), answer(key, request)))
                .collect();
            let state = reply.request_state();
            let next = self
                .retry(
                    tool,
                    arguments.clone(),
                    Value::Object(responses),
                    Some(&state),
                )
                .await;
            rounds.push(next);
        }
    }
}
