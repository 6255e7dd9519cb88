//! Runs one handler invocation as one MRTR round: opens and checks the incoming `requestState`,
//! takes its continuation, runs the handler, and either returns its result or parks a new
//! continuation and answers `input_required`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tracing::Instrument as _;

use super::ask::Asker;
use super::context::{RequestContext, TaskMode, Unkept};
use super::error::HandlerError;
use super::notify::Notifier;
use super::rounds::{RoundState, Rounds};
use super::seal::{StateClaims, StateSealer};
use crate::auth::Principal;
use crate::observe::{self, Refusal};
use crate::protocol::input::{InputRequest, OrderedRequests, parse_input_responses};
use crate::protocol::{Method, ProtocolError, RequestMeta, TraceCarrier};
use crate::store::{ContinuationId, ContinuationStore, Owner};
use crate::trace_context;

/// A continuation taken from the store, with what it takes to put it back as it was.
struct Resumed {
    continuation: Continuation,
    taken: Taken,
}

/// A retry's continuation, as taken from the store: put back when the retry fails for a reason
/// the client (an answer that does not answer its question, answers too large to carry) or the
/// server (no task can be kept now, the next round not parked) can mend, so the same
/// `requestState` works again.
struct Taken {
    id: ContinuationId,
    payload: Vec<u8>,
    /// Unix seconds when its state expires.
    expires_at: u64,
}

/// The engine: one per server, shared by every request.
pub struct Engine {
    sealer: Arc<StateSealer>,
    store: Arc<dyn ContinuationStore>,
    state_ttl: Duration,
}

/// One MRTR-capable request, as the engine needs to see it.
pub struct Call<'a> {
    /// `tools/call`, `prompts/get` or `resources/read`.
    pub method: Method,
    /// The tool or prompt name, or the resource URI.
    pub name: &'a str,
    /// The arguments the request is bound to (`Value::Null` when the method has none).
    pub arguments: &'a Value,
    /// The request params, where `inputResponses` and `requestState` live.
    pub params: &'a Map<String, Value>,
    /// Who is calling; a state only resumes for the principal it was sealed for.
    pub principal: Principal,
    /// Whose share of the store the parked continuations count against.
    pub owner: Owner,
    /// The request's `_meta`, passed to the handler's context.
    pub meta: RequestMeta,
    /// Where progress and log notifications go; `None` when the reply is plain JSON, not a stream.
    pub notifier: Option<Notifier>,
    /// Set when a live peer answers questions during the call (a 2025-11-25 session): then there
    /// are no rounds and no `requestState`.
    pub live_asker: Option<Arc<dyn Asker>>,
    /// Whether the handler may continue as a task: [`TaskMode::Available`] when the server
    /// keeps tasks for this call and the client declared the Tasks extension on this request,
    /// [`TaskMode::Undeclared`] when only the declaration is missing, otherwise
    /// [`TaskMode::Unavailable`] (the other modes are the engine's own).
    pub tasks: TaskMode,
}

/// How a round ended.
pub enum Outcome<T> {
    /// The handler finished with a result.
    Complete(T),
    /// The handler is waiting for answers; send this as the round's result.
    InputRequired(InputRequired),
    /// The handler asked to continue as a task, which the caller creates from this seed.
    Task(Box<TaskSeed>),
}

/// What a handler that asked to continue as a task has so far: the task starts from here.
pub struct TaskSeed {
    /// Who made the request; the task belongs to them.
    pub principal: Principal,
    /// Whose share of the task store the task counts against.
    pub owner: Owner,
    /// The request's `_meta`: the task's handler sees the same capabilities.
    pub meta: RequestMeta,
    /// Answers the request's rounds gave: those the handler read, and those of the last round
    /// it had not read yet when it asked for the task.
    pub answers: Map<String, Value>,
    /// Work the handler remembered.
    pub memo: Map<String, Value>,
    /// Rounds of the conversation answered `input_required` before the one that asked for the
    /// task.
    pub earlier_rounds: u32,
    /// The trace context of that round, and the conversation's baggage, so that a call that
    /// goes on in its request stays in its conversation's trace.
    pub trace: TraceCarrier,
    /// Whether the handler asked with [`RequestContext::require_task`]: it cannot go on
    /// without a task.
    required: bool,
    /// The continuation the round's retry took, for a call that goes on in its request.
    taken: Option<Taken>,
    /// How long the client took to answer, recorded once the task is made or the call that
    /// goes on in its request is done with the answers (not when its continuation is put back).
    answer_wait: Option<Duration>,
}

impl TaskSeed {
    /// The task was made: the retry's answers are taken for good.
    pub(crate) fn answers_taken(&self) {
        if let Some(waited) = self.answer_wait {
            observe::answer_wait(waited);
        }
    }
}

