//! Support for the workspace's integration tests: the library's own support (the in-process
//! server, the client, SSE reading, schema validation, ports, a private Redis; see
//! `crates/mcp-mrtr/tests/support/`), re-exported here, and what only the movie server needs:
//!
//! - [`movies`]: the real `moviedb-mcp` binary on a fresh catalogue;
//! - [`cluster`]: replicas, the cluster launcher and signed-in sessions;
//! - [`legacy`]: a 2025-11-25 client; [`openai`]: a local OpenAI-compatible provider;
//! - [`postgres`]: fresh PostgreSQL databases; [`tls_redis`]: a Redis that speaks only TLS.
#![allow(dead_code, unused_imports)]

#[path = "../../crates/mcp-mrtr/tests/support/mod.rs"]
mod library;

pub mod cluster;
pub mod legacy;
pub mod movies;
pub mod openai;
pub mod postgres;
pub mod tls_redis;

pub use library::*;
