//! Server-side change events (list changes, resource updates) fanned out to every open
//! `subscriptions/listen` stream, and the per-stream filter that decides which ones a client sees.
//!
//! A server running alone delivers its events to its own listeners. Replicas sharing Redis relay
//! them through it instead: `notify` publishes, and every replica (the one that published
//! included) delivers what it receives to its listeners, so each stream sees each event once,
//! whichever replica the change went through.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::protocol::ProtocolError;
use crate::protocol::RequestId;
use crate::protocol::jsonrpc::notification_bytes;
use crate::protocol::version::META_SUBSCRIPTION_ID;
use crate::store::RedisEventRelay;

/// Events waiting to be published; beyond this they are delivered locally only.
const OUTBOX_CAPACITY: usize = 256;
/// How often [`Events::published`] looks whether the relay has caught up.
const PUBLISHED_CHECK: Duration = Duration::from_millis(10);
/// Events a listener may fall behind by before it misses some (it is then sent again all it may
/// have missed). Every task's changes pass through, wanted by a stream or not.
const LOCAL_CAPACITY: usize = 1024;
/// The same for listeners that follow no task: list changes and resource updates are rare.
const WITHOUT_TASKS_CAPACITY: usize = 256;

/// A change a server announces to its `subscriptions/listen` streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// The set of tools changed: `notifications/tools/list_changed`.
    ToolsListChanged,
    /// The set of prompts changed: `notifications/prompts/list_changed`.
    PromptsListChanged,
    /// The set of resources or templates changed: `notifications/resources/list_changed`.
    ResourcesListChanged,
    /// The resource at this URI changed: `notifications/resources/updated`.
    ResourceUpdated(String),
    /// The task with this id changed status (Tasks extension).
    TaskChanged(String),
}

impl ServerEvent {
    /// The compact form relayed between replicas: one letter, then the URI of an updated resource.
    fn to_wire(&self) -> Vec<u8> {
        match self {
            Self::ToolsListChanged => b"T".to_vec(),
            Self::PromptsListChanged => b"P".to_vec(),
            Self::ResourcesListChanged => b"R".to_vec(),
            Self::ResourceUpdated(uri) => [b"U", uri.as_bytes()].concat(),
            Self::TaskChanged(id) => [b"K", id.as_bytes()].concat(),
        }
    }

    /// Reads [`Self::to_wire`]'s form; `None` for anything else.
    fn from_wire(bytes: &[u8]) -> Option<Self> {
        match bytes.split_first()? {
            (b'T', []) => Some(Self::ToolsListChanged),
            (b'P', []) => Some(Self::PromptsListChanged),
            (b'R', []) => Some(Self::ResourcesListChanged),
            (b'U', uri) => String::from_utf8(uri.to_vec())
                .ok()
                .map(Self::ResourceUpdated),
            (b'K', id) => String::from_utf8(id.to_vec()).ok().map(Self::TaskChanged),
            _ => None,
        }
    }
}

/// The fan-out point for change events. Cloning shares the same channel.
#[derive(Clone)]
pub struct Events {
    shared: Arc<Shared>,
}

/// A handle on [`Events`] that does not keep them (and their relay) alive.
#[derive(Clone)]
pub struct WeakEvents(Weak<Shared>);

impl WeakEvents {
    /// The events, unless every [`Events`] handle is gone.
    pub fn upgrade(&self) -> Option<Events> {
        self.0.upgrade().map(|shared| Events { shared })
    }
}

struct Shared {
    /// This server's listeners.
    local: Local,
    /// Events on their way to the relay, once the server relays through Redis.
    outbox: OnceLock<mpsc::Sender<ServerEvent>>,
    /// Events handed to the relay and not yet published.
    unpublished: Arc<AtomicUsize>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                local: Local::default(),
                outbox: OnceLock::new(),
                unpublished: Arc::new(AtomicUsize::new(0)),
            }),
        }
    }
}

impl Events {
    /// An event hub with no listeners that delivers on this server only until `relay_through`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Delivers `event` to every listener that opted in, on every replica when relayed; nobody
    /// listening is fine.
    pub fn notify(&self, event: ServerEvent) {
        let Some(outbox) = self.shared.outbox.get() else {
            self.shared.local.send(event);
            return;
        };
        self.shared.unpublished.fetch_add(1, Ordering::AcqRel);
        if let Err(full) = outbox.try_send(event) {
            self.shared.unpublished.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("change-event relay is backed up; delivering on this replica only");
            self.shared.local.send(full.into_inner());
        }
    }

    /// A handle that does not keep these events alive.
    pub fn downgrade(&self) -> WeakEvents {
        WeakEvents(Arc::downgrade(&self.shared))
    }