/// Where a round starts from: the answers and remembered work it finds, and what it took.
struct RoundStart {
    round: RoundState,
    memo: Map<String, Value>,
    /// Rounds of this conversation answered `input_required` before this one.
    earlier_rounds: u32,
    /// The request's digest, once worked out (to open a state); sealing needs it too.
    digest: Option<[u8; 32]>,
    /// The continuation this retry took, kept to be put back if the retry fails for a reason
    /// that can be mended.
    taken: Option<Taken>,
    /// How long the client took to answer the last round's questions: recorded once the retry
    /// bringing the answers is done with, unless its continuation is put back (the client will
    /// send the same answers again, and they would be counted twice).
    answer_wait: Option<Duration>,
    baggage: Option<String>,
    span: tracing::Span,
    tasks: TaskMode,
}

/// An `input_required` result: the questions of this round and the sealed state to echo back.
#[derive(Debug, Clone)]
pub struct InputRequired {
    /// The questions of this round, keyed and in the order asked; sent as `inputRequests`.
    pub requests: Vec<(String, InputRequest)>,
    /// The sealed state the client echoes as `requestState` on the retry.
    pub request_state: String,
}

impl Serialize for InputRequired {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("resultType", "input_required")?;
        map.serialize_entry("inputRequests", &OrderedRequests(&self.requests))?;
        map.serialize_entry("requestState", &self.request_state)?;
        map.end()
    }
}

/// What is parked between rounds. Short field names keep the stored form small.
#[derive(Serialize, Deserialize)]
struct Continuation {
    /// Answers already read by the handler.
    #[serde(rename = "a", default, skip_serializing_if = "Map::is_empty")]
    answers: Map<String, Value>,
    /// Remembered work.
    #[serde(rename = "m", default, skip_serializing_if = "Map::is_empty")]
    memo: Map<String, Value>,
    /// Keys asked in the round that produced this continuation.
    #[serde(rename = "q", default)]
    asked: Vec<String>,
    /// Rounds answered `input_required` so far in this conversation.
    #[serde(rename = "r", default)]
    rounds: u32,
    /// Unix milliseconds when this continuation was parked.
    #[serde(rename = "t", default)]
    parked_ms: u64,
    /// The W3C `traceparent` of the round that parked it, so the next round continues its trace.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    /// The W3C `tracestate` that goes with it.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
    /// The W3C baggage the conversation came with, for the rounds that do not send it again.
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    baggage: Option<String>,
}

/// The longest a state and its continuation may live; a longer `state_ttl` is taken as this.
const MOST_STATE_TTL: Duration = Duration::from_secs(365 * 86_400);

/// Largest continuation parked between two rounds: the answers read so far and the work
/// remembered. The stores bound continuations by number; this bounds what each may hold, so
/// that answers padded up to the body limit cannot make the store's memory grow with them.
const MAX_CONTINUATION_BYTES: usize = 256 * 1024;

impl Engine {
    /// An engine that seals states with `sealer`, parks continuations in `store`, and lets each
    /// state and its continuation live for `state_ttl` (from a second to a year).
    pub fn new(
        sealer: StateSealer,
        store: Arc<dyn ContinuationStore>,
        state_ttl: Duration,
    ) -> Self {
        Self {
            sealer: Arc::new(sealer),
            store,
            state_ttl: state_ttl.clamp(Duration::from_secs(1), MOST_STATE_TTL),
        }
    }

    /// The keys states are sealed with, which also vouch for a legacy session's question ids.
    pub fn sealer(&self) -> &Arc<StateSealer> {
        &self.sealer
    }

