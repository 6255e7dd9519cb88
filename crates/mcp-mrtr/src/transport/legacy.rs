//! 2025-11-25 Streamable HTTP, for clients that open with `initialize` (feature `legacy`).
//!
//! A session is minted on `initialize` and kept in the shared store, so any replica serves it.
//! Requests run through the same server and the same tool code; a tool's questions become real
//! server-initiated requests on the call's SSE stream, answered by POSTed JSON-RPC responses.
//! A client cancels a call with `notifications/cancelled`; closing its stream does not (the spec
//! says a disconnection is no cancellation), so the call runs on, within a bound. GET opens the
//! session's stream of change notifications; DELETE ends the session.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, Uri};
use axum::response::IntoResponse;
use bytes::Bytes;
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;

use super::answer_relay::AnswerRelay;
use super::headers::{MCP_PROTOCOL_VERSION, header_text, trace_headers};
use super::respond::{Accept, Cancelled, Stop, WireError, accepted, streamed};
use super::run_on_room::RunOnRoom;
use super::running_calls::RunningCalls;
use super::session_streams::SessionStreams;
use super::{Endpoint, TransportOptions, owner_of, sse};
use crate::auth::{Caller, Principal};
use crate::log_budget::LogBudget;
use crate::mrtr::{Asker, LegacyPeer, PendingAnswers, QuestionIds};
use crate::observe;
use crate::protocol::error::excerpt;
use crate::protocol::jsonrpc::{notification_bytes, success_bytes};
use crate::protocol::meta::{is_modern_meta, names_its_version};
use crate::protocol::{
    ClientCapabilities, Incoming, LogLevel, Method, ProtocolError, RequestId, RequestMeta,
    TraceCarrier, version,
};
use crate::server::{Era, RequestEnv, ServerEvent};
use crate::store::{Owner, RedisEventRelay, SessionStore, StoreError};

/// The most bytes of a client's `clientInfo` a session keeps (far more than a name and version).
const MAX_CLIENT_INFO_BYTES: usize = 4096;
/// The most bytes of a client's declared capabilities a session keeps.
const MAX_CAPABILITIES_BYTES: usize = 8192;
/// The most resources one session may subscribe to.
const MAX_SUBSCRIPTIONS: usize = 128;
/// The most bytes a session record may take in the store, whatever it holds.
const MAX_SESSION_BYTES: usize = 64 * 1024;
/// Why a request naming a session that is not (or no longer) there gets 404.
const SESSION_GONE: &str = "Session not found: initialize a new one";
/// Times a change to a session is tried over a record changed meanwhile before it gives up.
const UPDATE_ATTEMPTS: u32 = 16;

/// The newest legacy revision, offered when a client asks for one this server does not speak.
const LATEST_LEGACY: &str = "2025-11-25";
static SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");

/// Settings of the legacy wire.
pub struct LegacyOptions {
    /// How long a call waits for the client's answer to a server-initiated request.
    pub request_timeout: Duration,
    /// How long a session lives unused; each request gives it this long again.
    pub session_idle: Duration,
    /// How long a session lives at most, however busy.
    pub session_max: Duration,
    /// Where sessions live (shared by every replica when it is Redis).
    pub sessions: Arc<dyn SessionStore>,
    /// With replicas: carries clients' answers to the replica whose call waits for them.
    pub answer_relay: Option<RedisEventRelay>,
}

/// The legacy wire of one endpoint: its settings, and the calls waiting for clients' answers.
pub(super) struct LegacyWire {
    request_timeout: Duration,
    session_idle: Duration,
    session_max: Duration,
    sessions: Arc<dyn SessionStore>,
    /// Calls waiting here for a client's answer to a server-initiated request.
    pending: Arc<PendingAnswers>,
    /// Carries answers to calls waiting on other replicas.
    answers_elsewhere: Option<AnswerRelay>,
    /// The GET stream each session's notices go to here.
    streams: SessionStreams,
    /// The streamed calls running here, which their clients may cancel.
    calls: RunningCalls,
    /// Places for calls that run on after their clients closed their streams: as many as
    /// requests may be handled at once, a quarter of them per caller. With none free for its
    /// caller, a closed stream stops its call.
    closed_calls: Arc<RunOnRoom>,
}

impl LegacyWire {
    /// Takes the legacy settings out of `options`, starting the answer relay when there is one.
    pub(super) fn start(options: &mut TransportOptions) -> Self {
        let pending: Arc<PendingAnswers> = Arc::default();
        let calls = RunningCalls::default();
        let streams = SessionStreams::default();
        let answers_elsewhere = options.legacy.answer_relay.take().map(|relay| {
            AnswerRelay::start(relay, pending.clone(), calls.clone(), streams.clone())
        });
        Self {
            request_timeout: options.legacy.request_timeout,
            session_idle: options.legacy.session_idle,
            session_max: options.legacy.session_max,
            sessions: options.legacy.sessions.clone(),
            pending,
            answers_elsewhere,
            streams,
            calls,
            closed_calls: RunOnRoom::new(options.max_concurrent_requests),
        }
    }
}

