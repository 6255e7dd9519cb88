//! Assembling a server: sealing keys, the continuation and session stores (Redis when
//! configured, in memory otherwise), the engine, the protocol server and its HTTP router, from
//! plain [`Settings`]. A binary maps its own configuration (command line, environment) onto them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::auth::Authenticator;
use crate::drain::deadline_after;
use crate::mrtr::{Engine, StateSealer};
use crate::registry::Registry;
use crate::server::{CachePolicy, Events, Server, ServerInfo, TaskConfig};
use crate::store::{
    ContinuationStore, DEFAULT_SWEEP_EVERY, MemoryStore, MemoryTaskStore, RedisEventRelay,
    RedisStore, RedisStoreConfig, SessionStore, TaskStore,
};
use crate::tasks::TaskSettings;
use crate::transport::{
    self, ConnectionLimits, Drain, OriginPolicy, Readiness, StreamLimits, TransportOptions,
};

/// The MCP endpoint path.
pub const MCP_PATH: &str = "/mcp";

/// Beyond the shutdown grace period, how long the tasks stopped then may take to be recorded
/// and announced.
const WIND_DOWN_MARGIN: Duration = Duration::from_secs(8);

/// How to serve. [`Settings::default`] is a server alone on localhost with development keys.
#[derive(Debug, Clone)]
pub struct Settings {
    /// requestState sealing keys, `id:base64-32-bytes[,id:key…]`; the first seals, all open.
    /// `None` generates a development key (states then do not survive a restart and no other
    /// replica can open them), and says so in the log.
    pub state_keys: Option<String>,
    /// How long a client has to answer a round before its requestState expires (taken within a
    /// second and a year).
    pub state_ttl: Duration,
    /// Most continuations (and, apart, sessions and tasks) kept in memory at once. Full, the
    /// continuation and session stores evict their oldest entries; the task store keeps the
    /// tasks it has (a task is a promise to a client), and calls are answered in their requests.
    pub memory_capacity: u64,
    /// Most continuations (and, apart, sessions and tasks) one owner holds at once, in memory or
    /// in Redis: a signed-in principal, or an anonymous caller's address. Past it, the owner's
    /// own oldest continuations and sessions go; tasks are kept until they expire, and a call
    /// that would make one more goes on in its request (work that can only run as a task is
    /// refused with HTTP 429, told when the owner's first task expires).
    pub share_per_owner: u64,
    /// The shared store of replicas; in memory when `None`.
    pub redis: Option<RedisStoreConfig>,
    /// With Redis: how often this replica counts the continuations and sessions the store holds,
    /// and those that lapsed, for the metrics.
    pub redis_count_every: Duration,
    /// Origins allowed besides localhost (`*` allows any).
    pub allowed_origins: Vec<String>,
    /// Whether the server listens on a loopback address: then the host a request names (its
    /// `Host` header, or over HTTP/2 its `:authority`) must be local too (against DNS
    /// rebinding). Localhost origins are allowed either way.
    pub loopback: bool,
    /// Largest request body accepted, in bytes (larger ones get HTTP 413).
    pub max_body_bytes: usize,
    /// Most body bytes held at once across all requests being read and parsed.
    pub max_buffered_body_bytes: usize,
    /// Longest a client may take to send a request's body (HTTP 408).
    pub body_read_timeout: Duration,
    /// Longest a client may take to send a request's headers (the connection is closed): timed
    /// from the opening for the first request, from the first byte for later ones.
    pub header_read_timeout: Duration,
    /// Longest a connection may stay open with nothing to do; at least one second.
    pub idle_timeout: Duration,
    /// Most connections open at once; `None` for as many as the open-file limit allows (less
    /// 128 for everything else the process opens), at most 10,000.
    pub max_connections: Option<usize>,
    /// Most long-lived streams (`subscriptions/listen`, a legacy session's GET) open at once
    /// (more get HTTP 503), at most the connection cap less one; `None` for half the connection
    /// cap, so ordinary requests always find connections.
    pub max_streams: Option<usize>,
    /// Most long-lived streams one owner holds open at once; one more ends the owner's oldest.
    pub max_streams_per_owner: usize,
    /// On shutdown, how long requests being served, and tasks running, may take to finish.
    pub shutdown_grace: Duration,
    /// Begun when the server starts to shut down ([`serve`] begins it when its signal comes).
    pub drain: Drain,
    /// What `/readyz` checks besides the Redis store (which is checked whenever configured).
    pub readiness: Readiness,
    /// Period of keep-alive comments on streams, long-lived ones and those of requests that wait
    /// (taken within a millisecond and a day).
    pub keepalive: Duration,
    /// Most requests handled at once, counted from when their body is in (more wait a second,
    /// then get 503). Also how many 2025-11-25 calls run on after their clients closed their
    /// streams, a quarter of those per owner.
    pub max_concurrent_requests: usize,
    /// 2025-11-25 sessions: how long a tool waits for the client's answer to its question.
    pub legacy_request_timeout: Duration,
    /// 2025-11-25 sessions: how long a session lives unused (each request renews it).
    pub legacy_session_idle: Duration,
    /// 2025-11-25 sessions: how long a session lives at most, however busy.
    pub legacy_session_max: Duration,
    /// Whether the server offers the Tasks extension (`io.modelcontextprotocol/tasks`; yes by
    /// default). Without it no call becomes a task, discovery does not list the extension, and
    /// the `tasks/*` methods do not exist (-32601).
    pub offer_tasks: bool,
    /// Tasks (extension `io.modelcontextprotocol/tasks`): time-to-live, poll interval, lease.
    pub tasks: TaskSettings,
    /// How long clients may reuse discovery, lists and resource reads (`ttlMs`).
    pub cache: CachePolicy,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            state_keys: None,
            state_ttl: Duration::from_secs(600),
            memory_capacity: 100_000,
            share_per_owner: 1_000,
            redis: None,
            redis_count_every: DEFAULT_SWEEP_EVERY,
            allowed_origins: Vec::new(),
            loopback: true,
            max_body_bytes: 1024 * 1024,
            max_buffered_body_bytes: 64 * 1024 * 1024,
            body_read_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: None,
            max_streams: None,
            max_streams_per_owner: 16,
            shutdown_grace: Duration::from_secs(20),
            drain: Drain::default(),
            readiness: Readiness::default(),
            keepalive: Duration::from_secs(15),
            max_concurrent_requests: 512,
            legacy_request_timeout: Duration::from_secs(20),
            legacy_session_idle: Duration::from_secs(3600),
            legacy_session_max: Duration::from_secs(24 * 3600),
            offer_tasks: true,
            tasks: TaskSettings::default(),
            cache: CachePolicy::default(),
        }
    }
}

