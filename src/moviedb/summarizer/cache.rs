//! The cache of review summaries written by the LLM provider (or given in its place).
//!
//! An entry is keyed by the movie and a fingerprint of its reviews and of the model, so a new
//! review makes a new key at once and nothing has to be invalidated. Each entry carries its own
//! expiry: long for the provider's summaries, short for fallbacks.
//!
//! The in-process cache (moka) is always there, and it is also what makes concurrent calls for one
//! key share one computation. When the server runs with Redis, Redis is a second tier shared by
//! every replica, so one replica's provider call serves them all; Redis errors count as misses.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use moka::future::Cache;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::SummaryText;
use crate::moviedb::model::Review;
use crate::store::{RedisConnection, RedisStoreConfig, connect_redis, redis_query};

/// Most summaries kept in this process.
const LOCAL_CAPACITY: u64 = 10_000;

/// Where a summary is cached: `summary:{movie id}:{fingerprint}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryKey(String);

impl SummaryKey {
    /// The key of `reviews` (in the catalogue's order) of `movie_id` summarized by `writer` (a
    /// provider's [`writer`](super::provider::Provider::writer), or a client's lent model).
    pub fn new(movie_id: i64, writer: &str, reviews: &[Review]) -> Self {
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            // Length-prefixed, so no two different review sets hash the same bytes.
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(writer.as_bytes());
        field(&(reviews.len() as u64).to_le_bytes());
        for review in reviews {
            field(&review.score.to_le_bytes());
            field(review.author.as_bytes());
            field(review.comment.as_bytes());
        }
        Self(format!(
            "summary:{movie_id}:{}",
            hex::encode(hash.finalize())
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A cached summary and the moment (Unix milliseconds) it stops being served.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    text: SummaryText,
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
}

pub struct SummaryCache {
    local: Cache<String, Entry>,
    shared: Option<RedisSummaries>,
}

impl SummaryCache {
    /// A cache in this process only.
    pub fn in_process() -> Self {
        Self {
            local: local_cache(),
            shared: None,
        }
    }

    /// A cache in this process backed by Redis (failing at once if Redis cannot be reached now).
    pub async fn shared_in_redis(config: RedisStoreConfig) -> anyhow::Result<Self> {
        Ok(Self {
            local: local_cache(),
            shared: Some(RedisSummaries::connect(config).await?),
        })
    }

    /// Whether a summary is cached under `key`, here or in Redis (which then fills this
    /// process's tier, so the call that follows finds it here).
    pub async fn contains(&self, key: &SummaryKey) -> bool {
        if self.local.contains_key(key.as_str()) {
            return true;
        }
        let Some(shared) = &self.shared else {
            return false;
        };
        match shared.get(key).await {
            Some(entry) => {
                self.local.insert(key.as_str().to_owned(), entry).await;
                true
            }
            None => false,
        }
    }

    /// The summary cached under `key`, or the one `compute` produces along with how long to keep
    /// it. In this process one computation runs per key at a time and the other callers wait for
    /// its result. `compute` runs inside the calling task: when the caller running it is dropped
    /// (the client went away) the computation is dropped with it, and a waiting caller starts over.
    /// An error of `compute` is returned to every caller waiting for it and nothing is cached.
    pub async fn get_or_compute<F>(
        &self,
        key: &SummaryKey,
        compute: F,
    ) -> anyhow::Result<SummaryText>
    where
        F: Future<Output = anyhow::Result<(SummaryText, Duration)>>,
    {
        let entry = self
            .local
            .try_get_with(key.as_str().to_owned(), async {
                if let Some(shared) = &self.shared
                    && let Some(entry) = shared.get(key).await
                {
                    return Ok(entry);
                }
                let (text, lifetime) = compute.await?;
                let entry = Entry::new(text, lifetime);
                if let Some(shared) = &self.shared {
                    shared.put(key, &entry, lifetime).await;
                }
                Ok::<_, anyhow::Error>(entry)
            })
            .await
            .map_err(|shared_error| anyhow::anyhow!("{shared_error:#}"))?;
        Ok(entry.text)
    }
}

fn local_cache() -> Cache<String, Entry> {
    Cache::builder()
        .max_capacity(LOCAL_CAPACITY)
        .expire_after(UntilItsExpiry)
        .build()
}

/// The Redis tier: `GET` and `SET … PX`, each bounded by a timeout; failures are logged and
/// treated as misses, so a Redis outage costs provider calls, never answers.
struct RedisSummaries {
    connection: RedisConnection,
    prefix: String,
    timeout: Duration,
}

impl RedisSummaries {
    async fn connect(config: RedisStoreConfig) -> anyhow::Result<Self> {
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

    async fn get(&self, key: &SummaryKey) -> Option<Entry> {
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

    async fn put(&self, key: &SummaryKey, entry: &Entry, lifetime: Duration) {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    fn review(score: i64, author: &str, comment: &str) -> Review {
        Review {
            score,
            author: author.into(),
            comment: comment.into(),
        }
    }

    fn text(summary: &str) -> SummaryText {
        SummaryText {
            summary: Some(summary.into()),
            themes: vec!["story".into()],
        }
    }

    #[test]
    fn the_key_changes_with_any_review_and_with_the_model() {
        let reviews = vec![review(8, "ann", "Great story"), review(6, "bob", "Slow")];
        let key = SummaryKey::new(4, "m", &reviews);
        assert!(key.as_str().starts_with("summary:4:"), "{}", key.as_str());
        assert_eq!(key, SummaryKey::new(4, "m", &reviews.clone()));

        let mut added = reviews.clone();
        added.push(review(7, "cy", "Fine"));
        let mut rescored = reviews.clone();
        rescored[1].score = 7;
        let mut reworded = reviews.clone();
        reworded[0].comment.push('!');
        // The same bytes split differently between author and comment.
        let shifted = vec![review(8, "annG", "reat story"), review(6, "bob", "Slow")];
        for other in [&added, &rescored, &reworded, &shifted] {
            assert_ne!(key, SummaryKey::new(4, "m", other));
        }
        assert_ne!(key, SummaryKey::new(5, "m", &reviews));
        assert_ne!(key, SummaryKey::new(4, "other-model", &reviews));
        // A provider's writer names its address, model, budget and prompt version: any of them
        // changed is another key.
        let config = |base: &str, tokens: u32| crate::moviedb::summarizer::config::ProviderConfig {
            base_url: base.into(),
            model: "m".into(),
            api_key: None,
            timeout: Duration::from_secs(1),
            max_tokens: tokens,
            max_concurrent: 1,
        };
        let writers: Vec<String> = [
            ("http://a/v1", 300),
            ("http://b/v1", 300),
            ("http://a/v1", 301),
        ]
        .into_iter()
        .map(|(base, tokens)| {
            super::super::provider::Provider::new(config(base, tokens))
                .map(|provider| provider.writer().to_owned())
                .unwrap()
        })
        .collect();
        assert!(writers.iter().all(|writer| writer.contains("prompt")));
        let keys: std::collections::HashSet<String> = writers
            .iter()
            .map(|writer| SummaryKey::new(4, writer, &reviews).as_str().to_owned())
            .collect();
        assert_eq!(keys.len(), 3, "{writers:?}");
    }

    #[tokio::test]
    async fn a_cached_summary_is_served_without_computing_again() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(1, "m", &[review(5, "a", "b")]);
        let runs = AtomicUsize::new(0);
        for _ in 0..3 {
            let got = cache
                .get_or_compute(&key, async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok((text("once"), Duration::from_secs(60)))
                })
                .await
                .expect("computed or cached");
            assert_eq!(got, text("once"));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn errors_reach_the_caller_and_are_not_cached() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(1, "m", &[]);
        let failed = cache
            .get_or_compute(&key, async { Err(anyhow::anyhow!("our bug")) })
            .await;
        assert!(
            failed
                .err()
                .is_some_and(|e| e.to_string().contains("our bug"))
        );
        let later = cache
            .get_or_compute(&key, async { Ok((text("fine"), Duration::from_secs(60))) })
            .await
            .expect("computed");
        assert_eq!(later, text("fine"));
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_computation() {
        let cache = Arc::new(SummaryCache::in_process());
        let key = SummaryKey::new(2, "m", &[]);
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let callers: Vec<_> = (0..5)
            .map(|_| {
                let (cache, key, runs) = (cache.clone(), key.clone(), runs.clone());
                let mut released = released.clone();
                tokio::spawn(async move {
                    cache
                        .get_or_compute(&key, async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            let _ = released.wait_for(|open| *open).await;
                            Ok((text("shared"), Duration::from_secs(60)))
                        })
                        .await
                })
            })
            .collect();
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        release.send_replace(true);
        for caller in callers {
            let got = caller.await.expect("no panic").expect("computed");
            assert_eq!(got, text("shared"));
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_dropped_caller_drops_its_computation_and_the_next_caller_starts_over() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(3, "m", &[]);
        let started = AtomicUsize::new(0);
        /// Says when the computation holding it is dropped.
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        let abandoned = tokio::time::timeout(
            Duration::from_millis(50),
            cache.get_or_compute(&key, async {
                let _guard = guard;
                started.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok((text("never"), Duration::from_secs(60)))
            }),
        )
        .await;
        assert!(abandoned.is_err(), "the pending computation never finishes");
        assert!(
            dropped.load(Ordering::SeqCst),
            "the computation went with its caller, not on in the background"
        );
        let got = cache
            .get_or_compute(&key, async { Ok((text("fresh"), Duration::from_secs(60))) })
            .await
            .expect("computed");
        assert_eq!((got, started.load(Ordering::SeqCst)), (text("fresh"), 1));
    }

    #[tokio::test]
    async fn an_entry_lives_only_as_long_as_it_was_given() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(4, "m", &[]);
        cache
            .get_or_compute(&key, async { Ok((text("brief"), Duration::ZERO)) })
            .await
            .expect("computed");
        let next = cache
            .get_or_compute(&key, async { Ok((text("next"), Duration::from_secs(60))) })
            .await
            .expect("computed");
        assert_eq!(next, text("next"));
    }
}
