//! Reading SSE bodies: a parser of events (as the HTML standard reads them: lines ended by CRLF,
//! LF or CR, an event's `data:` lines joined, the event ended by a blank line), and a response
//! read as its messages come.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::Client;

/// Reads an SSE body as it arrives and parses the data of every event as one JSON message. An
/// event without data (a priming event, say) carries no message.
#[derive(Default)]
pub(super) struct SseParser {
    /// Whether a line has ended yet (a byte order mark may open the first).
    past_first_line: bool,
    /// The bytes of the line not yet ended.
    line: Vec<u8>,
    /// The last line ended with CR: an LF now belongs to the same line end.
    after_cr: bool,
    /// The data of the event being read, each `data:` line followed by LF.
    data: String,
}

impl SseParser {
    /// The messages of the events `chunk` completes.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Vec<Value> {
        let mut messages = Vec::new();
        for &byte in chunk {
            let crlf = byte == b'\n' && self.after_cr;
            self.after_cr = byte == b'\r';
            match byte {
                _ if crlf => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    messages.extend(self.end_line(&line));
                }
                _ => self.line.push(byte),
            }
        }
        messages
    }

    /// Panics when the body ended inside an event that carries data: the standard drops such
    /// an event, and a test would otherwise miss a message without being told why.
    pub(super) fn finish(&self) {
        let open_line = String::from_utf8_lossy(&self.line);
        assert!(
            self.data.is_empty() && !open_line.starts_with("data"),
            "the SSE body ended inside an event: {}{open_line}",
            self.data
        );
    }

    /// Takes one line; a blank one ends the event and gives its message, if it has data.
    fn end_line(&mut self, line: &[u8]) -> Option<Value> {
        let line = match line.strip_prefix("\u{feff}".as_bytes()) {
            Some(rest) if !self.past_first_line => rest,
            _ => line,
        };
        self.past_first_line = true;
        if line.is_empty() {
            let data = std::mem::take(&mut self.data);
            let data = data.strip_suffix('\n').unwrap_or(&data);
            if data.trim().is_empty() {
                return None;
            }
            return Some(serde_json::from_str(data).unwrap_or_else(|e| {
                panic!("the data of an SSE event is not one complete JSON message ({e}): {data}")
            }));
        }
        let line = String::from_utf8_lossy(line);
        // A line without a colon is a field with an empty value; one starting with it, a comment.
        let (field, value) = line.split_once(':').unwrap_or((&line, ""));
        if field == "data" {
            self.data.push_str(value.strip_prefix(' ').unwrap_or(value));
            self.data.push('\n');
        }
        None
    }
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
                Err(_) => return None,
                Ok(None) => {
                    self.parser.finish();
                    return None;
                }
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
            for message in self.pending.drain(..) {
                self.client.observe_message(&self.method, &message);
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return false,
                Ok(None) => return true,
                Ok(Some(Err(e))) => panic!("reading the {} stream failed: {e}", self.method),
                Ok(Some(Ok(chunk))) => self.pending.extend(self.parser.push(&chunk)),
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::SseParser;

    #[test]
    fn an_event_is_its_data_lines_joined_and_ends_at_a_blank_line() {
        let mut parser = SseParser::default();
        let body = b": keepalive\nid: 7\nevent: message\ndata: {\"id\":1,\ndata: \"result\":{}}\n";
        assert!(parser.push(body).is_empty(), "no blank line yet");
        assert_eq!(parser.push(b"\n"), [json!({"id": 1, "result": {}})]);
    }

    #[test]
    fn lines_end_with_crlf_lf_or_cr_even_split_between_chunks() {
        let mut parser = SseParser::default();
        let mut messages = parser.push(b"data: 1\r\n\r\ndata: [2,\r");
        messages.extend(parser.push(b"\ndata: 3]\r"));
        messages.extend(parser.push(b"\r"));
        messages.extend(parser.push(b"data:4\r\rdata\n\n"));
        assert_eq!(messages, [json!(1), json!([2, 3]), json!(4)]);
    }

    #[test]
    fn events_without_data_carry_no_message() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"id: prime\ndata:\n\nretry: 10\n\n").is_empty());
        parser.finish();
    }

    #[test]
    #[should_panic(expected = "the SSE body ended inside an event")]
    fn a_body_ending_inside_an_event_is_told() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: {\"cut\": ").is_empty());
        parser.finish();
    }

    #[test]
    fn a_byte_order_mark_opening_the_body_is_skipped() {
        let mut parser = SseParser::default();
        let body = [&b"\xef\xbb\xbf"[..], b"data: 1\n\n\xef\xbb\xbfdata: 2\n\n"].concat();
        assert_eq!(
            parser.push(&body),
            [json!(1)],
            "only the first line's mark is skipped"
        );
    }
}
