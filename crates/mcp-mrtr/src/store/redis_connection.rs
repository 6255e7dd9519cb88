//! How the stores reach Redis: one server, or a Redis Cluster when the URL lists several nodes,
//! the configuration says so, or the one node listed says it runs in cluster mode. Either way a
//! [`RedisConnection`] reconnects by itself, and every call through [`query`] is bounded by a
//! timeout.
//!
//! The clients reconnect when a connection fails, but not when it falls silent: a server gone
//! without a reset (its address moved, a firewall dropping the flow) leaves the socket open
//! until the kernel gives up, a quarter of an hour later. On a cluster, the client follows
//! redirections, but a master that died before its replica took over leaves it retrying the dead
//! address. So a silent call (or, on a cluster, any failing one) makes the connection open anew
//! (at most once a second) while the calls go on over the old one, and the calls after it reach
//! the server, or the new master. Sockets also carry TCP keepalives and a bound on unacknowledged
//! data, so that the kernel notices a dead peer within seconds too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{TcpSettings, socket2::TcpKeepalive};
use redis::{Cmd, IntoConnectionInfo as _, Pipeline, RedisFuture, Value};

use super::StoreError;

/// How to reach the Redis the stores share.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// The Redis connection URL, such as `redis://127.0.0.1:6379`; for a Redis Cluster, the URLs
    /// of some of its nodes, comma-separated.
    pub url: String,
    /// Prepended to every key, so several deployments can share one Redis.
    pub prefix: String,
    /// Longest any one Redis call may take before the request fails.
    pub timeout: Duration,
    /// Whether `url` names a Redis Cluster even when it lists a single node. Without it, a single
    /// node that says it runs in cluster mode is connected to as a cluster anyway.
    pub cluster: bool,
}

impl RedisStoreConfig {
    /// The node URLs `url` lists. A comma separates two URLs only where a scheme follows it, so
    /// one in a password stays part of it.
    pub(super) fn nodes(&self) -> Vec<&str> {
        let mut nodes = Vec::new();
        let mut rest = self.url.as_str();
        while let Some(comma) = rest
            .match_indices(',')
            .map(|(at, _)| at)
            .find(|&at| names_a_scheme(&rest[at + 1..]))
        {
            nodes.push(&rest[..comma]);
            rest = &rest[comma + 1..];
        }
        nodes.push(rest);
        // A comma before nothing, or before another comma, separates nothing.
        nodes
            .into_iter()
            .map(|node| node.trim().trim_end_matches([',', ' ']).trim())
            .filter(|node| !node.is_empty())
            .collect()
    }

    /// The client of one listed node, its sockets set to notice a dead peer.
    pub(super) fn node_client(&self, node: &str) -> redis::RedisResult<redis::Client> {
        let info = node.into_connection_info()?;
        redis::Client::open(info.set_tcp_settings(tcp_settings(self.timeout)))
    }

    /// Whether this is said to be a Redis Cluster: several nodes listed, or the flag set. (A single
    /// node may still turn out to be one when connecting: [`Connected::is_cluster`].)
    pub fn is_cluster(&self) -> bool {
        self.cluster || self.nodes().len() > 1
    }
}

/// Whether `text` starts with a Redis URL scheme.
fn names_a_scheme(text: &str) -> bool {
    let text = text.trim_start();
    [
        "redis://",
        "rediss://",
        "redis+unix://",
        "unix://",
        "valkey://",
        "valkeys://",
    ]
    .iter()
    .any(|scheme| {
        text.get(..scheme.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(scheme))
    })
}

/// Socket settings that notice a dead peer: keepalive probes on an idle connection, and a bound
/// on how long sent data may go unacknowledged (a few timeouts, at least ten seconds, so that a
/// slow answer is not mistaken for a dead server). No Nagle delay on small commands.
pub(super) fn tcp_settings(timeout: Duration) -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(Duration::from_secs(10))
        .with_interval(Duration::from_secs(5))
        .with_retries(3);
    let settings = TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive);
    // The bound on unacknowledged data is a Linux socket option.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let settings = settings.set_user_timeout((timeout * 5).max(Duration::from_secs(10)));
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "fuchsia")))]
    let _ = timeout;
    settings
}

/// A connection to one Redis server or to a Redis Cluster; cheap to clone.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server, through a connection that reconnects by itself when it fails, and is opened
    /// anew when it falls silent.
    Single(Arc<Renewable<ConnectionManager>>),
    /// A cluster, through a connection that is rebuilt when the cluster changed under it.
    Cluster(Arc<Renewable<ClusterConnection>>),
}

/// How a connection is opened anew.
type Open<C> = Box<dyn Fn() -> BoxFuture<'static, redis::RedisResult<C>> + Send + Sync>;