    /// Resolves once every event handed to the relay so far has been published, or `within`
    /// has passed: a replica about to exit waits for it, so that the others hear its last
    /// changes (its tasks stopped by the shutdown) at once.
    pub async fn published(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.shared.unpublished.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(PUBLISHED_CHECK).await;
        }
    }

    /// A receiver of every event delivered to this server's listeners, for one stream to filter.
    pub fn subscribe(&self) -> broadcast::Receiver<ServerEvent> {
        self.shared.local.all.subscribe()
    }

    /// A receiver of every event but task changes, for a stream that follows no task: task churn,
    /// however heavy, cannot make it fall behind and resend list changes that never happened.
    pub fn subscribe_without_tasks(&self) -> broadcast::Receiver<ServerEvent> {
        self.shared.local.without_tasks.subscribe()
    }

    /// From now on, relays every event through `relay` so the listeners of every replica sharing
    /// it hear about it. The relay runs until the last clone of these events is dropped; events
    /// already relaying keep their first relay.
    pub fn relay_through(&self, relay: RedisEventRelay) {
        let (outbox, pending) = mpsc::channel(OUTBOX_CAPACITY);
        if self.shared.outbox.set(outbox).is_err() {
            tracing::warn!("change events already relay through Redis; kept the first relay");
            return;
        }
        let local = self.shared.local.clone();
        let unpublished = self.shared.unpublished.clone();
        tokio::spawn(run_relay(relay, pending, local, unpublished));
    }
}

/// This server's listeners: those that take every event, and those that take all but task
/// changes.
#[derive(Clone)]
struct Local {
    all: broadcast::Sender<ServerEvent>,
    without_tasks: broadcast::Sender<ServerEvent>,
}

impl Default for Local {
    fn default() -> Self {
        Self {
            all: broadcast::channel(LOCAL_CAPACITY).0,
            without_tasks: broadcast::channel(WITHOUT_TASKS_CAPACITY).0,
        }
    }
}

impl Local {
    /// Delivers `event` to the listeners that take it; nobody listening is fine.
    fn send(&self, event: ServerEvent) {
        if !matches!(event, ServerEvent::TaskChanged(_)) {
            let _ = self.without_tasks.send(event.clone());
        }
        let _ = self.all.send(event);
    }
}

/// Publishes this server's events in order, and delivers every event any replica published.
async fn run_relay(
    mut relay: RedisEventRelay,
    mut pending: mpsc::Receiver<ServerEvent>,
    local: Local,
    unpublished: Arc<AtomicUsize>,
) {
    loop {
        tokio::select! {
            event = pending.recv() => {
                let Some(event) = event else { return };
                publish(&relay, event, &local).await;
                unpublished.fetch_sub(1, Ordering::AcqRel);
            }
            Some(payload) = relay.next_message() => match ServerEvent::from_wire(&payload) {
                Some(event) => {
                    local.send(event);
                }
                None => tracing::warn!(
                    channel = relay.channel(),
                    "ignored an unreadable change event"
                ),
            },
        }
    }
}

/// Publishes `event`; when that fails, or when no subscriber (this replica's own included) is
/// connected to receive it, delivers it to this replica's listeners directly.
async fn publish(relay: &RedisEventRelay, event: ServerEvent, local: &Local) {
    match relay.publish(&event.to_wire()).await {
        Ok(0) => {
            local.send(event);
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!("could not relay a change event ({e}); delivering on this replica only");
            local.send(event);
        }
    }
}

/// What one `subscriptions/listen` stream asked for, reduced to what this server honours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Subscription {
    /// The id of the listen request, echoed in every frame's `_meta` as the subscription id.
    pub id: Option<RequestId>,
    /// Send `notifications/tools/list_changed` (`toolsListChanged`).
    pub tools_list_changed: bool,
    /// Send `notifications/prompts/list_changed` (`promptsListChanged`).
    pub prompts_list_changed: bool,
    /// Send `notifications/resources/list_changed` (`resourcesListChanged`).
    pub resources_list_changed: bool,
    /// URIs to send `notifications/resources/updated` for (`resourceSubscriptions`).
    pub resource_uris: Vec<String>,
    /// Tasks to send `notifications/tasks` for (`taskIds`, Tasks extension).
    pub task_ids: Vec<String>,
}

/// Most task ids one listen request may follow.
pub const MAX_TASK_IDS: usize = 100;

