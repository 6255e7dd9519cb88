//! What the server writes about itself: log lines on stderr, filtered by `RUST_LOG`, and the
//! same spans exported over OTLP/HTTP when OpenTelemetry's variables name an endpoint. An export
//! that fails says so in the log.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use mcp_mrtr::log_budget::LogBudget;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The OpenTelemetry export, when configured: flushed and stopped when dropped.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // The exporter's blocking HTTP client must not be dropped on the async runtime.
            match std::thread::spawn(move || provider.shutdown()).join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("stopping the OTLP trace export: {e}"),
                Err(_) => tracing::warn!("stopping the OTLP trace export panicked"),
            }
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`); and when `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, exports the same spans over OTLP/HTTP,
/// following the standard `OTEL_*` variables, as service `moviedb-mcp` unless
/// `OTEL_SERVICE_NAME` says otherwise. Keep the returned value alive until the end.
pub fn init_logging() -> Telemetry {
    let mut filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // async-openai logs a failed provider call's whole body (a 5xx page, an answer that is not
    // JSON), which may echo the API key: the summarizer logs each failure itself, trimmed and
    // with the key scrubbed.
    if let Ok(quiet) = "async_openai=off".parse() {
        filter = filter.add_directive(quiet);
    }
    // Colours only for a terminal: a log file or journal would keep the escape codes.
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let (provider, failure) = match otlp_endpoint() {
        None => (None, None),
        Some(_) => match tracer_provider() {
            Ok(provider) => (Some(provider), None),
            Err(e) => (None, Some(e)),
        },
    };
    let export = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("moviedb-mcp"))
            // Not the HTTP layer's span: it starts before the body, where `_meta.traceparent`
            // is, is read, and the MCP request span under it carries the trace instead.
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target() != "mcp_mrtr::transport::layers"
            }))
    });
    // One filter for both: `RUST_LOG` (default `info`) decides which spans exist, logged or
    // exported alike.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(log)
        .with(export)
        .try_init();
    match (&provider, failure) {
        (Some(_), _) => tracing::info!(
            endpoint = crate::moviedb::catalogue::redact(&otlp_endpoint().unwrap_or_default()),
            "traces exported over OTLP/HTTP"
        ),
        (None, Some(e)) => tracing::error!("cannot set up the OTLP trace export: {e:#}"),
        (None, None) => {}
    }
    Telemetry { provider }
}

/// Where traces go, when OpenTelemetry's variables say.
fn otlp_endpoint() -> Option<String> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .find_map(|name| std::env::var(name).ok().filter(|value| !value.is_empty()))
}

/// The tracer provider exporting over OTLP/HTTP in batches. Built on a thread of its own: the
/// exporter's blocking HTTP client must not be made on the async runtime.
fn tracer_provider() -> anyhow::Result<SdkTracerProvider> {
    std::thread::spawn(|| {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .context("building the OTLP span exporter")?;
        let mut resource =
            Resource::builder().with_attribute(KeyValue::new("service.instance.id", instance_id()));
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("moviedb-mcp");
        }
        Ok(SdkTracerProvider::builder()
            .with_batch_exporter(Reporting(exporter))
            .with_resource(resource.build())
            .build())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the OTLP exporter panicked"))?
}

/// A line per failed export at most 5 times a second (a collector that is down fails them all).
static EXPORT_FAILURES: LogBudget = LogBudget::new("otlp_export_failed");

/// The OTLP exporter, saying in the log when a batch of spans could not be sent (the SDK reports
/// it only through its `internal-logs` feature, which would log its routine too).
#[derive(Debug)]
struct Reporting<E>(E);

impl<E: SpanExporter> SpanExporter for Reporting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let exported = self.0.export(batch).await;
        if let Err(e) = &exported
            && let Some(held_back) = EXPORT_FAILURES.take()
        {
            tracing::warn!(spans, held_back, "cannot export traces over OTLP: {e}");
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// A random name for this process among the replicas.
fn instance_id() -> String {
    let mut bytes = [0u8; 8];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut bytes);
    hex::encode(bytes)
}
