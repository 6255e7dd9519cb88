//! The 2026-07-28 wire: stateless requests whose routing headers mirror the body, each answered
//! with JSON or, when it streams progress or log messages, with SSE; `subscriptions/listen` opens
//! a stream of change notifications.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode};
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;

use super::headers::{
    MCP_PROTOCOL_VERSION, check_method, check_name, check_params, header_text, trace_headers,
};
use super::respond::{Accept, Stop, WireError, accepted, streamed};
use super::streams::StreamSlot;
use super::{Endpoint, owner_of, sse};
use crate::auth::{Caller, Principal};
use crate::protocol::error::INVALID_PARAMS;
use crate::protocol::jsonrpc::success_bytes;
use crate::protocol::meta::requested_version;
use crate::protocol::version::TASKS_EXTENSION;
use crate::protocol::{Incoming, Method, ProtocolError, RequestId, RequestMeta, version};
use crate::server::events::MAX_TASK_IDS;
use crate::server::{Era, RequestEnv, Server, ServerEvent, Subscription};
use crate::store::Owner;
use crate::tasks::Tasks;

/// The header that names a legacy session (which a modern request ignores).
const SESSION_ID: &str = "mcp-session-id";

/// Serves a message of the 2026-07-28 wire from `caller`, signed in (every message needs the
/// caller's credentials, as every HTTP request does: a notification or a response without them got
/// 401 at the front door like a request), from `peer`.
pub(super) async fn post(
    endpoint: &Arc<Endpoint>,
    headers: &HeaderMap,
    (caller, peer): (Caller, Option<IpAddr>),
    accept: Accept,
    incoming: Incoming,
) -> Result<Response<Body>, WireError> {
    if !matches!(incoming, Incoming::Request { .. }) {
        // A request's version is checked with the rest of it; any other message of a revision
        // this server does not serve (a legacy session's, say) is refused as such too.
        if let Some(named) = header_text(headers, &MCP_PROTOCOL_VERSION)?
            && !version::supported().contains(&named)
        {
            // Within a legacy session, what it may name instead are the revisions `initialize`
            // agrees on.
            let served: &[&str] = if cfg!(feature = "legacy") && headers.contains_key(SESSION_ID) {
                &version::AGREED_AT_INITIALIZE
            } else {
                version::supported()
            };
            return Err(ProtocolError::unsupported_version(named, served).into());
        }
    }
    match incoming {
        // No client notification is defined for this wire; accept and ignore, as the binding says.
        Incoming::Notification { .. } => Ok(accepted()),
        Incoming::Response { id, .. } => {
            let refusal = ProtocolError::invalid_request(
                "Clients must not send JSON-RPC responses on this protocol version",
            );
            Err(WireError::from(refusal).answering(Some(&id)))
        }
        Incoming::Request { id, method, params } => {
            let call = (caller, peer, accept);
            request(endpoint, headers, call, &id, &method, params)
                .await
                .map_err(|e| e.answering(Some(&id)))
        }
    }
}

/// Validates a 2026-07-28 request of the signed-in `caller` (from `peer`, accepting `accept`)
/// and serves it.
async fn request(
    endpoint: &Arc<Endpoint>,
    headers: &HeaderMap,
    (caller, peer, accept): (Caller, Option<IpAddr>, Accept),
    id: &RequestId,
    method: &str,
    params: Map<String, Value>,
) -> Result<Response<Body>, WireError> {
    let authenticator = &endpoint.options.authenticator;
    if let Some(scope) = missing_scope(&endpoint.server, &caller, method, &params).await? {
        let challenge = authenticator.insufficient_scope(&scope);
        return Err(WireError::insufficient_scope(&scope, &challenge));
    }
    let owner = owner_of(&caller.principal, peer);
    let caller = (caller.principal, owner, caller.valid_until);
    serve(endpoint, headers, accept, caller, id, method, params).await
}

