//! Request-scoped notifications (progress, log messages, and under a legacy session the server's
//! own requests) sent on the response stream of the request they belong to.

use serde_json::Value;
use tokio::sync::mpsc;

use crate::protocol::jsonrpc::notification_bytes;

/// Sends messages on one request's response stream. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    tx: mpsc::Sender<Vec<u8>>,
}

impl Notifier {
    /// A notifier writing serialized messages into `tx`, which the transport drains.
    pub fn new(tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self { tx }
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
