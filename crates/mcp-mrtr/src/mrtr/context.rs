//! The handle a handler uses to talk to its client: ask questions (elicitation, sampling, roots),
//! remember work across rounds, and report progress and log messages.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::ask::{Answers, Asker};
use super::error::{HandlerError, TaskPending};
use super::notify::Notifier;
use crate::auth::Principal;
use crate::protocol::input::{
    ElicitParams, Elicitation, EmptyParams, InputRequest, Roots, Sampling, SamplingParams,
};
use crate::protocol::version::TASKS_EXTENSION;
use crate::protocol::{ClientCapabilities, LogLevel, ProtocolError, RequestMeta};
use crate::store::NoRoom;

/// Why no task was kept for a call that would have become one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unkept {
    /// The call is too large to keep as a task: it never will be.
    TooLarge,
    /// This replica has no place for a task now, for the reason given (it holds as many as it
    /// may, or is shutting down): a moment later, or another replica, may have one.
    Busy(&'static str),
    /// The task store has no room for the caller's task (it is full, or the caller holds its
    /// share): room comes as tasks expire.
    NoRoom(NoRoom),
}

/// How long a call refused for want of room in the task store is told to wait when the store
/// cannot tell when room comes.
const NO_ROOM_RETRY_AFTER_SECS: u32 = 60;

impl Unkept {
    /// Why, in a few words, for the log and the caller.
    pub fn reason(self) -> &'static str {
        match self {
            Self::TooLarge => "it is too large to keep as a task",
            Self::Busy(why) => why,
            Self::NoRoom(NoRoom::Share { .. }) => "the caller holds its share of tasks",
            Self::NoRoom(_) => "the task store is full",
        }
    }

    /// The refusal of work that can only run as a task: -32603 with HTTP 503 and a
    /// `Retry-After` when room may come (HTTP 429 when the caller holds its share; it is told
    /// when the first of its tasks expires, when the store knows), HTTP 500 when it never will.
    pub(crate) fn refusal(self) -> ProtocolError {
        let (status, retry_after) = match self {
            Self::TooLarge => {
                return ProtocolError::internal(format!(
                    "No task can be kept for this call: {}",
                    self.reason()
                ));
            }
            Self::Busy(_) => (503, 1),
            Self::NoRoom(no_room) => {
                let (status, frees_in) = match no_room {
                    NoRoom::Share { frees_in } => (429, frees_in),
                    NoRoom::Store { frees_in } => (503, frees_in),
                };
                let seconds = frees_in.map_or(NO_ROOM_RETRY_AFTER_SECS, |wait| {
                    let whole = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                    u32::try_from(whole).unwrap_or(u32::MAX).max(1)
                });
                (status, seconds)
            }
        };
        ProtocolError::internal(format!(
            "No task can be kept for this call now ({}): call again later",
            self.reason()
        ))
        .with_status(status)
        .retry_after(retry_after)
    }
}

/// Whether the rest of a call may continue as a task (the Tasks extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskMode {
    /// No task can be created, whatever the client declares: the server keeps no tasks, the
    /// request came in a 2025-11-25 session, or the handler is not a tool's (tasks carry
    /// `tools/call` results only).
    Unavailable,
    /// A task could be created for this call, but the client did not declare the extension on
    /// this request.
    Undeclared,
    /// The client accepts a task in answer to this request.
    Available,
    /// The client accepts tasks, but none can be kept for this call, for the reason given: it
    /// goes on in the request.
    Unkept(Unkept),
    /// The handler is already running as a task.
    Running,
}

struct Inner {
    principal: Principal,
    meta: RequestMeta,
    notifier: Option<Notifier>,
    asker: Arc<dyn Asker>,
    tasks: TaskMode,
    /// The JSON-RPC code of the last refusal of [`RequestContext::require`] or
    /// [`RequestContext::require_task`] for something the client can mend (a capability it did
    /// not declare, no room for a task now); 0 for none.
    mendable_refusal: AtomicI64,
    /// Work remembered with [`RequestContext::remember`].
    memo: Mutex<Map<String, Value>>,
}

/// A handler's view of its request. Cheap to clone; every clone is the same request.
#[derive(Clone)]
pub struct RequestContext {
    inner: Arc<Inner>,
}

