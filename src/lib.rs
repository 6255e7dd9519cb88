//! # moviedb-mcp
//!
//! A Model Context Protocol server for a movie database, and the reference implementation of
//! Multi Round-Trip Requests (MRTR) from MCP revision 2026-07-28.
//!
//! ## Layout
//!
//! The MCP machinery is the [`mcp_mrtr`] library crate (`crates/mcp-mrtr`), which knows nothing
//! about movies; its modules are re-exported here under the same names. This crate adds the movie
//! domain and the binary around it.
//!
//! - [`moviedb`]: the catalogue (SQLite or PostgreSQL), review summaries (server-side or an LLM
//!   provider) and the movie tools. It knows tools and `RequestContext`, never HTTP.
//! - [`auth`]: sign-in with HS256 JWTs (`moviedb-mcp token`), on the library's principal.
//! - [`config`] and [`app`]: the `MOVIEDB_*` settings and running the endpoint from them;
//!   [`telemetry`]: log lines and OpenTelemetry traces.
//! - [`bounded`]: reading other services' answers up to a size.
//! - From the library: [`protocol`] (wire types), [`mrtr`] (the engine: `ctx.elicit`, rounds,
//!   sealed `requestState`), [`store`] (continuations and sessions, memory or Redis),
//!   [`registry`], [`server`] (dispatch) and [`transport`] (Streamable HTTP).
//!
//! ## The path of a request
//!
//! `POST /mcp` → [`transport`] checks Origin, content type, size, the `MCP-Protocol-Version`,
//! `Mcp-Method` and `Mcp-Name` headers against the body and the `_meta` → [`server::Server`]
//! finds the tool → [`mrtr::Engine`] opens any `requestState`, takes its continuation, runs the
//! tool (say [`moviedb::tools`]' `addToWatchlist`) → the tool either completes, or asks through
//! its [`mrtr::RequestContext`] and the engine answers `input_required` with a freshly sealed
//! state.

pub mod app;
pub mod auth;
pub mod bounded;
pub mod config;
pub mod moviedb;
pub mod telemetry;

pub use mcp_mrtr::{mrtr, protocol, registry, server, service, store, transport};
