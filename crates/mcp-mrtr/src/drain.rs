//! Draining: the moment a server begins to shut down. From then on it accepts no connection,
//! answers `/readyz` with 503 so balancers stop sending it work, ends its long-lived streams so
//! their clients reconnect elsewhere, and closes each connection once its requests are answered.
//! Work that outlives requests (tasks, legacy calls whose streams closed) holds the drain open
//! until it has wound down.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// Whether the server is draining; cheap to clone, shared by everything that reacts to it.
#[derive(Clone)]
pub struct Drain {
    /// When draining began.
    begun: Arc<watch::Sender<Option<Instant>>>,
    /// How many [`DrainHold`]s are alive.
    holds: Arc<watch::Sender<usize>>,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            begun: Arc::new(watch::channel(None).0),
            holds: Arc::new(watch::channel(0).0),
        }
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
        self.begun.send_if_modified(|begun| {
            let first = begun.is_none();
            if first {
                *begun = Some(Instant::now());
            }
            first
        });
    }

    /// Whether draining has begun.
    pub fn has_begun(&self) -> bool {
        self.begun.borrow().is_some()
    }

    /// When draining began, if it has.
    pub fn began_at(&self) -> Option<Instant> {
        *self.begun.borrow()
    }

    /// Resolves once draining has begun.
    pub async fn begun(&self) {
        let mut watching = self.begun.subscribe();
        // The sender lives in `self`, so waiting cannot fail for want of one.
        let _ = watching.wait_for(Option::is_some).await;
    }

    /// Keeps the server from being done draining until the hold is dropped.
    pub(crate) fn hold(&self) -> DrainHold {
        self.holds.send_modify(|holds| *holds += 1);
        DrainHold {
            holds: self.holds.clone(),
        }
    }

    /// Resolves once nothing holds the drain open: work that outlives requests has wound down.
    /// A server's owner awaits it after the last request was answered, before it exits.
    pub async fn released(&self) {
        let mut watching = self.holds.subscribe();
        let _ = watching.wait_for(|holds| *holds == 0).await;
    }
}

/// Holds a [`Drain`] open while alive.
pub(crate) struct DrainHold {
    holds: Arc<watch::Sender<usize>>,
}

impl Drop for DrainHold {
    fn drop(&mut self) {
        self.holds
            .send_modify(|holds| *holds = holds.saturating_sub(1));
    }
}

/// `wait` after `start`, or a deadline decades away when that is past what the clock can hold
/// (a grace period configured as "forever").
pub(crate) fn deadline_after(start: Instant, wait: Duration) -> Instant {
    const DECADES: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    start.checked_add(wait).unwrap_or_else(|| start + DECADES)
}
