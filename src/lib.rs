//! # moviedb-mcp
//!
//! A Model Context Protocol server for a movie database, and the reference implementation of
//! Multi Round-Trip Requests (MRTR) from MCP revision 2026-07-28.
//!
//! ## Layout
//!
//! The crate is layered; each layer knows only the ones below it.
//!
//! - [`protocol`]: wire types — the JSON-RPC envelope, `_meta`, input requests and responses,
//!   content, error codes.
//! - [`mrtr`]: the MRTR engine — the handler context (`ctx.elicit(...)`), rounds and the sealed
//!   `requestState`.
//! - [`store`]: the continuation store behind `requestState` (in memory, or Redis for replicas).
//! - [`registry`]: tools, prompts and resources with their handlers.
//! - [`server`]: method dispatch over a registry; change events for `subscriptions/listen`.
//! - [`transport`]: Streamable HTTP (axum) — header and Origin validation, JSON or SSE replies.
//! - [`app`] and [`config`]: assembling all of it from configuration and serving it.
//!
//! ## The path of a request
//!
//! `POST /mcp` → [`transport`] checks Origin, content type, size, the `MCP-Protocol-Version`,
//! `Mcp-Method` and `Mcp-Name` headers against the body and the `_meta` → [`server::Server`]
//! finds the tool → [`mrtr::Engine`] opens any `requestState`, takes its continuation, runs the
//! handler → the handler either completes, or asks through its [`mrtr::RequestContext`] and the
//! engine answers `input_required` with a freshly sealed state.

pub mod app;
pub mod auth;
pub mod config;
pub mod moviedb;
pub mod mrtr;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod store;
pub mod transport;
