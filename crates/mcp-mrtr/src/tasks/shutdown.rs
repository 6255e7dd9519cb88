//! Shutting down with tasks running. From the moment the server drains, this replica creates no
//! task and resumes none; the tasks it holds (running, waiting for a slot, or being created when
//! the drain began) get the shutdown grace period to finish, and those still unfinished then are
//! stopped and recorded `failed`, saying why, so a client polling another replica learns it at
//! once rather than when their lease lapses. The drain is held open until that is written.

use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;

use super::{Change, Status, Tasks, now_ms};
use crate::drain::{Drain, deadline_after};
use crate::observe;
use crate::protocol::ProtocolError;

/// How often a draining replica looks whether its tasks have finished.
const FINISHED_CHECK: Duration = Duration::from_millis(50);
/// After the grace period, how long to go on stopping tasks whose creation or resumption was
/// still under way (each registers its worker once its record is written).
const LATE_STARTS: Duration = Duration::from_secs(2);
/// Stopped tasks recorded `failed` at once.
const RECORDED_AT_ONCE: usize = 16;

impl Tasks {
    /// Winds these tasks down (see the module docs) once `drain` begins, giving them `grace`,
    /// then holds the drain until `announced` resolves (the announcements of the tasks' last
    /// changes are on their way). Called once; later calls change nothing.
    pub(crate) fn wind_down_on<F, A>(&self, drain: Drain, grace: Duration, announced: F)
    where
        F: FnOnce() -> A + Send + 'static,
        A: Future<Output = ()> + Send,
    {
        if self.shared.drain.set(drain.clone()).is_err() {
            return;
        }
        // Every worker and every creation under way keeps the tasks alive: while any exists,
        // there is something to wind down, and it can be reached.
        let tasks = self.downgrade();
        let hold = drain.hold();
        tokio::spawn(async move {
            drain.begun().await;
            if let Some(tasks) = tasks.upgrade() {
                tasks.wind_down(grace).await;
            }
            announced().await;
            drop(hold);
        });
    }

    async fn wind_down(&self, grace: Duration) {
        // No place is given from now on, even to a call that looked before the drain began.
        self.shared.places.close();
        let deadline = deadline_after(Instant::now(), grace);
        let held = self.held();
        if held > 0 {
            tracing::info!(held, "draining: letting the tasks running here finish");
        }
        while self.held() > 0 && Instant::now() < deadline {
            tokio::time::sleep(FINISHED_CHECK).await;
        }
        let mut stopped = 0;
        let late = deadline_after(deadline, LATE_STARTS);
        while self.held() > 0 && Instant::now() < late {
            stopped += self.stop_all().await;
            tokio::time::sleep(FINISHED_CHECK).await;
        }
        if stopped > 0 {
            tracing::warn!(
                tasks = stopped,
                "draining: tasks unfinished after the shutdown grace period were stopped and \
                 recorded failed"
            );
        }
    }

    /// How many tasks this replica holds: running, waiting for a slot, or being created or
    /// resumed.
    pub(super) fn held(&self) -> usize {
        let places = self.shared.settings.places();
        places.saturating_sub(self.shared.places.available_permits())
    }

    /// Stops every worker registered here and records its task `failed` (unless it had just
    /// ended on its own); returns how many were recorded.
    async fn stop_all(&self) -> usize {
        let unfinished: Vec<String> = {
            let mut running = self.lock_running();
            running.values().for_each(|worker| worker.abort());
            running.drain().map(|(id, _)| id).collect()
        };
        let error = shut_down_error();
        futures::stream::iter(unfinished)
            .map(|id| {
                let error = &error;
                async move { self.record_stopped(&id, error).await }
            })
            .buffer_unordered(RECORDED_AT_ONCE)
            .filter(|recorded| std::future::ready(*recorded))
            .count()
            .await
    }

    /// Records the stopped task `id` failed with `stopped`; whether it was.
    async fn record_stopped(&self, id: &str, stopped: &ProtocolError) -> bool {
        let now = now_ms();
        // A worker that wrote its ending before it stopped keeps it: the task is no longer held
        // here.
        let failed = self
            .modify(id, |task| {
                if !self.holds(task) {
                    return Change::Keep(false);
                }
                task.set_status(Status::Failed, Some(stopped.message.clone()), now);
                task.error = Some(stopped.to_json());
                Change::Write(true)
            })
            .await;
        // Also when the worker's own ending got there first: it may have been stopped before it
        // could announce it.
        (self.shared.announce)(id);
        match failed {
            Ok(Some(true)) => {
                observe::task("failed");
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::error!(task = %id, "could not record the stopped task as failed: {}", e.message);
                false
            }
        }
    }
}

fn shut_down_error() -> ProtocolError {
    ProtocolError::internal(
        "The server running this task shut down before the task finished; call the tool again",
    )
}
