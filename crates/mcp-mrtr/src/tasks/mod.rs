//! The Tasks extension (`io.modelcontextprotocol/tasks`): work that outlives its request.
//!
//! A tool that calls [`RequestContext::continue_as_task`](crate::mrtr::RequestContext::continue_as_task)
//! while the client accepts tasks is answered with a `CreateTaskResult`; the task's record is in
//! the [`TaskStore`] before that answer leaves, so `tasks/get` on any replica finds it. The tool
//! then runs again, as the task, on the replica that created it, which holds a lease on it and
//! renews it while working. A question the task asks (`ctx.elicit` and the rest, unchanged) parks
//! it in `input_required` with no worker at all; `tasks/update` on any replica records the answers,
//! and the replica that receives the last one runs the tool again from its answers and remembered
//! work. A lease that lapses (the replica died) turns the task `failed` at the next read, so a
//! task is never `working` forever. `tasks/cancel` marks the task `cancelled` and stops its
//! worker wherever it runs: directly on this replica, through the change events on others.
//!
//! Every task belongs to the principal that created it; anyone else is told it does not exist.

mod record;
mod shutdown;
mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::task::AbortHandle;

use record::{Lease, Status, TaskRecord};

use crate::auth::Principal;
use crate::drain::Drain;
use crate::log_budget::LogBudget;
use crate::mrtr::{TaskSeed, Unkept};
use crate::observe;
use crate::protocol::ProtocolError;
use crate::protocol::input::{Elicitation, Roots, Sampling};
use crate::registry::Registry;
use crate::store::TaskStore;

/// Largest task record created: the call's arguments, the client's `_meta` (its `clientInfo`,
/// capabilities) and what the handler carries into the task (answers, remembered work) are kept
/// with the task for its whole life, in the store every replica reads, so a call that would make
/// a larger record goes on in its request instead.
pub const MAX_NEW_TASK_BYTES: usize = 64 * 1024;

/// Largest task record its answers may make: a `tasks/update` that would make it larger is
/// refused, and nothing of it recorded; a task whose questions (with what it carries) would make
/// it larger fails.
pub const MAX_TASK_BYTES: usize = 256 * 1024;

/// Tasks one replica holds at once, running or waiting for a slot, per slot of
/// [`TaskSettings::max_running`]: a call that would make one more goes on in its request, and
/// the answer that would resume one more is refused (to be sent again), so a flood of calls
/// cannot pile up workers (each with its record, renewing its lease) that would only reach their
/// turn when their time to live is over.
const HELD_PER_SLOT: usize = 4;

/// Lines about no room for a task, which a flood of calls can cause.
static NO_ROOM: LogBudget = LogBudget::new("no_room_for_task");

/// How tasks are kept and run.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    /// How long a task is kept from its creation (`ttlMs`).
    pub ttl: Duration,
    /// How often clients are asked to poll (`pollIntervalMs`).
    pub poll_interval: Duration,
    /// How long a replica's hold on a working task lasts unless renewed (a third of it apart);
    /// a replica that dies leaves its tasks `failed` within this time.
    pub lease: Duration,
    /// Most tasks one replica runs at once; more wait their turn, `working`, up to four times as
    /// many in all: beyond, a call that would become a task goes on in its request, and answers
    /// that would resume a task are refused with HTTP 503, to be sent again. Taken as 1 when 0,
    /// and at most a quarter of tokio's semaphore limit (about 2^59 on 64-bit machines).
    pub max_running: usize,
}

/// The longest a task may be kept, or asked to wait between polls.
const MOST_TASK_TTL: Duration = Duration::from_secs(365 * 86_400);
/// The longest lease: a day.
const MOST_LEASE: Duration = Duration::from_secs(86_400);

impl TaskSettings {
    /// These settings, each taken within its bounds: a time to live of a millisecond to a year, a
    /// poll interval of a millisecond up to that time to live, a lease of 3 ms (renewed every
    /// millisecond) to a day.
    pub fn within_bounds(self) -> Self {
        let ttl = self.ttl.clamp(Duration::from_millis(1), MOST_TASK_TTL);
        Self {
            ttl,
            poll_interval: self.poll_interval.clamp(Duration::from_millis(1), ttl),
            lease: self.lease.clamp(Duration::from_millis(3), MOST_LEASE),
            max_running: self.max_running,
        }
    }

    /// Tasks run at once: [`max_running`](Self::max_running) within what a semaphore can count.
    fn slots(&self) -> usize {
        self.max_running
            .clamp(1, Semaphore::MAX_PERMITS / HELD_PER_SLOT)
    }

    /// Tasks held at once, running or waiting (see [`HELD_PER_SLOT`]).
    fn places(&self) -> usize {
        self.slots() * HELD_PER_SLOT
    }
}

impl Default for TaskSettings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3600),
            poll_interval: Duration::from_millis(500),
            lease: Duration::from_secs(15),
            max_running: 64,
        }
    }
}

/// Called with a task's id whenever its status changes, to tell every replica.
pub type Announce = Arc<dyn Fn(&str) + Send + Sync>;

/// The tasks of one server (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Tasks {
    shared: Arc<Shared>,
}

/// Tasks that may be gone: what outlives a server's requests (its change listener, its wind-down)
/// holds, so that it reaches the tasks while the server or any worker it started still lives.
pub struct WeakTasks(Weak<Shared>);

impl WeakTasks {
    /// The tasks, unless the server and all its workers are gone.
    pub fn upgrade(&self) -> Option<Tasks> {
        self.0.upgrade().map(|shared| Tasks { shared })
    }
}