/// A connection, and what it takes to open it anew when calls on it go wrong.
pub struct Renewable<C> {
    current: Mutex<C>,
    open: Open<C>,
    /// What is opened anew, for the log.
    what: &'static str,
    /// Longest an opening may take: past it the renewal gives up, and a later call may try again.
    open_limit: Duration,
    renewing: AtomicBool,
    /// Milliseconds after `clock` when the last renewal started, plus one (0: none yet).
    last_renewal: AtomicU64,
    clock: Instant,
}

/// The least time between two renewals of a connection.
const RENEWAL_INTERVAL: Duration = Duration::from_secs(1);

impl<C: Clone + Send + 'static> Renewable<C> {
    fn new(current: C, what: &'static str, open_limit: Duration, open: Open<C>) -> Arc<Self> {
        Arc::new(Self {
            current: Mutex::new(current),
            open,
            what,
            open_limit,
            renewing: AtomicBool::new(false),
            last_renewal: AtomicU64::new(0),
            clock: Instant::now(),
        })
    }

    fn connection(&self) -> C {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// A call went wrong: open the connection anew in the background, unless that was done
    /// less than [`RENEWAL_INTERVAL`] ago or is under way.
    fn suspect(self: &Arc<Self>) {
        let now = u64::try_from(self.clock.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self.last_renewal.load(Ordering::Relaxed);
        let interval = u64::try_from(RENEWAL_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        let recent = last != 0 && now.saturating_sub(last) < interval;
        if recent || self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_renewal.store(now, Ordering::Relaxed);
        let renewable = self.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(renewable.open_limit, (renewable.open)()).await {
                Ok(Ok(fresh)) => {
                    *renewable
                        .current
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
                    tracing::info!("{} opened anew", renewable.what);
                }
                Ok(Err(e)) => tracing::warn!("opening the {} anew failed: {e}", renewable.what),
                Err(_) => tracing::warn!(
                    "opening the {} anew took over {:?}; given up",
                    renewable.what,
                    renewable.open_limit
                ),
            }
            renewable.renewing.store(false, Ordering::Release);
        });
    }
}

impl RedisConnection {
    /// Awaits a call on this connection for at most `timeout`. A silence makes the connection
    /// open anew; on a cluster, so does a failure (the cluster may have changed under it).
    pub async fn bounded<T>(
        &self,
        timeout: Duration,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let outcome = tokio::time::timeout(timeout, call).await;
        // The client's own response timeout is as long as ours and often fires first.
        let silent = match &outcome {
            Err(_) => true,
            Ok(Err(e)) => e.is_timeout(),
            Ok(Ok(_)) => false,
        };
        match (&outcome, self) {
            (_, Self::Single(single)) if silent => single.suspect(),
            (Err(_) | Ok(Err(_)), Self::Cluster(cluster)) => cluster.suspect(),
            _ => {}
        }
        settled(timeout, outcome)
    }
}

impl<C: ConnectionLike + Clone + Send + 'static> Renewable<C> {
    /// Sends `cmd` on the current connection (a clone: the lock is not held across the call).
    fn command<'a>(&self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let mut connection = self.connection();
        Box::pin(async move { connection.req_packed_command(cmd).await })
    }

    /// Sends `count` commands of `pipeline` from `offset` on the current connection.
    fn commands<'a>(
        &self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let mut connection = self.connection();
        Box::pin(async move {
            connection
                .req_packed_commands(pipeline, offset, count)
                .await
        })
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(single) => single.command(cmd),
            Self::Cluster(cluster) => cluster.command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(single) => single.commands(pipeline, offset, count),
            Self::Cluster(cluster) => cluster.commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(single) => single.connection().get_db(),
            Self::Cluster(cluster) => cluster.connection().get_db(),
        }
    }
}

/// What [`connect`] opens: the connection for commands, and a client per listed node for pub/sub
/// (on a cluster, a message published on any node reaches subscribers on every node).
pub struct Connected {
    /// For commands.
    pub connection: RedisConnection,
    /// For subscriptions, tried in turn when one fails.
    pub nodes: Vec<redis::Client>,
}

impl Connected {
    /// Whether the commands go to a Redis Cluster: listed as one, or found to be one.
    pub fn is_cluster(&self) -> bool {
        matches!(self.connection, RedisConnection::Cluster(_))
    }
}

/// Connects, failing at once if Redis cannot be reached now. A single URL that names a node of a
/// Redis Cluster is connected to as a cluster: its slots may be spread over other nodes, and even
/// when they are not, a command or script that names keys of two slots is refused there.
pub async fn connect(config: &RedisStoreConfig) -> Result<Connected, StoreError> {
    let nodes = config
        .nodes()
        .into_iter()
        .map(|node| config.node_client(node))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError(format!("bad Redis URL: {e}")))?;
    let Some(first) = nodes.first() else {
        return Err(StoreError("no Redis URL given".into()));
    };
    // Each step has its own limit: a slow probe does not eat the cluster discovery's time.
    let limit = config.timeout * 3;
    let single = if config.is_cluster() {
        None
    } else {
        bounded(limit, probe_single(config, first)).await?
    };
    let connection = match single {
        Some(manager) => {
            let node = first.clone();
            let manager_config = manager_config(config);
            let open: Open<ConnectionManager> = Box::new(move || {
                let (node, manager_config) = (node.clone(), manager_config.clone());
                Box::pin(ConnectionManager::new_with_config(node, manager_config))
            });
            RedisConnection::Single(Renewable::new(manager, "Redis connection", limit, open))
        }
        None => bounded(limit, open_cluster(config)).await?,
    };
    Ok(Connected { connection, nodes })
}

