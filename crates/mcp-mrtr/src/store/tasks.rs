//! The task store: where the records of Tasks-extension tasks live, readable by every replica.
//!
//! A record is opaque bytes with a version. Reads are plain; every change is a compare-and-swap on
//! the version, so two replicas changing one task (a worker finishing it while another replica
//! cancels it) never overwrite each other: the loser reads again and decides afresh. Records
//! expire on their own at the deadline they were created with.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Owner, StoreError};

/// A task record as stored, with the version a change must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// Starts at 1 and grows by one with every replacement.
    pub version: u64,
    /// The record's bytes.
    pub record: Vec<u8>,
}

/// Where task records live (see the module docs).
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Stores a new record under `id` for `ttl`, counted against `owner`'s share. Durable when it
    /// returns `true`: any replica's [`read`](Self::read) finds it. `false`, and nothing stored,
    /// when the store has no room for another record or the owner holds its share of records
    /// not yet expired: a task is a promise to its client, so none is evicted to make room.
    async fn create(
        &self,
        owner: &Owner,
        id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// The record under `id`; `None` if there is none or it expired.
    async fn read(&self, id: &str) -> Result<Option<Versioned>, StoreError>;

    /// Replaces the record if it is still at `version`, keeping its deadline; `false` when it
    /// changed meanwhile or is gone.
    async fn replace(&self, id: &str, version: u64, record: Vec<u8>) -> Result<bool, StoreError>;
}

/// Task records inside this process, for a server running alone: at most `capacity` at once, of
/// which one owner holds at most its share. Expired records are dropped as new ones come, the
/// oldest deadlines first, so a full store of live records costs a create no scan.
pub struct MemoryTaskStore {
    capacity: usize,
    share: usize,
    inner: Mutex<Records>,
}

#[derive(Default)]
struct Records {
    by_id: HashMap<String, Record>,
    per_owner: HashMap<Owner, usize>,
    /// Every record's id by its deadline (and a number telling records of one deadline apart).
    by_deadline: BTreeMap<(Instant, u64), String>,
    next_number: u64,
}

struct Record {
    owner: Owner,
    stored: Versioned,
    deadline: Instant,
    /// Its number in `by_deadline`.
    number: u64,
}

