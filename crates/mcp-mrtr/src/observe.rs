//! What the library counts, through the `metrics` facade: every name and label is here, so the
//! list an operator reads in the README is this file. Nothing is recorded, at no cost, until the
//! application installs a recorder (a Prometheus exporter, say) and calls [`enable`].
//!
//! Labels take values from closed sets only (method names, outcomes, reasons), never from what a
//! client sent, so no client can make a series per request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::protocol::Method;
use crate::protocol::error::{
    HEADER_MISMATCH, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, LEGACY_RESOURCE_NOT_FOUND,
    METHOD_NOT_FOUND, MISSING_REQUIRED_CLIENT_CAPABILITY, PARSE_ERROR,
    UNSUPPORTED_PROTOCOL_VERSION,
};

/// Whether [`enable`] was called: until then every record below returns at once (building a
/// metric's key costs an allocation, even for the no-op recorder).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Times an operation for a histogram; the clock is read only when metrics are enabled (a
/// round trip would otherwise read it a dozen times for nothing).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch(Option<Instant>);

impl Stopwatch {
    pub(crate) fn start() -> Self {
        Self(enabled().then(Instant::now))
    }

    /// The time since [`Stopwatch::start`], when metrics were enabled then.
    fn elapsed(self) -> Option<Duration> {
        self.0.map(|started| started.elapsed())
    }
}

/// Whether the application enabled the metrics.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Starts recording the library's metrics, and gives each its help text and unit for the
/// exposition. Call it once, after installing a recorder.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
    describe_counter!(
        "mcp_requests_total",
        "Requests handled, by method and outcome (complete, input_required, task, cancelled, or the JSON-RPC error code)"
    );
    describe_counter!(
        "mcp_requests_refused_total",
        "POST /mcp messages refused before any method ran (a bad body, Origin, header, \
         credentials or protocol version, a server too busy), by HTTP status and JSON-RPC code"
    );
    describe_histogram!(
        "mcp_request_duration_seconds",
        Unit::Seconds,
        "Time to handle a request, by method"
    );
    describe_counter!(
        "mcp_mrtr_conversations_started_total",
        "MRTR conversations whose first round asked the client something"
    );
    describe_counter!(
        "mcp_mrtr_conversations_completed_total",
        "MRTR conversations finished by a retry"
    );
    describe_counter!(
        "mcp_mrtr_conversations_abandoned_total",
        "Continuations that expired or were evicted before their retry came, by store"
    );
    describe_histogram!(
        "mcp_mrtr_rounds_per_conversation",
        "Rounds of each finished MRTR conversation"
    );
    describe_histogram!(
        "mcp_mrtr_answer_wait_seconds",
        Unit::Seconds,
        "Time from an input_required answer to the retry bringing the answers"
    );
    describe_counter!(
        "mcp_mrtr_state_refusals_total",
        "requestStates refused, by reason (tampered, expired, wrong_principal, wrong_request, replayed)"
    );
    describe_gauge!(
        "mcp_continuations_pending",
        "Continuations parked now, by store (Redis: the whole store's count, the same on every replica)"
    );
    describe_histogram!(
        "mcp_store_operation_seconds",
        Unit::Seconds,
        "Continuation store calls, by store and operation"
    );
    describe_counter!(
        "mcp_legacy_sessions_opened_total",
        "2025-11-25 sessions opened"
    );
    describe_counter!(
        "mcp_legacy_sessions_closed_total",
        "2025-11-25 sessions closed by their client"
    );
    describe_gauge!(
        "mcp_legacy_sessions_open",
        "2025-11-25 sessions open now, by store (Redis: the whole store's count, the same on every replica)"
    );
    describe_counter!(
        "mcp_legacy_sessions_expired_total",
        "2025-11-25 sessions that expired unused or were evicted, by store"
    );
    describe_gauge!(
        "mcp_streams_open",
        "Long-lived streams (subscriptions/listen, 2025-11-25 GET) open now on this replica"
    );
    describe_counter!(
        "mcp_streams_refused_total",
        "Long-lived streams refused: the replica held as many as it may"
    );
    describe_counter!(
        "mcp_streams_replaced_total",
        "Long-lived streams ended because their caller opened one more than its share"
    );
    describe_counter!(
        "mcp_log_lines_held_back_total",
        "Log lines under a budget (those a client can cause at will, say) held back past 5 a second, by kind"
    );
    describe_counter!(
        "mcp_tasks_total",
        "Tasks created, task status changes (input_required, completed, failed, cancelled), and \
         calls answered in their request because no task could be kept (not_kept)"
    );
}

