//! The Redis continuation store, shared by every replica: a script that parks with `SET … PX` and
//! keeps the owner's share, `GETDEL` to take (atomic, so a state is used once even when two
//! replicas race), every call bounded by a timeout. The connection manager reconnects by itself
//! when Redis comes back.
//!
//! Each owner has an index (a sorted set by deadline) of what it wrote; past its share, its
//! earliest entries are deleted. The index counts what was written within the time-to-live,
//! taken or not, which bounds what one caller can hold.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use sha2::{Digest, Sha256};

use super::{ContinuationId, ContinuationStore, Owner, SessionStore, StoreError};

/// Writes `KEYS[1]` (value `ARGV[1]`, time-to-live `ARGV[2]` ms) into the owner's index
/// `KEYS[2]`, then deletes the owner's earliest entries beyond its share `ARGV[3]`. Scored by
/// deadline in microseconds, so entries written in the same millisecond keep their order.
const PUT_WITHIN_SHARE: &str = r"
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
-- Written out whole: Lua's default number format keeps only 14 digits.
local deadline = string.format('%.0f', now + tonumber(ARGV[2]) * 1000)
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], deadline, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now))
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if over > 0 then
  local earliest = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #earliest, 2 do redis.call('DEL', earliest[i]) end
end
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], string.format('%.0f', math.ceil(tonumber(last[2]) / 1000)))
";

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
    share: u64,
    put_within_share: redis::Script,
}

impl RedisStore {
    /// Connects (failing at once if Redis cannot be reached now); one owner holds at most `share`
    /// continuations (and, apart, `share` sessions).
    pub async fn connect(config: RedisStoreConfig, share: u64) -> Result<Self, StoreError> {
        let (_, connection) = connect(&config).await?;
        Ok(Self {
            connection,
            prefix: config.prefix,
            timeout: config.timeout,
            share: share.max(1),
            put_within_share: redis::Script::new(PUT_WITHIN_SHARE),
        })
    }

    /// The index of what `owner` holds of one `kind` of entry. Hashed: owners are names chosen
    /// by callers and authenticators, of any length.
    fn owner_key(&self, kind: &str, owner: &Owner) -> String {
        let digest = Sha256::digest(owner.as_str().as_bytes());
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}owner:{kind}:{hex}", self.prefix)
    }

    async fn put_within_share(
        &self,
        key: String,
        owner_key: String,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut invocation = self.put_within_share.key(key);
        invocation
            .key(owner_key)
            .arg(value)
            .arg(ttl_ms)
            .arg(self.share);
        let mut connection = self.connection.clone();
        match tokio::time::timeout(self.timeout, invocation.invoke_async::<()>(&mut connection))
            .await
        {
            Ok(result) => result.map_err(|e| StoreError(e.to_string())),
            Err(_) => Err(self.no_answer()),
        }
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.run::<()>(&redis::cmd("PING")).await
    }

    fn no_answer(&self) -> StoreError {
        StoreError(format!(
            "Redis did not answer within {} ms",
            self.timeout.as_millis()
        ))
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
        owner: &Owner,
        id: ContinuationId,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let owner_key = self.owner_key("continuations", owner);
        self.put_within_share(self.key(id), owner_key, payload, ttl)
            .await
    }

    async fn take(&self, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(redis::cmd("GETDEL").arg(self.key(id))).await
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn write_session(
        &self,
        owner: &Owner,
        session_id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let owner_key = self.owner_key("sessions", owner);
        self.put_within_share(self.session_key(session_id), owner_key, record, ttl)
            .await
    }

    async fn touch_session(&self, session_id: &str, ttl: Duration) -> Result<bool, StoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let command = redis::cmd("PEXPIRE")
            .arg(self.session_key(session_id))
            .arg(ttl_ms)
            .clone();
        self.run::<bool>(&command).await
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
