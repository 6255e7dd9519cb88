//! Running the movie server's endpoint from its command line: the library's assembly with the
//! `MOVIEDB_*` settings, logging, Prometheus metrics at `/metrics`, and a stop on Ctrl-C or
//! SIGTERM.

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

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

/// Latency buckets of every `*_seconds` histogram: from half a millisecond to five minutes (a
/// user answering a question).
const SECONDS_BUCKETS: [f64; 17] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// Installs the Prometheus recorder every metric of the process goes to, and keeps its
/// histograms drained.
pub fn install_metrics() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full("mcp_mrtr_rounds_per_conversation".into()),
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0],
        )?
        .set_buckets_for_metric(
            Matcher::Full("moviedb_sql_batch_size".into()),
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
        )?
        .install_recorder()
        .context("installing the Prometheus metrics recorder")?;
    mcp_mrtr::describe_metrics();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `GET /metrics` in Prometheus's text format.
pub fn metrics_routes(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                (
                    [("content-type", "text/plain; version=0.0.4")],
                    handle.render(),
                )
            }
        }),
    )
}

/// Serves `/metrics` on `bind`, apart from the MCP endpoint.
pub async fn serve_metrics_apart(bind: SocketAddr, handle: PrometheusHandle) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("cannot listen for metrics on {bind}"))?;
    tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, metrics_routes(handle)).await {
            tracing::error!("the metrics endpoint stopped: {e}");
        }
    });
    Ok(())
}
