//! The request methods this server knows, parsed once from the JSON-RPC `method` string and used
//! by dispatch, header validation and both transports.

use std::fmt;

/// A request method of either era's wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `server/discover`: the server's supported revisions, capabilities and info.
    ServerDiscover,
    /// `tools/list`: the tools the server offers.
    ToolsList,
    /// `tools/call`: runs a tool; may answer `input_required` and be retried with the answers.
    ToolsCall,
    /// `prompts/list`: the prompts the server offers.
    PromptsList,
    /// `prompts/get`: renders a prompt with arguments; may ask for input like a tool call.
    PromptsGet,
    /// `resources/list`: the concrete resources the server offers.
    ResourcesList,
    /// `resources/read`: the contents of one resource by URI; may ask for input.
    ResourcesRead,
    /// `resources/templates/list`: the URI templates the server can read resources from.
    ResourcesTemplatesList,
    /// `completion/complete`: suggestions for a prompt argument or resource template variable.
    CompletionComplete,
    /// `subscriptions/listen`: a long-lived stream of list-changed and resource-updated events.
    SubscriptionsListen,
    /// `tasks/get` (Tasks extension): a task's status, with its questions or its outcome.
    TasksGet,
    /// `tasks/update` (Tasks extension): answers to a task's outstanding questions.
    TasksUpdate,
    /// `tasks/cancel` (Tasks extension): asks a task to stop.
    TasksCancel,
    /// 2025-11-25 sessions only, like the four below.
    Initialize,
    /// `ping`: a liveness check answered with an empty result.
    Ping,
    /// `logging/setLevel`: sets the session's log level for later requests.
    LoggingSetLevel,
    /// `resources/subscribe`: asks for `notifications/resources/updated` about one URI.
    ResourcesSubscribe,
    /// `resources/unsubscribe`: stops the updates `resources/subscribe` asked for.
    ResourcesUnsubscribe,
}

impl Method {
    const ALL: [Method; 18] = [
        Self::ServerDiscover,
        Self::ToolsList,
        Self::ToolsCall,
        Self::PromptsList,
        Self::PromptsGet,
        Self::ResourcesList,
        Self::ResourcesRead,
        Self::ResourcesTemplatesList,
        Self::CompletionComplete,
        Self::SubscriptionsListen,
        Self::TasksGet,
        Self::TasksUpdate,
        Self::TasksCancel,
        Self::Initialize,
        Self::Ping,
        Self::LoggingSetLevel,
        Self::ResourcesSubscribe,
        Self::ResourcesUnsubscribe,
    ];

    /// The method named `name`, if this server knows it.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|method| method.as_str() == name)
    }

    /// The method's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServerDiscover => "server/discover",
            Self::ToolsList => "tools/list",
            Self::ToolsCall => "tools/call",
            Self::PromptsList => "prompts/list",
            Self::PromptsGet => "prompts/get",
            Self::ResourcesList => "resources/list",
            Self::ResourcesRead => "resources/read",
            Self::ResourcesTemplatesList => "resources/templates/list",
            Self::CompletionComplete => "completion/complete",
            Self::SubscriptionsListen => "subscriptions/listen",
            Self::TasksGet => "tasks/get",
            Self::TasksUpdate => "tasks/update",
            Self::TasksCancel => "tasks/cancel",
            Self::Initialize => "initialize",
            Self::Ping => "ping",
            Self::LoggingSetLevel => "logging/setLevel",
            Self::ResourcesSubscribe => "resources/subscribe",
            Self::ResourcesUnsubscribe => "resources/unsubscribe",
        }
    }

    /// Whether the stateless 2026-07-28 wire has this method.
    pub fn is_modern(self) -> bool {
        !matches!(
            self,
            Self::Initialize
                | Self::Ping
                | Self::LoggingSetLevel
                | Self::ResourcesSubscribe
                | Self::ResourcesUnsubscribe
        )
    }

    /// The params field that `Mcp-Name` mirrors, for methods aimed at a named target.
    pub fn name_field(self) -> Option<&'static str> {
        match self {
            Self::ToolsCall | Self::PromptsGet => Some("name"),
            Self::ResourcesRead => Some("uri"),
            Self::TasksGet | Self::TasksUpdate | Self::TasksCancel => Some("taskId"),
            _ => None,
        }
    }

    /// Whether its handler may send progress or log messages before the result (and so may be
    /// answered with SSE). These are also the methods that can ask for input.
    pub fn streams(self) -> bool {
        matches!(
            self,
            Self::ToolsCall | Self::PromptsGet | Self::ResourcesRead
        )
    }

    /// Whether the method lists a collection that the spec lets come in pages (`cursor` in,
    /// `nextCursor` out).
    pub fn is_paginated(self) -> bool {
        matches!(
            self,
            Self::ToolsList
                | Self::PromptsList
                | Self::ResourcesList
                | Self::ResourcesTemplatesList
        )
    }

    /// Whether the method belongs to the Tasks extension (`tasks/*`).
    pub fn is_task_method(self) -> bool {
        matches!(self, Self::TasksGet | Self::TasksUpdate | Self::TasksCancel)
    }

    /// The capability area (`tools`, `prompts`, `resources`, `completion`) the method belongs to,
    /// if any.
    pub fn area(self) -> Option<&'static str> {
        match self {
            Self::ToolsList | Self::ToolsCall => Some("tools"),
            Self::PromptsList | Self::PromptsGet => Some("prompts"),
            Self::ResourcesList
            | Self::ResourcesRead
            | Self::ResourcesTemplatesList
            | Self::ResourcesSubscribe
            | Self::ResourcesUnsubscribe => Some("resources"),
            Self::CompletionComplete => Some("completion"),
            _ => None,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_parses_back_from_its_name() {
        for method in Method::ALL {
            assert_eq!(Method::parse(method.as_str()), Some(method));
        }
        assert_eq!(Method::parse("tools/unknown"), None);
        assert_eq!(
            Method::parse("Tools/Call"),
            None,
            "names are case-sensitive"
        );
    }
}