/// `mcp_requests_total{method, outcome}` and `mcp_request_duration_seconds{method}` for one
/// request: by how it ended (`complete`, `input_required`, `task`, or the JSON-RPC error code),
/// or `cancelled` when it is dropped unfinished (its client went away, or cancelled it).
pub(crate) struct RequestCount {
    method: Method,
    started: Stopwatch,
    outcome: &'static str,
}

impl RequestCount {
    pub(crate) fn start(method: Method) -> Self {
        Self {
            method,
            started: Stopwatch::start(),
            outcome: "cancelled",
        }
    }

    /// The request ended with `outcome`.
    pub(crate) fn ended(mut self, outcome: &'static str) {
        self.outcome = outcome;
    }
}

impl Drop for RequestCount {
    fn drop(&mut self) {
        let Some(took) = self.started.elapsed() else {
            return;
        };
        let method = self.method.as_str();
        counter!("mcp_requests_total", "method" => method, "outcome" => self.outcome).increment(1);
        histogram!("mcp_request_duration_seconds", "method" => method).record(took.as_secs_f64());
    }
}

/// A JSON-RPC error code as an `outcome` label: the codes a server sends, or `other`.
pub(crate) fn error_outcome(code: i64) -> &'static str {
    match code {
        PARSE_ERROR => "-32700",
        INVALID_REQUEST => "-32600",
        METHOD_NOT_FOUND => "-32601",
        INVALID_PARAMS => "-32602",
        INTERNAL_ERROR => "-32603",
        HEADER_MISMATCH => "-32020",
        MISSING_REQUIRED_CLIENT_CAPABILITY => "-32021",
        UNSUPPORTED_PROTOCOL_VERSION => "-32022",
        LEGACY_RESOURCE_NOT_FOUND => "-32002",
        _ => "other",
    }
}

/// `mcp_requests_refused_total{status, outcome}`: a message refused by the transport, with the
/// HTTP `status` and the JSON-RPC `code` it was answered with (requests a method handled are
/// counted in `mcp_requests_total` instead).
pub(crate) fn request_refused(status: u16, code: i64) {
    if !enabled() {
        return;
    }
    counter!(
        "mcp_requests_refused_total",
        "status" => status.to_string(),
        "outcome" => error_outcome(code)
    )
    .increment(1);
}

/// `mcp_log_lines_held_back_total{kind}`: a line of `kind` held back by its log budget.
pub(crate) fn log_line_held_back(kind: &'static str) {
    if !enabled() {
        return;
    }
    counter!("mcp_log_lines_held_back_total", "kind" => kind).increment(1);
}

/// `mcp_mrtr_conversations_started_total`: a first round ended with `input_required`.
pub(crate) fn conversation_started() {
    if !enabled() {
        return;
    }
    counter!("mcp_mrtr_conversations_started_total").increment(1);
}

/// `mcp_mrtr_conversations_completed_total` and `mcp_mrtr_rounds_per_conversation`: a retry
/// finished the call after `rounds` rounds in all.
pub(crate) fn conversation_completed(rounds: u32) {
    if !enabled() {
        return;
    }
    counter!("mcp_mrtr_conversations_completed_total").increment(1);
    histogram!("mcp_mrtr_rounds_per_conversation").record(f64::from(rounds));
}

/// `mcp_mrtr_answer_wait_seconds`: from the `input_required` answer to the retry that brought
/// the answers.
pub(crate) fn answer_wait(waited: Duration) {
    if !enabled() {
        return;
    }
    histogram!("mcp_mrtr_answer_wait_seconds").record(waited.as_secs_f64());
}

/// Why a `requestState` was refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// It does not open with any key (altered, truncated, or not ours).
    Tampered,
    /// Past its expiry.
    Expired,
    /// Sealed for another principal.
    WrongPrincipal,
    /// Sealed for another method, name or arguments.
    WrongRequest,
    /// Its continuation was already taken (a replay) or is gone.
    Replayed,
}