struct Shared {
    store: Arc<dyn TaskStore>,
    settings: TaskSettings,
    registry: Arc<Registry>,
    /// This replica's name in the leases it holds.
    replica: String,
    /// The workers running on this replica, by task id.
    running: Mutex<HashMap<String, AbortHandle>>,
    /// One per task this replica may run at once.
    slots: Arc<Semaphore>,
    /// One per task this replica may hold at once, running or waiting for a slot; each worker
    /// holds one from before its record is written until it ends.
    places: Arc<Semaphore>,
    /// Begun when the server shuts down: from then on no task is created or resumed here.
    drain: OnceLock<Drain>,
    announce: Announce,
}

/// Most attempts at one change before giving up on a task too busy to change.
const MOST_ATTEMPTS: usize = 32;
/// Longest task id this server issues or looks up.
const ID_LENGTH: usize = 32;

/// What a change to a record decided: write the changed record, or leave it as it is.
enum Change<T> {
    Write(T),
    Keep(T),
}

impl Tasks {
    /// Tasks kept in `store`, running the tools of `registry`; `announce` hears of every status
    /// change. `settings` are kept within what the clock and the stores can count (see
    /// [`TaskSettings::within_bounds`]).
    pub fn new(
        store: Arc<dyn TaskStore>,
        settings: TaskSettings,
        registry: Arc<Registry>,
        announce: Announce,
    ) -> Self {
        let settings = settings.within_bounds();
        Self {
            shared: Arc::new(Shared {
                store,
                registry,
                replica: random_hex(),
                running: Mutex::new(HashMap::new()),
                slots: Arc::new(Semaphore::new(settings.slots())),
                places: Arc::new(Semaphore::new(settings.places())),
                drain: OnceLock::new(),
                settings,
                announce,
            }),
        }
    }

    /// A handle that does not keep the tasks alive.
    pub fn downgrade(&self) -> WeakTasks {
        WeakTasks(Arc::downgrade(&self.shared))
    }

    /// How tasks are kept and run.
    pub fn settings(&self) -> &TaskSettings {
        &self.shared.settings
    }

    /// Creates the task that continues `tool`'s call from `seed`, starts it on this replica, and
    /// returns the `CreateTaskResult`; the record is stored before this returns. `Err` with the
    /// reason, and no task, when none can be kept for the call: its record would take more than
    /// 64 KiB, this replica holds as many tasks as it may or is shutting down, or the task store
    /// has no room (for anyone, or for the caller, who holds its share). The call then goes on in
    /// its request ([`Engine::continue_untasked`](crate::mrtr::Engine::continue_untasked)).
    pub async fn create(
        &self,
        tool: &str,
        arguments: &Value,
        seed: &TaskSeed,
    ) -> Result<Result<Value, Unkept>, ProtocolError> {
        let settings = &self.shared.settings;
        let id = random_hex();
        let now = now_ms();
        let record = TaskRecord {
            owner: seed.principal.id(),
            user: seed.principal.user().map(str::to_owned),
            tool: tool.to_owned(),
            arguments: arguments.clone(),
            protocol_version: seed.meta.protocol_version.clone(),
            client_info: seed.meta.client_info.clone(),
            capabilities: seed.meta.capabilities.clone(),
            status: Status::Working,
            status_message: None,
            created_ms: now,
            updated_ms: now,
            ttl_ms: millis(settings.ttl),
            poll_ms: millis(settings.poll_interval),
            answers: seed.answers.clone(),
            memo: seed.memo.clone(),
            asked: Vec::new(),
            answered: Vec::new(),
            result: None,
            error: None,
            lease: Some(self.lease_from(now)),
            traceparent: seed.trace.traceparent.clone(),
            tracestate: seed.trace.tracestate.clone(),
        };
        let bytes = encode(&record)?;
        if bytes.len() > MAX_NEW_TASK_BYTES {
            tracing::debug!(
                tool = %record.tool,
                bytes = bytes.len(),
                "a call too large to keep as a task goes on in its request"
            );
            observe::task("not_kept");
            return Ok(Err(Unkept::TooLarge));
        }
        // Taken once the call is known to fit, so that a call too large is told so at once.
        let place = match self.place() {
            Ok(place) => place,
            Err(why) => return Ok(Err(no_room(Unkept::Busy(why)))),
        };
        let created = record.created(&id);
        // Stored and started apart from the request, so a client that hangs up meanwhile cannot
        // leave a record with no worker.
        let tasks = self.clone();
        let (ttl, owner) = (settings.ttl, seed.owner.clone());
        let kept = tokio::spawn(async move {
            if let Err(no_room) = tasks.shared.store.create(&owner, &id, bytes, ttl).await? {
                return Ok(Err(no_room));
            }
            tracing::debug!(task = %id, tool = %record.tool, "task created");
            observe::task("created");
            tasks.start(id, record, place);
            Ok::<_, ProtocolError>(Ok(()))
        })
        .await
        .map_err(|e| ProtocolError::internal(format!("creating the task failed: {e}")))??;
        if let Err(why) = kept {
            return Ok(Err(no_room(Unkept::NoRoom(why))));
        }
        Ok(Ok(created))
    }

