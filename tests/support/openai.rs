//! A local LLM provider for the tests: a real HTTP server speaking the OpenAI chat-completions
//! protocol (`POST /v1/chat/completions`) on 127.0.0.1 and a random port. It answers as the test
//! scripts it (a text, slowly, only when released, an HTTP error, a refusal, a huge answer with or
//! without its length), counts the calls it
//! receives, keeps their headers and bodies, and notices when a caller hangs up before its answer
//! is ready.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

/// How the provider answers each call.
#[derive(Debug, Clone)]
pub enum Answer {
    /// 200 with this text as the assistant's message.
    Text(String),
    /// 200 with this text, after a delay.
    Slow(Duration, String),
    /// 200 with this text once the test calls [`FakeProvider::release`].
    Held(String),
    /// This HTTP status with an OpenAI-style error body carrying this message.
    Error(u16, String),
    /// The same, once the test calls [`FakeProvider::release`].
    HeldError(u16, String),
    /// 401, repeating the key it was sent in its message as OpenAI does.
    BadKey,
    /// 200 with a refusal, stopped by the content filter.
    Refusal(String),
    /// 200 with this text, stopped at the token budget (`finish_reason: length`).
    CutShort(String),
    /// 200 with a well-formed answer whose summary makes the body this many bytes at least,
    /// sent with its `Content-Length`.
    Oversized(usize),
    /// The same, sent in chunks without a length.
    OversizedStream(usize),
}

/// One call the provider received.
#[derive(Debug, Clone)]
pub struct Call {
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The request body (a chat-completions request).
    pub body: Value,
}

impl Call {
    /// The text of the message with `role`.
    pub fn message(&self, role: &str) -> String {
        self.body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["role"] == role)
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_owned()
    }
}

struct Shared {
    answer: Mutex<Answer>,
    calls: Mutex<Vec<Call>>,
    hang_ups: AtomicUsize,
    released: watch::Sender<bool>,
}

impl Shared {
    async fn until_released(&self) {
        let mut released = self.released.subscribe();
        let _ = released.wait_for(|open| *open).await;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The running provider; stops when dropped.
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _shutdown: oneshot::Sender<()>,
}

impl FakeProvider {
    pub async fn start(answer: Answer) -> Self {
        let shared = Arc::new(Shared {
            answer: Mutex::new(answer),
            calls: Mutex::new(Vec::new()),
            hang_ups: AtomicUsize::new(0),
            released: watch::channel(false).0,
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind the fake provider to 127.0.0.1:0");
        let addr = listener.local_addr().expect("the fake provider's address");
        let (shutdown, stop) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.await;
                })
                .await;
        });
        Self {
            addr,
            shared,
            _shutdown: shutdown,
        }
    }

    /// What the server under test is given as `--llm-base-url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Answers the next calls with `answer`.
    pub fn answer_with(&self, answer: Answer) {
        *lock(&self.shared.answer) = answer;
    }

    /// Lets held answers go.
    pub fn release(&self) {
        self.shared.released.send_replace(true);
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.shared.calls).clone()
    }

    pub fn call_count(&self) -> usize {
        lock(&self.shared.calls).len()
    }

    /// Calls whose caller went away before the answer was ready.
    pub fn hang_ups(&self) -> usize {
        self.shared.hang_ups.load(Ordering::SeqCst)
    }

    /// Waits until `condition` holds; false if it still does not after `limit`.
    pub async fn wait_until(&self, limit: Duration, condition: impl Fn(&Self) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while !condition(self) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

/// Counts a hang-up when a call is dropped before it answered.
struct Unanswered<'a> {
    shared: &'a Shared,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.shared.hang_ups.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let model = body["model"].clone();
    lock(&shared.calls).push(Call {
        authorization: authorization.clone(),
        body,
    });
    let answer = lock(&shared.answer).clone();
    let mut unanswered = Unanswered {
        shared: &shared,
        answered: false,
    };
    let response = match answer {
        Answer::Text(text) => completion(&model, &text, "stop", None),
        Answer::Slow(delay, text) => {
            tokio::time::sleep(delay).await;
            completion(&model, &text, "stop", None)
        }
        Answer::Held(text) => {
            shared.until_released().await;
            completion(&model, &text, "stop", None)
        }
        Answer::Error(status, message) => error(status, &message),
        Answer::HeldError(status, message) => {
            shared.until_released().await;
            error(status, &message)
        }
        Answer::BadKey => {
            let key = authorization
                .as_deref()
                .and_then(|a| a.strip_prefix("Bearer "))
                .unwrap_or_default();
            error(401, &format!("Incorrect API key provided: {key}."))
        }
        Answer::Refusal(text) => completion(&model, "", "content_filter", Some(&text)),
        Answer::CutShort(text) => completion(&model, &text, "length", None),
        Answer::Oversized(bytes) => completion(&model, &oversized(bytes), "stop", None),
        Answer::OversizedStream(bytes) => {
            let body = completion_body(&model, &oversized(bytes), "stop", None).to_string();
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> = body
                .into_bytes()
                .chunks(64 * 1024)
                .map(|chunk| Ok(chunk.to_vec()))
                .collect();
            let body = axum::body::Body::from_stream(futures::stream::iter(chunks));
            ([("content-type", "application/json")], body).into_response()
        }
    };
    unanswered.answered = true;
    response
}

/// A two-line answer whose summary is `bytes` long.
fn oversized(bytes: usize) -> String {
    format!("SUMMARY: {}\nTHEMES: story", "a".repeat(bytes))
}

fn completion(
    model: &Value,
    content: &str,
    finish_reason: &str,
    refusal: Option<&str>,
) -> Response {
    Json(completion_body(model, content, finish_reason, refusal)).into_response()
}

fn completion_body(
    model: &Value,
    content: &str,
    finish_reason: &str,
    refusal: Option<&str>,
) -> Value {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_767_225_600,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": refusal},
            "finish_reason": finish_reason
        }],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    })
}

fn error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": null}});
    (status, Json(body)).into_response()
}
