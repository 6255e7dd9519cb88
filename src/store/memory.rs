//! The in-process continuation store: bounded and expiring, for a server running alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{ContinuationId, ContinuationStore, StoreError};

#[derive(Clone)]
struct Parked {
    payload: Arc<[u8]>,
    ttl: Duration,
    /// moka expires lazily and `remove` hands back an expired entry; this is the deadline `take`
    /// and `read_record` enforce themselves.
    expires_at: Instant,
}

impl Parked {
    fn new(payload: Vec<u8>, ttl: Duration) -> Self {
        Self {
            payload: payload.into(),
            ttl,
            expires_at: Instant::now() + ttl,
        }
    }

    fn live(self) -> Option<Vec<u8>> {
        (Instant::now() < self.expires_at).then(|| self.payload.to_vec())
    }
}

struct PerEntryTtl;

impl<K> moka::Expiry<K, Parked> for PerEntryTtl {
    fn expire_after_create(&self, _: &K, parked: &Parked, _: Instant) -> Option<Duration> {
        Some(parked.ttl)
    }

    /// A rewritten record starts its time-to-live afresh.
    fn expire_after_update(
        &self,
        _: &K,
        parked: &Parked,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some(parked.ttl)
    }
}

/// A bounded, expiring store inside this process. When full, the least useful entries are evicted
/// first; an evicted continuation is reported like an expired one.
pub struct MemoryStore {
    parked: moka::sync::Cache<ContinuationId, Parked>,
    #[cfg(feature = "legacy")]
    records: moka::sync::Cache<String, Parked>,
}

impl MemoryStore {
    pub fn new(capacity: u64) -> Self {
        Self {
            parked: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .expire_after(PerEntryTtl)
                .build(),
            #[cfg(feature = "legacy")]
            records: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .expire_after(PerEntryTtl)
                .build(),
        }
    }
}

#[async_trait]
impl ContinuationStore for MemoryStore {
    async fn put(
        &self,
        id: ContinuationId,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.parked.insert(id, Parked::new(payload, ttl));
        Ok(())
    }

    async fn take(&self, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.parked.remove(&id).and_then(Parked::live))
    }

    #[cfg(feature = "legacy")]
    async fn write_record(
        &self,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.records.insert(key.to_owned(), Parked::new(value, ttl));
        Ok(())
    }

    #[cfg(feature = "legacy")]
    async fn read_record(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.records.get(key).and_then(Parked::live))
    }

    #[cfg(feature = "legacy")]
    async fn delete_record(&self, key: &str) -> Result<(), StoreError> {
        self.records.invalidate(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_continuation_is_taken_once() {
        let store = MemoryStore::new(100);
        let id = ContinuationId::random();
        store
            .put(id, b"state".to_vec(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(store.take(id).await.unwrap(), Some(b"state".to_vec()));
        assert_eq!(store.take(id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_expired_continuation_is_gone() {
        let store = MemoryStore::new(100);
        let id = ContinuationId::random();
        store
            .put(id, b"state".to_vec(), Duration::from_millis(20))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(store.take(id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_store_stays_within_its_capacity() {
        let store = MemoryStore::new(50);
        for _ in 0..500 {
            store
                .put(
                    ContinuationId::random(),
                    vec![0; 8],
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
        }
        store.parked.run_pending_tasks();
        assert!(
            store.parked.entry_count() <= 50,
            "{} entries",
            store.parked.entry_count()
        );
    }
}
