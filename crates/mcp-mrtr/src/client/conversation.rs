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
                    Some("input_required") => asked(reply).keys().cloned().collect(),
                    _ => Vec::new(),
                }
            })
            .collect()
    }
}

/// The `inputRequests` of an `input_required` reply; a result may leave them out (it then
/// only carries a `requestState` to send back).
fn asked(reply: &Reply) -> Map<String, Value> {
    reply.result()["inputRequests"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// Answers from a JSON object of `inputResponses` by key. A question without one is answered
/// with `null`, which is not an answer: the server refuses the retry (-32602), and the
/// conversation ends with that error.
pub fn canned(answers: Value) -> impl FnMut(&str, &Value) -> Value {
    move |key, _| answers.get(key).cloned().unwrap_or(Value::Null)
}

impl Client {
    /// Calls `tool` and answers each `input_required` round with `answer(key, inputRequest)`,
    /// calling again with the answers and the echoed `requestState` (when the round has one;
    /// a round may carry either alone) until the tool completes or answers with an error.
    /// Panics after 16 rounds.
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
            let responses: Map<String, Value> = asked(reply)
                .iter()
                .map(|(key, request)| (key.clone(), answer(key, request)))
                .collect();
            let state = reply.result()["requestState"].as_str().map(str::to_owned);
            let next = self
                .retry(
                    tool,
                    arguments.clone(),
                    Value::Object(responses),
                    state.as_deref(),
                )
                .await;
            rounds.push(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::Json;
    use axum::routing::post;
    use serde_json::{Value, json};

    use super::canned;
    use crate::client::Client;

    /// A server of one tool whose rounds each leave out one of the optional members of an
    /// `input_required` result: the first has no `requestState`, the second no
    /// `inputRequests`. It records the params of every call it gets.
    async fn sparse_server(calls: Arc<Mutex<Vec<Value>>>) -> String {
        let answer = move |Json(request): Json<Value>| {
            let calls = calls.clone();
            async move {
                let params = request["params"].clone();
                let result = match request["method"].as_str() {
                    Some("tools/list") => json!({"tools": []}),
                    _ => {
                        let mut calls = calls.lock().expect("calls");
                        calls.push(params);
                        match calls.len() {
                            1 => json!({"resultType": "input_required", "inputRequests":
                                {"q": {"method": "roots/list", "params": {}}}}),
                            2 => json!({"resultType": "input_required", "requestState": "s2"}),
                            _ => json!({"resultType": "complete",
                                "content": [{"type": "text", "text": "done"}]}),
                        }
                    }
                };
                Json(json!({"jsonrpc": "2.0", "id": request["id"], "result": result}))
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("address"));
        tokio::spawn(async move {
            axum::serve(listener, axum::Router::new().route("/mcp", post(answer))).await
        });
        url
    }

    #[tokio::test]
    async fn a_round_without_state_or_without_questions_is_still_answered() {
        let calls = Arc::default();
        let client = Client::new(sparse_server(Arc::clone(&calls)).await);
        let talk = client
            .converse("t", json!({}), canned(json!({"q": {"roots": []}})))
            .await;
        assert_eq!(talk.last().text(), "done");
        assert_eq!(talk.questions(), [vec!["q".to_owned()], vec![], vec![]]);
        let calls = calls.lock().expect("calls");
        let state = |round: usize| calls[round].get("requestState").cloned();
        assert_eq!(
            (state(1), state(2)),
            (None, Some(json!("s2"))),
            "a state is sent back only when the round had one"
        );
        assert_eq!(calls[1]["inputResponses"], json!({"q": {"roots": []}}));
        assert_eq!(calls[2]["inputResponses"], json!({}));
    }
}