    /// The `tasks/get` result for `principal`'s task `id`.
    pub async fn get(&self, principal: &Principal, id: &str) -> Result<Value, ProtocolError> {
        let owner = principal.id();
        let now = now_ms();
        let mut lost = false;
        let detailed = self
            .modify(id, |task| {
                if task.owner != owner {
                    return Change::Keep(None);
                }
                if task.worker_lost(now) {
                    lost = true;
                    task.set_status(
                        Status::Failed,
                        Some("The replica running this task stopped answering".into()),
                        now,
                    );
                    task.error = Some(worker_lost_error());
                    return Change::Write(Some(task.detailed(id)));
                }
                lost = false;
                Change::Keep(Some(task.detailed(id)))
            })
            .await?
            .flatten()
            .ok_or_else(not_found)?;
        if lost {
            tracing::warn!(task = %id, "task failed: its worker's lease lapsed");
            observe::task("failed");
            (self.shared.announce)(id);
        }
        Ok(detailed)
    }

    /// The tool `principal`'s task `id` runs; `None` when they have no such task.
    pub async fn tool_of(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<Option<String>, ProtocolError> {
        let owner = principal.id();
        let task = self.read(id).await?;
        Ok(task
            .filter(|task| task.owner == owner)
            .map(|task| task.tool))
    }

    /// Records `principal`'s answers to task `id`'s outstanding questions. Answers to keys not
    /// outstanding are ignored; an answer that does not fit its question is refused with -32602
    /// and nothing is recorded. When the last one arrives the task resumes on this replica; when
    /// it cannot (it holds as many tasks as it may, or is shutting down) the answers are refused
    /// with -32603 and HTTP 503, nothing recorded, to be sent again (to another replica, or later).
    pub async fn update(
        &self,
        principal: &Principal,
        id: &str,
        responses: Map<String, Value>,
    ) -> Result<(), ProtocolError> {
        // Recorded and started apart from the request, so a client that hangs up meanwhile
        // cannot leave a task marked working with no worker.
        let tasks = self.clone();
        let (owner, id) = (principal.id(), id.to_owned());
        tokio::spawn(async move { tasks.record_answers(&owner, &id, &responses).await })
            .await
            .map_err(|e| ProtocolError::internal(format!("recording the answers failed: {e}")))?
    }

    async fn record_answers(
        &self,
        owner: &str,
        id: &str,
        responses: &Map<String, Value>,
    ) -> Result<(), ProtocolError> {
        let now = now_ms();
        let lease = self.lease_from(now);
        // Taken, when the last answer arrives, before the record changes: a task marked working
        // here always has its worker. Kept when the change is tried again.
        let mut place = None;
        let changing = self
            .modify(id, |task| {
                if task.owner != owner {
                    return Change::Keep(Err(not_found()));
                }
                if task.works_under(&lease) {
                    // An attempt before this one landed, though its reply was lost.
                    return Change::Keep(Ok(Some(task.clone())));
                }
                if task.status != Status::InputRequired {
                    return Change::Keep(Ok(None));
                }
                let mut took = false;
                for (key, answer) in responses {
                    let Some(at) = task.asked.iter().position(|(asked, _)| asked == key) else {
                        continue;
                    };
                    if let Err(refusal) = fits(key, &task.asked[at].1, answer) {
                        return Change::Keep(Err(refusal));
                    }
                    task.asked.remove(at);
                    task.answers.insert(key.clone(), answer.clone());
                    task.answered.push(key.clone());
                    took = true;
                }
                if !took {
                    return Change::Keep(Ok(None));
                }
                if encode(task).is_ok_and(|bytes| bytes.len() > MAX_TASK_BYTES) {
                    return Change::Keep(Err(ProtocolError::invalid_params(format!(
                        "These answers would make the task larger than {} KiB; nothing was \
                         recorded",
                        MAX_TASK_BYTES / 1024
                    ))));
                }
                if task.asked.is_empty() {
                    if let Err(why) = place.get_or_insert_with(|| self.place()) {
                        return Change::Keep(Err(cannot_resume(why)));
                    }
                    task.set_status(Status::Working, None, now);
                    task.lease = Some(lease.clone());
                } else {
                    task.updated_ms = now;
                }
                Change::Write(Ok(Some(task.clone())))
            })
            .await;
        let changed = match changing {
            Ok(changed) => changed.unwrap_or_else(|| Err(not_found()))?,
            // The write may have landed with its reply lost: a task resumed under this very
            // lease was resumed by this request, and must have its worker. Read again for a
            // lease at most, as a worker tries its ending again (best effort: a store out of
            // reach for longer leaves the task to be reported failed once the lease lapses).
            Err(e) if place.as_ref().is_some_and(Result::is_ok) => {
                let deadline = tokio::time::Instant::now() + self.shared.settings.lease;
                loop {
                    match self.read(id).await {
                        Ok(Some(task)) if task.works_under(&lease) => break Some(task),
                        Ok(_) => return Err(e),
                        Err(_) if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(worker::ENDING_RETRY).await;
                        }
                        Err(_) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        };
        if let Some(record) = changed {
            (self.shared.announce)(id);
            if record.status == Status::Working
                && let Some(Ok(place)) = place
            {
                self.start(id.to_owned(), record, place);
            }
        }
        Ok(())
    }

    /// Cancels `principal`'s task `id` unless it is over already, and stops its worker.
    pub async fn cancel(&self, principal: &Principal, id: &str) -> Result<(), ProtocolError> {
        let owner = principal.id();
        let now = now_ms();
        let cancelled = self
            .modify(id, |task| {
                if task.owner != owner {
                    return Change::Keep(Err(not_found()));
                }
                if task.status.is_terminal() {
                    return Change::Keep(Ok(false));
                }
                task.set_status(
                    Status::Cancelled,
                    Some("Cancelled at the client's request".into()),
                    now,
                );
                Change::Write(Ok(true))
            })
            .await?
            .unwrap_or_else(|| Err(not_found()))?;
        if cancelled {
            tracing::debug!(task = %id, "task cancelled");
            observe::task("cancelled");
            self.stop_local(id);
            (self.shared.announce)(id);
        }
        Ok(())
    }

    /// Hears that task `id` changed, on whichever replica: a worker running it here re-reads
    /// it and stops if it is no longer its to run. A store out of reach stops nothing: the
    /// worker's lease renewal and its ending's write decide then.
    pub fn changed(&self, id: &str) {
        let Some(worker) = self.lock_running().get(id).map(AbortHandle::id) else {
            return;
        };
        let tasks = self.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            let not_ours = match tasks.read(&id).await {
                Ok(Some(task)) => !tasks.holds(&task),
                Ok(None) => true,
                Err(_) => false,
            };
            if not_ours {
                tasks.stop_worker(&id, worker);
            }
        });
    }

    /// Checks every task running here as if each had changed: notices of changes were lost
    /// (this replica fell behind them), and one may have been a cancel.
    pub fn changed_unheard(&self) {
        let running: Vec<String> = self.lock_running().keys().cloned().collect();
        for id in running {
            self.changed(&id);
        }
    }

    /// A place for one more task on this replica, or why there is none.
    fn place(&self) -> Result<OwnedSemaphorePermit, &'static str> {
        if self.shared.drain.get().is_some_and(Drain::has_begun) {
            return Err("this server is shutting down");
        }
        self.shared
            .places
            .clone()
            .try_acquire_owned()
            .map_err(|refused| match refused {
                TryAcquireError::Closed => "this server is shutting down",
                TryAcquireError::NoPermits => "this server holds as many tasks as it may",
            })
    }