/// What the store keeps of a session.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Session {
    version: String,
    capabilities: Map<String, Value>,
    client_info: Option<Value>,
    principal: String,
    /// Whose share of the session store the session counts against.
    #[serde(default)]
    owner: String,
    /// When it was opened, in seconds since the Unix epoch; a record from before this field is
    /// taken as opened now.
    #[serde(default = "unix_now")]
    opened_at: u64,
    log_level: Option<String>,
    subscriptions: Vec<String>,
    /// Whether the client has sent `notifications/initialized`. Until it has, the server sends
    /// it no requests (the lifecycle's rule): its tools are served as to a client that cannot
    /// be asked. A record from before this field is of an initialized session.
    #[serde(default = "initialized_before_the_field")]
    initialized: bool,
    /// The GET stream the session's notices go to: its latest, on whichever replica. A stream
    /// left open on another replica (a client that reconnected elsewhere) ends rather than send
    /// them too. A record from before this field names none, and its streams go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stream: Option<String>,
}

fn initialized_before_the_field() -> bool {
    true
}

/// About how long after `initialize` (whole seconds of the clock) a session is served as
/// initialized even without its notification: by then a client is not setting up any more, and
/// the notification may have been lost (a write of the session racing its own, or a replica from
/// before this rule).
const INITIALIZED_AT_THE_LATEST: Duration = Duration::from_secs(10);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

impl Session {
    /// Whether the client may be sent requests: it said `notifications/initialized`, or it
    /// opened the session [`INITIALIZED_AT_THE_LATEST`] ago.
    fn may_be_asked(&self) -> bool {
        self.initialized
            || unix_now().saturating_sub(self.opened_at) >= INITIALIZED_AT_THE_LATEST.as_secs()
    }

    /// The refusal of a request whose `MCP-Protocol-Version` names a legacy revision
    /// `initialize` does not agree on (unless the session agreed on it before that changed): 400,
    /// naming those it does, as the transport says of a revision not supported.
    fn refuses_version_in(&self, headers: &HeaderMap) -> Option<WireError> {
        let Ok(Some(named)) = header_text(headers, &MCP_PROTOCOL_VERSION) else {
            return None;
        };
        if version::AGREED_AT_INITIALIZE.contains(&named) || named == self.version {
            return None;
        }
        let refusal = ProtocolError::unsupported_version(named, &version::AGREED_AT_INITIALIZE);
        Some(WireError::from(refusal).with_status(StatusCode::BAD_REQUEST))
    }

    /// Whether a newer GET stream than `stream` has taken the session's notices over.
    fn streams_elsewhere(&self, stream: &str) -> bool {
        self.stream
            .as_deref()
            .is_some_and(|latest| latest != stream)
    }

    /// Whose share of the session store it counts against.
    fn owner(&self) -> Owner {
        Owner::new(&self.owner)
    }

    /// How long the session may still live: its idle time, or less near its maximum age.
    fn lifetime(&self, wire: &LegacyWire) -> Option<Duration> {
        let age = Duration::from_secs(unix_now().saturating_sub(self.opened_at));
        let left = wire
            .session_max
            .checked_sub(age)
            .filter(|left| !left.is_zero())?;
        Some(left.min(wire.session_idle))
    }
}

/// Whether a POST belongs to the legacy wire, by the rule of the spec's backward compatibility
/// section (a request with modern `_meta` is served statelessly). Never when an
/// `MCP-Protocol-Version` header names a revision other than a legacy one: that is a modern
/// request, or one of a revision this server does not serve, which the modern wire refuses with
/// 400 as both revisions require. Otherwise:
/// - with an `Mcp-Session-Id`, unless its `_meta` names its protocol version, as every modern
///   request's does (a dual-era client may keep sending the header; a modern request ignores
///   it). Other `io.modelcontextprotocol/` keys do not count there: a session's own messages may
///   carry them (a 2025-11-25 task's, say);
/// - without one, when its `_meta` has no `io.modelcontextprotocol/` key. A legacy `initialize`
///   with a `_meta` of its own still opens a session.
pub(super) fn routes_here(headers: &HeaderMap, incoming: &Incoming) -> bool {
    let params = match incoming {
        Incoming::Request { params, .. } | Incoming::Notification { params, .. } => Some(params),
        Incoming::Response { .. } => None,
    };
    if !names_a_legacy_version(headers).unwrap_or(true) {
        return false;
    }
    if headers.contains_key(&SESSION_HEADER) {
        return !params.is_some_and(names_its_version);
    }
    !params.is_some_and(is_modern_meta)
}

/// Whether the `MCP-Protocol-Version` header names a legacy revision; `None` without one. Sent
/// on more than one line, it names none (the modern wire refuses it as such).
fn names_a_legacy_version(headers: &HeaderMap) -> Option<bool> {
    let mut lines = headers.get_all(&MCP_PROTOCOL_VERSION).iter();
    let value = lines.next()?;
    Some(
        lines.next().is_none()
            && value
                .to_str()
                .is_ok_and(|version| version::is_legacy(version.trim())),
    )
}

