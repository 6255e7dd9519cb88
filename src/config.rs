//! Command-line and environment configuration shared by every binary that serves MCP.

use std::net::SocketAddr;
use std::time::Duration;

/// How to serve: where to listen, how to seal and park continuations, what HTTP to accept.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on; the MCP endpoint is /mcp.
    #[arg(long, env = "MOVIEDB_BIND", default_value = "127.0.0.1:3000")]
    pub bind: SocketAddr,

    /// requestState sealing keys, `id:base64-32-bytes[,id:key…]`; the first seals, all open.
    /// Give every replica the same list. When unset a development key is generated (states then
    /// do not survive a restart and no other replica can open them).
    #[arg(long, env = "MOVIEDB_STATE_KEYS", hide_env_values = true)]
    pub state_keys: Option<String>,

    /// How long a client has to answer a round before its requestState expires, in seconds (at
    /// most a week: work that waits longer belongs in a task).
    #[arg(long, env = "MOVIEDB_STATE_TTL", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=MOST_STATE_TTL_SECS))]
    pub state_ttl_secs: u64,

    /// Most continuations kept in memory at once (in-memory store).
    #[arg(long, env = "MOVIEDB_CONTINUATION_CAPACITY", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub continuation_capacity: u64,

    /// Most pending continuations, and apart legacy sessions and tasks, one caller holds at
    /// once: a signed-in user, or an anonymous caller's address. Past it, the caller's own oldest
    /// continuations and sessions go; tasks are kept until they expire, and a call that would
    /// make one more is answered in its request.
    #[arg(long, env = "MOVIEDB_SHARE_PER_CALLER", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub share_per_caller: u64,

    /// Redis URL for the shared continuation store (`redis://127.0.0.1:6379`), or the URLs of
    /// some nodes of a Redis Cluster, comma-separated; every replica pointed at the same Redis can
    /// resume any call. `rediss://` for TLS (certificates checked against the system's
    /// authorities, or those in `SSL_CERT_FILE`/`SSL_CERT_DIR` when set). In-memory store when
    /// unset.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,

    /// The Redis URL names a Redis Cluster (implied when it lists several nodes,
    /// comma-separated, or when its one node says it runs in cluster mode). The variable takes
    /// true/false, 1/0, yes/no or on/off.
    #[arg(long, env = "REDIS_CLUSTER",
          value_parser = clap::builder::BoolishValueParser::new())]
    pub redis_cluster: bool,

    /// Prefix of every Redis key this server writes.
    #[arg(long, env = "MOVIEDB_REDIS_PREFIX", default_value = "moviedb:")]
    pub redis_prefix: String,

    /// Longest a Redis call may take before the request fails with -32603, in milliseconds (1
    /// to 60,000).
    #[arg(long, env = "MOVIEDB_REDIS_TIMEOUT_MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub redis_timeout_ms: u64,

    /// With Redis: how often this replica counts what the store holds (pending continuations,
    /// open legacy sessions) and what lapsed unread, for the metrics, in seconds (1 to 3,600).
    #[arg(long, env = "MOVIEDB_REDIS_COUNT_SECS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub redis_count_secs: u64,

    /// Legacy (2025-11-25) sessions: how long a tool waits for the client's answer to an
    /// elicitation or sampling request, in seconds (1 to 86,400).
    #[arg(
        long,
        env = "MOVIEDB_LEGACY_REQUEST_TIMEOUT",
        default_value_t = 20,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub legacy_request_timeout_secs: u64,

    /// Legacy (2025-11-25) sessions: how long a session lives unused, in seconds; each request
    /// gives it this long again (at most 30 days).
    #[arg(long, env = "MOVIEDB_LEGACY_SESSION_IDLE", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=MOST_SESSION_SECS))]
    pub legacy_session_idle_secs: u64,

    /// Legacy (2025-11-25) sessions: how long a session lives at most, however busy, in seconds
    /// (at most 30 days).
    #[arg(long, env = "MOVIEDB_LEGACY_SESSION_MAX", default_value_t = 24 * 3600,
          value_parser = clap::value_parser!(u64).range(1..=MOST_SESSION_SECS))]
    pub legacy_session_max_secs: u64,

    /// Origins allowed besides localhost, comma-separated (`*` allows any).
    #[arg(long, env = "MOVIEDB_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// Largest request body accepted, in bytes (larger ones get HTTP 413): from 1 KiB to 1 GiB.
    #[arg(long, env = "MOVIEDB_MAX_BODY_BYTES", default_value_t = 1024 * 1024,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..=1 << 30))]
    pub max_body_bytes: usize,

    /// Most requests handled at once, counted from when their body is in; more wait a second,
    /// then get HTTP 503 with Retry-After (at most a million). Also how many 2025-11-25 calls
    /// run on after their clients closed their streams, a quarter of those per caller.
    #[arg(long, env = "MOVIEDB_MAX_CONCURRENT_REQUESTS", default_value_t = 512,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub max_concurrent_requests: usize,

    /// Most request body bytes held at once across all requests being read and parsed, claimed
    /// as they arrive; a request whose next bytes do not fit waits a second, then gets HTTP 503
    /// (1 KiB to 64 GiB).
    #[arg(long, env = "MOVIEDB_MAX_BUFFERED_BODY_BYTES", default_value_t = 64 * 1024 * 1024,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..=1 << 36))]
    pub max_buffered_body_bytes: usize,

    /// Most connections open at once; when reached, the connection idle the longest is closed.
    /// At least 2 (a stream must leave one for requests); ceiling: the open-file limit less
    /// 128; default: that, or 10000 if lower.
    #[arg(long, env = "MOVIEDB_MAX_CONNECTIONS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(2..))]
    pub max_connections: Option<usize>,

    /// Most long-lived streams (subscriptions/listen, 2025-11-25 GET) open at once, at most the
    /// connection cap less one; more get HTTP 503. Default: half the connection cap, so requests
    /// always find connections.
    #[arg(long, env = "MOVIEDB_MAX_STREAMS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_streams: Option<usize>,

    /// Most long-lived streams one caller (a signed-in user, or an anonymous address) holds open
    /// at once; one more ends the caller's oldest.
    #[arg(long, env = "MOVIEDB_MAX_STREAMS_PER_CALLER", default_value_t = 16,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_streams_per_caller: usize,

    /// Seconds a client has to send a request's headers before its connection is closed (1 to
    /// 3,600).
    #[arg(long, env = "MOVIEDB_HEADER_READ_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_secs: u64,

    /// Seconds a client has to send a request's body once its headers are in (HTTP 408), 1 to
    /// 3,600.
    #[arg(long, env = "MOVIEDB_BODY_READ_TIMEOUT_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_read_timeout_secs: u64,

    /// Seconds a connection may sit with no request and no traffic before it is closed (a
    /// stream is a request until it ends), 1 to 86,400.
    #[arg(long, env = "MOVIEDB_IDLE_TIMEOUT_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout_secs: u64,

    /// On SIGTERM or Ctrl-C, seconds the requests being served, and the tasks running, have to
    /// finish (tasks still running then are recorded failed), at most 3,600.
    #[arg(long, env = "MOVIEDB_SHUTDOWN_GRACE_SECS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_grace_secs: u64,

    /// Seconds between keep-alive comments on streams, those of subscriptions and of calls that
    /// wait (at most half an hour, well
    /// inside the read timeouts of proxies, such as deploy/nginx.conf's hour).
    #[arg(long, env = "MOVIEDB_KEEPALIVE_SECS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(1..=1800))]
    pub keepalive_secs: u64,

    /// Resource-server sign-in: the issuer URL of the OAuth 2.1 authorization server whose access
    /// tokens this server accepts (its metadata and keys are discovered from it). Unset: the
    /// development sign-in with `moviedb-mcp token`.
    #[arg(long, env = "MOVIEDB_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,

    /// Resource-server sign-in: this server's canonical URL (such as
    /// `https://movies.example.com/mcp`), the audience access tokens must name. Like the other
    /// resource-server settings, refused without --auth-issuer (which would leave the development
    /// sign-in on, and anonymous callers in).
    #[arg(long, env = "MOVIEDB_RESOURCE_URL", requires = "auth_issuer")]
    pub resource_url: Option<String>,

    /// Resource-server sign-in: seconds of clock difference allowed on a token's `exp` and `nbf`
    /// (at most 300: more would take tokens long expired).
    #[arg(long, env = "MOVIEDB_AUTH_LEEWAY_SECS", requires = "auth_issuer", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=300))]
    pub auth_leeway_secs: u64,

    /// Resource-server sign-in: the least seconds between two fetches of the authorization
    /// server's keys, which a token signed with an unknown key id, or keys past their most age,
    /// trigger (at most an hour, so that rotated keys are found).
    #[arg(long, env = "MOVIEDB_AUTH_KEY_REFRESH_SECS", requires = "auth_issuer", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub auth_key_refresh_secs: u64,

    /// Resource-server sign-in: seconds the authorization server's keys are trusted as fetched;
    /// older, they are fetched again in the background (only a token naming an unknown key id
    /// waits for it), so that a key the authorization server withdrew stops signing anyone in.
    /// Keys that cannot be fetched stay as they are, tried again every
    /// --auth-key-refresh-secs, which is also the least age in effect (1 to 86,400).
    #[arg(long, env = "MOVIEDB_AUTH_KEYS_MAX_AGE_SECS", requires = "auth_issuer", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub auth_keys_max_age_secs: u64,

    /// Serve Prometheus metrics (`GET /metrics`) on this address instead of the MCP listener's,
    /// so they need not be public.
    #[arg(long, env = "MOVIEDB_METRICS_BIND")]
    pub metrics_bind: Option<SocketAddr>,

    /// Tasks (extension `io.modelcontextprotocol/tasks`): how long a task is kept after it was
    /// created, in seconds (its `ttlMs`), at most 30 days.
    #[arg(long, env = "MOVIEDB_TASK_TTL_SECS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=MOST_TASK_TTL_SECS))]
    pub task_ttl_secs: u64,

    /// Tasks: how often clients are asked to poll a task, in milliseconds (`pollIntervalMs`), at
    /// most a minute.
    #[arg(long, env = "MOVIEDB_TASK_POLL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub task_poll_ms: u64,

    /// Tasks: how long a replica's hold on a running task lasts unless renewed, in milliseconds;
    /// a replica that dies leaves its running tasks `failed` within this time. From 300 (a
    /// third of it apart is renewed: well above a store round trip) to 600,000.
    #[arg(long, env = "MOVIEDB_TASK_LEASE_MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(300..=MOST_TASK_LEASE_MS))]
    pub task_lease_ms: u64,

    /// Tasks: most tasks this replica runs at once (a summary task holds one LLM provider
    /// call); more wait their turn. While it holds four times as many, running or waiting, a
    /// call that would become a new task is answered in its request, and answers that would
    /// resume a task are refused with HTTP 503, to be sent again. At most a million.
    #[arg(long, env = "MOVIEDB_TASK_MAX_RUNNING", default_value_t = 64,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub task_max_running: usize,
}

