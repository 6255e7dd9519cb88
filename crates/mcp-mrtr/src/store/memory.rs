//! The in-process continuation store: bounded and expiring, for a server running alone.
//!
//! Entries live in a few shards (hash maps behind their own mutex, so concurrent requests rarely
//! wait for each other), each with its entries in the order they were written. Writing first drops
//! what has expired from the front of that order, then the oldest entries while the shard is full:
//! a new continuation is always kept, and the ones evicted are those a client has left unanswered
//! the longest. Reads check the deadline themselves, so an expired entry is never handed out.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{ContinuationId, ContinuationStore, SessionStore, StoreError};

/// Most shards per table (fewer when the capacity is smaller).
const SHARDS: usize = 16;
/// Positions in a shard's write order that may refer to entries already gone before the order is
/// compacted (taken continuations leave theirs behind).
const STALE_SLACK: usize = 64;

/// A bounded, expiring store inside this process. When a shard is full its oldest entry is evicted;
/// an evicted continuation is reported like an expired one.
pub struct MemoryStore {
    parked: Table<ContinuationId>,
    sessions: Table<String>,
}

impl MemoryStore {
    /// A store holding at most `capacity` continuations (and, apart, `capacity` sessions).
    pub fn new(capacity: u64) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX).max(1);
        Self {
            parked: Table::new(capacity),
            sessions: Table::new(capacity),
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
        self.parked.insert(id, payload, ttl);
        Ok(())
    }

    async fn take(&self, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.parked.take(&id))
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    /// A rewritten session starts its time-to-live afresh.
    async fn write_session(
        &self,
        session_id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.sessions.insert(session_id.to_owned(), record, ttl);
        Ok(())
    }

    async fn read_session(&self, session_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.sessions.get(session_id))
    }

    async fn delete_session(&self, session_id: &str) -> Result<(), StoreError> {
        self.sessions.take(session_id);
        Ok(())
    }
}

/// Entries by key, in shards.
struct Table<K> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: RandomState,
}

struct Shard<K> {
    entries: HashMap<K, Entry>,
    /// Keys in the order they were written, with the deadline each was written with; a position
    /// whose deadline no longer matches its entry's is stale and skipped.
    order: VecDeque<(Instant, K)>,
    capacity: usize,
}

struct Entry {
    payload: Vec<u8>,
    expires_at: Instant,
}

impl<K: Hash + Eq + Clone> Table<K> {
    /// Shards whose capacities add up to exactly `capacity`.
    fn new(capacity: usize) -> Self {
        let count = capacity.min(SHARDS);
        let shards = (0..count)
            .map(|i| {
                Mutex::new(Shard {
                    entries: HashMap::new(),
                    order: VecDeque::new(),
                    capacity: capacity / count + usize::from(i < capacity % count),
                })
            })
            .collect();
        Self {
            shards,
            hasher: RandomState::new(),
        }
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> MutexGuard<'_, Shard<K>> {
        let index = (self.hasher.hash_one(key) % self.shards.len() as u64) as usize;
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn insert(&self, key: K, payload: Vec<u8>, ttl: Duration) {
        let now = Instant::now();
        // A time-to-live beyond what the clock can represent is as good as a year.
        let expires_at = now
            .checked_add(ttl)
            .unwrap_or(now + Duration::from_secs(365 * 86_400));
        self.shard(&key).insert(
            key,
            Entry {
                payload,
                expires_at,
            },
            now,
        );
    }

    /// Removes and returns a live entry.
    fn take<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<Vec<u8>>
    where
        K: Borrow<Q>,
    {
        let entry = self.shard(key).entries.remove(key)?;
        (Instant::now() < entry.expires_at).then_some(entry.payload)
    }

    /// Returns a copy of a live entry.
    fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<Vec<u8>>
    where
        K: Borrow<Q>,
    {
        let shard = self.shard(key);
        let entry = shard.entries.get(key)?;
        (Instant::now() < entry.expires_at).then(|| entry.payload.clone())
    }
}

impl<K: Hash + Eq + Clone> Shard<K> {
    fn insert(&mut self, key: K, entry: Entry, now: Instant) {
        self.entries.remove(&key);
        self.evict(now);
        self.order.push_back((entry.expires_at, key.clone()));
        self.entries.insert(key, entry);
        if self.order.len() > 2 * self.entries.len() + STALE_SLACK {
            let entries = &self.entries;
            self.order
                .retain(|(at, key)| entries.get(key).is_some_and(|e| e.expires_at == *at));
        }
    }

    /// Drops stale positions and expired entries from the front of the order, then the oldest
    /// entries until there is room for one more.
    fn evict(&mut self, now: Instant) {
        while let Some((at, key)) = self.order.front() {
            let current = self.entries.get(key).is_some_and(|e| e.expires_at == *at);
            if current && *at > now && self.entries.len() < self.capacity {
                break;
            }
            if current {
                self.entries.remove(key);
            }
            self.order.pop_front();
        }
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

    fn entries(table: &Table<ContinuationId>) -> (usize, usize) {
        table.shards.iter().fold((0, 0), |(entries, order), shard| {
            let shard = shard.lock().unwrap();
            (entries + shard.entries.len(), order + shard.order.len())
        })
    }

    #[tokio::test]
    async fn the_store_stays_within_its_capacity_and_keeps_the_newest() {
        let store = MemoryStore::new(50);
        let mut last = ContinuationId::random();
        for _ in 0..500 {
            last = ContinuationId::random();
            store
                .put(last, vec![0; 8], Duration::from_secs(60))
                .await
                .unwrap();
        }
        assert!(
            entries(&store.parked).0 <= 50,
            "{:?}",
            entries(&store.parked)
        );
        assert_eq!(store.take(last).await.unwrap(), Some(vec![0; 8]));
    }

    #[tokio::test]
    async fn taken_and_expired_entries_do_not_pile_up() {
        let store = MemoryStore::new(1000);
        for _ in 0..10_000 {
            let id = ContinuationId::random();
            store
                .put(id, vec![1], Duration::from_secs(60))
                .await
                .unwrap();
            store.take(id).await.unwrap();
            store
                .put(ContinuationId::random(), vec![2], Duration::ZERO)
                .await
                .unwrap();
        }
        let (live, order) = entries(&store.parked);
        assert!(live <= SHARDS, "{live} entries left");
        assert!(
            order <= SHARDS * (2 * SHARDS + STALE_SLACK + 1),
            "{order} positions left"
        );
    }

    #[tokio::test]
    async fn a_session_is_read_until_deleted_and_a_rewrite_renews_it() {
        let store = MemoryStore::new(100);
        let ttl = Duration::from_millis(80);
        store
            .write_session("s", b"one".to_vec(), ttl)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        store
            .write_session("s", b"two".to_vec(), ttl)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            store.read_session("s").await.unwrap(),
            Some(b"two".to_vec())
        );
        assert_eq!(
            store.read_session("s").await.unwrap(),
            Some(b"two".to_vec())
        );
        store.delete_session("s").await.unwrap();
        assert_eq!(store.read_session("s").await.unwrap(), None);
    }
}