    fn holds(&self, task: &TaskRecord) -> bool {
        task.status == Status::Working
            && task
                .lease
                .as_ref()
                .is_some_and(|lease| lease.holder == self.shared.replica)
    }

    fn lease_from(&self, now: u64) -> Lease {
        Lease {
            holder: self.shared.replica.clone(),
            until_ms: now + millis(self.shared.settings.lease),
            run: rand::thread_rng().next_u64(),
        }
    }

    fn stop_local(&self, id: &str) {
        if let Some(worker) = self.lock_running().remove(id) {
            worker.abort();
        }
    }

    /// Stops task `id`'s worker if it is still `worker`, not one started since.
    fn stop_worker(&self, id: &str, worker: tokio::task::Id) {
        let mut running = self.lock_running();
        if running.get(id).map(AbortHandle::id) == Some(worker)
            && let Some(handle) = running.remove(id)
        {
            handle.abort();
        }
    }

    fn lock_running(&self) -> MutexGuard<'_, HashMap<String, AbortHandle>> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.shared
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn read(&self, id: &str) -> Result<Option<TaskRecord>, ProtocolError> {
        if !is_task_id(id) {
            return Ok(None);
        }
        match self.shared.store.read(id).await? {
            Some(stored) => decode(&stored.record).map(Some),
            None => Ok(None),
        }
    }

    /// Reads task `id`, lets `change` decide, and writes what it changed unless the task changed
    /// meanwhile, in which case it reads again and lets `change` decide afresh. `None` when
    /// there is no such task.
    async fn modify<T>(
        &self,
        id: &str,
        mut change: impl FnMut(&mut TaskRecord) -> Change<T>,
    ) -> Result<Option<T>, ProtocolError> {
        if !is_task_id(id) {
            return Ok(None);
        }
        for _ in 0..MOST_ATTEMPTS {
            let Some(stored) = self.shared.store.read(id).await? else {
                return Ok(None);
            };
            let mut task = decode(&stored.record)?;
            match change(&mut task) {
                Change::Keep(outcome) => return Ok(Some(outcome)),
                Change::Write(outcome) => {
                    if self
                        .shared
                        .store
                        .replace(id, stored.version, encode(&task)?)
                        .await?
                    {
                        return Ok(Some(outcome));
                    }
                }
            }
        }
        Err(ProtocolError::internal(
            "The task is changing too often to be changed now; try again",
        ))
    }
}

/// Whether `answer` answers the question `asked` (as sent in `inputRequests`) in the shape its
/// kind calls for, a form's values fitting its schema; -32602 naming the key otherwise.
fn fits(key: &str, asked: &Value, answer: &Value) -> Result<(), ProtocolError> {
    match asked.get("method").and_then(Value::as_str) {
        Some("elicitation/create") => {
            let answer = Elicitation::from_response(key, answer)?;
            match asked.pointer("/params/requestedSchema") {
                Some(schema) => answer.fitting_form(key, schema).map(drop),
                None => Ok(()),
            }
        }
        Some("sampling/createMessage") => Sampling::from_response(key, answer).map(drop),
        Some("roots/list") => Roots::from_response(key, answer).map(drop),
        _ => Ok(()),
    }
}

/// No task for a call, for reason `why`: said in the log (a few lines a second at most) and
/// counted; the call goes on in its request.
fn no_room(why: Unkept) -> Unkept {
    if let Some(held_back) = NO_ROOM.take() {
        tracing::warn!(
            held_back,
            "no room for a task ({}): a call that would have become one goes on in its request",
            why.reason()
        );
    }
    observe::task("not_kept");
    why
}

/// The refusal of answers that would resume a task this replica has no place for (`why`).
fn cannot_resume(why: &str) -> ProtocolError {
    ProtocolError::internal(format!(
        "The task cannot resume here now ({why}); nothing was recorded: send the answers again"
    ))
    .with_status(503)
}