/// Where continuations and sessions are kept.
struct Stores {
    continuations: Arc<dyn ContinuationStore>,
    #[cfg_attr(not(feature = "legacy"), allow(dead_code))]
    sessions: Arc<dyn SessionStore>,
    tasks: Arc<dyn TaskStore>,
    /// The settings' readiness checks, and Redis's when it is configured.
    readiness: Readiness,
}

async fn stores(settings: &Settings) -> anyhow::Result<Stores> {
    let Some(config) = &settings.redis else {
        tracing::info!(
            capacity = settings.memory_capacity,
            "continuations kept in memory"
        );
        let store = Arc::new(MemoryStore::new(
            settings.memory_capacity,
            settings.share_per_owner,
        ));
        return Ok(Stores {
            continuations: store.clone(),
            sessions: store,
            tasks: Arc::new(MemoryTaskStore::new(
                settings.memory_capacity,
                settings.share_per_owner,
            )),
            readiness: settings.readiness.clone(),
        });
    };
    let store = Arc::new(
        RedisStore::connect(config.clone(), settings.share_per_owner)
            .await
            .context("connecting to the Redis continuation store")?
            .sweeping_every(settings.redis_count_every),
    );
    tracing::info!(prefix = %config.prefix, "continuations kept in Redis");
    let pinged = store.clone();
    let readiness = settings.readiness.clone().with("redis", move || {
        let store = pinged.clone();
        async move { store.ping().await.map_err(|e| e.0) }
    });
    Ok(Stores {
        continuations: store.clone(),
        sessions: store.clone(),
        tasks: store,
        readiness,
    })
}

/// The MRTR engine: the configured sealing keys (or a logged development key) and `store`.
fn engine(settings: &Settings, store: Arc<dyn ContinuationStore>) -> anyhow::Result<Engine> {
    let sealer = match &settings.state_keys {
        Some(spec) => StateSealer::from_spec(spec)
            .map_err(anyhow::Error::msg)
            .context("the requestState sealing keys")?,
        None => {
            tracing::warn!(
                "no requestState sealing keys configured: generated a development key; \
                 states will not survive a restart or open on another replica, and a legacy \
                 client's answer is taken only by the replica that asked"
            );
            StateSealer::generate()
        }
    };
    tracing::info!(
        key_id = sealer.active_key_id(),
        "requestState sealing ready"
    );
    Ok(Engine::new(sealer, store, settings.state_ttl))
}

