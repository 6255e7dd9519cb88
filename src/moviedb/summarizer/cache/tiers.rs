//! Where summaries are kept: this process's cache (moka), each entry until its own expiry, and
//! with Redis the tier every replica shares ([`super::redis_tier`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use serde::{Deserialize, Serialize};

use super::redis_tier::RedisSummaries;
use super::{Keep, LOCAL_CAPACITY, SummaryKey};
use crate::moviedb::summarizer::SummaryText;

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

    pub(super) async fn store(&self, key: &SummaryKey, text: SummaryText, keep: Keep) {
        let (lifetime, everywhere) = match keep {
            Keep::Everywhere(lifetime) => (lifetime, true),
            Keep::HereOnly(lifetime) => (lifetime, false),
        };
        let entry = Entry::new(text, lifetime);
        if everywhere && let Some(shared) = &self.shared {
            shared.put(key, &entry, lifetime).await;
        }
        self.local.insert(key.as_str().to_owned(), entry).await;
    }
}

pub(super) fn local_cache() -> Cache<String, Entry> {
    Cache::builder()
        .max_capacity(LOCAL_CAPACITY)
        .expire_after(UntilItsExpiry)
        .build()
}
