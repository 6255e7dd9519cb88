//! # mcp-mrtr
//!
//! A Model Context Protocol server library for revision 2026-07-28, built around Multi
//! Round-Trip Requests (MRTR): a tool asks for what it needs in straight-line code, and the
//! library turns each question into an `input_required` round, seals the state the client
//! echoes back, parks the continuation in a store any replica can read, and runs the tool again
//! when the answers come. With the `legacy` feature the same tools serve 2025-11-25 clients,
//! whose questions become server-initiated requests on the call's stream.
//!
//! ## A server in a page
//!
//! A tool that asks the user a question, and the two rounds a client goes through to get its
//! result, driven by the library's test client (feature `client`); this example runs as a test:
//!
//! ```
//! use std::sync::Arc;
//!
//! use mcp_mrtr::auth::AnonymousOnly;
//! use mcp_mrtr::client::{Client, accept};
//! use mcp_mrtr::mrtr::{HandlerError, RequestContext};
//! use mcp_mrtr::protocol::content::CallToolResult;
//! use mcp_mrtr::protocol::input::Elicitation;
//! use mcp_mrtr::registry::{Registry, Tool};
//! use mcp_mrtr::server::{Events, ServerInfo};
//! use mcp_mrtr::service::{self, Settings};
//! use serde_json::{Value, json};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct Order {
//!     /// What to order.
//!     item: String,
//! }
//!
//! /// Asks how many, then confirms. Nothing here knows about rounds or state: on the first call
//! /// `elicit` ends the call with `input_required`; on the retry it returns the answer.
//! async fn order(ctx: RequestContext, order: Order) -> Result<CallToolResult, HandlerError> {
//!     let form = json!({
//!         "type": "object",
//!         "properties": { "count": { "type": "integer", "minimum": 1 } },
//!         "required": ["count"]
//!     });
//!     let count = match ctx.elicit("count", "How many?", form).await? {
//!         Elicitation::Accepted(answer) => answer.get("count").and_then(|n| n.as_u64()).unwrap_or(1),
//!         _ => 1, // declined, cancelled, or a client that cannot show forms
//!     };
//!     Ok(CallToolResult::text(format!("Ordered {count} × {}", order.item)))
//! }
//!
//! #[tokio::main]
//! async fn main() -> anyhow::Result<()> {
//!     let mut registry = Registry::new();
//!     registry.add_tool(Tool::new("order", "Orders an item.", order));
//!     let info = ServerInfo { name: "shop".into(), version: "1.0.0".into(), instructions: None };
//!     let events = Events::new();
//!     let settings = Settings::default();
//!     let router =
//!         service::router(&settings, registry, info, events, Arc::new(AnonymousOnly)).await?;
//!     // `service::serve(address, &settings, router, shutdown)` serves for real; here, a free port.
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//!     let url = format!("http://{}{}", listener.local_addr()?, service::MCP_PATH);
//!     let limits = settings.connection_limits();
//!     tokio::spawn(mcp_mrtr::transport::serve(listener, router, limits, settings.drain.clone()));
//!
//!     // A client's rounds: the call, then the retry with the answer and the echoed
//!     // requestState. `converse` answers each question with the closure and keeps every round.
//!     let client = Client::new(url);
//!     let answer = |_: &str, _: &Value| accept(json!({"count": 2}));
//!     let talk = client.converse("order", json!({"item": "tea"}), answer).await;
//!     assert_eq!(talk.questions(), [vec!["count".to_owned()], vec![]]);
//!     assert_eq!(talk.last().text(), "Ordered 2 × tea");
//!     Ok(())
//! }
//! ```
//!
//! ## Layout
//!
//! Layered; each module knows only the ones above it in this list.
//!
//! - [`protocol`]: wire types — the JSON-RPC envelope, [`protocol::Method`], `_meta`, input
//!   requests and responses, content, error codes.
//! - [`auth`]: who is calling ([`auth::Principal`]) and the [`auth::Authenticator`] that says.
//! - [`store`]: where continuations wait between rounds ([`store::ContinuationStore`], take at
//!   most once) and where sessions live ([`store::SessionStore`]); in memory, or Redis for
//!   replicas.
//! - [`mrtr`]: the engine — the handler's [`mrtr::RequestContext`], the [`mrtr::Asker`] its
//!   questions go to (rounds, or a live 2025-11-25 peer), and the sealed `requestState`.
//! - [`registry`]: tools, prompts and resources with their handlers and portable JSON schemas.
//! - [`tasks`]: the Tasks extension — tasks kept in a [`store::TaskStore`] every replica reads,
//!   run under a lease by the replica that created or resumed them.
//! - [`server`]: method dispatch over a registry; change events for `subscriptions/listen`.
//! - [`transport`]: Streamable HTTP (axum) — the front door, the 2026-07-28 wire, the legacy
//!   wire, responses and SSE.
//! - [`service`]: all of it assembled from plain [`service::Settings`].
//! - `client` (feature `client`): a scripted 2026-07-28 client for testing MRTR servers: whole
//!   conversations answered by closures, or hand-built rounds.

#![warn(missing_docs)]

pub mod auth;
#[cfg(feature = "client")]
pub mod client;
mod drain;
pub mod log_budget;
pub mod mrtr;
mod observe;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod service;
pub mod store;
pub mod tasks;
mod trace_context;
pub mod transport;

pub use observe::enable as enable_metrics;
