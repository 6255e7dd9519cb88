//! Running the movie server's endpoint from its command line: the library's assembly with the
//! `MOVIEDB_*` settings, Prometheus metrics at `/metrics`, and a stop on Ctrl-C or SIGTERM (its
//! log and traces are [`telemetry`](crate::telemetry)'s).

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
    let tls_hint = if config.url.contains("rediss://") {
        " (over TLS, its certificate must check out against the system's certificate \
         authorities, or those in SSL_CERT_FILE or SSL_CERT_DIR when set)"
    } else {
        ""
    };
    match mcp_mrtr::store::connect_redis(&config).await {
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!(
            "cannot reach Redis at {} ({e}): set REDIS_URL (or --redis-url) to a Redis that \
             answers{tls_hint}, or unset it to keep continuations and sessions in this process",
            crate::moviedb::catalogue::redact(&config.url)
        ),
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    StopSignals::listen().next().await;
}

/// Resolves on the first Ctrl-C or SIGTERM, when the server begins to drain. A second one ends
/// the process at once, with the status a process killed by that signal reports (130 or 143),
/// for an operator who will not wait for the calls under way.
pub async fn drain_signal() {
    let mut stops = StopSignals::listen();
    stops.next().await;
    tracing::info!(
        "stopping: finishing the calls under way (a second Ctrl-C or SIGTERM stops at once)"
    );
    tokio::spawn(async move {
        let status = stops.next().await;
        tracing::warn!("a second stop signal: stopping now, calls under way unanswered");
        std::process::exit(status);
    });
}

/// Ctrl-C and SIGTERM, listened to from the start, so that none is missed between two waits.
struct StopSignals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next signal; returns the exit status it stands for (128 + its number).
    #[cfg(unix)]
    async fn next(&mut self) -> i32 {
        async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
            let heard = match signal {
                Some(signal) => signal.recv().await.is_some(),
                None => false,
            };
            if !heard {
                // Not listened to, or no longer: it never comes.
                std::future::pending::<()>().await;
            }
        }
        tokio::select! {
            () = received(self.interrupt.as_mut()) => 130,
            () = received(self.terminate.as_mut()) => 143,
        }
    }

    #[cfg(not(unix))]
    async fn next(&mut self) -> i32 {
        match tokio::signal::ctrl_c().await {
            Ok(()) => 130,
            Err(_) => std::future::pending().await,
        }
    }
}

/// Latency buckets of every `*_seconds` histogram: from half a millisecond to ten minutes (a
/// user answering a question, within the default time a `requestState` stays valid).
const SECONDS_BUCKETS: [f64; 18] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 600.0,
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
    mcp_mrtr::enable_metrics();
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
