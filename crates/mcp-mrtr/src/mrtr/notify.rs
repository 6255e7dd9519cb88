//! Request-scoped notifications (progress, log messages, and under a legacy session the server's
//! own requests) sent on the response stream of the request they belong to.

use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::mpsc;

use crate::protocol::jsonrpc::notification_bytes;

/// Sends messages on one request's response stream. Cheap to clone; clones share the stream
/// and its progress so far.
#[derive(Clone)]
pub struct Notifier {
    tx: mpsc::Sender<Vec<u8>>,
    /// The last progress value sent on this request's token.
    progress: Arc<Mutex<Option<f64>>>,
}

impl Notifier {
    /// A notifier writing serialized messages into `tx`, which the transport drains.
    pub fn new(tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self {
            tx,
            progress: Arc::default(),
        }
    }

    /// Whether `progress` is past every value sent before on this request, noting it if so: the
    /// spec has each progress notification's value increase, and a handler run again in the same
    /// request (its call going on when no task can be kept for it) reports its steps again.
    pub(crate) fn progress_advances(&self, progress: f64) -> bool {
        let mut last = self
            .progress
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if progress.is_nan() || last.is_some_and(|last| progress <= last) {
            return false;
        }
        *last = Some(progress);
        true
    }

    /// Sends a notification. A closed stream means the client went away and the handler is
    /// about to be dropped, so a failed send is not an error.
    pub(crate) async fn notify(&self, method: &str, params: Value) {
        self.send_raw(notification_bytes(method, &params)).await;
    }

    /// Sends an already-serialized message; `false` when the stream is gone.
    pub(crate) async fn send_raw(&self, message: Vec<u8>) -> bool {
        self.tx.send(message).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_sent_only_as_it_increases_across_clones() {
        let (tx, _rx) = mpsc::channel(1);
        let notifier = Notifier::new(tx);
        let again = notifier.clone();
        assert!(notifier.progress_advances(0.0));
        assert!(notifier.progress_advances(0.4));
        assert!(!again.progress_advances(0.0), "a step reported again");
        assert!(!again.progress_advances(0.4), "the same value");
        assert!(again.progress_advances(1.0));
        assert!(
            !notifier.progress_advances(f64::NAN),
            "not a value past anything"
        );
    }
}