impl MemoryTaskStore {
    /// A store of at most `capacity` records, `share` of them per owner.
    pub fn new(capacity: u64, share: u64) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX).max(1);
        Self {
            capacity,
            share: usize::try_from(share)
                .unwrap_or(usize::MAX)
                .clamp(1, capacity),
            inner: Mutex::new(Records::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Records {
    fn live(&self, id: &str, now: Instant) -> Option<&Record> {
        self.by_id.get(id).filter(|record| record.deadline > now)
    }

    fn held_by(&self, owner: &Owner) -> usize {
        self.per_owner.get(owner).copied().unwrap_or(0)
    }

    fn insert(&mut self, id: &str, owner: &Owner, stored: Versioned, deadline: Instant) {
        self.remove(id);
        let number = self.next_number;
        self.next_number += 1;
        self.by_deadline.insert((deadline, number), id.to_owned());
        let record = Record {
            owner: owner.clone(),
            stored,
            deadline,
            number,
        };
        self.by_id.insert(id.to_owned(), record);
        *self.per_owner.entry(owner.clone()).or_default() += 1;
    }

    fn remove(&mut self, id: &str) {
        let Some(record) = self.by_id.remove(id) else {
            return;
        };
        self.by_deadline.remove(&(record.deadline, record.number));
        if let Some(count) = self.per_owner.get_mut(&record.owner) {
            *count -= 1;
            if *count == 0 {
                self.per_owner.remove(&record.owner);
            }
        }
    }

    fn drop_expired(&mut self, now: Instant) {
        while let Some(entry) = self.by_deadline.first_entry()
            && entry.key().0 <= now
        {
            let id = entry.remove();
            self.remove(&id);
        }
    }
}

#[async_trait]
impl TaskStore for MemoryTaskStore {
    async fn create(
        &self,
        owner: &Owner,
        id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        records.drop_expired(now);
        if records.by_id.len() >= self.capacity || records.held_by(owner) >= self.share {
            return Ok(false);
        }
        records.insert(id, owner, Versioned { version: 1, record }, now + ttl);
        Ok(true)
    }

    async fn read(&self, id: &str) -> Result<Option<Versioned>, StoreError> {
        let records = self.lock();
        Ok(records
            .live(id, Instant::now())
            .map(|record| record.stored.clone()))
    }

    async fn replace(&self, id: &str, version: u64, record: Vec<u8>) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        match records.by_id.get_mut(id) {
            Some(entry) if entry.deadline > now && entry.stored.version == version => {
                entry.stored = Versioned {
                    version: version + 1,
                    record,
                };
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_that_names_an_old_version_is_refused() {
        let store = MemoryTaskStore::new(10, 10);
        let alice = Owner::new("alice");
        let created = store.create(&alice, "t", b"one".to_vec(), Duration::from_secs(60));
        assert!(created.await.unwrap());
        assert!(store.replace("t", 1, b"two".to_vec()).await.unwrap());
        assert!(!store.replace("t", 1, b"late".to_vec()).await.unwrap());
        let read = store.read("t").await.unwrap().unwrap();
        assert_eq!((read.version, read.record), (2, b"two".to_vec()));
    }

    #[tokio::test]
    async fn an_expired_record_is_gone() {
        let store = MemoryTaskStore::new(10, 10);
        let alice = Owner::new("alice");
        let created = store.create(&alice, "a", b"x".to_vec(), Duration::from_millis(20));
        assert!(created.await.unwrap());
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(store.read("a").await.unwrap(), None);
        assert!(!store.replace("a", 1, b"z".to_vec()).await.unwrap());
    }

    #[tokio::test]
    async fn an_owner_at_its_share_gets_no_new_record_and_loses_none() {
        let store = MemoryTaskStore::new(10, 2);
        let (alice, bob) = (Owner::new("alice"), Owner::new("bob"));
        let hour = Duration::from_secs(3600);
        for id in ["a1", "a2"] {
            assert!(store.create(&alice, id, b"a".to_vec(), hour).await.unwrap());
        }
        let refused = store.create(&alice, "a3", b"a".to_vec(), hour).await;
        assert_eq!(refused.ok(), Some(false), "alice is at her share");
        assert_eq!(store.read("a3").await.unwrap(), None, "nothing stored");
        assert!(store.create(&bob, "b1", b"b".to_vec(), hour).await.unwrap());
        for kept in ["a1", "a2", "b1"] {
            assert!(store.read(kept).await.unwrap().is_some(), "{kept} is kept");
        }

        // Once one of hers has expired, there is room again.
        let short = Duration::from_millis(20);
        let store = MemoryTaskStore::new(10, 1);
        assert!(store.create(&alice, "s1", vec![], short).await.unwrap());
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(store.create(&alice, "s2", vec![], hour).await.unwrap());
    }

    #[tokio::test]
    async fn a_full_store_refuses_new_records() {
        let store = MemoryTaskStore::new(2, 2);
        let hour = Duration::from_secs(3600);
        for (owner, id) in [("a", "1"), ("b", "2")] {
            let owner = Owner::new(owner);
            assert!(store.create(&owner, id, vec![], hour).await.unwrap());
        }
        let refused = store.create(&Owner::new("c"), "3", vec![], hour).await;
        assert_eq!(refused.ok(), Some(false), "no room");
        assert_eq!(store.read("3").await.ok(), Some(None), "nothing stored");
    }

    #[tokio::test]
    async fn expired_records_are_dropped_as_new_ones_come_though_the_store_has_room() {
        let store = MemoryTaskStore::new(100, 100);
        let alice = Owner::new("alice");
        for id in ["a", "b", "c"] {
            let created = store.create(&alice, id, vec![], Duration::from_millis(20));
            assert!(created.await.unwrap());
        }
        assert!(
            store
                .create(&alice, "long", vec![], Duration::from_secs(60))
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(
            store
                .create(&alice, "d", vec![], Duration::from_secs(60))
                .await
                .unwrap()
        );
        let records = store.lock();
        let mut kept: Vec<&str> = records.by_id.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["d", "long"]);
        assert_eq!(records.by_deadline.len(), 2);
        assert_eq!(records.held_by(&alice), 2);
    }
}