/// The protocol server over `registry` and its HTTP router, serving MCP at [`MCP_PATH`]. With
/// Redis configured, `events` are relayed through it, so `subscriptions/listen` streams on every
/// replica hear about every change.
pub async fn router(
    settings: &Settings,
    registry: Registry,
    info: ServerInfo,
    events: Events,
    authenticator: Arc<dyn Authenticator>,
) -> anyhow::Result<axum::Router> {
    if let Some(config) = &settings.redis {
        let relay = RedisEventRelay::connect(config, "events")
            .await
            .context("connecting the change-event relay to Redis")?;
        tracing::info!(
            channel = relay.channel(),
            "change events relayed through Redis"
        );
        events.relay_through(relay);
    }
    let stores = stores(settings).await?;
    let readiness = stores.readiness;
    let server = Server::new(
        registry,
        engine(settings, stores.continuations)?,
        info,
        events,
        settings.cache,
        settings.offer_tasks.then(|| TaskConfig {
            store: stores.tasks,
            settings: settings.tasks.clone(),
            drain: settings.drain.clone(),
            shutdown_grace: settings.shutdown_grace,
        }),
    );
    let options = TransportOptions {
        origin: OriginPolicy::new(settings.allowed_origins.clone(), settings.loopback),
        authenticator,
        max_body_bytes: settings.max_body_bytes,
        body_read_timeout: settings.body_read_timeout,
        max_buffered_body_bytes: settings.max_buffered_body_bytes,
        keepalive: settings.keepalive,
        drain: settings.drain.clone(),
        streams: settings.stream_limits(),
        max_concurrent_requests: settings.max_concurrent_requests,
        #[cfg(feature = "legacy")]
        legacy: crate::transport::LegacyOptions {
            request_timeout: settings.legacy_request_timeout,
            session_idle: settings.legacy_session_idle,
            session_max: settings.legacy_session_max,
            sessions: stores.sessions,
            answer_relay: match &settings.redis {
                Some(config) => Some(
                    RedisEventRelay::connect(config, "answers")
                        .await
                        .context("connecting the legacy answer relay to Redis")?,
                ),
                None => None,
            },
        },
    };
    Ok(transport::router(server, options, MCP_PATH, readiness))
}

impl Settings {
    /// The connection bounds these settings ask for, fitted to this process's open-file limit.
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: transport::max_connections(self.max_connections),
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            shutdown_grace: self.shutdown_grace,
        }
    }

    /// The bounds on long-lived streams these settings ask for: by default half the connection
    /// cap in all, which leaves the other half to requests; never the whole connection cap, so
    /// that streams cannot keep every request out.
    pub fn stream_limits(&self) -> StreamLimits {
        let connections = self.connection_limits().max_connections;
        let total = self
            .max_streams
            .unwrap_or(connections / 2)
            .min(connections.saturating_sub(1));
        StreamLimits {
            total: total.max(1),
            per_owner: self.max_streams_per_owner.max(1),
        }
    }
}

/// Serves `router` on `bind` within `settings`' connection bounds until `shutdown` resolves;
/// then drains (see [`Drain`]) and returns once the requests being served are answered and the
/// tasks running are finished or recorded failed: within the grace period, and a few seconds
/// more to record the tasks stopped at its end.
pub async fn serve(
    bind: SocketAddr,
    settings: &Settings,
    router: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .with_context(|| format!("cannot listen on {bind}"))?;
    let limits = settings.connection_limits();
    tracing::info!(
        max_connections = limits.max_connections,
        "MCP endpoint on http://{}{MCP_PATH}",
        listener.local_addr()?
    );
    let drain = settings.drain.clone();
    let signal = drain.clone();
    tokio::spawn(async move {
        shutdown.await;
        signal.begin();
    });
    transport::serve(listener, router, limits, drain.clone()).await;
    // The tasks' grace began with the drain, as the requests' did.
    let began = drain.began_at().unwrap_or_else(tokio::time::Instant::now);
    let wound_down = tokio::time::timeout_at(
        deadline_after(
            began,
            settings.shutdown_grace.saturating_add(WIND_DOWN_MARGIN),
        ),
        drain.released(),
    );
    if wound_down.await.is_err() {
        tracing::warn!(
            "work that outlives its requests (tasks, legacy calls whose streams closed) was still running when the server stopped"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lived_streams_always_leave_a_connection_for_requests() {
        for (connections, streams, expected) in [
            (Some(1), None, (2, 1)),
            (Some(1), Some(5), (2, 1)),
            (Some(10), Some(10), (10, 9)),
            (Some(10), None, (10, 5)),
            (Some(10), Some(0), (10, 1)),
        ] {
            let settings = Settings {
                max_connections: connections,
                max_streams: streams,
                ..Settings::default()
            };
            let cap = settings.connection_limits().max_connections;
            let total = settings.stream_limits().total;
            assert_eq!((cap, total), expected, "{connections:?} {streams:?}");
        }
    }
}
