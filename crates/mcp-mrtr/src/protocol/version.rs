//! Protocol revisions this server speaks, and the names of the `_meta` keys they use.

/// The modern, stateless revision served on every request that carries `_meta`.
pub const MODERN: &str = "2026-07-28";

/// Revisions whose clients open a session with `initialize` (served by the `legacy` feature).
pub const LEGACY_REVISIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Every revision a request may name and be served with, newest first.
pub fn supported() -> &'static [&'static str] {
    &[MODERN]
}

/// Whether `version` names a revision of the initialize-handshake era.
pub fn is_legacy(version: &str) -> bool {
    LEGACY_REVISIONS.contains(&version)
}

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