    /// Runs `handler` for one round of `call`. A retry takes its continuation before the
    /// handler runs, so a `requestState` completes at most one call; when the retry fails for a
    /// reason that can be mended (an answer refused, answers too large to carry, a capability
    /// the client did not declare, no room for a task, the next round not parked) the
    /// continuation is put back, and the same retry may be
    /// sent again. The handler's own errors use it up: it may have done part of its work.
    pub async fn run<T, F, Fut>(
        &self,
        call: Call<'_>,
        handler: F,
    ) -> Result<Outcome<T>, ProtocolError>
    where
        F: FnOnce(RequestContext) -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        if let Some(asker) = call.live_asker {
            let context = RequestContext::new(
                call.principal,
                call.meta,
                call.notifier,
                asker,
                Map::new(),
                TaskMode::Unavailable,
            );
            return match handler(context).await {
                Ok(result) => Ok(Outcome::Complete(result)),
                Err(error) => Err(protocol_error(call.method, call.name, error)),
            };
        }
        let mut responses = parse_input_responses(call.params)?;
        let mut baggage = call.meta.trace.baggage.clone();
        // The digest is needed only to open a state or to seal one: not for calls that never ask.
        let mut digest = None;
        let mut taken = None;
        let mut round = RoundState::default();
        let mut memo = Map::new();
        let mut earlier_rounds = 0;
        let mut answer_wait = None;
        let round_span = round_span(&call);
        match call.params.get("requestState") {
            None => round.available = responses,
            Some(Value::String(state)) => {
                let request = request_digest(call.method.as_str(), call.name, call.arguments);
                let Resumed {
                    continuation: parked,
                    taken: resumed,
                } = self
                    .resume(state, &call.principal.id(), &call.owner, &request)
                    .await?;
                taken = Some(resumed);
                digest = Some(request);
                earlier_rounds = parked.rounds.max(1);
                let earlier = TraceCarrier {
                    traceparent: parked.traceparent,
                    tracestate: parked.tracestate,
                    baggage: None,
                };
                trace_context::adopt(&round_span, &earlier);
                baggage = baggage.or(parked.baggage);
                if parked.parked_ms > 0 {
                    let waited = unix_now_ms().saturating_sub(parked.parked_ms);
                    answer_wait = Some(Duration::from_millis(waited));
                }
                round.available = parked.answers;
                memo = parked.memo;
                // Only answers to the questions of the last round count; the rest is ignored.
                for key in parked.asked {
                    if let Some(answer) = responses.remove(&key) {
                        round.available.insert(key, answer);
                    }
                }
            }
            Some(_) => {
                return Err(ProtocolError::invalid_params(
                    "requestState must be a string",
                ));
            }
        }
        let tasks = call.tasks;
        let start = RoundStart {
            round,
            memo,
            earlier_rounds,
            digest,
            taken,
            answer_wait,
            baggage,
            span: round_span,
            tasks,
        };
        self.run_round(call, start, handler).await
    }

    /// Runs `handler` again, in the request whose round asked to continue as a task, when no
    /// task can be kept for it (for the reason `why`): the handler finds the answers and
    /// remembered work of that round's `seed`, is offered no task, and its call goes on in the
    /// request as it would for a client without the Tasks extension. `call` is the request's,
    /// with the seed's principal, owner and meta. A handler that asked with
    /// [`RequestContext::require_task`] is not run again: the call fails with -32603 saying why
    /// (with HTTP 503, or 429 for a caller at its share, when room may come later). Either way
    /// the continuation the request's retry took is put back when the call fails for a reason
    /// that can be mended (no room now, an answer refused, the next round not parked), so the
    /// same `requestState` works again.
    pub async fn continue_untasked<T, F, Fut>(
        &self,
        call: Call<'_>,
        seed: TaskSeed,
        why: Unkept,
        handler: F,
    ) -> Result<Outcome<T>, ProtocolError>
    where
        F: FnOnce(RequestContext) -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        let TaskSeed {
            owner,
            answers,
            memo,
            earlier_rounds,
            trace,
            required,
            taken,
            answer_wait,
            ..
        } = seed;
        if required {
            // Running the handler again would only repeat its work up to the same refusal.
            if let Some(taken) = taken {
                self.put_back(&owner, taken).await;
            }
            return Err(why.refusal());
        }
        let span = round_span(&call);
        let round_trace = TraceCarrier {
            traceparent: trace.traceparent,
            tracestate: trace.tracestate,
            baggage: None,
        };
        trace_context::adopt(&span, &round_trace);
        let start = RoundStart {
            round: RoundState {
                available: answers,
                ..RoundState::default()
            },
            memo,
            earlier_rounds,
            digest: None,
            taken,
            answer_wait,
            baggage: call.meta.trace.baggage.clone().or(trace.baggage),
            span,
            tasks: TaskMode::Unkept(why),
        };
        self.run_round(call, start, handler).await
    }

    /// Runs `handler` from `start`: its result, or the next round parked, or its task's seed.
    async fn run_round<T, F, Fut>(
        &self,
        call: Call<'_>,
        start: RoundStart,
        handler: F,
    ) -> Result<Outcome<T>, ProtocolError>
    where
        F: FnOnce(RequestContext) -> Fut,
        Fut: Future<Output = Result<T, HandlerError>>,
    {
        let RoundStart {
            round,
            memo,
            earlier_rounds,
            digest,
            taken,
            answer_wait,
            baggage,
            span: round_span,
            tasks,
        } = start;
        let answers_taken = || {
            if let Some(waited) = answer_wait {
                observe::answer_wait(waited);
            }
        };
        if let Some(baggage) = &baggage {
            trace_context::record_baggage(&round_span, baggage);
        }

        let rounds = Arc::new(Rounds::new(round));
        let context = RequestContext::new(
            call.principal,
            call.meta,
            call.notifier,
            rounds.clone(),
            memo,
            tasks,
        );
        round_span.record("mcp.round", earlier_rounds + 1);
        let ran = handler(context.clone())
            .instrument(round_span.clone())
            .await;
        match ran {
            Ok(result) => {
                answers_taken();
                if earlier_rounds > 0 {
                    observe::conversation_completed(earlier_rounds + 1);
                }
                Ok(Outcome::Complete(result))
            }
            Err(HandlerError::InputRequired(_)) => {
                let digest = digest.unwrap_or_else(|| {
                    request_digest(call.method.as_str(), call.name, call.arguments)
                });
                let parked = Parked {
                    round: rounds.take(),
                    memo: context.take_memo(),
                    rounds: earlier_rounds + 1,
                    trace: trace_context::carrier_of(&round_span, baggage.as_deref()),
                };
                let parking = self
                    .park(parked, context.principal().id(), &call.owner, digest)
                    .await;
                match (&parking, taken) {
                    // The next round could not be kept: the same state may try again.
                    (Err(_), Some(taken)) => self.put_back(&call.owner, taken).await,
                    (Err(_), None) => {}
                    (Ok(_), _) => {
                        answers_taken();
                        if earlier_rounds == 0 {
                            observe::conversation_started();
                        }
                    }
                }
                parking.map(Outcome::InputRequired)
            }
            Err(HandlerError::TaskRequested(pending)) => {
                // Answers not read before the task point are read after it.
                let round = rounds.take();
                let mut answers = round.used;
                answers.extend(round.available);
                Ok(Outcome::Task(Box::new(TaskSeed {
                    principal: context.principal().clone(),
                    owner: call.owner,
                    meta: context.meta().clone(),
                    answers,
                    memo: context.take_memo(),
                    earlier_rounds,
                    trace: trace_context::carrier_of(&round_span, baggage.as_deref()),
                    required: pending.required(),
                    taken,
                    answer_wait,
                })))
            }
            Err(error) => {
                // A handler's own failure uses the state up: it may have done part of its last
                // round's work, which must not run twice. A refusal the client can mend does
                // not (the refusal itself, not a later failure of a handler that went on past
                // one).
                let client_may_mend =
                    rounds.refused_answer() || context.is_mendable_refusal(&error);
                match taken {
                    // The client may still answer properly, find room, or declare what the
                    // tool needs, with the same state.
                    Some(taken) if client_may_mend => self.put_back(&call.owner, taken).await,
                    _ => answers_taken(),
                }
                Err(protocol_error(call.method, call.name, error))
            }
        }
    }

    /// Puts back the continuation the retry behind `seed` took, when no task was made from it
    /// because the task store failed: the same `requestState` works again.
    pub async fn give_back(&self, seed: TaskSeed) {
        if let Some(taken) = seed.taken {
            self.put_back(&seed.owner, taken).await;
        }
    }

    /// Puts a taken continuation back under its id for what is left of its state's life.
    async fn put_back(&self, owner: &Owner, taken: Taken) {
        let Taken {
            id,
            payload,
            expires_at,
        } = taken;
        let left = Duration::from_secs(expires_at.saturating_sub(unix_now()).max(1));
        if let Err(error) = self.store.put(owner, id, payload, left).await {
            tracing::warn!("a failed retry used up its requestState: cannot put it back: {error}");
        }
    }

    /// Opens a state, checks its bindings in order, and takes its continuation.
    async fn resume(
        &self,
        state: &str,
        principal: &str,
        owner: &Owner,
        digest: &[u8; 32],
    ) -> Result<Resumed, ProtocolError> {
        let refuse = |reason, message: &str| {
            observe::state_refused(reason);
            ProtocolError::invalid_params(message)
        };
        let claims = self
            .sealer
            .open(state)
            .map_err(|e| refuse(Refusal::Tampered, &e.to_string()))?;
        if claims.expires_at < unix_now() {
            return Err(refuse(
                Refusal::Expired,
                "requestState has expired; send the request again without requestState to start over",
            ));
        }
        if claims.principal != principal {
            return Err(refuse(
                Refusal::WrongPrincipal,
                "requestState belongs to another principal",
            ));
        }
        if &claims.request_digest != digest {
            return Err(refuse(
                Refusal::WrongRequest,
                "requestState was issued for a different request (method, name or arguments differ)",
            ));
        }
        let started = observe::Stopwatch::start();
        let span = tracing::info_span!(
            "mcp.store",
            otel.name = "mcp.store take",
            store = self.store.kind(),
            op = "take"
        );
        let taken = self
            .store
            .take(owner, claims.continuation)
            .instrument(span)
            .await;
        observe::store_operation(self.store.kind(), "take", started);
        let payload = taken?.ok_or_else(|| {
            refuse(
                Refusal::Replayed,
                "requestState has already been used or its continuation is gone; send the request again without requestState to start over",
            )
        })?;
        let continuation = serde_json::from_slice(&payload).map_err(|e| {
            ProtocolError::internal(format!("stored continuation is unreadable: {e}"))
        })?;
        Ok(Resumed {
            continuation,
            taken: Taken {
                id: claims.continuation,
                payload,
                expires_at: claims.expires_at,
            },
        })
    }

    /// Parks what the handler has so far and seals a state pointing at it.
    async fn park(
        &self,
        parked: Parked,
        principal: String,
        owner: &Owner,
        digest: [u8; 32],
    ) -> Result<InputRequired, ProtocolError> {
        let Parked {
            round,
            memo,
            rounds,
            trace,
        } = parked;
        let asked = round.pending.iter().map(|(key, _)| key.clone()).collect();
        let continuation = Continuation {
            answers: round.used,
            memo,
            asked,
            rounds,
            parked_ms: unix_now_ms(),
            traceparent: trace.traceparent,
            tracestate: trace.tracestate,
            baggage: trace.baggage,
        };
        let payload = serde_json::to_vec(&continuation)
            .map_err(|e| ProtocolError::internal(format!("cannot store continuation: {e}")))?;
        if payload.len() > MAX_CONTINUATION_BYTES {
            return Err(too_large(&continuation));
        }
        let id = ContinuationId::random();
        let started = observe::Stopwatch::start();
        let span = tracing::info_span!(
            "mcp.store",
            otel.name = "mcp.store put",
            store = self.store.kind(),
            op = "put"
        );
        let put = self
            .store
            .put(owner, id, payload, self.state_ttl)
            .instrument(span)
            .await;
        observe::store_operation(self.store.kind(), "put", started);
        put?;
        let claims = StateClaims {
            continuation: id,
            principal,
            request_digest: digest,
            expires_at: unix_now().saturating_add(self.state_ttl.as_secs()),
        };
        Ok(InputRequired {
            requests: round.pending,
            request_state: self.sealer.seal(&claims),
        })
    }
}

