//! Running the movie server's endpoint from its command line: the library's assembly with the
//! `MOVIEDB_*` settings, logging, and a stop on Ctrl-C or SIGTERM.

use std::io::IsTerminal as _;

use crate::config::ServeArgs;

pub use mcp_mrtr::service::MCP_PATH;

/// Fails, saying what to set, when Redis is configured but does not answer: checked once at
/// start-up, before the stores, the event relay and the summary cache all try it.
pub async fn check_redis(args: &ServeArgs) -> anyhow::Result<()> {
    let Some(config) = args.redis() else {
        return Ok(());
    };
    match mcp_mrtr::store::connect_redis(&config).await {
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!(
            "cannot reach Redis at {} ({e}): set REDIS_URL (or --redis-url) to a Redis that \
             answers, or unset it to keep continuations and sessions in this process",
            crate::moviedb::catalogue::redact(&config.url)
        ),
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colours only for a terminal: a log file or journal would keep the escape codes.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
