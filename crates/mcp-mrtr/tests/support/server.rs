//! The server under test, in-process: the library's service on a free port of 127.0.0.1 with the
//! test tools of [`fixtures`](super::fixtures), callers named by an `X-Test-User` header, and
//! probes that tell what the tools really ran.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mcp_mrtr::auth::{AuthError, Authenticator, Caller, Principal};
use mcp_mrtr::mrtr::StateSealer;
use mcp_mrtr::server::{CachePolicy, Events, ServerInfo};
use mcp_mrtr::service::{self, MCP_PATH, Settings};
use mcp_mrtr::store::RedisStoreConfig;
use mcp_mrtr::transport::Readiness;
use tokio::sync::oneshot;

use super::Client;
use super::fixtures::test_registry;

/// Resolves the caller from an `X-Test-User` header; without it the caller is anonymous. An
/// `X-Test-Valid-For-Ms` header makes the caller's credentials expire that long from now.
pub struct TestUserAuthenticator;

#[async_trait::async_trait]
impl Authenticator for TestUserAuthenticator {
    async fn authenticate(&self, headers: &axum::http::HeaderMap) -> Result<Caller, AuthError> {
        let principal = match headers.get("x-test-user") {
            None => Principal::Anonymous,
            Some(value) => match value.to_str() {
                Ok(name) if !name.trim().is_empty() => Principal::User(name.trim().to_owned()),
                _ => return Err(AuthError::new("X-Test-User must be a non-empty name")),
            },
        };
        let caller = Caller::unlimited(principal);
        match headers.get("x-test-valid-for-ms") {
            None => Ok(caller),
            Some(value) => match value.to_str().ok().and_then(|ms| ms.parse::<u64>().ok()) {
                Some(ms) => Ok(caller
                    .expiring(std::time::SystemTime::now() + std::time::Duration::from_millis(ms))),
                None => Err(AuthError::new("X-Test-Valid-For-Ms must be milliseconds")),
            },
        }
    }
}

/// Settings a test may change; everything else is the server's ordinary configuration.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub state_ttl_secs: u64,
    pub max_body_bytes: usize,
    pub allowed_origins: Vec<String>,
    pub keepalive_secs: u64,
    /// Shared continuation store; in memory when `None`.
    pub redis_url: Option<String>,
    /// Its key prefix; `mcp-test-<process id>:` when `None`.
    pub redis_prefix: Option<String>,
    /// Continuations, and apart legacy sessions, one caller may hold.
    pub share_per_owner: u64,
    /// Sealing keys; a fresh key per server when `None`.
    pub state_keys: Option<String>,
    /// How long a legacy call waits for the client's answer.
    pub legacy_request_timeout_secs: u64,
    /// How long a legacy session lives unused, and at most.
    pub legacy_session_idle_secs: u64,
    pub legacy_session_max_secs: u64,
    /// Most requests handled at once.
    pub max_concurrent_requests: usize,
    /// The `ttlMs` of cacheable results.
    pub cache: CachePolicy,
    /// What `/readyz` checks.
    pub readiness: Readiness,
    /// Whether the server offers the Tasks extension.
    pub offer_tasks: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            state_ttl_secs: 600,
            max_body_bytes: 1024 * 1024,
            allowed_origins: Vec::new(),
            keepalive_secs: 15,
            redis_url: None,
            redis_prefix: None,
            share_per_owner: 1_000,
            state_keys: None,
            legacy_request_timeout_secs: 20,
            legacy_session_idle_secs: 3600,
            legacy_session_max_secs: 24 * 3600,
            max_concurrent_requests: 512,
            cache: CachePolicy::default(),
            readiness: Readiness::default(),
            offer_tasks: true,
        }
    }
}

/// What the test tools record about their own execution, so tests can tell what really ran.
#[derive(Debug, Default)]
pub struct Probes {
    /// Times the `greet` handler started (any round).
    pub greet_runs: AtomicUsize,
    /// Times the work `remembered_lookup` remembers actually ran.
    pub lookup_work_runs: AtomicUsize,
    /// `slow_progress` started its work.
    pub slow_started: AtomicBool,
    /// `slow_progress` reached its end.
    pub slow_finished: AtomicBool,
    /// `slow_progress`'s future was dropped before it reached its end (it was cancelled).
    pub slow_dropped_early: AtomicBool,
    /// `asks_when_let_go` waits on this before it asks its question.
    pub ask_gate: tokio::sync::Notify,
    /// `asks_when_let_go` is waiting on `ask_gate`.
    pub ask_waiting: AtomicBool,
    /// What `asks_when_let_go` got for its question (`Debug` of the answer).
    pub late_answer: std::sync::Mutex<Option<String>>,
}

impl Probes {
    pub fn greet_runs(&self) -> usize {
        self.greet_runs.load(Ordering::SeqCst)
    }

    pub fn lookup_work_runs(&self) -> usize {
        self.lookup_work_runs.load(Ordering::SeqCst)
    }
}

/// A server started in-process from the library, listening on 127.0.0.1 on a free port.
pub struct TestServer {
    addr: SocketAddr,
    pub probes: Arc<Probes>,
    pub events: Events,
    shutdown: Option<oneshot::Sender<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(ServerOptions::default()).await
    }

    pub async fn start_with(options: ServerOptions) -> Self {
        let probes = Arc::new(Probes::default());
        let events = Events::new();
        let registry = test_registry(&probes, &events);
        let settings = Settings {
            state_keys: Some(
                options
                    .state_keys
                    .unwrap_or_else(|| StateSealer::generate_spec("test")),
            ),
            state_ttl: Duration::from_secs(options.state_ttl_secs),
            memory_capacity: 10_000,
            share_per_owner: options.share_per_owner,
            redis: options.redis_url.map(|url| RedisStoreConfig {
                url,
                prefix: options
                    .redis_prefix
                    .unwrap_or_else(|| format!("mcp-test-{}:", std::process::id())),
                timeout: Duration::from_secs(1),
                cluster: false,
            }),
            allowed_origins: options.allowed_origins,
            loopback: true,
            max_body_bytes: options.max_body_bytes,
            keepalive: Duration::from_secs(options.keepalive_secs),
            max_concurrent_requests: options.max_concurrent_requests,
            legacy_request_timeout: Duration::from_secs(options.legacy_request_timeout_secs),
            legacy_session_idle: Duration::from_secs(options.legacy_session_idle_secs),
            legacy_session_max: Duration::from_secs(options.legacy_session_max_secs),
            cache: options.cache,
            readiness: options.readiness,
            offer_tasks: options.offer_tasks,
            ..Settings::default()
        };
        let info = ServerInfo {
            name: "mcp-mrtr-tests".into(),
            version: "0.0.0-test".into(),
            instructions: Some("Test server".into()),
        };
        let router = service::router(
            &settings,
            registry,
            info,
            events.clone(),
            Arc::new(TestUserAuthenticator),
        )
        .await
        .expect("the router builds");
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let (shutdown, stop) = oneshot::channel::<()>();
        let limits = settings.connection_limits();
        let drain = settings.drain.clone();
        tokio::spawn(async move {
            let _ = stop.await;
            drain.begin();
        });
        tokio::spawn(mcp_mrtr::transport::serve(
            listener,
            router,
            limits,
            settings.drain.clone(),
        ));
        Self {
            addr,
            probes,
            events,
            shutdown: Some(shutdown),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The MCP endpoint.
    pub fn url(&self) -> String {
        format!("http://{}{MCP_PATH}", self.addr)
    }

    /// An anonymous client of this server.
    pub fn client(&self) -> Client {
        super::checked_client(self.url())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}