/// A scope the request needs and the caller's token does not grant: that of the tool it calls
/// (`tools/call`), or of the tool a task it names runs (`tasks/*`, and `subscriptions/listen`
/// following tasks): a task is read, answered, cancelled and followed with the rights its tool
/// needs, so a token without them cannot reach a task another token of the same user started.
async fn missing_scope(
    server: &Server,
    caller: &Caller,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Option<String>, WireError> {
    let Some(method) = Method::parse(method) else {
        return Ok(None);
    };
    let lacking = |tool: &str| {
        let scope = server.registry().tool(tool)?.required_scope.as_deref()?;
        (!caller.may(scope)).then(|| scope.to_owned())
    };
    if method == Method::ToolsCall {
        return Ok(params.get("name").and_then(Value::as_str).and_then(lacking));
    }
    // Only a token lacking a scope some tool needs has its tasks read.
    let lacks_some = server
        .registry()
        .required_scopes()
        .any(|scope| !caller.may(scope));
    // A request without the Tasks extension in its `_meta` is refused for that afterwards
    // (-32021), and reads no task.
    let takes_tasks = || RequestMeta::from_params(params).is_ok_and(|meta| meta.capabilities.tasks);
    let Some(tasks) = server.tasks().filter(|_| lacks_some && takes_tasks()) else {
        return Ok(None);
    };
    let named: Vec<&str> = match method {
        Method::TasksGet | Method::TasksUpdate | Method::TasksCancel => params
            .get("taskId")
            .and_then(Value::as_str)
            .into_iter()
            .collect(),
        // Malformed or too many ids are refused afterwards, with the listen's own -32602.
        Method::SubscriptionsListen => params
            .get("notifications")
            .and_then(|filter| filter.get("taskIds"))
            .and_then(Value::as_array)
            .filter(|ids| ids.len() <= MAX_TASK_IDS)
            .map(|ids| {
                let unique: BTreeSet<&str> = ids.iter().filter_map(Value::as_str).collect();
                unique.into_iter().collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    for id in named {
        if let Some(scope) = tasks
            .tool_of(&caller.principal, id)
            .await?
            .as_deref()
            .and_then(lacking)
        {
            return Ok(Some(scope));
        }
    }
    Ok(None)
}

/// Checks what a signed-in request carries, in the spec's order, and serves it.
async fn serve(
    endpoint: &Arc<Endpoint>,
    headers: &HeaderMap,
    accept: Accept,
    (principal, owner, valid_until): (Principal, Owner, Option<SystemTime>),
    id: &RequestId,
    method: &str,
    params: Map<String, Value>,
) -> Result<Response<Body>, WireError> {
    let Some(header_version) = header_text(headers, &MCP_PROTOCOL_VERSION)? else {
        return Err(ProtocolError::header_mismatch("Missing MCP-Protocol-Version header").into());
    };
    let supported = version::supported();
    let requested = match requested_version(&params) {
        Ok(requested) => requested,
        // A revision this server does not serve is refused as such, so that a client of a later
        // one learns which to retry with, whatever its `_meta` lacks.
        Err(_) if !supported.contains(&header_version) => {
            return Err(ProtocolError::unsupported_version(header_version, supported).into());
        }
        Err(malformed) => return Err(malformed.into()),
    };
    if header_version != requested {
        return Err(ProtocolError::header_mismatch(format!(
            "Header mismatch: MCP-Protocol-Version header value '{header_version}' does not match _meta value '{requested}'"
        )).into());
    }
    if !supported.contains(&requested) {
        return Err(ProtocolError::unsupported_version(requested, supported).into());
    }
    let mut meta = RequestMeta::from_params(&params)?;
    // W3C trace context as HTTP carries it, for clients that set the headers only.
    let from_headers = trace_headers(headers);
    if meta.trace.traceparent.is_none() {
        meta.trace.traceparent = from_headers.traceparent;
        meta.trace.tracestate = from_headers.tracestate;
    }
    if meta.trace.baggage.is_none() {
        meta.trace.baggage = from_headers.baggage;
    }
    check_method(headers, method)?;
    let server = &endpoint.server;
    let method = match Method::parse(method) {
        Some(known) if server.implements(known) => known,
        _ => return Err(ProtocolError::method_not_found(method).into()),
    };
    check_name(headers, method, &params)?;
    if method == Method::ToolsCall
        && let Some(tool) = params
            .get("name")
            .and_then(Value::as_str)
            .and_then(|name| server.registry().tool(name))
    {
        check_params(headers, &tool.header_params, params.get("arguments"))?;
    }

    if method == Method::SubscriptionsListen {
        if !accept.sse {
            // Its answer is an event stream, which the client says it cannot take.
            return Err(WireError::refused(
                StatusCode::NOT_ACCEPTABLE,
                "subscriptions/listen needs Accept: text/event-stream",
            ));
        }
        let registry = server.registry();
        let subscription = Subscription::from_params(id.clone(), &params)?;
        // Only a server that keeps tasks can say the client lacks the extension; one that keeps
        // none drops `taskIds` below, as it drops any other notice it never sends.
        if !subscription.task_ids.is_empty() && server.tasks().is_some() && !meta.capabilities.tasks
        {
            return Err(ProtocolError::missing_capability(
                json!({ "extensions": { TASKS_EXTENSION: {} } }),
            )
            .into());
        }
        let mut subscription = subscription.limited_to(
            registry.has_tools(),
            registry.has_prompts(),
            registry.has_resources(),
            server.tasks().is_some(),
        );
        // A listen the server has no room for is refused before any task is read for it.
        endpoint.streams.has_room(&owner)?;
        // Listening before the tasks are read: a change made after a read is heard.
        let events = if subscription.task_ids.is_empty() {
            server.events().subscribe_without_tasks()
        } else {
            server.events().subscribe()
        };
        let mut first_reads = Vec::new();
        if let Some(tasks) = server.tasks() {
            first_reads = followable(tasks, &principal, &subscription.task_ids).await?;
            subscription.task_ids = first_reads.iter().map(|(id, _)| id.clone()).collect();
        }
        // Room last: taking it may end the caller's oldest stream, which a listen that fails
        // must not do.
        let slot = endpoint.stream_room(&owner)?;
        let holder = (slot, valid_until);
        let heard = (events, first_reads);
        return Ok(listen(endpoint, subscription, principal, holder, heard));
    }

    let wants_stream = accept.sse
        && method.streams()
        && (meta.progress_token.is_some() || meta.log_level.is_some());
    let env = RequestEnv {
        principal,
        owner,
        meta,
        notifier: None,
        era: Era::Modern,
    };
    if wants_stream {
        return Ok(streamed(endpoint, env, (id.clone(), method, params), Stop::OnClose).await);
    }
    let reply = server
        .handle(method, &params, env)
        .await
        .map_err(WireError::handled)?;
    Ok(sse::json(StatusCode::OK, success_bytes(id, &reply)))
}

/// The frames of one listen stream after its acknowledgement, until the client goes away (`Err`)
/// or events end; it starts with the followed tasks as read before the acknowledgement.
async fn stream_events(
    server: &Server,
    subscription: &Subscription,
    principal: &Principal,
    (mut events, first_reads): (broadcast::Receiver<ServerEvent>, Vec<FollowedTask>),
    frames: &mpsc::Sender<Bytes>,
) -> Result<(), mpsc::error::SendError<Bytes>> {
    let mut followed = server
        .tasks()
        .filter(|_| !subscription.task_ids.is_empty())
        .map(|tasks| Followed {
            tasks,
            subscription,
            principal,
            sent: HashMap::new(),
        });
    // The followed tasks as they were when the listen came, so a task that changed before the
    // stream opened is not waited for in vain.
    if let Some(followed) = &mut followed {
        for (id, task) in first_reads {
            followed.offer(id, task, frames).await?;
        }
    }
    // Read again every lease: a replica that died announces nothing (the read marks its tasks
    // failed), and a replica that stopped may not have got its last notices out.
    let lease = followed
        .as_ref()
        .map_or(Duration::from_secs(3600), |followed| {
            followed.tasks.settings().lease
        });
    let mut check = tokio::time::interval_at(tokio::time::Instant::now() + lease, lease);
    loop {
        let heard = tokio::select! {
            event = events.recv() => match event {
                Ok(event) if subscription.wants(&event) => Heard::Event(event),
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => Heard::Missed,
                Err(RecvError::Closed) => return Ok(()),
            },
            _ = check.tick() => Heard::Due,
        };
        match heard {
            Heard::Event(ServerEvent::TaskChanged(id)) => {
                if let Some(followed) = &mut followed {
                    followed.send(&id, frames).await?;
                }
            }
            Heard::Event(event) => {
                frames
                    .send(sse::frame(&subscription.notification(&event)))
                    .await?;
            }
            Heard::Missed | Heard::Due => {
                if matches!(heard, Heard::Missed) {
                    for event in subscription.may_have_missed() {
                        frames
                            .send(sse::frame(&subscription.notification(&event)))
                            .await?;
                    }
                }
                if let Some(followed) = &mut followed {
                    followed.send_all(frames).await?;
                }
            }
        }
    }
}

/// What woke a listen stream.
enum Heard {
    /// A notice it wants.
    Event(ServerEvent),
    /// It fell behind the notices and missed some: all it wants is sent again.
    Missed,
    /// Its followed tasks are due to be read again.
    Due,
}

/// The tasks a listen stream follows, with a digest of each as last sent on it, so that no
/// state of a task is sent twice.
struct Followed<'a> {
    tasks: &'a Tasks,
    subscription: &'a Subscription,
    principal: &'a Principal,
    sent: HashMap<String, u64>,
}

impl Followed<'_> {
    /// Sends every followed task that changed since it was last sent.
    async fn send_all(
        &mut self,
        frames: &mpsc::Sender<Bytes>,
    ) -> Result<(), mpsc::error::SendError<Bytes>> {
        let subscription = self.subscription;
        for id in &subscription.task_ids {
            self.send(id, frames).await?;
        }
        Ok(())
    }

    /// Sends task `id` as it is now, unless it is as last sent (or unreadable).
    async fn send(
        &mut self,
        id: &str,
        frames: &mpsc::Sender<Bytes>,
    ) -> Result<(), mpsc::error::SendError<Bytes>> {
        match self.tasks.get(self.principal, id).await {
            Ok(task) => self.offer(id.to_owned(), task, frames).await,
            Err(_) => Ok(()),
        }
    }

    /// Sends `task` (task `id` as read for this stream's principal) unless it is as last sent.
    async fn offer(
        &mut self,
        id: String,
        task: Value,
        frames: &mpsc::Sender<Bytes>,
    ) -> Result<(), mpsc::error::SendError<Bytes>> {
        let Value::Object(task) = task else {
            return Ok(());
        };
        let mut digest = DefaultHasher::new();
        serde_json::to_vec(&task)
            .unwrap_or_default()
            .hash(&mut digest);
        let digest = digest.finish();
        if self.sent.insert(id, digest) == Some(digest) {
            return Ok(());
        }
        frames
            .send(sse::frame(&self.subscription.task_notification(task)))
            .await
    }
}

/// Most task reads a listen makes at once to see which of its tasks it can follow.
const TASK_READS_AT_ONCE: usize = 8;

/// A task a listen stream follows, with its state as last read.
type FollowedTask = (String, Value);

/// The tasks of `wanted` a listen stream will follow, as read now: each one once, and only those
/// the caller can see (another's task, an expired or unknown one, is left out of the
/// acknowledgement, which names only the tasks the server agreed to report on). A store that
/// cannot answer fails the listen rather than leave a task out. Read a few at a time, in the
/// order asked.
async fn followable(
    tasks: &Tasks,
    principal: &Principal,
    wanted: &[String],
) -> Result<Vec<FollowedTask>, ProtocolError> {
    let mut unique: Vec<String> = Vec::with_capacity(wanted.len());
    for id in wanted {
        if !unique.contains(id) {
            unique.push(id.clone());
        }
    }
    let seen: Vec<Result<Option<FollowedTask>, ProtocolError>> = futures::stream::iter(unique)
        .map(|id| async move {
            match tasks.get(principal, &id).await {
                Ok(task) => Ok(Some((id, task))),
                Err(unknown) if unknown.code == INVALID_PARAMS => Ok(None),
                Err(failed) => Err(failed),
            }
        })
        .buffered(TASK_READS_AT_ONCE)
        .collect()
        .await;
    seen.into_iter().filter_map(Result::transpose).collect()
}

/// Opens a `subscriptions/listen` stream in the room `slot` holds: the acknowledgement, then the
/// events it opted into (`heard`: the notices since just before its tasks were read, and those
/// reads), with keep-alive comments, until the client goes away, or until the server ends it
/// with the closing response (it drains, or the caller's credentials expire at `valid_until`). A
/// task's status goes only to the principal it belongs to.
fn listen(
    endpoint: &Arc<Endpoint>,
    subscription: Subscription,
    principal: Principal,
    (slot, valid_until): (StreamSlot, Option<SystemTime>),
    heard: (broadcast::Receiver<ServerEvent>, Vec<FollowedTask>),
) -> Response<Body> {
    let acknowledgement = Some(subscription.acknowledgement());
    let farewell = endpoint.server.subscription_ended(&subscription);
    let long_lived = endpoint.long_lived(slot, valid_until, acknowledgement, farewell);
    let (frames_tx, frames_rx) = mpsc::channel::<Bytes>(64);
    let server = endpoint.server.clone();
    let task = tokio::spawn(async move {
        let _ = stream_events(&server, &subscription, &principal, heard, &frames_tx).await;
    });
    sse::stream(
        ReceiverStream::new(frames_rx),
        AbortOnDropHandle::new(task),
        Some(long_lived),
    )
}
