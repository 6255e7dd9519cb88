//! The summary cache's second tier, in Redis and shared by every replica: one replica's provider
//! call serves them all. Failures are logged and count as misses.

use std::time::Duration;

use anyhow::Context as _;

use super::SummaryKey;
use super::tiers::Entry;
use crate::store::{RedisConnection, RedisStoreConfig, connect_redis, redis_query};

/// The Redis tier: `GET` and `SET … PX`, each bounded by a timeout; failures are logged and
/// treated as misses, so a Redis outage costs provider calls, never answers.
pub(super) struct RedisSummaries {
    connection: RedisConnection,
    prefix: String,
    timeout: Duration,
}

impl RedisSummaries {
    pub(super) async fn connect(config: RedisStoreConfig) -> anyhow::Result<Self> {
        let connected = connect_redis(&config)
            .await
            .context("connecting to Redis")?;
        Ok(Self {
            connection: connected.connection,
            prefix: config.prefix,
            timeout: config.timeout,
        })
    }

    fn redis_key(&self, key: &SummaryKey) -> String {
        format!("{}{}", self.prefix, key.as_str())
    }

    pub(super) async fn get(&self, key: &SummaryKey) -> Option<Entry> {
        let command = redis::cmd("GET").arg(self.redis_key(key)).clone();
        let stored: Option<Vec<u8>> = self.run(&command).await?;
        match serde_json::from_slice(&stored?) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!(
                    key = key.as_str(),
                    "ignoring an unreadable cached summary in Redis: {e}"
                );
                None
            }
        }
    }

    pub(super) async fn put(&self, key: &SummaryKey, entry: &Entry, lifetime: Duration) {
        let value = match serde_json::to_vec(entry) {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(key = key.as_str(), "cannot encode a summary for Redis: {e}");
                return;
            }
        };
        let lifetime_ms = u64::try_from(lifetime.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let command = redis::cmd("SET")
            .arg(self.redis_key(key))
            .arg(value)
            .arg("PX")
            .arg(lifetime_ms)
            .clone();
        let _: Option<()> = self.run(&command).await;
    }

    /// Runs `command`; `None` (after a warning) when Redis fails or is too slow.
    async fn run<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Option<T> {
        match redis_query(&self.connection, self.timeout, command).await {
            Ok(value) => Some(value),
            Err(e) => {
                tracing::warn!("summary cache in Redis unavailable, treating it as a miss: {e}");
                None
            }
        }
    }
}