/// A connection to the single server `node`, or `None` when it says it is a cluster node.
async fn probe_single(
    config: &RedisStoreConfig,
    node: &redis::Client,
) -> redis::RedisResult<Option<ConnectionManager>> {
    let manager = ConnectionManager::new_with_config(node.clone(), manager_config(config)).await?;
    if !is_cluster_node(&manager).await? {
        return Ok(Some(manager));
    }
    // Said once, though the stores, the event relay and a cache each connect.
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        tracing::info!("the Redis URL names a node of a Redis Cluster: connecting to the cluster");
    }
    Ok(None)
}

/// How the connection to a single server behaves: bounded connecting and answering, one retry.
fn manager_config(config: &RedisStoreConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500))
}

/// A connection to the cluster the listed nodes belong to (the client finds the other nodes).
async fn open_cluster(config: &RedisStoreConfig) -> redis::RedisResult<RedisConnection> {
    let client = redis::cluster::ClusterClient::builder(config.nodes())
        .connection_timeout(config.timeout)
        .response_timeout(config.timeout)
        .tcp_settings(tcp_settings(config.timeout))
        .build()?;
    let connection = client.get_async_connection().await?;
    let open: Open<ClusterConnection> = Box::new(move || {
        let client = client.clone();
        Box::pin(async move { client.get_async_connection().await })
    });
    Ok(RedisConnection::Cluster(Renewable::new(
        connection,
        "Redis Cluster connection (its topology rediscovered)",
        config.timeout * 3,
        open,
    )))
}

/// Whether the server says it runs in cluster mode: `INFO cluster`, or, for a user whose ACL
/// refuses `INFO` (it is in `@dangerous`), whether `CLUSTER INFO` answers, which only a cluster
/// node does. A server that refuses both is taken for a single server; a connection that fails
/// or times out fails the start, rather than deciding "single server" for the process's life.
async fn is_cluster_node(manager: &ConnectionManager) -> redis::RedisResult<bool> {
    let mut connection = manager.clone();
    let info = redis::cmd("INFO")
        .arg("cluster")
        .query_async::<String>(&mut connection)
        .await;
    match info {
        Ok(info) => Ok(info.lines().any(|line| line.trim() == "cluster_enabled:1")),
        Err(e) if !refused_by_server(&e) => Err(e),
        Err(_) => match redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async::<String>(&mut connection)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if refused_by_server(&e) => Ok(false),
            Err(e) => Err(e),
        },
    }
}

/// Whether Redis answered with an error reply (a refusal), as opposed to not answering.
fn refused_by_server(error: &redis::RedisError) -> bool {
    matches!(
        error.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// Runs one command, failing when Redis errs or does not answer within `timeout`.
pub async fn query<T: redis::FromRedisValue>(
    connection: &RedisConnection,
    timeout: Duration,
    command: &Cmd,
) -> Result<T, StoreError> {
    let mut calling = connection.clone();
    connection
        .bounded(timeout, command.query_async(&mut calling))
        .await
}

/// Awaits a Redis call, or a step of connecting, for at most `timeout`.
pub(super) async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    settled(timeout, tokio::time::timeout(timeout, call).await)
}

/// What a call bounded by `timeout` came to.
fn settled<T>(
    timeout: Duration,
    outcome: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
) -> Result<T, StoreError> {
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(StoreError(e.to_string())),
        Err(_) => Err(StoreError(format!(
            "Redis did not answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(url: &str) -> Vec<String> {
        let config = RedisStoreConfig {
            url: url.into(),
            prefix: String::new(),
            timeout: Duration::from_secs(1),
            cluster: false,
        };
        config.nodes().into_iter().map(str::to_owned).collect()
    }

    #[test]
    fn a_comma_separates_nodes_only_before_a_url() {
        assert_eq!(
            listed("redis://a:7000, rediss://b:7001,redis://c:7002,"),
            ["redis://a:7000", "rediss://b:7001", "redis://c:7002"]
        );
        assert_eq!(
            listed("redis://:pa,ss@127.0.0.1:6379"),
            ["redis://:pa,ss@127.0.0.1:6379"]
        );
        assert_eq!(
            listed("redis://:a,b@h:1,REDIS://:c,d@h:2"),
            ["redis://:a,b@h:1", "REDIS://:c,d@h:2"]
        );
        assert_eq!(
            listed("redis://a:1, ,redis://b:2"),
            ["redis://a:1", "redis://b:2"]
        );
    }
}
