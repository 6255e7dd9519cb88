//! Draining: the moment a server begins to shut down. From then on it accepts no connection,
//! answers `/readyz` with 503 so balancers stop sending it work, ends its long-lived streams so
//! their clients reconnect elsewhere, and closes each connection once its requests are answered.

use std::sync::Arc;

use tokio::sync::watch;

/// Whether the server is draining; cheap to clone, shared by everything that reacts to it.
#[derive(Clone)]
pub struct Drain(Arc<watch::Sender<bool>>);

impl Default for Drain {
    fn default() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }
}

impl std::fmt::Debug for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Drain").field(&self.has_begun()).finish()
    }
}

impl Drain {
    /// Starts draining (once; later calls change nothing).
    pub fn begin(&self) {
        self.0.send_replace(true);
    }

    /// Whether draining has begun.
    pub fn has_begun(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once draining has begun.
    pub async fn begun(&self) {
        let mut watching = self.0.subscribe();
        // The sender lives in `self`, so waiting cannot fail for want of one.
        let _ = watching.wait_for(|draining| *draining).await;
    }
}
