//! One task as the store keeps it, and as `tasks/get` and `CreateTaskResult` show it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::auth::Principal;
use crate::protocol::{ClientCapabilities, RequestMeta, TraceCarrier};

/// How far apart the clocks of two replicas may be: a lease is judged lapsed only this long after
/// its holder's deadline.
const CLOCK_SKEW_MS: u64 = 1_000;

/// A task's status, as the extension names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The handler is running on the replica holding the lease.
    Working,
    /// The handler waits for answers to `asked`; no replica runs it.
    InputRequired,
    /// The handler returned a result (a tool error included).
    Completed,
    /// The handler failed with a JSON-RPC error, or its worker was lost.
    Failed,
    /// The client cancelled the task.
    Cancelled,
}

impl Status {
    /// Whether the task is over: completed, failed or cancelled.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The status as the extension names it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Which replica runs a working task, until when. A lease not renewed in time means the
/// replica is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The random name of the replica's task service.
    pub holder: String,
    /// Unix milliseconds after which the lease has lapsed.
    pub until_ms: u64,
    /// Drawn anew for each worker started (the task created, or resumed by its answers), so a
    /// worker trying its write again after a reply that came late tells its own lease from that
    /// of a worker started since on the same replica. Records from before it read as 0.
    #[serde(default)]
    pub run: u64,
}

impl Lease {
    /// Whether `self` is the same grant as `other`: the same replica's, for the same worker.
    pub fn is_grant(&self, other: &Lease) -> bool {
        self.holder == other.holder && self.run == other.run
    }
}

/// What the store keeps for one task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The principal id the task belongs to; nobody else sees it.
    pub owner: String,
    /// The signed-in user's name, to rebuild the principal the handler sees; none if anonymous.
    pub user: Option<String>,
    /// The tool the task runs, and its arguments.
    pub tool: String,
    /// The tool's arguments.
    pub arguments: Value,
    /// The creating request's protocol revision.
    pub protocol_version: String,
    /// The creating request's client info.
    pub client_info: Option<Value>,
    /// The creating request's capabilities: the task asks only what the client can answer.
    pub capabilities: ClientCapabilities,
    /// Where the task is.
    pub status: Status,
    /// Why, in words, when there is something to say.
    pub status_message: Option<String>,
    /// Unix milliseconds of creation.
    pub created_ms: u64,
    /// Unix milliseconds of the last status change.
    pub updated_ms: u64,
    /// How long the task is kept from creation.
    pub ttl_ms: u64,
    /// How often a client should poll.
    pub poll_ms: u64,
    /// Every answer received so far, by key.
    pub answers: Map<String, Value>,
    /// Work the handler remembered.
    pub memo: Map<String, Value>,
    /// Questions waiting for an answer, by key, as sent in `inputRequests`. A key answered once
    /// is never asked again: the tool finds its answer in `answers` on every later run.
    pub asked: Vec<(String, Value)>,
    /// The keys of the task's own questions the client has answered (through `tasks/update`):
    /// the extension lets a task use a key for one question only, so an answer under one of
    /// them that a later run refuses (the tool asked something else under it) fails the task
    /// instead of asking again. Absent from records written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answered: Vec<String>,
    /// The handler's result, once completed.
    pub result: Option<Value>,
    /// The JSON-RPC error, once failed.
    pub error: Option<Value>,
    /// The replica running a working task.
    pub lease: Option<Lease>,
    /// W3C trace context of the round that made the task, so that the task's runs, on whichever
    /// replica, are spans of the call's trace. Absent from records written before it existed,
    /// and for calls that came without a trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl TaskRecord {
    /// The principal the task's handler runs for.
    pub fn principal(&self) -> Principal {
        match &self.user {
            Some(name) => Principal::User(name.clone()),
            None => Principal::Anonymous,
        }
    }

    /// The `_meta` the task's handler sees: the creating request's, without progress or logging
    /// (the extension sends neither for tasks).
    pub fn meta(&self) -> RequestMeta {
        RequestMeta {
            protocol_version: self.protocol_version.clone(),
            client_info: self.client_info.clone(),
            capabilities: self.capabilities.clone(),
            log_level: None,
            progress_token: None,
            trace: self.trace(),
        }
    }

    /// The trace context the task's runs continue.
    pub fn trace(&self) -> TraceCarrier {
        TraceCarrier {
            traceparent: self.traceparent.clone(),
            tracestate: self.tracestate.clone(),
            baggage: None,
        }
    }

    /// Moves the task to `status` at `now_ms`.
    pub fn set_status(&mut self, status: Status, message: Option<String>, now_ms: u64) {
        self.status = status;
        self.status_message = message;
        self.updated_ms = now_ms;
        if status != Status::Working {
            self.lease = None;
        }
        if status != Status::InputRequired {
            self.asked.clear();
        }
    }

    /// Whether the task is working under the lease `grant` (the same worker's), no other since.
    pub fn works_under(&self, grant: &Lease) -> bool {
        self.status == Status::Working
            && self.lease.as_ref().is_some_and(|held| held.is_grant(grant))
    }

    /// Whether the task is working under a lease that lapsed before `now_ms`, by more than the
    /// clocks of two replicas may disagree.
    pub fn worker_lost(&self, now_ms: u64) -> bool {
        self.status == Status::Working
            && self
                .lease
                .as_ref()
                .is_none_or(|l| l.until_ms.saturating_add(CLOCK_SKEW_MS) < now_ms)
    }

    /// The `Task` fields: what `CreateTaskResult` and every `tasks/get` carry.
    fn task_fields(&self, id: &str) -> Map<String, Value> {
        let mut task = Map::new();
        task.insert("taskId".into(), json!(id));
        task.insert("status".into(), json!(self.status.as_str()));
        if let Some(message) = &self.status_message {
            task.insert("statusMessage".into(), json!(message));
        }
        task.insert("createdAt".into(), json!(iso8601(self.created_ms)));
        task.insert("lastUpdatedAt".into(), json!(iso8601(self.updated_ms)));
        task.insert("ttlMs".into(), json!(self.ttl_ms));
        task.insert("pollIntervalMs".into(), json!(self.poll_ms));
        task
    }

    /// The `CreateTaskResult` answering the request that created the task.
    pub fn created(&self, id: &str) -> Value {
        let mut result = self.task_fields(id);
        result.insert("resultType".into(), json!("task"));
        Value::Object(result)
    }

    /// The `tasks/get` result: the task with what its status carries (questions, result or
    /// error).
    pub fn detailed(&self, id: &str) -> Value {
        let mut result = self.task_fields(id);
        match self.status {
            Status::InputRequired => {
                let asked: Map<String, Value> = self.asked.iter().cloned().collect();
                result.insert("inputRequests".into(), Value::Object(asked));
            }
            Status::Completed => {
                result.insert("result".into(), self.result.clone().unwrap_or(json!({})));
            }
            Status::Failed => {
                let error = self
                    .error
                    .clone()
                    .unwrap_or_else(|| json!({ "code": -32603, "message": "The task failed" }));
                result.insert("error".into(), error);
            }
            Status::Working | Status::Cancelled => {}
        }
        result.insert("resultType".into(), json!("complete"));
        Value::Object(result)
    }
}

/// Unix milliseconds as an ISO 8601 UTC timestamp with milliseconds.
fn iso8601(unix_ms: u64) -> String {
    let ms = i64::try_from(unix_ms).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_iso_8601_in_utc() {
        assert_eq!(iso8601(1_764_590_400_123), "2025-12-01T12:00:00.123Z");
    }
}
