//! How the stores reach Redis: one server, or a Redis Cluster when the URL lists several nodes,
//! the configuration says so, or the one node listed says it runs in cluster mode. Either way a
//! [`RedisConnection`] reconnects by itself, and every call through [`query`] is bounded by a
//! timeout.
//!
//! On a cluster, the client follows redirections, but a master that died before its replica took
//! over leaves it retrying the dead address. So a failing or silent call makes the connection
//! rediscover the cluster from the listed nodes (at most once a second), and the calls after it
//! reach the new master.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

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
    /// The node URLs `url` lists.
    pub(super) fn nodes(&self) -> Vec<&str> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|node| !node.is_empty())
            .collect()
    }

    /// Whether this is said to be a Redis Cluster: several nodes listed, or the flag set. (A single
    /// node may still turn out to be one when connecting: [`Connected::is_cluster`].)
    pub fn is_cluster(&self) -> bool {
        self.cluster || self.nodes().len() > 1
    }
}

/// A connection to one Redis server or to a Redis Cluster; cheap to clone.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server, through a connection that reconnects by itself.
    Single(ConnectionManager),
    /// A cluster, through a connection that is rebuilt when the cluster changed under it.
    Cluster(Arc<Cluster>),
}

/// The connection to a cluster, and what it takes to rediscover the cluster.
pub struct Cluster {
    client: redis::cluster::ClusterClient,
    current: Mutex<ClusterConnection>,
    rediscovering: AtomicBool,
    /// Milliseconds after `clock` when the last rediscovery started.
    last_rediscovery: AtomicU64,
    clock: Instant,
}

/// The least time between two rediscoveries of a cluster.
const REDISCOVERY_INTERVAL: Duration = Duration::from_secs(1);

impl Cluster {
    fn connection(&self) -> ClusterConnection {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// A call failed or did not answer: rediscover the cluster in the background, unless that
    /// was done less than [`REDISCOVERY_INTERVAL`] ago or is under way.
    fn suspect(self: &Arc<Self>) {
        let now = u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_rediscovery.load(Ordering::Relaxed);
        let interval = u64::try_from(REDISCOVERY_INTERVAL.as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(last) < interval || self.rediscovering.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_rediscovery.store(now, Ordering::Relaxed);
        let cluster = self.clone();
        tokio::spawn(async move {
            match cluster.client.get_async_connection().await {
                Ok(fresh) => {
                    *cluster
                        .current
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
                    tracing::info!("Redis Cluster topology rediscovered");
                }
                Err(e) => tracing::warn!("rediscovering the Redis Cluster failed: {e}"),
            }
            cluster.rediscovering.store(false, Ordering::Release);
        });
    }
}

impl RedisConnection {
    /// Awaits a call on this connection for at most `timeout`; on a cluster, a failure or a
    /// silence makes the connection rediscover the cluster.
    pub async fn bounded<T>(
        &self,
        timeout: Duration,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let outcome = bounded(timeout, call).await;
        if let (Err(_), Self::Cluster(cluster)) = (&outcome, self) {
            cluster.suspect();
        }
        outcome
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(connection) => connection.req_packed_command(cmd),
            Self::Cluster(cluster) => {
                let mut connection = cluster.connection();
                Box::pin(async move { connection.req_packed_command(cmd).await })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(connection) => connection.req_packed_commands(pipeline, offset, count),
            Self::Cluster(cluster) => {
                let mut connection = cluster.connection();
                Box::pin(async move {
                    connection
                        .req_packed_commands(pipeline, offset, count)
                        .await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(connection) => connection.get_db(),
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
        .map(redis::Client::open)
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
        Some(manager) => RedisConnection::Single(manager),
        None => bounded(limit, open_cluster(config)).await?,
    };
    Ok(Connected { connection, nodes })
}

/// A connection to the single server `node`, or `None` when it says it is a cluster node.
async fn probe_single(
    config: &RedisStoreConfig,
    node: &redis::Client,
) -> redis::RedisResult<Option<ConnectionManager>> {
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500));
    let manager = ConnectionManager::new_with_config(node.clone(), manager_config).await?;
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

/// A connection to the cluster the listed nodes belong to (the client finds the other nodes).
async fn open_cluster(config: &RedisStoreConfig) -> redis::RedisResult<RedisConnection> {
    let client = redis::cluster::ClusterClient::builder(config.nodes())
        .connection_timeout(config.timeout)
        .response_timeout(config.timeout)
        .build()?;
    let connection = client.get_async_connection().await?;
    Ok(RedisConnection::Cluster(Arc::new(Cluster {
        client,
        current: Mutex::new(connection),
        rediscovering: AtomicBool::new(false),
        last_rediscovery: AtomicU64::new(0),
        clock: Instant::now(),
    })))
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
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(StoreError(e.to_string())),
        Err(_) => Err(StoreError(format!(
            "Redis did not answer within {} ms",
            timeout.as_millis()
        ))),
    }
}
