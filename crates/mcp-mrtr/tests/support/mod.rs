//! Shared support for the integration tests of the library, one concern a module:
//!
//! - [`server`]: the in-process server under test (the library's service on a free port) and
//!   [`fixtures`], the test tools it offers;
//! - [`checked_client`]: the library's own client (`mcp_mrtr::client`), checking every message
//!   against the official JSON schema with [`schema`];
//! - [`net`]: free ports, random names, waiting on ports; [`redis`]: a private redis-server.
//!
//! The workspace's own tests (`tests/` at the root) include this module too, beside their own.
//! Each test file that uses it declares `mod support;`; not every file uses every helper (or
//! every re-export below), hence the allowances.
#![allow(dead_code, unused_imports)]

pub mod fixtures;
pub mod net;
pub mod redis;
pub mod redis_cluster;
pub mod schema;
pub mod server;

use std::time::Duration;

pub use mcp_mrtr::client::{
    Client, EventStream, REQUEST_TIMEOUT, Reply, RpcRequest, accept, assert_structured_fits,
    default_capabilities, fresh_id,
};
pub use server::{Probes, ServerOptions, TestServer, TestUserAuthenticator};

/// A client of the endpoint at `url` that checks every message the server sends against the
/// official schema of 2026-07-28.
pub fn checked_client(url: String) -> Client {
    Client::new(url).observe(schema::validate_server_message)
}

/// `message` POSTed to `url` as a 2025-11-25 client sends it: within `session` once it has one.
pub fn legacy_post(
    http: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    message: &serde_json::Value,
) -> reqwest::RequestBuilder {
    let request = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .json(message);
    match session {
        Some(session) => request
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25"),
        None => request,
    }
}

/// The protocol revision the tests speak.
pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// The tools `tools/list` shows, in registration order (hidden trigger tools are not listed).
pub const LISTED_TOOLS: [&str; 11] = [
    "simple_text",
    "greet",
    "three_questions",
    "remembered_lookup",
    "progress_steps",
    "chatty",
    "slow_progress",
    "needs_sampling",
    "ask_model",
    "regional",
    "open_link",
];
