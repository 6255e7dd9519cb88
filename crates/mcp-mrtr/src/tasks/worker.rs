//! Running a task on this replica: the tool runs again from the task's answers and remembered
//! work, under a lease renewed while it works, and its ending (a result, a JSON-RPC error, or
//! questions) is written to the record only if the task is still this worker's to end.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value};
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tokio::task::AbortHandle;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument as _;

use super::record::Lease;
use super::{Change, MAX_TASK_BYTES, Status, TaskRecord, Tasks, encode, millis, now_ms};
use crate::mrtr::engine::protocol_error;
use crate::mrtr::rounds::{RefusedAnswer, RoundState, Rounds};
use crate::mrtr::{HandlerError, RequestContext, TaskMode};
use crate::observe;
use crate::protocol::content::CallToolResult;
use crate::protocol::{Method, ProtocolError};
use crate::trace_context;

/// How long to wait before trying again to record a task's ending.
pub(super) const ENDING_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// How a run of the task's tool ended.
enum Ending {
    /// The tool returned this result.
    Completed(Value),
    /// The tool failed with this JSON-RPC error.
    Failed(ProtocolError),
    /// The tool asks these questions, having read these answers and remembered this work.
    Asking {
        asked: Vec<(String, Value)>,
        answers: Map<String, Value>,
        memo: Map<String, Value>,
    },
}

/// Removes a worker from the running ones when it ends, however it ends (aborted included),
/// unless a newer worker of the same task took its place meanwhile.
struct Running {
    tasks: Tasks,
    id: String,
    worker: tokio::task::Id,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.tasks.lock_running();
        if running.get(&self.id).map(AbortHandle::id) == Some(self.worker) {
            running.remove(&self.id);
        }
    }
}

impl Tasks {
    /// Runs `record`'s tool as task `id` on this replica, which holds its lease; the worker
    /// keeps `place` (one of the replica's places for tasks) until it ends.
    pub(super) fn start(&self, id: String, record: TaskRecord, place: OwnedSemaphorePermit) {
        // The worker waits until it is registered, so that it cannot end (and unregister)
        // before it is registered.
        let (registered, wait) = oneshot::channel::<()>();
        let tasks = self.clone();
        let worker_id = id.clone();
        let worker = tokio::spawn(async move {
            let _place = place;
            if wait.await.is_err() {
                return;
            }
            let running = Running {
                tasks: tasks.clone(),
                id: worker_id,
                worker: tokio::task::id(),
            };
            tasks.work(&running.id, record).await;
        });
        self.lock_running().insert(id, worker.abort_handle());
        let _ = registered.send(());
    }

