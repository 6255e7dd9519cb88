//! Server-side change events (list changes, resource updates) fanned out to every open
//! `subscriptions/listen` stream, and the per-stream filter that decides which ones a client sees.

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::protocol::ProtocolError;
use crate::protocol::RequestId;
use crate::protocol::jsonrpc::notification_bytes;
use crate::protocol::version::META_SUBSCRIPTION_ID;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    ToolsListChanged,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated(String),
}

/// The fan-out point for change events. Cloning shares the same channel.
#[derive(Clone)]
pub struct Events {
    tx: broadcast::Sender<ServerEvent>,
}

impl Default for Events {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(256).0,
        }
    }
}

impl Events {
    pub fn new() -> Self {
        Self::default()
    }

    /// Delivers `event` to every listener that opted in; nobody listening is fine.
    pub fn notify(&self, event: ServerEvent) {
        let _ = self.tx.send(event);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<ServerEvent> {
        self.tx.subscribe()
    }
}

/// What one `subscriptions/listen` stream asked for, reduced to what this server honours.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Subscription {
    pub id: Option<RequestId>,
    pub tools_list_changed: bool,
    pub prompts_list_changed: bool,
    pub resources_list_changed: bool,
    pub resource_uris: Vec<String>,
}

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
        Ok(Self {
            id: Some(id),
            tools_list_changed: flag("toolsListChanged"),
            prompts_list_changed: flag("promptsListChanged"),
            resources_list_changed: flag("resourcesListChanged"),
            resource_uris,
        })
    }

    /// Drops the notification types a server without tools, prompts or resources never sends, so
    /// the acknowledgement reflects what will actually be honoured.
    pub fn limited_to(mut self, tools: bool, prompts: bool, resources: bool) -> Self {
        self.tools_list_changed &= tools;
        self.prompts_list_changed &= prompts;
        self.resources_list_changed &= resources;
        if !resources {
            self.resource_uris.clear();
        }
        self
    }

    pub fn wants(&self, event: &ServerEvent) -> bool {
        match event {
            ServerEvent::ToolsListChanged => self.tools_list_changed,
            ServerEvent::PromptsListChanged => self.prompts_list_changed,
            ServerEvent::ResourcesListChanged => self.resources_list_changed,
            ServerEvent::ResourceUpdated(uri) => self.resource_uris.contains(uri),
        }
    }

    fn meta(&self) -> Value {
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
        let params = json!({ "_meta": self.meta(), "notifications": honoured });
        notification_bytes("notifications/subscriptions/acknowledged", &params)
    }

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
        };
        params["_meta"] = self.meta();
        notification_bytes(method, &params)
    }
}
