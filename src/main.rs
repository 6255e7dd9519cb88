//! The `moviedb-mcp` binary.

use std::sync::Arc;

use clap::Parser;
use moviedb_mcp::app;
use moviedb_mcp::auth::AnonymousOnly;
use moviedb_mcp::config::ServeArgs;
use moviedb_mcp::registry::Registry;
use moviedb_mcp::server::{Events, ServerInfo};

/// A Model Context Protocol server for a movie database (MCP 2026-07-28, with MRTR).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    app::init_logging();
    let cli = Cli::parse();
    let info = ServerInfo {
        name: "moviedb-mcp".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        instructions: None,
    };
    let router = app::router(
        &cli.serve,
        Registry::new(),
        info,
        Events::new(),
        Arc::new(AnonymousOnly),
    )?;
    app::serve(&cli.serve, router).await
}
