//! Assembling a server from configuration — keys, continuation store, engine, transport — and
//! running it until Ctrl-C or SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::auth::Authenticator;
use crate::config::ServeArgs;
use crate::mrtr::{Engine, StateSealer};
use crate::registry::Registry;
use crate::server::{Events, Server, ServerInfo};
use crate::store::{ContinuationStore, MemoryStore, RedisEventRelay, RedisStore, SessionStore};
use crate::transport::{self, OriginPolicy, TransportOptions};

/// The MCP endpoint path.
pub const MCP_PATH: &str = "/mcp";

/// Builds the MRTR engine: sealing keys from the configuration (or a logged development key)
/// and the continuation store.
fn engine(args: &ServeArgs, store: Arc<dyn ContinuationStore>) -> anyhow::Result<Engine> {
    let sealer = match &args.state_keys {
        Some(spec) => StateSealer::from_spec(spec)
            .map_err(anyhow::Error::msg)
            .context("MOVIEDB_STATE_KEYS")?,
        None => {
            tracing::warn!(
                "MOVIEDB_STATE_KEYS is not set: generated a development key for requestState sealing; \
                 states will not survive a restart or open on another replica"
            );
            StateSealer::generate()
        }
    };
    tracing::info!(
        key_id = sealer.active_key_id(),
        "requestState sealing ready"
    );
    Ok(Engine::new(sealer, store, args.state_ttl()))
}

/// Where continuations and sessions are kept: Redis when configured, in memory otherwise.
struct Stores {
    continuations: Arc<dyn ContinuationStore>,
    #[cfg_attr(not(feature = "legacy"), allow(dead_code))]
    sessions: Arc<dyn SessionStore>,
}

async fn stores(args: &ServeArgs) -> anyhow::Result<Stores> {
    let Some(config) = args.redis() else {
        tracing::info!(
            capacity = args.continuation_capacity,
            "continuations kept in memory"
        );
        let store = Arc::new(MemoryStore::new(args.continuation_capacity));
        return Ok(Stores {
            continuations: store.clone(),
            sessions: store,
        });
    };
    let store = Arc::new(
        RedisStore::connect(config)
            .await
            .context("connecting to the Redis continuation store")?,
    );
    tracing::info!(prefix = %args.redis_prefix, "continuations kept in Redis");
    Ok(Stores {
        continuations: store.clone(),
        sessions: store,
    })
}

/// Builds the protocol server and its HTTP router. With Redis configured, `events` are relayed
/// through it, so `subscriptions/listen` streams on every replica hear about every change.
pub async fn router(
    args: &ServeArgs,
    registry: Registry,
    info: ServerInfo,
    events: Events,
    authenticator: Arc<dyn Authenticator>,
) -> anyhow::Result<axum::Router> {
    if let Some(config) = args.redis() {
        let relay = RedisEventRelay::connect(&config, "events")
            .await
            .context("connecting the change-event relay to Redis")?;
        tracing::info!(
            channel = relay.channel(),
            "change events relayed through Redis"
        );
        events.relay_through(relay);
    }
    let stores = stores(args).await?;
    let server = Server::new(registry, engine(args, stores.continuations)?, info, events);
    let options = TransportOptions {
        origin: OriginPolicy::new(args.allowed_origins.clone(), args.bind.ip().is_loopback()),
        authenticator,
        max_body_bytes: args.max_body_bytes,
        keepalive: Duration::from_secs(args.keepalive_secs.max(1)),
        #[cfg(feature = "legacy")]
        legacy: crate::transport::LegacyOptions {
            request_timeout: Duration::from_secs(args.legacy_request_timeout_secs.max(1)),
            session_ttl: Duration::from_secs(args.legacy_session_ttl_secs.max(60)),
            sessions: stores.sessions,
            answer_relay: match args.redis() {
                Some(config) => Some(
                    RedisEventRelay::connect(&config, "answers")
                        .await
                        .context("connecting the legacy answer relay to Redis")?,
                ),
                None => None,
            },
        },
    };
    Ok(transport::router(server, options, MCP_PATH))
}

/// Binds `args.bind` and serves until Ctrl-C or SIGTERM.
pub async fn serve(args: &ServeArgs, router: axum::Router) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("cannot listen on {}", args.bind))?;
    tracing::info!(
        "MCP endpoint on http://{}{MCP_PATH}",
        listener.local_addr()?
    );
    transport::serve(listener, router, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