/// The longest a requestState may wait for its answers: a week.
const MOST_STATE_TTL_SECS: u64 = 7 * 86_400;
/// The longest a legacy session may live, idle or at all: 30 days.
const MOST_SESSION_SECS: u64 = 30 * 86_400;
/// The longest a task may be kept: 30 days.
const MOST_TASK_TTL_SECS: u64 = 30 * 86_400;
/// The longest lease a replica may hold on a task: 10 minutes.
const MOST_TASK_LEASE_MS: u64 = 600_000;

impl ServeArgs {
    /// The library's settings for these arguments.
    pub fn settings(&self) -> mcp_mrtr::service::Settings {
        mcp_mrtr::service::Settings {
            state_keys: self.state_keys.clone(),
            state_ttl: self.state_ttl(),
            memory_capacity: self.continuation_capacity,
            share_per_owner: self.share_per_caller,
            redis: self.redis(),
            redis_count_every: Duration::from_secs(self.redis_count_secs),
            allowed_origins: self.allowed_origins.clone(),
            loopback: self.bind.ip().is_loopback(),
            max_body_bytes: self.max_body_bytes,
            keepalive: Duration::from_secs(self.keepalive_secs),
            max_concurrent_requests: self.max_concurrent_requests,
            max_buffered_body_bytes: self.max_buffered_body_bytes,
            body_read_timeout: Duration::from_secs(self.body_read_timeout_secs),
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            max_connections: self.max_connections,
            max_streams: self.max_streams,
            max_streams_per_owner: self.max_streams_per_caller,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
            legacy_request_timeout: Duration::from_secs(self.legacy_request_timeout_secs),
            legacy_session_idle: Duration::from_secs(self.legacy_session_idle_secs),
            legacy_session_max: Duration::from_secs(self.legacy_session_max_secs),
            tasks: mcp_mrtr::tasks::TaskSettings {
                ttl: Duration::from_secs(self.task_ttl_secs),
                poll_interval: Duration::from_millis(self.task_poll_ms),
                lease: Duration::from_millis(self.task_lease_ms),
                max_running: self.task_max_running,
            },
            ..mcp_mrtr::service::Settings::default()
        }
    }

    /// Where replicas share state, when Redis is configured.
    pub fn redis(&self) -> Option<crate::store::RedisStoreConfig> {
        self.redis_url
            .as_ref()
            .map(|url| crate::store::RedisStoreConfig {
                url: url.clone(),
                prefix: self.redis_prefix.clone(),
                timeout: Duration::from_millis(self.redis_timeout_ms),
                cluster: self.redis_cluster,
            })
    }

    pub fn state_ttl(&self) -> Duration {
        Duration::from_secs(self.state_ttl_secs)
    }
}

/// Whether `url` names this machine (`localhost`, or a loopback address): the only hosts a
/// secret may be sent to over plain `http`.
pub fn names_loopback(url: &reqwest::Url) -> bool {
    url.host_str().is_some_and(|host| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    })
}
