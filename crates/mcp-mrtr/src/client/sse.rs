//! Reading SSE bodies: a parser of `data:` lines, and a response read as its messages come.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::Client;

/// Splits an SSE body into lines and parses every `data:` line as one JSON message.
#[derive(Default)]
pub(super) struct SseParser {
    buffer: Vec<u8>,
}

impl SseParser {
    pub(super) fn push(&mut self, chunk: &[u8]) -> Vec<Value> {
        self.buffer.extend_from_slice(chunk);
        let mut messages = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            if let Some(message) = parse_line(&line) {
                messages.push(message);
            }
        }
        messages
    }

    pub(super) fn finish(&mut self) -> Vec<Value> {
        let line = std::mem::take(&mut self.buffer);
        parse_line(&line).into_iter().collect()
    }
}

fn parse_line(line: &[u8]) -> Option<Value> {
    let line = String::from_utf8_lossy(line);
    let line = line.trim_end_matches(['\n', '\r']);
    let data = line.strip_prefix("data:")?;
    let data = data.strip_prefix(' ').unwrap_or(data);
    if data.trim().is_empty() {
        return None;
    }
    Some(serde_json::from_str(data).unwrap_or_else(|e| {
        panic!("an SSE data line is not one complete JSON message ({e}): {data}")
    }))
}

/// A response read incrementally (SSE): progress, log messages, subscription events.
pub struct EventStream {
    /// The method of the request this answers.
    pub method: String,
    /// The id the request carried.
    pub request_id: Option<Value>,
    /// The HTTP status.
    pub status: StatusCode,
    /// The HTTP headers.
    pub headers: HeaderMap,
    pub(super) body: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>,
    pub(super) parser: SseParser,
    pub(super) pending: VecDeque<Value>,
    pub(super) client: Client,
}

impl EventStream {
    /// The `Content-Type` of the response.
    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The next message, passed to the client's observer first; `None` when the stream ended or
    /// nothing arrived within `within`.
    pub async fn next_message(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(message) = self.pending.pop_front() {
                self.client.observe_message(&self.method, &message);
                return Some(message);
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) | Ok(None) => return None,
                Ok(Some(Err(e))) => panic!("reading the {} stream failed: {e}", self.method),
                Ok(Some(Ok(chunk))) => self.pending.extend(self.parser.push(&chunk)),
            }
        }
    }

    /// Whether the server ends the stream within `within`; messages still arriving are read and
    /// dropped (passed to the observer as any other).
    pub async fn ends_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            self.pending.clear();
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return false,
                Ok(None) => return true,
                Ok(Some(Err(e))) => panic!("reading the {} stream failed: {e}", self.method),
                Ok(Some(Ok(chunk))) => {
                    for message in self.parser.push(&chunk) {
                        self.client.observe_message(&self.method, &message);
                    }
                }
            }
        }
    }

    /// The next message; panics when none arrives within `within`.
    pub async fn expect_message(&mut self, within: Duration) -> Value {
        match self.next_message(within).await {
            Some(message) => message,
            None => panic!("no message on the {} stream within {within:?}", self.method),
        }
    }
}