impl Subscription {
    /// Reads the `notifications` filter of a listen request.
    pub fn from_params(id: RequestId, params: &Map<String, Value>) -> Result<Self, ProtocolError> {
        let filter = match params.get("notifications") {
            Some(Value::Object(filter)) => filter,
            Some(_) => {
                return Err(ProtocolError::invalid_params(
                    "notifications must be an object",
                ));
            }
            None => {
                return Err(ProtocolError::invalid_params(
                    "Missing notifications filter",
                ));
            }
        };
        let flag = |name: &str| filter.get(name).and_then(Value::as_bool).unwrap_or(false);
        let resource_uris = match filter.get("resourceSubscriptions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(uris)) => uris
                .iter()
                .map(|u| u.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ProtocolError::invalid_params(
                        "resourceSubscriptions must be an array of strings",
                    )
                })?,
            Some(_) => {
                return Err(ProtocolError::invalid_params(
                    "resourceSubscriptions must be an array of strings",
                ));
            }
        };
        let task_ids = match filter.get("taskIds") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) if ids.len() <= MAX_TASK_IDS => ids
                .iter()
                .map(|id| id.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    ProtocolError::invalid_params("taskIds must be an array of strings")
                })?,
            Some(Value::Array(_)) => {
                return Err(ProtocolError::invalid_params(format!(
                    "taskIds lists at most {MAX_TASK_IDS} tasks"
                )));
            }
            Some(_) => {
                return Err(ProtocolError::invalid_params(
                    "taskIds must be an array of strings",
                ));
            }
        };
        Ok(Self {
            id: Some(id),
            tools_list_changed: flag("toolsListChanged"),
            prompts_list_changed: flag("promptsListChanged"),
            resources_list_changed: flag("resourcesListChanged"),
            resource_uris,
            task_ids,
        })
    }

    /// Drops the notification types a server without tools, prompts, resources or tasks never
    /// sends, so the acknowledgement reflects what will actually be honoured.
    pub fn limited_to(mut self, tools: bool, prompts: bool, resources: bool, tasks: bool) -> Self {
        self.tools_list_changed &= tools;
        self.prompts_list_changed &= prompts;
        self.resources_list_changed &= resources;
        if !resources {
            self.resource_uris.clear();
        }
        if !tasks {
            self.task_ids.clear();
        }
        self
    }

    /// Whether this stream should be sent `event`.
    pub fn wants(&self, event: &ServerEvent) -> bool {
        match event {
            ServerEvent::ToolsListChanged => self.tools_list_changed,
            ServerEvent::PromptsListChanged => self.prompts_list_changed,
            ServerEvent::ResourcesListChanged => self.resources_list_changed,
            ServerEvent::ResourceUpdated(uri) => self.resource_uris.contains(uri),
            ServerEvent::TaskChanged(id) => self.task_ids.contains(id),
        }
    }

    /// Every notice other than a task's this stream wants, to send again after it missed some: one
    /// about a change that did not happen only has the client read a list or a resource again.
    pub fn may_have_missed(&self) -> Vec<ServerEvent> {
        let lists = [
            (self.tools_list_changed, ServerEvent::ToolsListChanged),
            (self.prompts_list_changed, ServerEvent::PromptsListChanged),
            (
                self.resources_list_changed,
                ServerEvent::ResourcesListChanged,
            ),
        ];
        let mut seen = HashSet::new();
        let resources = self
            .resource_uris
            .iter()
            .filter(|uri| seen.insert(uri.as_str()))
            .cloned()
            .map(ServerEvent::ResourceUpdated);
        lists
            .into_iter()
            .filter_map(|(wanted, event)| wanted.then_some(event))
            .chain(resources)
            .collect()
    }

    pub(super) fn meta(&self) -> Value {
        json!({ META_SUBSCRIPTION_ID: self.id })
    }

    /// The first frame of the stream: the honoured filter.
    pub fn acknowledgement(&self) -> Vec<u8> {
        let mut honoured = Map::new();
        for (name, on) in [
            ("toolsListChanged", self.tools_list_changed),
            ("promptsListChanged", self.prompts_list_changed),
            ("resourcesListChanged", self.resources_list_changed),
        ] {
            if on {
                honoured.insert(name.into(), Value::Bool(true));
            }
        }
        if !self.resource_uris.is_empty() {
            honoured.insert("resourceSubscriptions".into(), json!(self.resource_uris));
        }
        if !self.task_ids.is_empty() {
            honoured.insert("taskIds".into(), json!(self.task_ids));
        }
        let params = json!({ "_meta": self.meta(), "notifications": honoured });
        notification_bytes("notifications/subscriptions/acknowledged", &params)
    }

    /// The `notifications/tasks` frame carrying `task` (as `tasks/get` shows it) on this stream.
    pub fn task_notification(&self, mut task: Map<String, Value>) -> Vec<u8> {
        task.remove("resultType");
        task.insert("_meta".into(), self.meta());
        notification_bytes("notifications/tasks", &Value::Object(task))
    }

    /// The notification frame announcing `event` on this stream, tagged with its subscription id.
    pub fn notification(&self, event: &ServerEvent) -> Vec<u8> {
        let (method, mut params) = match event {
            ServerEvent::ToolsListChanged => ("notifications/tools/list_changed", json!({})),
            ServerEvent::PromptsListChanged => ("notifications/prompts/list_changed", json!({})),
            ServerEvent::ResourcesListChanged => {
                ("notifications/resources/list_changed", json!({}))
            }
            ServerEvent::ResourceUpdated(uri) => {
                ("notifications/resources/updated", json!({ "uri": uri }))
            }
            ServerEvent::TaskChanged(id) => ("notifications/tasks", json!({ "taskId": id })),
        };
        params["_meta"] = self.meta();
        notification_bytes(method, &params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn published_waits_for_the_relay_but_no_longer_than_asked() {
        let events = Events::new();
        // A relay that publishes only when the test says so.
        let (outbox, mut relay) = mpsc::channel(OUTBOX_CAPACITY);
        assert!(events.shared.outbox.set(outbox).is_ok(), "no relay yet");
        let at_once = Duration::from_secs(10);
        let never = Duration::from_secs(3600);

        tokio::time::timeout(at_once, events.published(never))
            .await
            .expect("nothing handed to the relay: no wait");

        events.notify(ServerEvent::TaskChanged("t1".into()));
        let waiting = {
            let events = events.clone();
            tokio::spawn(async move { events.published(never).await })
        };
        tokio::time::sleep(PUBLISHED_CHECK * 5).await;
        assert!(
            !waiting.is_finished(),
            "waits while the event is unpublished"
        );
        assert_eq!(
            relay.recv().await,
            Some(ServerEvent::TaskChanged("t1".into()))
        );
        events.shared.unpublished.fetch_sub(1, Ordering::AcqRel);
        tokio::time::timeout(at_once, waiting)
            .await
            .expect("done once the relay published")
            .expect("the wait ends well");

        // A relay that never publishes is waited for only as long as asked.
        events.notify(ServerEvent::TaskChanged("t2".into()));
        tokio::time::timeout(at_once, events.published(PUBLISHED_CHECK * 3))
            .await
            .expect("gives up after its limit");
        assert_eq!(events.shared.unpublished.load(Ordering::Acquire), 1);
    }

    #[test]
    fn every_event_survives_the_wire_form() {
        for event in [
            ServerEvent::ToolsListChanged,
            ServerEvent::PromptsListChanged,
            ServerEvent::ResourcesListChanged,
            ServerEvent::ResourceUpdated("test://items/ä?x=1".into()),
            ServerEvent::ResourceUpdated(String::new()),
            ServerEvent::TaskChanged("0123abcd".into()),
        ] {
            assert_eq!(ServerEvent::from_wire(&event.to_wire()), Some(event));
        }
    }

    #[test]
    fn anything_else_on_the_wire_is_refused() {
        for junk in [&b""[..], b"X", b"TT", b"tools", b"U\xff\xfe"] {
            assert_eq!(ServerEvent::from_wire(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn a_stream_that_missed_notices_is_sent_each_it_wants_except_tasks() {
        let subscription = Subscription {
            tools_list_changed: true,
            resources_list_changed: true,
            resource_uris: vec!["test://a".into(), "test://b".into(), "test://a".into()],
            task_ids: vec!["t1".into()],
            ..Subscription::default()
        };
        assert_eq!(
            subscription.may_have_missed(),
            [
                ServerEvent::ToolsListChanged,
                ServerEvent::ResourcesListChanged,
                ServerEvent::ResourceUpdated("test://a".into()),
                ServerEvent::ResourceUpdated("test://b".into()),
            ]
        );
    }

    #[tokio::test]
    async fn task_churn_does_not_make_a_listener_without_tasks_fall_behind() {
        let events = Events::new();
        let mut everything = events.subscribe();
        let mut without_tasks = events.subscribe_without_tasks();
        events.notify(ServerEvent::ToolsListChanged);
        for task in 0..LOCAL_CAPACITY * 2 {
            events.notify(ServerEvent::TaskChanged(task.to_string()));
        }
        events.notify(ServerEvent::ResourceUpdated("test://a".into()));
        assert_eq!(
            without_tasks.recv().await.ok(),
            Some(ServerEvent::ToolsListChanged)
        );
        assert_eq!(
            without_tasks.recv().await.ok(),
            Some(ServerEvent::ResourceUpdated("test://a".into()))
        );
        assert!(
            matches!(
                everything.recv().await,
                Err(broadcast::error::RecvError::Lagged(_))
            ),
            "a listener of every event fell behind"
        );
    }

    #[tokio::test]
    async fn without_a_relay_events_reach_local_listeners() {
        let events = Events::new();
        let mut listener = events.subscribe();
        events.notify(ServerEvent::ResourceUpdated("test://a".into()));
        assert_eq!(
            listener.recv().await.ok(),
            Some(ServerEvent::ResourceUpdated("test://a".into()))
        );
    }
}
