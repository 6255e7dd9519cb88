//! Protocol revisions this server speaks, and the names of the `_meta` keys they use.

/// The modern, stateless revision, served on every request whose `MCP-Protocol-Version` header
/// names a revision that is not a legacy one, and on every request outside a legacy session
/// whose `_meta` carries one of its `io.modelcontextprotocol/…` keys (within one, whose `_meta`
/// names its protocol version).
pub const MODERN: &str = "2026-07-28";

/// Revisions whose clients open a session with `initialize` (served by the `legacy` feature).
pub const LEGACY_REVISIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// The legacy revisions a client may agree on at `initialize`: those whose wire this server
/// follows. 2025-03-26 obliges a server to take JSON-RPC batches, which this one refuses, and
/// 2024-11-05 predates Streamable HTTP: a client asking for either is offered 2025-11-25, as
/// the lifecycle allows, and decides whether to go on.
pub const AGREED_AT_INITIALIZE: [&str; 2] = ["2025-11-25", "2025-06-18"];

/// Every revision a request may name and be served with, newest first.
pub fn supported() -> &'static [&'static str] {
    &[MODERN]
}

/// Whether `version` names a revision of the initialize-handshake era.
pub fn is_legacy(version: &str) -> bool {
    LEGACY_REVISIONS.contains(&version)
}

/// `_meta` key naming the protocol revision a 2026-07-28 request is written for.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key carrying the client's `Implementation` (name and version), optional.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key carrying the capabilities the client declares for this one request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key carrying the least severe log level the client wants sent for this request.
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
/// `_meta` key under which every 2026-07-28 result reports the server's name and version.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key tagging each `subscriptions/listen` frame with the subscription it belongs to.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The Tasks extension's identifier, in client and server `extensions` capabilities.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