/// `mcp_mrtr_state_refusals_total{reason}`.
pub(crate) fn state_refused(reason: Refusal) {
    if !enabled() {
        return;
    }
    let reason = match reason {
        Refusal::Tampered => "tampered",
        Refusal::Expired => "expired",
        Refusal::WrongPrincipal => "wrong_principal",
        Refusal::WrongRequest => "wrong_request",
        Refusal::Replayed => "replayed",
    };
    counter!("mcp_mrtr_state_refusals_total", "reason" => reason).increment(1);
}

/// What a store holds that it counts for the metrics: what is there now, and what left unread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// Parked continuations: `mcp_continuations_pending{store}` now, and
    /// `mcp_mrtr_conversations_abandoned_total{store}` for those that expired or were evicted
    /// before their retry came.
    Continuations,
    /// Legacy sessions: `mcp_legacy_sessions_open{store}` now, and
    /// `mcp_legacy_sessions_expired_total{store}` for those that expired or were evicted.
    Sessions,
}

impl Held {
    /// How many `store` holds now.
    pub(crate) fn now(self, store: &'static str, count: u64) {
        if !enabled() {
            return;
        }
        gauge!(self.gauge_name(), "store" => store).set(count as f64);
    }

    /// `store` holds `change` entries more (or fewer) than it did.
    pub(crate) fn changed(self, store: &'static str, change: i64) {
        if !enabled() || change == 0 {
            return;
        }
        gauge!(self.gauge_name(), "store" => store).increment(change as f64);
    }

    fn gauge_name(self) -> &'static str {
        match self {
            Self::Continuations => "mcp_continuations_pending",
            Self::Sessions => "mcp_legacy_sessions_open",
        }
    }

    /// `count` entries left `store` unread: expired or evicted.
    pub(crate) fn lapsed(self, store: &'static str, count: u64) {
        if count == 0 || !enabled() {
            return;
        }
        let name = match self {
            Self::Continuations => "mcp_mrtr_conversations_abandoned_total",
            Self::Sessions => "mcp_legacy_sessions_expired_total",
        };
        counter!(name, "store" => store).increment(count);
    }
}

/// `mcp_store_operation_seconds{store, op}`: one continuation-store call (`put`, `take`).
pub(crate) fn store_operation(store: &'static str, op: &'static str, took: Stopwatch) {
    let Some(took) = took.elapsed() else {
        return;
    };
    histogram!("mcp_store_operation_seconds", "store" => store, "op" => op)
        .record(took.as_secs_f64());
}

/// `mcp_legacy_sessions_opened_total` and `mcp_legacy_sessions_closed_total` (closed by the
/// client with DELETE; the stores count the open ones and those that expire, see [`Held`]).
#[cfg(feature = "legacy")]
pub(crate) fn legacy_session(opened: bool) {
    if !enabled() {
        return;
    }
    if opened {
        counter!("mcp_legacy_sessions_opened_total").increment(1);
    } else {
        counter!("mcp_legacy_sessions_closed_total").increment(1);
    }
}

/// `mcp_streams_open`: long-lived streams open now on this replica.
pub(crate) fn streams_open(count: usize) {
    if !enabled() {
        return;
    }
    gauge!("mcp_streams_open").set(count as f64);
}

/// `mcp_streams_refused_total`: a long-lived stream refused, the server holding as many as it may.
pub(crate) fn stream_refused() {
    if !enabled() {
        return;
    }
    counter!("mcp_streams_refused_total").increment(1);
}

/// `mcp_streams_replaced_total`: a caller's oldest long-lived stream ended to make room for its
/// newest.
pub(crate) fn stream_replaced() {
    if !enabled() {
        return;
    }
    counter!("mcp_streams_replaced_total").increment(1);
}

/// `mcp_tasks_total{status}`: tasks created (`created`), their status changes, and calls answered
/// in their request because no task could be kept for them (`not_kept`).
pub(crate) fn task(status: &'static str) {
    if !enabled() {
        return;
    }
    counter!("mcp_tasks_total", "status" => status).increment(1);
}
