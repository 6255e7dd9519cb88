//! The request span of the HTTP layers lasts as long as its answer: until the answer is handed
//! over when its length is known, until the stream ends when it is streamed (SSE), with the
//! `debug` lines of target `mcp_mrtr::http` for each. A test binary of its own, which installs
//! the process's subscriber: with a scoped one (`set_default`) as the only subscriber, tracing
//! works out a new callsite's interest from the default of whichever thread reaches it first,
//! and a test running beside it on another thread has none (the lines were lost 3 times in 5).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::TestServer;
use tracing::span;
use tracing_subscriber::layer::{self, Layer, SubscriberExt as _};
use tracing_subscriber::registry::{LookupSpan, Registry};

/// Long enough for anything that should arrive; only a broken server ever waits this long.
const PATIENCE: Duration = Duration::from_secs(10);

/// What a tracing subscriber saw: the lines of target `mcp_mrtr::http` and each closing of a
/// request span, in order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<String>>>);

impl Seen {
    fn lines(&self) -> Vec<String> {
        self.0.lock().map(|lines| lines.clone()).unwrap_or_default()
    }

    fn clear(&self) {
        if let Ok(mut lines) = self.0.lock() {
            lines.clear();
        }
    }

    /// Waits until the request span has closed; the lines by then.
    async fn after_the_span_closed(&self) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let lines = self.lines();
            if lines.iter().any(|line| line == SPAN_CLOSED) {
                return lines;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the request span never closed: {lines:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

const SPAN_CLOSED: &str = "request span closed";

/// The `message` field of an event.
struct MessageOf(String);

impl tracing::field::Visit for MessageOf {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S> Layer<S> for Seen
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &tracing::Event<'_>, _: layer::Context<'_, S>) {
        if event.metadata().target() == "mcp_mrtr::http" {
            let mut message = MessageOf(String::new());
            event.record(&mut message);
            if let Ok(mut lines) = self.0.lock() {
                lines.push(message.0);
            }
        }
    }

    fn on_close(&self, id: span::Id, context: layer::Context<'_, S>) {
        let closed = context.span(&id).is_some_and(|span| {
            span.name() == "request" && span.metadata().target().starts_with("mcp_mrtr")
        });
        if closed && let Ok(mut lines) = self.0.lock() {
            lines.push(SPAN_CLOSED.to_owned());
        }
    }
}

#[tokio::test]
async fn a_streamed_answer_keeps_its_request_span_open_until_the_stream_ends() {
    let seen = Seen::default();
    tracing::subscriber::set_global_default(Registry::default().with(seen.clone()))
        .expect("the only subscriber of this test binary");
    let server = TestServer::start().await;
    let client = server.client();
    let streamed_call = || {
        client
            .request("tools/call")
            .params(json!({"name": "progress_steps", "arguments": {}}))
            .progress_token(json!("span-check"))
            .send()
    };
    // The client reads the tools' output schemas (one `tools/list`) before its first call.
    streamed_call().await;

    seen.clear();
    let listed = client.request("tools/list").send().await;
    assert_eq!(listed.status.as_u16(), 200);
    let lines = seen.after_the_span_closed().await;
    assert_eq!(
        lines,
        ["finished processing request", SPAN_CLOSED],
        "an answer of known length: one line, then the span closes"
    );

    seen.clear();
    let streamed = streamed_call().await;
    assert!(streamed.is_event_stream(), "{}", streamed.content_type());
    assert_eq!(streamed.text(), "three steps done");
    let lines = seen.after_the_span_closed().await;
    assert_eq!(
        lines,
        ["finished processing request", "end of stream", SPAN_CLOSED],
        "the span outlives the headers and closes once the stream has ended"
    );
}