/// Serves a message of the 2025-11-25 wire from `caller`, signed in at the front door, from
/// `peer`: `initialize` opens a session, anything else needs one.
pub(super) async fn post(
    endpoint: &Arc<Endpoint>,
    headers: &HeaderMap,
    (caller, peer): (Caller, Option<IpAddr>),
    accept: Accept,
    incoming: Incoming,
) -> Result<Response<Body>, WireError> {
    let authenticator = &endpoint.options.authenticator;
    if let Incoming::Request { id, method, params } = &incoming
        && method == Method::ToolsCall.as_str()
        && let Some(scope) = params
            .get("name")
            .and_then(Value::as_str)
            .and_then(|name| endpoint.server.registry().tool(name))
            .and_then(|tool| tool.required_scope.as_deref())
        && !caller.may(scope)
    {
        let challenge = authenticator.insufficient_scope(scope);
        return Err(WireError::insufficient_scope(scope, &challenge).answering(Some(id)));
    }
    let principal = caller.principal;
    let session_id = header_text(headers, &SESSION_HEADER)
        .map_err(|e| unreadable_session_header(e).answering(request_id(&incoming).as_ref()))?
        .map(str::to_owned);
    let Some(session_id) = session_id else {
        return match incoming {
            Incoming::Request { id, method, params } if method == Method::Initialize.as_str() => {
                let owner = owner_of(&principal, peer);
                Ok(initialize(endpoint, principal, owner, &id, &params).await)
            }
            other => {
                let missing = "Missing Mcp-Session-Id header: send initialize first";
                Err(WireError::refused(StatusCode::BAD_REQUEST, missing)
                    .answering(request_id(&other).as_ref()))
            }
        };
    };
    let session = load(endpoint, &session_id, &principal)
        .await
        .map_err(|e| e.answering(request_id(&incoming).as_ref()))?;
    if let Some(refusal) = session.refuses_version_in(headers) {
        return Err(refusal.answering(request_id(&incoming).as_ref()));
    }
    match incoming {
        Incoming::Notification { method, params } => {
            if method == "notifications/cancelled"
                && let Some(request_id) = params.get("requestId")
            {
                // A call running here stops; one on another replica hears of it through the
                // relay, when there is one, even when a call runs here too (a client that reused
                // the id may have had the other call served elsewhere).
                let legacy = &endpoint.legacy;
                legacy.calls.cancel(&session_id, request_id);
                if let Some(relay) = &legacy.answers_elsewhere {
                    relay.cancel(&session_id, request_id);
                }
            }
            if method == "notifications/initialized" && !session.may_be_asked() {
                let marking = update(endpoint, &session_id, |session| {
                    session.initialized = true;
                    Ok(())
                });
                // A session ended meanwhile stays ended: there is nothing to mark.
                marking
                    .await
                    .map_err(|e| WireError::from(e).with_status(StatusCode::SERVICE_UNAVAILABLE))?;
            }
            Ok(accepted())
        }
        Incoming::Response { id, outcome } => {
            deliver_answer(endpoint, &session_id, &id, outcome);
            Ok(accepted())
        }
        Incoming::Request { id, method, params } => serve_request(
            endpoint,
            principal,
            session_id,
            session,
            (accept, trace_headers(headers)),
            &id,
            &method,
            params,
        )
        .await
        .map_err(|e| e.answering(Some(&id)).within_session()),
    }
}