/// Why a continuation is too large to park: the client's answers, all rounds' (-32602: it may
/// answer again with less, or start over), or the handler's own remembered work (-32603).
fn too_large(continuation: &Continuation) -> ProtocolError {
    let answers = serde_json::to_vec(&continuation.answers).map_or(0, |bytes| bytes.len());
    if answers * 2 > MAX_CONTINUATION_BYTES {
        ProtocolError::invalid_params(format!(
            "The answers given to this request's questions come to {answers} bytes, more than \
             a round can carry to the next ({MAX_CONTINUATION_BYTES}): answer with less, or \
             send the request again without requestState to start over"
        ))
    } else {
        tracing::error!("a continuation is larger than {MAX_CONTINUATION_BYTES} bytes");
        ProtocolError::internal("This request's next round is too large to keep")
    }
}

/// The JSON-RPC error a failed handler answers with; internal failures are logged, not shown.
pub(crate) fn protocol_error(method: Method, name: &str, error: HandlerError) -> ProtocolError {
    match error {
        HandlerError::Protocol(error) => error,
        HandlerError::Internal(error) => {
            tracing::error!(%method, name, "handler failed: {error:#}");
            ProtocolError::internal(format!("Internal error while handling {method} {name}"))
        }
        HandlerError::InputRequired(_) => {
            ProtocolError::internal(format!("{method} {name} asked for input it cannot get"))
        }
        HandlerError::TaskRequested(_) => {
            ProtocolError::internal(format!("{method} {name} asked for a task it cannot get"))
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

/// What a round that asked leaves for the next one.
struct Parked {
    round: RoundState,
    memo: Map<String, Value>,
    /// Rounds answered `input_required` so far, this one included.
    rounds: u32,
    /// This round's trace context (when traces are exported) and the conversation's baggage.
    trace: TraceCarrier,
}

/// The span of one round of `call`.
fn round_span(call: &Call<'_>) -> tracing::Span {
    let span = tracing::info_span!(
        "mcp.round",
        otel.name = "mcp.round",
        mcp.round = tracing::field::Empty,
        mcp.name = tracing::field::Empty,
    );
    if call.method != Method::ResourcesRead {
        // A tool's or prompt's name; a resource URI may carry what a user typed.
        span.record("mcp.name", call.name);
    }
    span
}

/// SHA-256 over the method, the name and the arguments in canonical JSON (keys sorted), so the
/// same request always has the same digest whatever the client's key order.
pub fn request_digest(method: &str, name: &str, arguments: &Value) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(method.as_bytes());
    hasher.update([0]);
    hasher.update(name.as_bytes());
    hasher.update([0]);
    let mut canonical = Vec::with_capacity(64);
    write_canonical(arguments, &mut canonical);
    hasher.update(&canonical);
    hasher.finalize().into()
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_unstable_by_key(|(key, _)| *key);
            out.push(b'{');
            for (i, (key, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(key, out);
                out.push(b':');
                write_canonical(member, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_json(scalar, out),
    }
}

/// Compact JSON, as `Value`'s `Display` writes it.
fn write_json<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Writing strings and scalars into a Vec cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// Calls the crate's unit tests make.
#[cfg(test)]
pub(crate) mod test_calls {
    use super::*;
    use crate::protocol::ClientCapabilities;

    /// A 2026-07-28 `tools/call` of `name` by an anonymous caller who declared `capabilities`.
    pub(crate) fn anonymous<'a>(
        name: &'a str,
        arguments: &'a Value,
        params: &'a Map<String, Value>,
        capabilities: ClientCapabilities,
    ) -> Call<'a> {
        Call {
            method: Method::ToolsCall,
            name,
            arguments,
            params,
            principal: Principal::Anonymous,
            owner: Owner::new("anonymous"),
            meta: RequestMeta {
                protocol_version: "2026-07-28".into(),
                client_info: None,
                capabilities,
                log_level: None,
                progress_token: None,
                trace: TraceCarrier::default(),
            },
            notifier: None,
            live_asker: None,
            tasks: TaskMode::Unavailable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ClientCapabilities;
    use crate::protocol::input::Elicitation;
    use crate::store::{MemoryStore, NoRoom};
    use serde_json::json;

    /// No task kept, as a full store that cannot tell when room comes refuses one.
    const STORE_FULL: Unkept = Unkept::NoRoom(NoRoom::Store { frees_in: None });

    /// A `tools/call` of tool `t` by an anonymous caller who can show forms.
    fn call<'a>(arguments: &'a Value, params: &'a Map<String, Value>) -> Call<'a> {
        let forms = ClientCapabilities {
            elicitation_form: true,
            ..ClientCapabilities::default()
        };
        test_calls::anonymous("t", arguments, params, forms)
    }

    #[tokio::test]
    async fn a_call_no_task_is_kept_for_goes_on_with_what_its_round_had() {
        let engine = Engine::new(
            StateSealer::generate(),
            Arc::new(MemoryStore::new(10, 10)),
            Duration::from_secs(60),
        );
        let (arguments, params) = (json!({}), Map::new());
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let handler = |ctx: RequestContext| {
            let schema = schema.clone();
            async move {
                let first = ctx.elicit("first", "Go ahead?", schema.clone()).await?;
                let step = ctx.remember("step", || async { Ok(2) }).await?;
                ctx.continue_as_task()?;
                let second = ctx.elicit("second", "Sure?", schema).await?;
                Ok((first, step, second))
            }
        };
        let accepted = json!({"action": "accept", "content": {"ok": true}});
        let answers = Map::from_iter([("first".to_owned(), accepted.clone())]);
        let memo = Map::from_iter([("step".to_owned(), json!(1))]);

        let seed = |answers: &Map<String, Value>| TaskSeed {
            principal: Principal::Anonymous,
            owner: Owner::new("anonymous"),
            meta: call(&arguments, &params).meta,
            answers: answers.clone(),
            memo: memo.clone(),
            earlier_rounds: 1,
            trace: TraceCarrier::default(),
            required: false,
            taken: None,
            answer_wait: None,
        };

        // What the round had is found again; a question after the task point is a new round.
        let outcome = engine
            .continue_untasked(
                call(&arguments, &params),
                seed(&answers),
                STORE_FULL,
                handler,
            )
            .await;
        let Ok(Outcome::InputRequired(round)) = outcome else {
            panic!("a question past the task point is asked in a round of the request");
        };
        let asked: Vec<&str> = round.requests.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(
            asked,
            ["second"],
            "the first question was answered in its round"
        );

        // The retry, from a client that still takes tasks, asks for a task again; its seed
        // carries the new answer, which was not read before the task point.
        let retry = Map::from_iter([
            ("requestState".to_owned(), json!(round.request_state)),
            (
                "inputResponses".to_owned(),
                json!({"second": {"action": "decline"}}),
            ),
        ]);
        let taking_tasks = Call {
            tasks: TaskMode::Available,
            ..call(&arguments, &retry)
        };
        let Ok(Outcome::Task(again)) = engine.run(taking_tasks, handler).await else {
            panic!("the retry reaches the task point");
        };
        assert_eq!(again.answers["second"], json!({"action": "decline"}));
        // With no room for that task either, it completes in the request, not asking again.
        let Ok(Outcome::Complete((first, step, second))) = engine
            .continue_untasked(call(&arguments, &retry), *again, STORE_FULL, handler)
            .await
        else {
            panic!("the retry completes in its request");
        };
        assert!(matches!(first, Elicitation::Accepted(ref form) if form["ok"] == true));
        assert_eq!(step, 1, "the remembered work, not done again");
        assert!(matches!(second, Elicitation::Declined));

        // Work that can only run as a task says why it cannot run now, and whether it may later.
        for (why, status, retry_after, message) in [
            (
                STORE_FULL,
                503,
                Some(60),
                "No task can be kept for this call now (the task store is full): call again later",
            ),
            (
                Unkept::NoRoom(NoRoom::Store {
                    frees_in: Some(Duration::from_millis(2_500)),
                }),
                503,
                Some(3),
                "No task can be kept for this call now (the task store is full): call again later",
            ),
            (
                Unkept::NoRoom(NoRoom::Share {
                    frees_in: Some(Duration::from_secs(1_800)),
                }),
                429,
                Some(1_800),
                "No task can be kept for this call now (the caller holds its share of tasks): \
                 call again later",
            ),
            (
                Unkept::Busy("shutting down"),
                503,
                Some(1),
                "No task can be kept for this call now (shutting down): call again later",
            ),
            (
                Unkept::TooLarge,
                500,
                None,
                "No task can be kept for this call: it is too large to keep as a task",
            ),
        ] {
            let outcome = engine
                .continue_untasked(
                    call(&arguments, &params),
                    seed(&answers),
                    why,
                    |ctx| async move { ctx.require_task() },
                )
                .await;
            let Err(error) = outcome else {
                panic!("require_task fails when no task can be kept");
            };
            assert_eq!(error.to_json()["code"], -32603);
            assert_eq!(error.http_status(), status, "{why:?}");
            assert_eq!(error.retry_after_secs(), retry_after, "{why:?}");
            assert_eq!(error.to_json()["message"], message);
        }
    }

    /// Where a test handler asks its one question, `go`, and what it does about tasks.
    #[derive(Clone, Copy)]
    enum Plan {
        /// A task point, then the question.
        AskAfterTaskPoint,
        /// The question, then work that can only run as a task.
        AskThenRequireTask,
        /// A task point, the question, then work that can only run as a task.
        TaskPointAskRequireTask,
    }

    #[tokio::test]
    async fn a_retry_that_goes_on_in_its_request_keeps_its_state_when_it_cannot_finish() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let engine = Engine::new(
            StateSealer::generate(),
            Arc::new(MemoryStore::new(10, 10)),
            Duration::from_secs(60),
        );
        let arguments = json!({});
        let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let runs = AtomicUsize::new(0);
        let handler = |plan: Plan| {
            let (schema, runs) = (schema.clone(), &runs);
            move |ctx: RequestContext| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let ask = || ctx.elicit("go", "Go ahead?", schema.clone());
                match plan {
                    Plan::AskAfterTaskPoint => {
                        ctx.continue_as_task()?;
                        ask().await
                    }
                    Plan::AskThenRequireTask => {
                        let go = ask().await?;
                        ctx.require_task()?;
                        Ok(go)
                    }
                    Plan::TaskPointAskRequireTask => {
                        ctx.continue_as_task()?;
                        let go = ask().await?;
                        ctx.require_task()?;
                        Ok(go)
                    }
                }
            }
        };
        let retry_with = |state: &str, answer: Value| {
            Map::from_iter([
                ("requestState".to_owned(), json!(state)),
                ("inputResponses".to_owned(), json!({ "go": answer })),
            ])
        };
        let taking_tasks = |params| Call {
            tasks: TaskMode::Available,
            ..call(&arguments, params)
        };
        let first_round = |plan| {
            let params = Map::new();
            let handler = handler(plan);
            let engine = &engine;
            let arguments = &arguments;
            async move {
                match engine.run(call(arguments, &params), handler).await {
                    Ok(Outcome::InputRequired(round)) => round.request_state,
                    _ => panic!("the first round asks"),
                }
            }
        };
        let accepted = json!({"action": "accept", "content": {"ok": true}});
        let assert_no_task_kept = |outcome: Result<Outcome<Elicitation>, ProtocolError>| {
            let Err(error) = outcome else {
                panic!("no task, no work");
            };
            assert_eq!(error.to_json()["code"], -32603, "{}", error.to_json());
        };

        // An answer that does not answer its question, found only when the handler runs on in
        // the request: the client can still answer properly with the same state.
        let plan = Plan::AskAfterTaskPoint;
        let state = first_round(plan).await;
        let wrong = retry_with(&state, json!({"action": "accept", "content": "yes"}));
        let Ok(Outcome::Task(seed)) = engine.run(taking_tasks(&wrong), handler(plan)).await else {
            panic!("the retry reaches the task point before it reads its answer");
        };
        let refused = engine
            .continue_untasked(call(&arguments, &wrong), *seed, STORE_FULL, handler(plan))
            .await;
        let Err(error) = refused else {
            panic!("the answer is refused");
        };
        assert_eq!(error.to_json()["code"], -32602, "{}", error.to_json());
        let right = retry_with(&state, accepted.clone());
        let Ok(Outcome::Complete(go)) = engine.run(call(&arguments, &right), handler(plan)).await
        else {
            panic!("the same state, answered properly, completes the call");
        };
        assert!(matches!(go, Elicitation::Accepted(ref form) if form["ok"] == true));

        // Work that can only run as a task is refused at once, not run again to find that out,
        // and its state works again once there is room.
        let plan = Plan::AskThenRequireTask;
        let state = first_round(plan).await;
        let retry = retry_with(&state, accepted.clone());
        let Ok(Outcome::Task(seed)) = engine.run(taking_tasks(&retry), handler(plan)).await else {
            panic!("the retry asks for its task");
        };
        let before = runs.load(Ordering::SeqCst);
        assert_no_task_kept(
            engine
                .continue_untasked(call(&arguments, &retry), *seed, STORE_FULL, handler(plan))
                .await,
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            before,
            "the handler was not run again"
        );
        let Ok(Outcome::Task(seed)) = engine.run(taking_tasks(&retry), handler(plan)).await else {
            panic!("the state was put back");
        };

        // The task store failed: what the seed took is given back.
        engine.give_back(*seed).await;
        assert!(
            matches!(
                engine.run(taking_tasks(&retry), handler(plan)).await,
                Ok(Outcome::Task(_))
            ),
            "the state was given back"
        );

        // Work found to need a task only when run again in the request keeps its state too.
        let plan = Plan::TaskPointAskRequireTask;
        let state = first_round(plan).await;
        let retry = retry_with(&state, accepted);
        let Ok(Outcome::Task(seed)) = engine.run(taking_tasks(&retry), handler(plan)).await else {
            panic!("the retry reaches the task point");
        };
        assert_no_task_kept(
            engine
                .continue_untasked(call(&arguments, &retry), *seed, STORE_FULL, handler(plan))
                .await,
        );
        assert!(
            matches!(
                engine.run(taking_tasks(&retry), handler(plan)).await,
                Ok(Outcome::Task(_))
            ),
            "the state was put back"
        );
    }

    /// A memory store that fails its next put once told to, as a store out of reach for a
    /// moment does.
    struct Faltering {
        store: MemoryStore,
        next_put_fails: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl ContinuationStore for Faltering {
        async fn put(
            &self,
            owner: &Owner,
            id: ContinuationId,
            payload: Vec<u8>,
            ttl: Duration,
        ) -> Result<(), crate::store::StoreError> {
            if self
                .next_put_fails
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return Err(crate::store::StoreError("out of reach".into()));
            }
            self.store.put(owner, id, payload, ttl).await
        }

        async fn take(
            &self,
            owner: &Owner,
            id: ContinuationId,
        ) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
            self.store.take(owner, id).await
        }
    }

    #[tokio::test]
    async fn a_retry_keeps_its_state_when_its_failure_can_be_mended() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let store = Arc::new(Faltering {
            store: MemoryStore::new(10, 10),
            next_put_fails: AtomicBool::new(false),
        });
        let engine = Engine::new(
            StateSealer::generate(),
            store.clone(),
            Duration::from_secs(60),
        );
        let arguments = json!({});
        let schema = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        let database_down = AtomicBool::new(false);
        let handler = |ctx: RequestContext| {
            let (schema, database_down) = (schema.clone(), &database_down);
            async move {
                let first = ctx.elicit("first", "Name?", schema.clone()).await?;
                let second = ctx.elicit("second", "Other name?", schema).await?;
                if database_down.swap(false, Ordering::SeqCst) {
                    return Err(HandlerError::Internal(anyhow::anyhow!("database down")));
                }
                Ok((first, second))
            }
        };
        let retry = |state: &str, answers: Value| {
            Map::from_iter([
                ("requestState".to_owned(), json!(state)),
                ("inputResponses".to_owned(), answers),
            ])
        };
        let named = |name: &str| json!({"action": "accept", "content": {"name": name}});
        let run = |params: Map<String, Value>| {
            let (engine, arguments, handler) = (&engine, &arguments, &handler);
            async move { engine.run(call(arguments, &params), handler).await }
        };
        let state_of = |outcome: Result<Outcome<_>, ProtocolError>| match outcome {
            Ok(Outcome::InputRequired(round)) => round.request_state,
            Ok(_) => panic!("a question was expected"),
            Err(error) => panic!("a question was expected: {}", error.to_json()),
        };
        let code_of = |outcome: Result<Outcome<_>, ProtocolError>| match outcome {
            Err(error) => error.to_json()["code"].clone(),
            Ok(_) => panic!("an error was expected"),
        };

        // The next round cannot be parked: the state the retry took is put back.
        let state = state_of(run(Map::new()).await);
        let answered_first = retry(&state, json!({"first": named("Ada")}));
        store.next_put_fails.store(true, Ordering::SeqCst);
        assert_eq!(code_of(run(answered_first.clone()).await), -32603);
        let state = state_of(run(answered_first).await);

        let answered_both = retry(&state, json!({"second": named("Grace")}));
        let Ok(Outcome::Complete((first, second))) = run(answered_both.clone()).await else {
            panic!("the retry completes the call");
        };
        assert!(matches!(first, Elicitation::Accepted(ref form) if form["name"] == "Ada"));
        assert!(matches!(second, Elicitation::Accepted(ref form) if form["name"] == "Grace"));
        assert_eq!(
            code_of(run(answered_both).await),
            -32602,
            "a state that completed its call is used up"
        );

        // The handler's own failure uses its state up: it may have done part of its work.
        let state = state_of(
            run(retry(
                &state_of(run(Map::new()).await),
                json!({"first": named("Ada")}),
            ))
            .await,
        );
        let answered_both = retry(&state, json!({"second": named("Grace")}));
        database_down.store(true, Ordering::SeqCst);
        assert_eq!(code_of(run(answered_both.clone()).await), -32603);
        assert_eq!(code_of(run(answered_both).await), -32602);

        // Answers too large to carry to the next round are refused, and the state kept.
        let state = state_of(run(Map::new()).await);
        let padded = "x".repeat(MAX_CONTINUATION_BYTES);
        let oversized = retry(&state, json!({"first": named(&padded)}));
        assert_eq!(code_of(run(oversized).await), -32602);
        state_of(run(retry(&state, json!({"first": named("Ada")}))).await);
    }

    #[test]
    fn the_canonical_form_is_stable() {
        // States sealed by one version must open on the next: these bytes must never change.
        let mut out = Vec::new();
        write_canonical(
            &json!({"b": "x\"y\u{e9}\n", "a": [1, -2.5, null, true, {"d": {}, "c": []}]}),
            &mut out,
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"a\":[1,-2.5,null,true,{\"c\":[],\"d\":{}}],\"b\":\"x\\\"y\u{e9}\\n\"}"
        );
    }

    #[test]
    fn the_digest_ignores_key_order_but_not_values() {
        let a = request_digest(
            "tools/call",
            "t",
            &json!({"x": 1, "y": {"b": 2, "a": [1, 2]}}),
        );
        let b = request_digest(
            "tools/call",
            "t",
            &json!({"y": {"a": [1, 2], "b": 2}, "x": 1}),
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            request_digest(
                "tools/call",
                "t",
                &json!({"x": 2, "y": {"b": 2, "a": [1, 2]}})
            )
        );
        assert_ne!(
            a,
            request_digest(
                "tools/call",
                "u",
                &json!({"x": 1, "y": {"b": 2, "a": [1, 2]}})
            )
        );
        assert_ne!(
            a,
            request_digest(
                "prompts/get",
                "t",
                &json!({"x": 1, "y": {"b": 2, "a": [1, 2]}})
            )
        );
    }
}