/// The answer for a task that does not exist, expired, or belongs to someone else: the same for
/// all three, so task ids cannot be probed.
fn not_found() -> ProtocolError {
    ProtocolError::invalid_params("Failed to retrieve task: Task not found")
}

fn worker_lost_error() -> Value {
    json!({
        "code": crate::protocol::error::INTERNAL_ERROR,
        "message": "The worker running this task was lost (its replica stopped renewing its lease)",
    })
}

/// Whether `id` could be a task id this server issued (lower-case hex of 128 random bits).
fn is_task_id(id: &str) -> bool {
    id.len() == ID_LENGTH
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// 128 random bits in lower-case hex: task ids and replica names.
fn random_hex() -> String {
    let mut bytes = [0u8; ID_LENGTH / 2];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn encode(task: &TaskRecord) -> Result<Vec<u8>, ProtocolError> {
    serde_json::to_vec(task)
        .map_err(|e| ProtocolError::internal(format!("cannot store the task: {e}")))
}

fn decode(bytes: &[u8]) -> Result<TaskRecord, ProtocolError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ProtocolError::internal(format!("stored task is unreadable: {e}")))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::mrtr::engine::test_calls;
    use crate::mrtr::{Call, Engine, Outcome, StateSealer, TaskMode};
    use crate::protocol::ClientCapabilities;
    use crate::protocol::content::CallToolResult;
    use crate::registry::Tool;
    use crate::store::{MemoryStore, MemoryTaskStore};

    /// The seed of a call of `tool` by an anonymous client that takes tasks.
    async fn seed_of(tool: &str) -> Box<TaskSeed> {
        let engine = Engine::new(
            StateSealer::generate(),
            Arc::new(MemoryStore::new(10, 10)),
            Duration::from_secs(60),
        );
        let (arguments, params) = (json!({}), Map::new());
        let taking_tasks = ClientCapabilities {
            tasks: true,
            elicitation_form: true,
            ..ClientCapabilities::default()
        };
        let call = Call {
            tasks: TaskMode::Available,
            ..test_calls::anonymous(tool, &arguments, &params, taking_tasks)
        };
        let asked = engine.run(call, |ctx| async move { ctx.continue_as_task() });
        match asked.await {
            Ok(Outcome::Task(seed)) => seed,
            _ => panic!("the call asks for a task"),
        }
    }

    /// Two replicas running `registry`'s tools with `settings`, sharing a memory store, whose
    /// notices of changes never arrive.
    fn two_replicas(registry: Registry, settings: TaskSettings) -> (Tasks, Tasks) {
        let registry = Arc::new(registry);
        let store: Arc<dyn TaskStore> = Arc::new(MemoryTaskStore::new(10, 10));
        let unheard: Announce = Arc::new(|_: &str| {});
        let here = Tasks::new(
            store.clone(),
            settings.clone(),
            registry.clone(),
            unheard.clone(),
        );
        (here, Tasks::new(store, settings, registry, unheard))
    }

    async fn status_of(tasks: &Tasks, id: &str) -> Value {
        tasks
            .get(&Principal::Anonymous, id)
            .await
            .expect("the task")["status"]
            .clone()
    }

    #[test]
    fn settings_past_what_the_clock_counts_are_taken_within_bounds() {
        let none = TaskSettings {
            ttl: Duration::ZERO,
            poll_interval: Duration::ZERO,
            lease: Duration::ZERO,
            max_running: 1,
        }
        .within_bounds();
        assert_eq!(none.ttl, Duration::from_millis(1));
        assert_eq!(none.poll_interval, Duration::from_millis(1));
        assert!(
            none.lease / 3 >= Duration::from_millis(1),
            "renewed on a clock that ticks"
        );
        let endless = TaskSettings {
            ttl: Duration::MAX,
            poll_interval: Duration::MAX,
            lease: Duration::MAX,
            max_running: 1,
        }
        .within_bounds();
        assert_eq!(endless.ttl, MOST_TASK_TTL);
        assert_eq!(
            endless.poll_interval, MOST_TASK_TTL,
            "never past the time to live"
        );
        assert_eq!(endless.lease, MOST_LEASE);
        let now = tokio::time::Instant::now();
        assert!(now.checked_add(endless.ttl + endless.lease).is_some());
        let defaults = TaskSettings::default();
        let kept = defaults.clone().within_bounds();
        assert_eq!(
            (kept.ttl, kept.poll_interval, kept.lease),
            (defaults.ttl, defaults.poll_interval, defaults.lease)
        );
    }

    #[test]
    fn any_max_running_makes_a_replica_that_counts_its_places() {
        for (max_running, slots) in [
            (0, 1),
            (64, 64),
            (usize::MAX, Semaphore::MAX_PERMITS / HELD_PER_SLOT),
        ] {
            let (here, _) = two_replicas(
                Registry::new(),
                TaskSettings {
                    max_running,
                    ..TaskSettings::default()
                },
            );
            assert_eq!(here.shared.slots.available_permits(), slots);
            assert_eq!(
                here.shared.places.available_permits(),
                slots * HELD_PER_SLOT
            );
            assert_eq!(here.held(), 0, "{max_running}: none held yet");
        }
    }

    #[tokio::test]
    async fn a_task_cancelled_elsewhere_while_it_waited_does_not_start_though_the_notice_was_lost()
    {
        // Holds the first task until the test lets it go; counts both tools' runs.
        let gate = Arc::new(Semaphore::new(0));
        let (first_runs, second_runs) =
            (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut registry = Registry::new();
        let counted = second_runs.clone();
        registry
            .add_tool(held_tool("first", &gate, &first_runs))
            .add_tool(Tool::without_arguments("second", "Counts", move |ctx| {
                let counted = counted.clone();
                async move {
                    ctx.continue_as_task()?;
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok(CallToolResult::text("second done"))
                }
            }));
        let one_at_a_time = TaskSettings {
            max_running: 1,
            ..TaskSettings::default()
        };
        let (here, elsewhere) = two_replicas(registry, one_at_a_time);

        let create = |tool: &'static str| {
            let here = here.clone();
            async move {
                let seed = seed_of(tool).await;
                let created = here.create(tool, &json!({}), &seed).await;
                let created = created.expect("created").expect("kept");
                created["taskId"].as_str().expect("an id").to_owned()
            }
        };
        let first = create("first").await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while first_runs.load(Ordering::SeqCst) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first task did not start"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The second waits for the only slot; the other replica cancels it meanwhile.
        let second = create("second").await;
        elsewhere
            .cancel(&Principal::Anonymous, &second)
            .await
            .expect("cancelled");
        gate.add_permits(1);

        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while status_of(&here, &first).await != "completed"
            || here.lock_running().contains_key(&second)
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the tasks did not settle"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            second_runs.load(Ordering::SeqCst),
            0,
            "the second never ran"
        );
        assert_eq!(status_of(&here, &second).await, "cancelled");
    }

    /// Polls `tasks`' task `id` until its status is `wanted`; returns the task.
    async fn settled(tasks: &Tasks, id: &str, wanted: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let task = tasks
                .get(&Principal::Anonymous, id)
                .await
                .expect("the task");
            if task["status"] == wanted {
                return task;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task is not {wanted}: {task}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Tasks alone on a memory store running `registry`'s tools, one at a time.
    fn one_at_a_time(registry: Registry) -> Tasks {
        let settings = TaskSettings {
            max_running: 1,
            ..TaskSettings::default()
        };
        let store = Arc::new(MemoryTaskStore::new(100, 100));
        Tasks::new(store, settings, Arc::new(registry), Arc::new(|_: &str| {}))
    }

    /// A tool that goes on as a task, counts its runs in `runs`, then waits for a permit of
    /// `gate`.
    fn held_tool(name: &'static str, gate: &Arc<Semaphore>, runs: &Arc<AtomicUsize>) -> Tool {
        let (gate, runs) = (gate.clone(), runs.clone());
        Tool::without_arguments(name, "Waits", move |ctx| {
            let (gate, runs) = (gate.clone(), runs.clone());
            async move {
                ctx.continue_as_task()?;
                runs.fetch_add(1, Ordering::SeqCst);
                let _let_go = gate.acquire().await;
                Ok(CallToolResult::text("done"))
            }
        })
    }

    /// A tool that goes on as a task, then asks its user to confirm.
    fn asking_tool() -> Tool {
        Tool::without_arguments("asks", "Asks to confirm", |ctx| async move {
            ctx.continue_as_task()?;
            let form = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
            ctx.elicit("confirm", "Go on?", form).await?;
            Ok(CallToolResult::text("confirmed"))
        })
    }

    /// A tool that goes on as a task and never ends on its own.
    fn stuck_tool() -> Tool {
        Tool::without_arguments("stuck", "Never ends alone", |ctx| async move {
            ctx.continue_as_task()?;
            std::future::pending::<()>().await;
            Ok(CallToolResult::text("unstuck"))
        })
    }

    /// A task of [`asking_tool`], once it waits for its answer.
    async fn asking_task(tasks: &Tasks) -> String {
        let id = create(tasks, "asks").await.expect("kept");
        settled(tasks, &id, "input_required").await;
        id
    }

    async fn create(tasks: &Tasks, tool: &str) -> Option<String> {
        let seed = seed_of(tool).await;
        let created = tasks
            .create(tool, &json!({}), &seed)
            .await
            .expect("no error");
        created
            .ok()
            .map(|created| created["taskId"].as_str().expect("an id").to_owned())
    }

    fn confirmed() -> Map<String, Value> {
        let answer = json!({"action": "accept", "content": {"ok": true}});
        Map::from_iter([("confirm".to_owned(), answer)])
    }

    #[tokio::test]
    async fn a_replica_holds_four_tasks_per_slot_whether_they_are_created_or_resumed() {
        let gate = Arc::new(Semaphore::new(0));
        let mut registry = Registry::new();
        registry
            .add_tool(asking_tool())
            .add_tool(held_tool("holds", &gate, &Arc::default()));
        let tasks = one_at_a_time(registry);
        let asking = asking_task(&tasks).await;
        let mut holding = Vec::new();
        for _ in 0..HELD_PER_SLOT {
            holding.push(create(&tasks, "holds").await.expect("kept"));
        }
        assert_eq!(create(&tasks, "holds").await, None, "no place for a fifth");

        // The answer that would resume a fifth task is refused, and nothing of it recorded.
        let refused = tasks
            .update(&Principal::Anonymous, &asking, confirmed())
            .await
            .expect_err("no place to resume it");
        assert_eq!(
            (refused.code, refused.http_status()),
            (crate::protocol::error::INTERNAL_ERROR, 503),
            "{refused}"
        );
        let waiting = status_of(&tasks, &asking).await;
        assert_eq!(waiting, "input_required");
        let task = tasks
            .get(&Principal::Anonymous, &asking)
            .await
            .expect("the task");
        assert!(task["inputRequests"].get("confirm").is_some(), "{task}");

        // Once the others are done, the same answer is taken.
        gate.add_permits(1);
        for id in &holding {
            settled(&tasks, id, "completed").await;
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tasks.shared.places.available_permits() < HELD_PER_SLOT {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the places are given back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tasks
            .update(&Principal::Anonymous, &asking, confirmed())
            .await
            .expect("taken");
        let done = settled(&tasks, &asking, "completed").await;
        assert_eq!(done["result"]["content"][0]["text"], "confirmed", "{done}");
    }

    #[tokio::test]
    async fn a_key_the_task_asked_and_had_answered_is_never_asked_again() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let mut registry = Registry::new();
        registry.add_tool(Tool::without_arguments(
            "changes_its_mind",
            "Asks one question, then asks another under the same key",
            move |ctx| {
                let run = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    ctx.continue_as_task()?;
                    let sizes = if run == 0 { ["S", "M"] } else { ["L", "XL"] };
                    let form = json!({"type": "object", "properties": {
                        "size": {"type": "string", "enum": sizes}}});
                    let answer = ctx.elicit("size", "Which size?", form).await?;
                    Ok(CallToolResult::text(format!("{answer:?}")))
                }
            },
        ));
        let tasks = one_at_a_time(registry);
        let id = create(&tasks, "changes_its_mind").await.expect("kept");
        settled(&tasks, &id, "input_required").await;
        let small = Map::from_iter([(
            "size".to_owned(),
            json!({"action": "accept", "content": {"size": "S"}}),
        )]);
        tasks
            .update(&Principal::Anonymous, &id, small)
            .await
            .expect("S answers the question asked");
        // The second run asks L or XL under "size": the key was used, so the task fails, and
        // not as the client's mistake.
        let failed = settled(&tasks, &id, "failed").await;
        assert_eq!(failed["error"]["code"], -32603, "{failed}");
        assert!(
            failed["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("\"size\"") && m.contains("already answered")),
            "{failed}"
        );
        assert!(failed.get("inputRequests").is_none(), "{failed}");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "not run a third time");
    }

    #[tokio::test]
    async fn a_task_whose_questions_outgrow_a_task_record_fails_saying_why() {
        let mut registry = Registry::new();
        registry.add_tool(Tool::without_arguments(
            "hoards",
            "Remembers much, then asks",
            |ctx| async move {
                ctx.continue_as_task()?;
                let bulky = "x".repeat(MAX_TASK_BYTES);
                ctx.remember("bulky", || async { Ok(bulky) }).await?;
                let form = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
                ctx.elicit("confirm", "Go on?", form).await?;
                Ok(CallToolResult::text("confirmed"))
            },
        ));
        let tasks = one_at_a_time(registry);
        let id = create(&tasks, "hoards").await.expect("kept");
        let failed = settled(&tasks, &id, "failed").await;
        assert_eq!(failed["error"]["code"], -32603, "{failed}");
        assert!(
            failed["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("larger than 256 KiB")),
            "{failed}"
        );
    }

    #[tokio::test]
    async fn shutting_down_lets_running_tasks_finish_then_fails_the_rest_and_takes_no_more() {
        let mut registry = Registry::new();
        registry
            .add_tool(asking_tool())
            .add_tool(Tool::without_arguments(
                "quick",
                "Ends soon",
                |ctx| async move {
                    ctx.continue_as_task()?;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(CallToolResult::text("quick done"))
                },
            ))
            .add_tool(stuck_tool());
        let tasks = one_at_a_time(registry);
        let asking = asking_task(&tasks).await;
        // The quick one runs first; the stuck one waits for its slot.
        let quick = create(&tasks, "quick").await.expect("kept");
        let stuck = create(&tasks, "stuck").await.expect("kept");

        let drain = Drain::default();
        tasks.wind_down_on(drain.clone(), Duration::from_secs(3), || async {});
        drain.begin();
        assert_eq!(
            create(&tasks, "quick").await,
            None,
            "no task while shutting down"
        );
        let refused = tasks
            .update(&Principal::Anonymous, &asking, confirmed())
            .await
            .expect_err("no task resumes while shutting down");
        assert_eq!(refused.http_status(), 503, "{refused}");
        tokio::time::timeout(Duration::from_secs(10), drain.released())
            .await
            .expect("the tasks wind down within their grace");

        let done = settled(&tasks, &quick, "completed").await;
        assert_eq!(done["result"]["content"][0]["text"], "quick done", "{done}");
        let failed = settled(&tasks, &stuck, "failed").await;
        assert!(
            failed["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("shut down before the task finished")),
            "{failed}"
        );
        assert_eq!(status_of(&tasks, &asking).await, "input_required");
        assert!(tasks.lock_running().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tool_that_holds_up_its_thread_past_a_lease_keeps_its_task() {
        // Work that never yields, such as a long computation, until the test has looked, past
        // the lease and the second of leeway for clocks.
        let looked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done_looking = looked.clone();
        let mut registry = Registry::new();
        registry.add_tool(Tool::without_arguments(
            "computes",
            "Works without yielding",
            move |ctx| {
                let looked = done_looking.clone();
                async move {
                    ctx.continue_as_task()?;
                    while !looked.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Ok(CallToolResult::text("computed"))
                }
            },
        ));
        let settings = TaskSettings {
            lease: Duration::from_millis(300),
            ..TaskSettings::default()
        };
        let (here, elsewhere) = two_replicas(registry, settings);
        let id = create(&here, "computes").await.expect("kept");
        tokio::time::sleep(Duration::from_millis(1800)).await;
        // Another replica reading a task whose lease lapsed would report it failed.
        assert_eq!(
            status_of(&elsewhere, &id).await,
            "working",
            "the lease was renewed while the tool held up its thread"
        );
        looked.store(true, Ordering::SeqCst);
        let done = settled(&here, &id, "completed").await;
        assert_eq!(done["result"]["content"][0]["text"], "computed", "{done}");
    }

    #[tokio::test]
    async fn a_replica_that_missed_notices_stops_a_worker_whose_task_was_cancelled_elsewhere() {
        let mut registry = Registry::new();
        registry.add_tool(stuck_tool());
        // A lease far longer than the test: its renewal would notice the cancel only minutes on.
        let settings = TaskSettings {
            lease: Duration::from_secs(600),
            ..TaskSettings::default()
        };
        let (here, elsewhere) = two_replicas(registry, settings);
        let id = create(&here, "stuck").await.expect("kept");
        elsewhere
            .cancel(&Principal::Anonymous, &id)
            .await
            .expect("cancelled");
        assert!(here.lock_running().contains_key(&id), "the notice was lost");

        here.changed_unheard();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while here.lock_running().contains_key(&id) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the worker was not stopped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    /// A memory task store that carries out its next replace once told to but answers it with
    /// an error, as a Redis reply that came past its time limit is; the error waits for a
    /// permit of `let_go` when `held` is set.
    struct LateReplies {
        store: MemoryTaskStore,
        next_reply_lost: std::sync::atomic::AtomicBool,
        held: std::sync::atomic::AtomicBool,
        let_go: Semaphore,
    }

    #[async_trait::async_trait]
    impl TaskStore for LateReplies {
        async fn create(
            &self,
            owner: &crate::store::Owner,
            id: &str,
            record: Vec<u8>,
            ttl: Duration,
        ) -> Result<Result<(), crate::store::NoRoom>, crate::store::StoreError> {
            self.store.create(owner, id, record, ttl).await
        }

        async fn read(
            &self,
            id: &str,
        ) -> Result<Option<crate::store::Versioned>, crate::store::StoreError> {
            self.store.read(id).await
        }

        async fn replace(
            &self,
            id: &str,
            version: u64,
            record: Vec<u8>,
        ) -> Result<bool, crate::store::StoreError> {
            let replaced = self.store.replace(id, version, record).await;
            if self.next_reply_lost.swap(false, Ordering::SeqCst) {
                if self.held.load(Ordering::SeqCst) {
                    let _ = self.let_go.acquire().await;
                }
                return Err(crate::store::StoreError("no answer in time".into()));
            }
            replaced
        }
    }

    /// Tasks on a [`LateReplies`] store, and how many announcements they made.
    fn late_replies(registry: Registry) -> (Tasks, Arc<LateReplies>, Arc<AtomicUsize>) {
        let store = Arc::new(LateReplies {
            store: MemoryTaskStore::new(100, 100),
            next_reply_lost: std::sync::atomic::AtomicBool::new(false),
            held: std::sync::atomic::AtomicBool::new(false),
            let_go: Semaphore::new(0),
        });
        let announced = Arc::new(AtomicUsize::new(0));
        let counted = announced.clone();
        let tasks = Tasks::new(
            store.clone(),
            TaskSettings::default(),
            Arc::new(registry),
            Arc::new(move |_: &str| {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
        );
        (tasks, store, announced)
    }

    #[tokio::test]
    async fn answers_recorded_though_the_reply_was_lost_resume_their_task() {
        let mut registry = Registry::new();
        registry.add_tool(asking_tool());
        let (tasks, store, _) = late_replies(registry);
        let id = asking_task(&tasks).await;
        store.next_reply_lost.store(true, Ordering::SeqCst);
        tasks
            .update(&Principal::Anonymous, &id, confirmed())
            .await
            .expect("the answers were recorded, and their worker started");
        let task = settled(&tasks, &id, "completed").await;
        assert!(task["result"].to_string().contains("confirmed"), "{task}");
    }

    #[tokio::test]
    async fn a_worker_whose_ending_was_recorded_late_does_not_undo_the_worker_started_since() {
        let (gate, resumed) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut registry = Registry::new();
        let (held, counted) = (gate.clone(), resumed.clone());
        registry.add_tool(Tool::without_arguments(
            "asks",
            "Asks, then waits",
            move |ctx| {
                let (held, counted) = (held.clone(), counted.clone());
                async move {
                    ctx.continue_as_task()?;
                    let form = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
                    ctx.elicit("confirm", "Go on?", form).await?;
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _let_go = held.acquire().await;
                    Ok(CallToolResult::text("confirmed"))
                }
            },
        ));
        let (tasks, store, announced) = late_replies(registry);
        // The first worker's ending (its question) is recorded, but the worker hears so only
        // after the answer came and a second worker started; then it tries its write again.
        store.held.store(true, Ordering::SeqCst);
        store.next_reply_lost.store(true, Ordering::SeqCst);
        let id = asking_task(&tasks).await;
        tasks
            .update(&Principal::Anonymous, &id, confirmed())
            .await
            .expect("answered");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while resumed.load(Ordering::SeqCst) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "not resumed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let announced_before = announced.load(Ordering::SeqCst);
        store.let_go.add_permits(1);
        // The first worker, unsure whether its ending landed, tells the task's followers to read
        // it again once its second try finds the task another worker's.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while announced.load(Ordering::SeqCst) == announced_before {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no announcement after the late reply"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status_of(&tasks, &id).await, "working", "not asked again");
        gate.add_permits(1);
        let task = settled(&tasks, &id, "completed").await;
        assert!(task["result"].to_string().contains("confirmed"), "{task}");
        assert_eq!(resumed.load(Ordering::SeqCst), 1, "the tool went on once");
    }
}