    async fn work(&self, id: &str, record: TaskRecord) {
        // The lease this worker was started under: started since, another worker holds another.
        let Some(grant) = record.lease.clone() else {
            tracing::error!(task = %id, "a task was started without a lease; it does not run");
            return;
        };
        // The lease is renewed by a task of its own, so that a tool that holds up its thread
        // for a while does not hold up the renewal too, while another worker thread drives the
        // runtime's timers and I/O (tokio does not promise one does: work that never yields
        // belongs in `spawn_blocking` or `block_in_place`). It says when the task is no longer
        // this worker's to run, and stops when the worker ends, however it ends.
        let (started, has_started) = oneshot::channel::<()>();
        let (lost, mut no_longer_ours) = oneshot::channel::<()>();
        let renewer = {
            let (tasks, id, grant) = (self.clone(), id.to_owned(), grant.clone());
            tokio::spawn(async move {
                let _ = started.send(());
                tasks.keep_lease(&id, &grant).await;
                let _ = lost.send(());
            })
        };
        let renewer = AbortOnDropHandle::new(renewer);
        // Until it first runs, the renewer waits in a spot of this thread's queue that other
        // threads do not take work from: a tool holding up the thread would hold it up too.
        let _ = has_started.await;
        // A replica runs a bounded number of tasks at once; the others wait their turn, still
        // holding their lease.
        let _slot = tokio::select! {
            slot = self.shared.slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
            lost = &mut no_longer_ours => return renewal_ended(id, lost),
        };
        // A task cancelled while it waited does not start, though the notice of its cancel was
        // lost; a store out of reach now does not stop it (its ending's write decides).
        match self.read(id).await {
            Ok(Some(task)) if task.works_under(&grant) => {}
            Ok(_) => return,
            Err(_) => {}
        }
        let span = tracing::info_span!(
            "mcp.task",
            otel.name = "mcp.task",
            mcp.name = %record.tool,
            mcp.task = %id,
        );
        trace_context::adopt(&span, &record.trace());
        let ending = tokio::select! {
            ending = self.run(&record).instrument(span) => ending,
            lost = &mut no_longer_ours => return renewal_ended(id, lost),
        };
        drop(renewer);
        let now = now_ms();
        let mut settle = |task: &mut TaskRecord| {
            if !task.works_under(&grant) {
                return Change::Keep(None);
            }
            match &ending {
                Ending::Completed(result) => {
                    task.set_status(Status::Completed, None, now);
                    task.result = Some(result.clone());
                }
                Ending::Failed(error) => {
                    task.set_status(Status::Failed, Some(error.message.clone()), now);
                    task.error = Some(error.to_json());
                }
                Ending::Asking {
                    asked,
                    answers,
                    memo,
                } => {
                    task.set_status(Status::InputRequired, None, now);
                    task.asked = asked.clone();
                    task.answers = answers.clone();
                    task.memo = memo.clone();
                    // Answers could never be recorded on a record this large: the task ends.
                    if encode(task).is_ok_and(|bytes| bytes.len() > MAX_TASK_BYTES) {
                        let outgrown = outgrown();
                        task.set_status(Status::Failed, Some(outgrown.message.clone()), now);
                        task.error = Some(outgrown.to_json());
                        task.answers.clear();
                        task.memo.clear();
                    }
                }
            }
            Change::Write(Some(task.status))
        };
        // The store may fail for a moment: try again for a lease, rather than lose work that
        // may have taken long (a write past the lease is harmless: it lands only while the
        // record still says the task is this worker's, so a first write that landed with its
        // reply lost is not undone once a worker started since holds the task).
        let deadline = tokio::time::Instant::now() + self.shared.settings.lease;
        let mut failed_once = false;
        let written = loop {
            match self.modify(id, &mut settle).await {
                Ok(written) => break written,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    failed_once = true;
                    tracing::warn!(task = %id, "could not record the task's ending yet: {}", e.message);
                    tokio::time::sleep(ENDING_RETRY).await;
                }
                Err(e) => {
                    tracing::error!(task = %id, "could not record the task's ending: {}", e.message);
                    return;
                }
            }
        };
        if let Some(Some(status)) = written {
            observe::task(status.as_str());
            (self.shared.announce)(id);
        } else {
            tracing::debug!(task = %id, "task ended elsewhere; its run's ending dropped");
            if failed_once {
                // A write that failed may have landed all the same: followers read again.
                (self.shared.announce)(id);
            }
        }
    }

    /// Runs the task's tool from its answers and remembered work. An answer the task was
    /// created with that does not answer its question (the call's last request brought it, and
    /// the tool had not read it before its task point) is dropped, and the tool runs again to
    /// ask that question as the task's (its keys are the task's own, apart from the call's).
    /// An answer to one of the task's own questions was checked as it came; refused now (the
    /// tool asked something else under its key), it fails the task with -32603: a key the client
    /// answered is never asked again, and the client answered what it was asked.
    async fn run(&self, record: &TaskRecord) -> Ending {
        let Some(tool) = self.shared.registry.tool(&record.tool) else {
            return Ending::Failed(ProtocolError::invalid_params(format!(
                "Unknown tool: {}",
                record.tool
            )));
        };
        let mut answers = record.answers.clone();
        let mut memo = record.memo.clone();
        loop {
            let rounds = Arc::new(Rounds::new(RoundState {
                available: answers,
                ..RoundState::default()
            }));
            let context = RequestContext::new(
                record.principal(),
                record.meta(),
                None,
                rounds.clone(),
                memo,
                TaskMode::Running,
            );
            let call = tool.call(context.clone(), record.arguments.clone());
            let ran = AssertUnwindSafe(call).catch_unwind().await;
            let round = rounds.take();
            if let Some(RefusedAnswer { key, .. }) = &round.refused
                && record.answered.contains(key)
            {
                // Even when the tool went on past the refusal: its next question would be this
                // key's again, or one without the answer the client gave.
                return Ending::Failed(ProtocolError::internal(format!(
                    "The tool {} asked again under key {key:?}, which the client already \
                     answered, something its answer does not fit: a task asks each key once",
                    record.tool
                )));
            }
            if let (
                Ok(Err(_)),
                Some(RefusedAnswer {
                    key,
                    first_read: true,
                }),
            ) = (&ran, &round.refused)
            {
                // The refused answer left `available` and did not go into `used`: each run has
                // one answer fewer, so this ends.
                answers = round.used;
                answers.extend(round.available);
                memo = context.take_memo();
                tracing::debug!(tool = %record.tool, key = %key, "an answer the task was created with does not answer its question: the task asks it");
                continue;
            }
            return Self::ending(record, context, round, ran);
        }
    }

    /// What a run of the task's tool came to.
    fn ending(
        record: &TaskRecord,
        context: RequestContext,
        round: RoundState,
        ran: std::thread::Result<Result<CallToolResult, HandlerError>>,
    ) -> Ending {
        match ran {
            Ok(Ok(result)) => match serde_json::to_value(&result) {
                Ok(value) => Ending::Completed(value),
                Err(e) => Ending::Failed(ProtocolError::internal(format!(
                    "the tool's result cannot be written: {e}"
                ))),
            },
            Ok(Err(HandlerError::InputRequired(_))) => {
                let mut answers = round.used;
                answers.extend(round.available);
                let asked = round
                    .pending
                    .into_iter()
                    .filter_map(|(key, request)| Some((key, serde_json::to_value(request).ok()?)))
                    .collect();
                Ending::Asking {
                    asked,
                    answers,
                    memo: context.take_memo(),
                }
            }
            Ok(Err(error)) => {
                Ending::Failed(protocol_error(Method::ToolsCall, &record.tool, error))
            }
            Err(_) => {
                tracing::error!(tool = %record.tool, "the task's tool panicked");
                Ending::Failed(ProtocolError::internal(format!(
                    "Internal error while handling tools/call {}",
                    record.tool
                )))
            }
        }
    }

    /// Renews the worker's lease `grant` on task `id` a third of a lease apart; returns when the
    /// task is no longer the worker's to run (cancelled, ended elsewhere, or gone).
    async fn keep_lease(&self, id: &str, grant: &Lease) {
        let lease = self.shared.settings.lease;
        loop {
            tokio::time::sleep(lease / 3).await;
            let now = now_ms();
            let renewed = self
                .modify(id, |task| {
                    let ours = task.works_under(grant);
                    match (&mut task.lease, ours) {
                        (Some(held), true) => {
                            held.until_ms = now + millis(lease);
                            Change::Write(true)
                        }
                        _ => Change::Keep(false),
                    }
                })
                .await;
            match renewed {
                Ok(Some(true)) => {}
                Ok(_) => return,
                // The store is out of reach: keep working; the ending's write decides.
                Err(e) => {
                    tracing::warn!(task = %id, "could not renew the task's lease: {}", e.message)
                }
            }
        }
    }
}

/// The error of a task whose questions, with the answers and work it carries, outgrew what a
/// task record may hold.
fn outgrown() -> ProtocolError {
    ProtocolError::internal(format!(
        "The task's questions, with the answers and work it carries, would make it larger than \
         {} KiB",
        MAX_TASK_BYTES / 1024
    ))
}

/// The worker stops as its lease renewal ended: the task is no longer this worker's to run, or,
/// should the renewal have panicked (its sender dropped), it is left to its lease, and reported
/// `failed` once that lapses, as a lost worker's task is.
fn renewal_ended(id: &str, lost: Result<(), oneshot::error::RecvError>) {
    if lost.is_err() {
        tracing::error!(task = %id, "the task's lease renewal stopped unexpectedly: its worker stops");
    }
}
