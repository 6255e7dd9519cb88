//! The Redis continuation store, shared by every replica: `SET … PX` to park, `GETDEL` to take
//! (atomic, so a state is used once even when two replicas race), every call bounded by a timeout.
//! The connection manager reconnects by itself when Redis comes back.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{ContinuationId, ContinuationStore, SessionStore, StoreError};

/// How to reach the Redis server the stores share.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    /// The Redis connection URL, such as `redis://127.0.0.1:6379`.
    pub url: String,
    /// Prepended to every key, so several deployments can share one Redis.
    pub prefix: String,
    /// Longest any one Redis call may take before the request fails.
    pub timeout: Duration,
}

/// Continuations and sessions kept in Redis, so every replica can resume any call.
pub struct RedisStore {
    connection: ConnectionManager,
    prefix: String,
    timeout: Duration,
}

impl RedisStore {
    /// Connects (failing at once if Redis cannot be reached now).
    pub async fn connect(config: RedisStoreConfig) -> Result<Self, StoreError> {
        let (_, connection) = connect(&config).await?;
        Ok(Self {
            connection,
            prefix: config.prefix,
            timeout: config.timeout,
        })
    }

    fn session_key(&self, session_id: &str) -> String {
        format!("{}record:session:{session_id}", self.prefix)
    }

    fn key(&self, id: ContinuationId) -> String {
        format!("{}{}", self.prefix, id.to_hex())
    }

    async fn run<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, StoreError> {
        query(&self.connection, self.timeout, command).await
    }
}

/// Opens the client and a connection that reconnects by itself, failing at once if Redis cannot
/// be reached now.
pub async fn connect(
    config: &RedisStoreConfig,
) -> Result<(redis::Client, ConnectionManager), StoreError> {
    let client = redis::Client::open(config.url.as_str())
        .map_err(|e| StoreError(format!("bad Redis URL: {e}")))?;
    let manager_config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.timeout))
        .set_response_timeout(Some(config.timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500));
    let connection = tokio::time::timeout(
        config.timeout * 3,
        ConnectionManager::new_with_config(client.clone(), manager_config),
    )
    .await
    .map_err(|_| StoreError("timed out connecting to Redis".into()))?
    .map_err(|e| StoreError(e.to_string()))?;
    Ok((client, connection))
}

/// Runs one command, failing when Redis errs or does not answer within `timeout`.
pub async fn query<T: redis::FromRedisValue>(
    connection: &ConnectionManager,
    timeout: Duration,
    command: &redis::Cmd,
) -> Result<T, StoreError> {
    let mut connection = connection.clone();
    match tokio::time::timeout(timeout, command.query_async(&mut connection)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(StoreError(e.to_string())),
        Err(_) => Err(StoreError(format!(
            "Redis did not answer within {} ms",
            timeout.as_millis()
        ))),
    }
}

#[async_trait]
impl ContinuationStore for RedisStore {
    async fn put(
        &self,
        id: ContinuationId,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let command = redis::cmd("SET")
            .arg(self.key(id))
            .arg(payload)
            .arg("PX")
            .arg(ttl_ms)
            .clone();
        self.run::<()>(&command).await
    }

    async fn take(&self, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(redis::cmd("GETDEL").arg(self.key(id))).await
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn write_session(
        &self,
        session_id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let command = redis::cmd("SET")
            .arg(self.session_key(session_id))
            .arg(record)
            .arg("PX")
            .arg(ttl_ms)
            .clone();
        self.run::<()>(&command).await
    }

    async fn read_session(&self, session_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(redis::cmd("GET").arg(self.session_key(session_id)))
            .await
    }

    async fn delete_session(&self, session_id: &str) -> Result<(), StoreError> {
        self.run::<()>(redis::cmd("DEL").arg(self.session_key(session_id)))
            .await
    }
}
