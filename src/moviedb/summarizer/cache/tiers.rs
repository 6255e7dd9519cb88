//! Where summaries are kept: this process's cache (moka), each entry until its own expiry, and
//! with Redis the tier every replica shares ([`RedisSummaries`]): one replica's provider call
//! serves them all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use moka::future::Cache;
use serde::{Deserialize, Serialize};

use super::{Keep, LOCAL_CAPACITY, SummaryKey};
use crate::moviedb::summarizer::SummaryText;
use crate::store::{RedisConnection, RedisStoreConfig, connect_redis, redis_query};

/// A cached summary and the moment (Unix milliseconds) it stops being served.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Entry {
    pub(super) text: SummaryText,
    expires_at_ms: i64,
}

impl Entry {
    fn new(text: SummaryText, lifetime: Duration) -> Self {
        let lifetime_ms = i64::try_from(lifetime.as_millis()).unwrap_or(i64::MAX);
        Self {
            text,
            expires_at_ms: now_ms().saturating_add(lifetime_ms),
        }
    }

    fn remaining(&self) -> Duration {
        let left = self.expires_at_ms.saturating_sub(now_ms());
        Duration::from_millis(u64::try_from(left).unwrap_or(0))
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Keeps each local entry until its own expiry (so an entry read from Redis does not outlive it).
struct UntilItsExpiry;

impl moka::Expiry<String, Entry> for UntilItsExpiry {
    fn expire_after_create(&self, _: &String, entry: &Entry, _: Instant) -> Option<Duration> {
        Some(entry.remaining())
    }

    /// A replaced entry's expiry is the new entry's (moka would keep the old one's): a fallback
    /// written over an hour-long summary lasts its own minute.
    fn expire_after_update(
        &self,
        _: &String,
        entry: &Entry,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.remaining())
    }
}

/// The local cache and, with Redis, the shared one; cheap to clone into a flight.
#[derive(Clone)]
pub(super) struct Tiers {
    pub(super) local: Cache<String, Entry>,
    pub(super) shared: Option<Arc<RedisSummaries>>,
}

impl Tiers {
    /// The entry under `key` here, or in Redis (which then fills this process's tier).
    pub(super) async fn lookup(&self, key: &SummaryKey) -> Option<Entry> {
        if let Some(entry) = self.local.get(key.as_str()).await {
            return Some(entry);
        }
        let entry = self.shared.as_ref()?.get(key).await?;
        self.local
            .insert(key.as_str().to_owned(), entry.clone())
            .await;
        Some(entry)
    }

    /// Keeps `text` under `key` as `keep` says; returns what is now served under `key`: `text`,
    /// or the entry Redis already held when `keep` defers to it.
    pub(super) async fn store(
        &self,
        key: &SummaryKey,
        text: SummaryText,
        keep: Keep,
    ) -> SummaryText {
        let (lifetime, shared) = match keep {
            Keep::Everywhere(lifetime) | Keep::UnlessShared(lifetime) => {
                (lifetime, self.shared.as_ref())
            }
            Keep::HereOnly(lifetime) => (lifetime, None),
        };
        let mut entry = Entry::new(text, lifetime);
        if let Some(shared) = shared {
            if matches!(keep, Keep::UnlessShared(_)) {
                if let Some(held) = shared.put_unless_held(key, &entry, lifetime).await {
                    tracing::info!(
                        key = key.as_str(),
                        "another replica's summary landed in Redis meanwhile: served instead"
                    );
                    entry = held;
                }
            } else {
                shared.put(key, &entry, lifetime).await;
            }
        }
        self.local
            .insert(key.as_str().to_owned(), entry.clone())
            .await;
        entry.text
    }
}

pub(super) fn local_cache() -> Cache<String, Entry> {
    Cache::builder()
        .max_capacity(LOCAL_CAPACITY)
        .expire_after(UntilItsExpiry)
        .build()
}

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
        if let Some(command) = self.set_command(key, entry, lifetime) {
            let _: Option<()> = self.run(&command).await;
        }
    }

    /// Puts `entry` under `key` unless Redis holds one already (`SET … NX`), which is returned
    /// (when it can be read).
    pub(super) async fn put_unless_held(
        &self,
        key: &SummaryKey,
        entry: &Entry,
        lifetime: Duration,
    ) -> Option<Entry> {
        let command = self.set_command(key, entry, lifetime)?.arg("NX").clone();
        // Nil when Redis holds the key already, "OK" when it took this entry.
        let set: Option<String> = self.run(&command).await?;
        match set {
            Some(_) => None,
            None => self.get(key).await,
        }
    }

    /// `SET key entry PX lifetime`; `None` (after a warning) if the entry cannot be encoded.
    fn set_command(
        &self,
        key: &SummaryKey,
        entry: &Entry,
        lifetime: Duration,
    ) -> Option<redis::Cmd> {
        let value = match serde_json::to_vec(entry) {
            Ok(value) => value,
            Err(e) => {
                tracing::warn!(key = key.as_str(), "cannot encode a summary for Redis: {e}");
                return None;
            }
        };
        let lifetime_ms = u64::try_from(lifetime.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        Some(
            redis::cmd("SET")
                .arg(self.redis_key(key))
                .arg(value)
                .arg("PX")
                .arg(lifetime_ms)
                .clone(),
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moviedb::model::Review;

    #[tokio::test]
    async fn an_entry_written_over_another_lasts_its_own_lifetime() {
        let tiers = Tiers {
            local: local_cache(),
            shared: None,
        };
        let key = SummaryKey::new(1, "m", &[] as &[Review]);
        let text = |summary: &str| SummaryText {
            summary: Some(summary.into()),
            themes: Vec::new(),
        };
        let written = |summary: &'static str| {
            let tiers = &tiers;
            let key = &key;
            async move {
                let entry = tiers.lookup(key).await;
                entry.and_then(|entry| entry.text.summary) == Some(summary.to_owned())
            }
        };
        tiers
            .store(
                &key,
                text("good"),
                Keep::Everywhere(Duration::from_secs(3600)),
            )
            .await;
        assert!(written("good").await);
        let fallback = Duration::from_millis(500);
        tiers
            .store(&key, text("fallback"), Keep::HereOnly(fallback))
            .await;
        assert!(written("fallback").await);
        tokio::time::sleep(fallback * 3).await;
        assert!(
            tiers.lookup(&key).await.is_none(),
            "the fallback expired with its own lifetime, not the hour of the entry it replaced"
        );
    }
}