#[allow(clippy::too_many_arguments)]
async fn serve_request(
    endpoint: &Arc<Endpoint>,
    principal: Principal,
    session_id: String,
    session: Session,
    (accept, trace): (Accept, TraceCarrier),
    id: &RequestId,
    method: &str,
    params: Map<String, Value>,
) -> Result<Response<Body>, WireError> {
    let server = &endpoint.server;
    let method = match Method::parse(method) {
        Some(known) if !known.is_modern() || server.implements(known) => known,
        _ => return Err(ProtocolError::method_not_found(method).into()),
    };
    match method {
        Method::Ping => return Ok(ok(id, json!({}))),
        Method::Initialize => {
            return Err(
                ProtocolError::invalid_request("This session is already initialized").into(),
            );
        }
        Method::LoggingSetLevel => {
            let level = params
                .get("level")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let level = LogLevel::parse(level).ok_or_else(|| {
                ProtocolError::invalid_params(format!("Unknown log level: {level}"))
            })?;
            let setting = update(endpoint, &session_id, |session| {
                session.log_level = Some(level.as_str().to_owned());
                Ok(())
            });
            return Ok(changed(setting.await?, id));
        }
        Method::ResourcesSubscribe | Method::ResourcesUnsubscribe => {
            // Only a server that declares resources offers to subscribe to them.
            if !server.registry().has_resources() {
                return Err(ProtocolError::method_not_found(method.as_str()).into());
            }
            let uri = params
                .get("uri")
                .and_then(Value::as_str)
                .ok_or_else(|| ProtocolError::invalid_params("Missing uri"))?;
            let subscribing = update(endpoint, &session_id, |session| {
                session.subscriptions.retain(|known| known != uri);
                if method == Method::ResourcesSubscribe {
                    if session.subscriptions.len() >= MAX_SUBSCRIPTIONS {
                        return Err(ProtocolError::invalid_params(format!(
                            "A session subscribes to at most {MAX_SUBSCRIPTIONS} resources"
                        )));
                    }
                    session.subscriptions.push(uri.to_owned());
                }
                Ok(())
            });
            return Ok(changed(subscribing.await?, id));
        }
        // Stateless discovery and listening, and tasks, belong to the 2026-07-28 wire.
        Method::ServerDiscover
        | Method::SubscriptionsListen
        | Method::TasksGet
        | Method::TasksUpdate
        | Method::TasksCancel => {
            return Err(ProtocolError::method_not_found(method.as_str()).into());
        }
        _ => {}
    }
    // Before `notifications/initialized` the client may be sent no requests, so it is served as
    // one that declared no capability to answer them.
    let capabilities = if session.may_be_asked() {
        let mut declared = ClientCapabilities::from_object(&session.capabilities);
        // URL mode came with 2025-11-25: a client of an earlier revision cannot be asked so.
        declared.elicitation_url &= session.version.as_str() >= LATEST_LEGACY;
        declared
    } else {
        ClientCapabilities::default()
    };
    let meta = RequestMeta {
        protocol_version: session.version.clone(),
        client_info: session.client_info.clone(),
        capabilities,
        log_level: session.log_level.as_deref().and_then(LogLevel::parse),
        progress_token: params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_number())
            .cloned(),
        // The 2025-11-25 wire names no place in `_meta` for it: the HTTP headers carry it.
        trace,
    };
    let peer: Arc<dyn Asker> = Arc::new(
        LegacyPeer::new(
            endpoint.legacy.pending.clone(),
            question_ids(endpoint, &session_id),
            endpoint.legacy.request_timeout,
        )
        .speaking(&session.version),
    );
    // Legacy calls park no continuation (their questions are asked live), but the share is the
    // session's all the same.
    let env = RequestEnv {
        principal,
        owner: Owner::new(&session.owner),
        meta,
        notifier: None,
        era: Era::Legacy(peer),
    };
    if accept.sse && method.streams() {
        // Registered for as long as the call runs (the future owns the registration).
        let call = endpoint.legacy.calls.start(&session_id, id);
        let cancelled: Cancelled = Box::pin(async move { call.cancelled().await });
        let request = (id.clone(), method, params);
        let stop = Stop::OnNotice {
            cancelled,
            room: endpoint.legacy.closed_calls.clone(),
            owner: env.owner.clone(),
        };
        return Ok(streamed(endpoint, env, request, stop).await);
    }
    let reply = server
        .handle(method, &params, env)
        .await
        .map_err(WireError::handled)?;
    Ok(sse::json(StatusCode::OK, success_bytes(id, &reply)))
}

async fn initialize(
    endpoint: &Arc<Endpoint>,
    principal: Principal,
    owner: Owner,
    id: &RequestId,
    params: &Map<String, Value>,
) -> Response<Body> {
    let requested = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or(LATEST_LEGACY);
    let negotiated = if version::AGREED_AT_INITIALIZE.contains(&requested) {
        requested
    } else {
        LATEST_LEGACY
    };
    let capabilities = params.get("capabilities");
    let client_info = params.get("clientInfo");
    for (name, value, limit) in [
        ("capabilities", capabilities, MAX_CAPABILITIES_BYTES),
        ("clientInfo", client_info, MAX_CLIENT_INFO_BYTES),
    ] {
        let size = value.map_or(0, |v| v.to_string().len());
        if size > limit {
            let refusal = ProtocolError::invalid_params(format!(
                "{name} takes {size} bytes; this server keeps at most {limit}"
            ));
            return legacy_refusal(id, refusal);
        }
    }
    let session = Session {
        version: negotiated.to_owned(),
        capabilities: capabilities
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        client_info: client_info.cloned(),
        principal: principal.id(),
        owner: owner.as_str().to_owned(),
        opened_at: unix_now(),
        log_level: None,
        subscriptions: Vec::new(),
        initialized: false,
        stream: None,
    };
    let session_id = crate::store::ContinuationId::random().to_hex();
    if let Err(e) = save(endpoint, &session_id, &session).await {
        return legacy_refusal(id, e);
    }
    observe::legacy_session(true);
    let server = &endpoint.server;
    let info = server.info();
    let mut result = json!({
        "protocolVersion": negotiated,
        "capabilities": legacy_capabilities(server),
        "serverInfo": { "name": info.name, "version": info.version },
    });
    if let Some(instructions) = &info.instructions {
        result["instructions"] = json!(instructions);
    }
    if let Some(held_back) = SESSION_LINES.take() {
        tracing::info!(session = %session_id, version = negotiated, held_back, "legacy session opened");
    }
    let mut response = ok(id, result);
    if let Ok(value) = HeaderValue::from_str(&session_id) {
        response.headers_mut().insert(SESSION_HEADER.clone(), value);
    }
    response
}

