//! The Redis continuation store, shared by every replica, on one Redis server or a Redis
//! Cluster: `SET … PX` to park, `GETDEL` to take (atomic, so a state is used once even when two
//! replicas race), every call bounded by a timeout.
//!
//! Each owner has an index (a sorted set by deadline) of what it wrote; past its share, its
//! earliest entries are deleted. The index counts what was written within the time-to-live,
//! taken or not, which bounds what one caller can hold. An entry and its owner's index are written
//! together but are separate keys (on a cluster they live on different nodes), so no command or
//! script ever touches two slots.

use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::redis_connection::{RedisConnection, RedisStoreConfig, connect, query};
use super::{ContinuationId, ContinuationStore, Owner, SessionStore, StoreError};

/// Adds `ARGV[1]` to the owner's index `KEYS[1]` with a deadline `ARGV[2]` ms from now, drops
/// what has expired, and returns the owner's earliest entries beyond its share `ARGV[3]`, which
/// the caller deletes. Scored by deadline in microseconds, so entries written in the same
/// millisecond keep their order.
const INDEX_WITHIN_SHARE: &str = r"
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
-- Written out whole: Lua's default number format keeps only 14 digits.
local deadline = string.format('%.0f', now + tonumber(ARGV[2]) * 1000)
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local evicted = {}
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[3])
if over > 0 then
  local earliest = redis.call('ZPOPMIN', KEYS[1], over)
  for i = 1, #earliest, 2 do evicted[#evicted + 1] = earliest[i] end
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.ceil(tonumber(last[2]) / 1000)))
return evicted
";

/// Continuations and sessions kept in Redis, so every replica can resume any call.
pub struct RedisStore {
    connection: RedisConnection,
    prefix: String,
    timeout: Duration,
    share: u64,
    index_within_share: redis::Script,
}

impl RedisStore {
    /// Connects (failing at once if Redis cannot be reached now); one owner holds at most `share`
    /// continuations (and, apart, `share` sessions).
    pub async fn connect(config: RedisStoreConfig, share: u64) -> Result<Self, StoreError> {
        let connected = connect(&config).await?;
        Ok(Self {
            connection: connected.connection,
            prefix: config.prefix,
            timeout: config.timeout,
            share: share.max(1),
            index_within_share: redis::Script::new(INDEX_WITHIN_SHARE),
        })
    }

    /// The index of what `owner` holds of one `kind` of entry. Hashed: owners are names chosen
    /// by callers and authenticators, of any length.
    fn owner_key(&self, kind: &str, owner: &Owner) -> String {
        let digest = Sha256::digest(owner.as_str().as_bytes());
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        format!("{}owner:{kind}:{hex}", self.prefix)
    }

    /// Writes `key` and records it in the owner's index, then deletes what the owner holds
    /// beyond its share.
    async fn put_within_share(
        &self,
        key: String,
        owner_key: String,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut indexing = self.index_within_share.key(owner_key);
        indexing.arg(&key).arg(ttl_ms).arg(self.share);
        let write = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(ttl_ms)
            .clone();
        // Sent together: one round trip on a single server (its connection pipelines concurrent
        // commands), and on a cluster each to the node of its slot.
        let mut connection = self.connection.clone();
        let ((), evicted): ((), Vec<String>) = tokio::try_join!(
            self.run(&write),
            self.connection
                .bounded(self.timeout, indexing.invoke_async(&mut connection)),
        )?;
        for key in evicted {
            // Best effort: an eviction that fails leaves an entry to expire on its own.
            let _ = self.run::<()>(redis::cmd("DEL").arg(key)).await;
        }
        Ok(())
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.run::<()>(&redis::cmd("PING")).await
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
