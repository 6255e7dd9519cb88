//! Shared support for the integration tests of the library, one concern a module:
//!
//! - [`server`]: the in-process server under test (the library's service on a free port) and
//!   [`fixtures`], the test tools it offers;
//! - [`client`]: a 2026-07-28 client over reqwest, and [`sse`] for reading streamed answers;
//! - [`schema`]: validation of every message against the official JSON schema;
//! - [`net`]: free ports, random names, waiting on ports; [`redis`]: a private redis-server.
//!
//! The workspace's own tests (`tests/` at the root) include this module too, beside their own.
//! Each test file that uses it declares `mod support;`; not every file uses every helper (or
//! every re-export below), hence the allowances.
#![allow(dead_code, unused_imports)]

pub mod client;
pub mod fixtures;
pub mod net;
pub mod redis;
pub mod schema;
pub mod server;
pub mod sse;

use std::time::Duration;

pub use client::{
    Client, Reply, RpcRequest, accept, assert_structured_fits, default_capabilities, fresh_id,
};
pub use server::{Probes, ServerOptions, TestServer, TestUserAuthenticator};
pub use sse::EventStream;

/// The protocol revision the tests speak.
pub const PROTOCOL_VERSION: &str = "2026-07-28";
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// Upper bound for any single HTTP exchange, so a broken server fails a test instead of hanging it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The tools `tools/list` shows, in registration order (hidden trigger tools are not listed).
pub const LISTED_TOOLS: [&str; 10] = [
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
];