/// Opens the session's stream of change notifications, when the session's owner and the server
/// have room for one more. It takes the session's notices over from the session's earlier stream,
/// which ends: at once on this replica, before its next notice on another (each checks the
/// stream the session names, see [`keep_open`] and [`relay`]). While it is open the session
/// stays alive (up to its longest lifetime); it ends when the session does: at once when the
/// session is deleted here, within half the session's idle time otherwise.
pub(super) async fn get(
    State(endpoint): State<Arc<Endpoint>>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response<Body>, WireError> {
    let (session_id, session, valid_until) = session_of(&endpoint, &uri, &headers).await?;
    let owner = Owner::new(&session.owner);
    let slot = endpoint.stream_room(&owner)?;
    let long_lived = endpoint.long_lived(slot, valid_until, None, None);
    let (frames_tx, frames_rx) = mpsc::channel::<Bytes>(64);
    // The earlier stream here stops before this one hears anything; then the session names this
    // stream as its latest, so that one open on another replica stops before its next notice.
    // Named only while this stream is the latest here: of two GETs at once, the one claimed
    // last is the one written last.
    let claim = Mutex::new(endpoint.legacy.streams.take_over(&session_id));
    let stream = crate::store::ContinuationId::random().to_hex();
    let naming = update(&endpoint, &session_id, |session| {
        if !claim
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_superseded()
        {
            session.stream = Some(stream.clone());
        }
        Ok(())
    });
    match naming.await {
        Ok(true) => {}
        Ok(false) => return Err(WireError::refused(StatusCode::NOT_FOUND, SESSION_GONE)),
        Err(e) => return Err(WireError::from(e).with_status(StatusCode::SERVICE_UNAVAILABLE)),
    }
    let mut claim = claim.into_inner().unwrap_or_else(PoisonError::into_inner);
    // A 2025-11-25 stream follows no task.
    let mut events = endpoint.server.events().subscribe_without_tasks();
    let watcher = endpoint.clone();
    let task = tokio::spawn(async move {
        let beat = (watcher.legacy.session_idle / 2).max(Duration::from_millis(100));
        // The first check comes at once: the session may have ended since it was read.
        let mut check = tokio::time::interval(beat);
        loop {
            let next = async {
                tokio::select! {
                    _ = check.tick() => keep_open(&watcher, &session_id, &stream).await,
                    received = events.recv() => {
                        relay(&watcher, &session_id, &stream, received, &frames_tx).await
                    }
                }
            };
            // A newer stream stops this one even halfway through its notices.
            let going = tokio::select! {
                biased;
                () = claim.superseded() => false,
                going = next => going,
            };
            if !going {
                return;
            }
        }
    });
    Ok(sse::stream(
        ReceiverStream::new(frames_rx),
        AbortOnDropHandle::new(task),
        Some(long_lived),
    ))
}

/// Whether a session's `stream` is still open: the session is, and no newer stream took it over;
/// then the session gets its idle time again (a stream is use). A store that cannot answer leaves
/// the stream open.
async fn keep_open(endpoint: &Endpoint, session_id: &str, stream: &str) -> bool {
    match read(endpoint, session_id).await {
        Ok(None) => false,
        Ok(Some(session)) if session.streams_elsewhere(stream) => false,
        Err(_) => true,
        Ok(Some(session)) => renew(endpoint, session_id, &session).await.unwrap_or(true),
    }
}

/// Sends a session's `stream` the notices `received` carries for it; `false` when the stream
/// should end (the client left, a newer stream took the session's notices over, or events end).
async fn relay(
    endpoint: &Endpoint,
    session_id: &str,
    stream: &str,
    received: Result<ServerEvent, RecvError>,
    frames: &mpsc::Sender<Bytes>,
) -> bool {
    // Each event, and whether the session is known to subscribe to its resource.
    let heard = match received {
        // Legacy sessions do not get tasks (their streams listen without them: none comes).
        Ok(ServerEvent::TaskChanged(_)) => return true,
        Ok(event) => vec![(event, false)],
        Err(RecvError::Lagged(_)) => may_have_missed(endpoint, session_id)
            .await
            .into_iter()
            .map(|event| (event, true))
            .collect(),
        Err(RecvError::Closed) => return false,
    };
    // Read once per notice: subscriptions may have changed on any replica since the stream
    // opened, and a session that ended (on any replica, or with its time), or whose notices a
    // newer stream took over, hears nothing more here.
    let session = match read(endpoint, session_id).await {
        Ok(Some(session)) if session.streams_elsewhere(stream) => return false,
        Ok(Some(session)) => Some(session),
        Ok(None) => return false,
        // The store cannot say: list changes still go out, updates on what is known.
        Err(_) => None,
    };
    for (event, subscribed) in heard {
        let message = match &event {
            ServerEvent::ToolsListChanged => {
                notification_bytes("notifications/tools/list_changed", &json!({}))
            }
            ServerEvent::PromptsListChanged => {
                notification_bytes("notifications/prompts/list_changed", &json!({}))
            }
            ServerEvent::ResourcesListChanged => {
                notification_bytes("notifications/resources/list_changed", &json!({}))
            }
            ServerEvent::ResourceUpdated(uri) => {
                let subscribed = subscribed
                    || session
                        .as_ref()
                        .is_some_and(|s| s.subscriptions.contains(uri));
                if !subscribed {
                    continue;
                }
                let params = json!({ "uri": uri });
                notification_bytes("notifications/resources/updated", &params)
            }
            ServerEvent::TaskChanged(_) => continue,
        };
        if frames.send(sse::frame(&message)).await.is_err() {
            return false;
        }
    }
    true
}

/// Every notice a session's stream that fell behind may have missed: the changes of each list
/// the server has, and an update of each resource the session subscribes to. One about a change
/// that did not happen only has the client read again.
async fn may_have_missed(endpoint: &Endpoint, session_id: &str) -> Vec<ServerEvent> {
    let registry = endpoint.server.registry();
    let lists = [
        (registry.has_tools(), ServerEvent::ToolsListChanged),
        (registry.has_prompts(), ServerEvent::PromptsListChanged),
        (registry.has_resources(), ServerEvent::ResourcesListChanged),
    ];
    let subscribed = match read(endpoint, session_id).await {
        Ok(Some(session)) => session.subscriptions,
        _ => Vec::new(),
    };
    lists
        .into_iter()
        .filter_map(|(has, event)| has.then_some(event))
        .chain(subscribed.into_iter().map(ServerEvent::ResourceUpdated))
        .collect()
}

/// The server's capabilities as a 2025-11-25 session gets them: without the extensions (tasks),
/// which this server offers on the 2026-07-28 wire only.
fn legacy_capabilities(server: &crate::server::Server) -> Value {
    let mut capabilities = server.capabilities();
    if let Some(declared) = capabilities.as_object_mut() {
        declared.remove("extensions");
    }
    capabilities
}

/// Ends a session.
pub(super) async fn delete(
    State(endpoint): State<Arc<Endpoint>>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response<Body>, WireError> {
    let (session_id, session, _) = session_of(&endpoint, &uri, &headers).await?;
    let sessions = &endpoint.legacy.sessions;
    match sessions.delete_session(&session.owner(), &session_id).await {
        Ok(()) => {
            // Its calls stop, here and on other replicas, as its streams do.
            endpoint.legacy.calls.cancel_session(&session_id);
            if let Some(relay) = &endpoint.legacy.answers_elsewhere {
                relay.end_session(&session_id);
            }
            endpoint.legacy.streams.end(&session_id);
            if let Some(held_back) = SESSION_LINES.take() {
                tracing::info!(session = %session_id, held_back, "legacy session ended");
            }
            observe::legacy_session(false);
            Ok(Response::builder()
                .status(StatusCode::OK)
                .body(Body::empty())
                .unwrap_or_default())
        }
        Err(e) => {
            Err(WireError::from(ProtocolError::from(e))
                .with_status(StatusCode::SERVICE_UNAVAILABLE))
        }
    }
}

/// The session named by the request's header, once its head earns no
/// [`Endpoint::head_refusal`], checked against its caller; with when the caller's credentials
/// expire.
async fn session_of(
    endpoint: &Arc<Endpoint>,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(String, Session, Option<SystemTime>), WireError> {
    if let Some(refusal) = endpoint.head_refusal(uri, headers) {
        return Err(refusal);
    }
    let Caller {
        principal,
        valid_until,
        ..
    } = endpoint
        .options
        .authenticator
        .authenticate(headers)
        .await
        .map_err(|e| WireError::unauthorized(&e))?;
    let session_id = header_text(headers, &SESSION_HEADER)
        .map_err(unreadable_session_header)?
        .ok_or_else(|| {
            WireError::refused(StatusCode::BAD_REQUEST, "Missing Mcp-Session-Id header")
        })?
        .to_owned();
    // A repeated or unreadable header is -32020; a revision not served here -32022.
    let named = header_text(headers, &MCP_PROTOCOL_VERSION)
        .map_err(|e| WireError::from(e).with_status(StatusCode::BAD_REQUEST))?;
    if let Some(named) = named.filter(|named| !version::is_legacy(named)) {
        let refusal = ProtocolError::unsupported_version(named, &version::AGREED_AT_INITIALIZE);
        return Err(WireError::from(refusal).with_status(StatusCode::BAD_REQUEST));
    }
    let session = load(endpoint, &session_id, &principal).await?;
    if let Some(refusal) = session.refuses_version_in(headers) {
        return Err(refusal);
    }
    Ok((session_id, session, valid_until))
}

/// An `Mcp-Session-Id` sent twice or not in visible ASCII: an invalid request with 400, as for a
/// missing one (2025-11-25 has no -32020, the modern wire's code for a header it cannot read).
fn unreadable_session_header(error: ProtocolError) -> WireError {
    WireError::refused(StatusCode::BAD_REQUEST, error.message)
}

/// Loads a session and gives it its idle time again: 404 when unknown, ended or past its maximum
/// age, 403 when it belongs to someone else.
async fn load(
    endpoint: &Arc<Endpoint>,
    session_id: &str,
    principal: &Principal,
) -> Result<Session, WireError> {
    let unavailable =
        |e: ProtocolError| WireError::from(e).with_status(StatusCode::SERVICE_UNAVAILABLE);
    let gone = || WireError::refused(StatusCode::NOT_FOUND, SESSION_GONE);
    match read(endpoint, session_id).await {
        Ok(Some(session)) if session.principal == principal.id() => {
            match renew(endpoint, session_id, &session).await {
                Ok(true) => Ok(session),
                Ok(false) => Err(gone()),
                Err(e) => Err(unavailable(e.into())),
            }
        }
        Ok(Some(_)) => Err(WireError::refused(
            StatusCode::FORBIDDEN,
            "This session belongs to another user",
        )),
        Ok(None) => Err(gone()),
        Err(e) => Err(unavailable(e)),
    }
}

/// Gives `session` its idle time again; `false` when it is over: gone from the store, or past its
/// longest lifetime, when it expires now, unread.
async fn renew(
    endpoint: &Endpoint,
    session_id: &str,
    session: &Session,
) -> Result<bool, StoreError> {
    let sessions = &endpoint.legacy.sessions;
    let Some(lifetime) = session.lifetime(&endpoint.legacy) else {
        if sessions
            .delete_session(&session.owner(), session_id)
            .await
            .is_ok()
        {
            observe::Held::Sessions.lapsed(sessions.kind(), 1);
        }
        return Ok(false);
    };
    sessions
        .touch_session(&session.owner(), session_id, lifetime)
        .await
}

async fn read(endpoint: &Endpoint, session_id: &str) -> Result<Option<Session>, ProtocolError> {
    let stored = endpoint.legacy.sessions.read_session(session_id).await?;
    stored.as_deref().map(decode).transpose()
}

fn decode(stored: &[u8]) -> Result<Session, ProtocolError> {
    serde_json::from_slice(stored)
        .map_err(|e| ProtocolError::internal(format!("unreadable session: {e}")))
}

/// A session's record, and how long it may live from now.
fn encode(endpoint: &Endpoint, session: &Session) -> Result<(Vec<u8>, Duration), ProtocolError> {
    let bytes = serde_json::to_vec(session).map_err(|e| ProtocolError::internal(e.to_string()))?;
    // The stream's name does not count: a session at its limit still opens streams.
    let naming_its_stream = session
        .stream
        .as_ref()
        .map_or(0, |stream| r#","stream":"""#.len() + stream.len());
    let counted = bytes.len().saturating_sub(naming_its_stream);
    if counted > MAX_SESSION_BYTES {
        return Err(ProtocolError::invalid_params(format!(
            "The session would take {counted} bytes; a session takes at most {MAX_SESSION_BYTES}"
        )));
    }
    let lifetime = session.lifetime(&endpoint.legacy).ok_or_else(|| {
        ProtocolError::invalid_request(
            "The session has reached its maximum age: initialize a new one",
        )
    })?;
    Ok((bytes, lifetime))
}

/// Writes a new session.
async fn save(
    endpoint: &Endpoint,
    session_id: &str,
    session: &Session,
) -> Result<(), ProtocolError> {
    let (bytes, lifetime) = encode(endpoint, session)?;
    endpoint
        .legacy
        .sessions
        .write_session(&session.owner(), session_id, bytes, lifetime)
        .await
        .map_err(ProtocolError::from)
}

/// Changes a stored session with `change`, written back only over the record it was made to
/// (read again otherwise), so that a log level, subscriptions and the `initialized` mark sent at
/// once, to one replica or to several, all stay; a session ended meanwhile stays ended. `false`
/// when the session is gone.
async fn update(
    endpoint: &Endpoint,
    session_id: &str,
    change: impl Fn(&mut Session) -> Result<(), ProtocolError>,
) -> Result<bool, ProtocolError> {
    let sessions = &endpoint.legacy.sessions;
    for attempt in 0..UPDATE_ATTEMPTS {
        if attempt > 0 {
            // Apart at random, so that changes colliding once rarely collide again.
            let most = 1u64 << attempt.min(5);
            let pause = rand::thread_rng().gen_range(0..=most);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let Some(stored) = sessions.read_session(session_id).await? else {
            return Ok(false);
        };
        let mut session = decode(&stored)?;
        if session.lifetime(&endpoint.legacy).is_none() {
            // Past its maximum age since it was loaded: ended, as `load` would have found it.
            return Ok(false);
        }
        change(&mut session)?;
        let (record, lifetime) = encode(endpoint, &session)?;
        if sessions
            .replace_session(&session.owner(), session_id, &stored, record, lifetime)
            .await?
        {
            return Ok(true);
        }
    }
    Err(ProtocolError::internal(
        "The session kept changing while this request changed it: send the request again",
    ))
}

/// The empty result of a request that changed the session, or, when the session ended before
/// the change was written, the 404 that tells a client to initialize a new one.
fn changed(updated: bool, id: &RequestId) -> Response<Body> {
    if updated {
        return ok(id, json!({}));
    }
    let gone = WireError::refused(StatusCode::NOT_FOUND, SESSION_GONE);
    gone.count_refusal();
    gone.answering(Some(id)).into_response()
}

/// The ids of `session`'s questions, vouched for by the keys every replica shares.
fn question_ids(endpoint: &Endpoint, session: &str) -> QuestionIds {
    QuestionIds::new(endpoint.server.engine().sealer().clone(), session)
}

/// Hands a client's answer to the call waiting for it: on this replica, or through the relay to
/// the replica where the call waits. A response to no question asked in its session is dropped.
fn deliver_answer(
    endpoint: &Endpoint,
    session: &str,
    id: &RequestId,
    outcome: Result<Value, Value>,
) {
    let ids = question_ids(endpoint, session);
    let Some((key, deadline)) = id
        .as_value()
        .as_str()
        .and_then(|key| Some((key, ids.answer_deadline(key)?)))
    else {
        tracing::debug!("ignored a response to no question asked in its session");
        return;
    };
    // Whatever the clocks say: the call's own wait decides whether it still wants the answer.
    let relay = endpoint.legacy.answers_elsewhere.as_ref();
    match (endpoint.legacy.pending.deliver(key, outcome), relay) {
        (Ok(()), Some(relay)) => relay.taken_here(key, deadline),
        (Ok(()), None) => {}
        (Err(not_taken), Some(relay)) => relay.send(key, deadline, not_taken),
        (Err(_), None) => {
            if let Some(held_back) = UNWAITED_ANSWERS.take() {
                tracing::info!(
                    id = %excerpt(key),
                    held_back,
                    "an answer nobody waits for (late, or the call was cancelled)"
                );
            }
        }
    }
}

/// Lines about answers dropped here, which any client can send.
static UNWAITED_ANSWERS: LogBudget = LogBudget::new("legacy_answer_unwaited");
/// Lines about sessions opened and ended, which anonymous clients can do at will.
static SESSION_LINES: LogBudget = LogBudget::new("legacy_session_opened_or_ended");

/// The id an error answering `incoming` carries: a request's own. A client's response carries
/// the id of the server's request, which is not the client's to match, and a notification none.
fn request_id(incoming: &Incoming) -> Option<RequestId> {
    match incoming {
        Incoming::Request { id, .. } => Some(id.clone()),
        Incoming::Response { .. } | Incoming::Notification { .. } => None,
    }
}

fn ok(id: &RequestId, result: Value) -> Response<Body> {
    sse::json(StatusCode::OK, success_bytes(id, &result))
}

/// A refusal as the legacy wire sends it (see [`WireError::within_session`]), counted.
fn legacy_refusal(id: &RequestId, e: ProtocolError) -> Response<Body> {
    let refusal = WireError::from(e).answering(Some(id)).within_session();
    refusal.count_refusal();
    refusal.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(seconds_ago: u64, initialized: bool) -> Session {
        Session {
            version: LATEST_LEGACY.to_owned(),
            capabilities: Map::new(),
            client_info: None,
            principal: "ada".into(),
            owner: "ada".into(),
            opened_at: unix_now() - seconds_ago,
            log_level: None,
            subscriptions: Vec::new(),
            initialized,
            stream: None,
        }
    }

    #[test]
    fn a_stream_goes_on_unless_a_newer_one_took_the_session_over() {
        let mut session = opened(0, true);
        assert!(!session.streams_elsewhere("a"), "a record naming no stream");
        session.stream = Some("a".into());
        assert!(!session.streams_elsewhere("a"));
        assert!(session.streams_elsewhere("b"));
    }

    #[test]
    fn a_session_is_asked_once_initialized_or_past_the_setting_up_time() {
        assert!(!opened(0, false).may_be_asked(), "still setting up");
        assert!(opened(0, true).may_be_asked(), "it said initialized");
        let late = INITIALIZED_AT_THE_LATEST.as_secs();
        assert!(
            opened(late, false).may_be_asked(),
            "its notification was lost"
        );
        let older: Session = serde_json::from_value(json!({
            "version": LATEST_LEGACY, "capabilities": {}, "client_info": null,
            "principal": "ada", "log_level": null, "subscriptions": []
        }))
        .expect("a record from before the field reads");
        assert!(older.initialized, "a record from before the field");
    }

    #[tokio::test]
    async fn a_change_to_a_session_ended_meanwhile_is_answered_404_with_the_request_id() {
        let id = RequestId::from_value(json!(7)).expect("an id");
        let answered = changed(true, &id);
        assert_eq!(answered.status(), StatusCode::OK);
        let gone = changed(false, &id);
        assert_eq!(gone.status(), StatusCode::NOT_FOUND);
        let body = axum::body::to_bytes(gone.into_body(), 4096)
            .await
            .expect("the body");
        let error: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(error["id"], 7, "{error}");
        assert_eq!(error["error"]["message"], SESSION_GONE, "{error}");
    }
}