impl RequestContext {
    pub(crate) fn new(
        principal: Principal,
        meta: RequestMeta,
        notifier: Option<Notifier>,
        asker: Arc<dyn Asker>,
        memo: Map<String, Value>,
        tasks: TaskMode,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                principal,
                meta,
                notifier,
                asker,
                tasks,
                mendable_refusal: AtomicI64::new(0),
                memo: Mutex::new(memo),
            }),
        }
    }

    /// Whether questions are answered while this call waits (a 2025-11-25 session's live peer)
    /// rather than in a later round: then asking costs no round trip of the client's.
    pub fn answers_live(&self) -> bool {
        self.inner.asker.answers_live()
    }

    /// Who made the request, as resolved by the server's authenticator.
    pub fn principal(&self) -> &Principal {
        &self.inner.principal
    }

    /// The client capabilities declared on this request (or, for a legacy session, at initialize).
    pub fn capabilities(&self) -> &ClientCapabilities {
        &self.inner.meta.capabilities
    }

    /// Everything the request's `_meta` said: protocol version, client info, log level and so on.
    pub fn meta(&self) -> &RequestMeta {
        &self.inner.meta
    }

    /// Fails with -32021 unless the client declared `capability` on this request: one of
    /// `"elicitation"` (its form mode, the one [`elicit`](Self::elicit) asks with), `"sampling"`
    /// or `"roots"`; any other name fails. A retry refused this way keeps its `requestState`,
    /// for the client to send again declaring the capability: call this before any work of the
    /// round that must not run twice.
    pub fn require(&self, capability: &str) -> Result<(), ProtocolError> {
        let caps = self.capabilities();
        let declared = match capability {
            "elicitation" => caps.elicitation_form,
            "sampling" => caps.sampling,
            "roots" => caps.roots,
            _ => false,
        };
        if declared {
            return Ok(());
        }
        let refusal = if capability == "elicitation" {
            ProtocolError::missing_capability(json!({ "elicitation": { "form": {} } }))
        } else {
            ProtocolError::missing_capability(json!({ capability: {} }))
        };
        Err(self.mendable(refusal))
    }

    /// Continues the rest of this call as a task when the client accepts tasks: the request is
    /// answered at once with the new task, and the handler runs again as that task, finding its
    /// answers and remembered work, and returning `Ok` here. Ask the questions that decide
    /// whether to go ahead before this point: they are answered in rounds of the request itself,
    /// as the extension advises. Without tasks this returns `Ok` and the call goes on as usual,
    /// and so it does, the handler run again, when no task can be kept for the call.
    pub fn continue_as_task(&self) -> Result<(), HandlerError> {
        match self.inner.tasks {
            TaskMode::Available => Err(HandlerError::TaskRequested(TaskPending::new(false))),
            TaskMode::Running
            | TaskMode::Unavailable
            | TaskMode::Undeclared
            | TaskMode::Unkept(_) => Ok(()),
        }
    }

    /// Like [`continue_as_task`](Self::continue_as_task) for work that can only run as a task:
    /// a client that did not declare the Tasks extension gets -32021 naming it; when no task can
    /// be kept for the call, -32603 says why: with HTTP 503 and `Retry-After` when there is no
    /// room now (HTTP 429 when the caller holds its share of tasks), HTTP 500 when the call is
    /// too large to keep as a task, or when no task can be created for it whatever the client
    /// declares (see [`TaskMode::Unavailable`]: declaring would not help, so no capability is
    /// named). A retry refused for the missing extension or for want of room keeps its
    /// `requestState`, as with [`require`](Self::require).
    pub fn require_task(&self) -> Result<(), HandlerError> {
        match self.inner.tasks {
            TaskMode::Available => Err(HandlerError::TaskRequested(TaskPending::new(true))),
            TaskMode::Running => Ok(()),
            TaskMode::Undeclared => Err(HandlerError::Protocol(self.mendable(
                ProtocolError::missing_capability(json!({ "extensions": { TASKS_EXTENSION: {} } })),
            ))),
            TaskMode::Unavailable => Err(HandlerError::Protocol(ProtocolError::internal(
                "This call can only run as a task, and no task can be created for it here",
            ))),
            TaskMode::Unkept(why) => Err(HandlerError::Protocol(self.mendable(why.refusal()))),
        }
    }

    /// `refusal`, noted as one the client can mend.
    fn mendable(&self, refusal: ProtocolError) -> ProtocolError {
        self.inner
            .mendable_refusal
            .store(refusal.code, Ordering::Relaxed);
        refusal
    }

    /// Whether `error` is a refusal of [`require`](Self::require) or
    /// [`require_task`](Self::require_task) for something the client can mend (by its code: a
    /// handler that went on past such a refusal and failed otherwise is not mistaken for it).
    pub(crate) fn is_mendable_refusal(&self, error: &HandlerError) -> bool {
        let code = self.inner.mendable_refusal.load(Ordering::Relaxed);
        matches!(error, HandlerError::Protocol(refusal) if code != 0 && refusal.code == code)
    }

    /// Asks the user to fill a form. Returns [`Elicitation::Unsupported`] at once when the client
    /// did not declare form elicitation, so the handler can take its fallback. Accepted content
    /// is checked against `schema` first (see [`form`](crate::protocol::form)): a value that does
    /// not fit is refused with -32602 and the question stands; properties left out (required or
    /// not) are the handler's to judge.
    pub async fn elicit(
        &self,
        key: &str,
        message: &str,
        schema: Value,
    ) -> Result<Elicitation, HandlerError> {
        let request = InputRequest::Elicit(ElicitParams::Form {
            message: message.to_owned(),
            requested_schema: schema,
        });
        let answers = self.ask(vec![(key.to_owned(), request)]).await?;
        Ok(answers
            .elicitation(key)
            .cloned()
            .unwrap_or(Elicitation::Unsupported))
    }

    /// Asks the client's model for a completion.
    pub async fn sample(
        &self,
        key: &str,
        params: SamplingParams,
    ) -> Result<Sampling, HandlerError> {
        let answers = self
            .ask(vec![(key.to_owned(), InputRequest::Sample(params))])
            .await?;
        Ok(answers
            .sampling(key)
            .cloned()
            .unwrap_or(Sampling::Unsupported))
    }

    /// Asks the client for its roots.
    pub async fn list_roots(&self, key: &str) -> Result<Roots, HandlerError> {
        let answers = self
            .ask(vec![(
                key.to_owned(),
                InputRequest::ListRoots(EmptyParams {}),
            )])
            .await?;
        Ok(answers.roots(key).cloned().unwrap_or(Roots::Unsupported))
    }

    /// Asks several questions in one round. Questions the client cannot answer (capability not
    /// declared) come back as `Unsupported`; if any other answer is missing, the call ends with
    /// `input_required` carrying every missing question, and the handler runs again on the retry.
    /// A question the spec does not let a server send (see [`InputRequest::malformed`]) is a bug
    /// in the handler: nothing is sent, and the call fails with -32603, whatever the client's
    /// capabilities (so the bug shows with every client).
    pub async fn ask(
        &self,
        questions: Vec<(String, InputRequest)>,
    ) -> Result<Answers, HandlerError> {
        if let Some((key, why)) = questions
            .iter()
            .find_map(|(key, question)| Some((key, question.malformed()?)))
        {
            return Err(HandlerError::Internal(anyhow::anyhow!(
                "question {key:?} cannot be sent: {why}"
            )));
        }
        self.inner
            .asker
            .ask(self.capabilities(), self.inner.notifier.as_ref(), questions)
            .await
    }

    /// Runs `work` once per call: on a retry its remembered result is returned instead, so a
    /// database read or a model call made before a question is not made again after it.
    pub async fn remember<T, F, Fut>(&self, key: &str, work: F) -> Result<T, HandlerError>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        let remembered = self.memo().get(key).cloned();
        if let Some(value) = remembered {
            return serde_json::from_value(value).map_err(|e| {
                HandlerError::Internal(anyhow::anyhow!(
                    "remembered value {key:?} no longer fits: {e}"
                ))
            });
        }
        let value = work().await?;
        let encoded = serde_json::to_value(&value)
            .map_err(|e| HandlerError::Internal(anyhow::anyhow!("cannot remember {key:?}: {e}")))?;
        self.memo().insert(key.to_owned(), encoded);
        Ok(value)
    }

    /// Reports progress when the request carries a progress token, and `progress` is past the
    /// last value reported in this request (the spec has each notification's value increase).
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let (Some(notifier), Some(token)) = (&self.inner.notifier, &self.inner.meta.progress_token)
        else {
            return;
        };
        if !notifier.progress_advances(progress) {
            return;
        }
        let mut params = json!({ "progressToken": token, "progress": progress });
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        notifier.notify("notifications/progress", params).await;
    }

    /// Sends a log message when the request asked for this level or a lower one.
    pub async fn log(&self, level: LogLevel, logger: &str, data: Value) {
        let (Some(notifier), Some(wanted)) = (&self.inner.notifier, self.inner.meta.log_level)
        else {
            return;
        };
        if level >= wanted {
            let params = json!({ "level": level.as_str(), "logger": logger, "data": data });
            notifier.notify("notifications/message", params).await;
        }
    }

    fn memo(&self) -> MutexGuard<'_, Map<String, Value>> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.inner
            .memo
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The remembered work, for the next continuation.
    pub(crate) fn take_memo(&self) -> Map<String, Value> {
        std::mem::take(&mut *self.memo())
    }
}
