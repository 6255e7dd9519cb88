//! The task store: where the records of Tasks-extension tasks live, readable by every replica.
//!
//! A record is opaque bytes with a version. Reads are plain; every change is a compare-and-swap on
//! the version, so two replicas changing one task (a worker finishing it while another replica
//! cancels it) never overwrite each other: the loser reads again and decides afresh. Records
//! expire on their own at the deadline they were created with.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// Why a store keeps no new record. A task is a promise to its client, so none is evicted to
/// make room: room comes as records expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NoRoom {
    /// The store holds all it may (its capacity, or the memory Redis may use); `frees_in`, when
    /// known, is when its first record expires.
    Store {
        /// How long until the store's first record expires, when the store can tell.
        frees_in: Option<Duration>,
    },
    /// The owner holds its share of records not yet expired; `frees_in`, when known, is when the
    /// first of them expires.
    Share {
        /// How long until the owner's first record expires, when the store can tell.
        frees_in: Option<Duration>,
    },
}

/// Where task records live (see the module docs).
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Stores a new record under `id` for `ttl`, counted against `owner`'s share. Durable when it
    /// returns `Ok(Ok(()))`: any replica's [`read`](Self::read) finds it. [`NoRoom`], and nothing
    /// stored, when the store has no room for another record or the owner holds its share of
    /// records not yet expired.
    async fn create(
        &self,
        owner: &Owner,
        id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<Result<(), NoRoom>, StoreError>;

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
    /// Each owner's records, by deadline as in `by_deadline`.
    per_owner: HashMap<Owner, BTreeSet<(Instant, u64)>>,
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
        self.per_owner.get(owner).map_or(0, BTreeSet::len)
    }

    /// How long until the first of `deadlines` passes.
    fn first_after<'d>(
        mut deadlines: impl Iterator<Item = &'d (Instant, u64)>,
        now: Instant,
    ) -> Option<Duration> {
        deadlines
            .next()
            .map(|(deadline, _)| deadline.saturating_duration_since(now))
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
        self.per_owner
            .entry(owner.clone())
            .or_default()
            .insert((deadline, number));
    }

    fn remove(&mut self, id: &str) {
        let Some(record) = self.by_id.remove(id) else {
            return;
        };
        self.by_deadline.remove(&(record.deadline, record.number));
        if let Some(held) = self.per_owner.get_mut(&record.owner) {
            held.remove(&(record.deadline, record.number));
            if held.is_empty() {
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
    ) -> Result<Result<(), NoRoom>, StoreError> {
        let now = Instant::now();
        let mut records = self.lock();
        records.drop_expired(now);
        if records.held_by(owner) >= self.share {
            let held = records.per_owner.get(owner).into_iter().flatten();
            let frees_in = Records::first_after(held, now);
            return Ok(Err(NoRoom::Share { frees_in }));
        }
        if records.by_id.len() >= self.capacity {
            let frees_in = Records::first_after(records.by_deadline.keys(), now);
            return Ok(Err(NoRoom::Store { frees_in }));
        }
        records.insert(id, owner, Versioned { version: 1, record }, now + ttl);
        Ok(Ok(()))
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
        assert_eq!(created.await.unwrap(), Ok(()));
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
        assert_eq!(created.await.unwrap(), Ok(()));
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(store.read("a").await.unwrap(), None);
        assert!(!store.replace("a", 1, b"z".to_vec()).await.unwrap());
    }

    #[tokio::test]
    async fn an_owner_at_its_share_gets_no_new_record_and_loses_none() {
        let store = MemoryTaskStore::new(10, 2);
        let (alice, bob) = (Owner::new("alice"), Owner::new("bob"));
        let hour = Duration::from_secs(3600);
        // The store's first record to expire is somebody else's.
        let carol = Owner::new("carol");
        let created = store.create(&carol, "c1", vec![], Duration::from_secs(5));
        assert_eq!(created.await.unwrap(), Ok(()));
        for id in ["a1", "a2"] {
            assert_eq!(
                store.create(&alice, id, b"a".to_vec(), hour).await.unwrap(),
                Ok(())
            );
        }
        let refused = store
            .create(&alice, "a3", b"a".to_vec(), hour)
            .await
            .unwrap();
        let Err(NoRoom::Share {
            frees_in: Some(frees_in),
        }) = refused
        else {
            panic!("alice is at her share: {refused:?}");
        };
        assert!(
            frees_in <= hour && frees_in > hour - Duration::from_secs(60),
            "her first task expires in about an hour: {frees_in:?}"
        );
        assert_eq!(store.read("a3").await.unwrap(), None, "nothing stored");
        assert_eq!(
            store.create(&bob, "b1", b"b".to_vec(), hour).await.unwrap(),
            Ok(())
        );
        for kept in ["a1", "a2", "b1"] {
            assert!(store.read(kept).await.unwrap().is_some(), "{kept} is kept");
        }

        // Once one of hers has expired, there is room again.
        let short = Duration::from_millis(20);
        let store = MemoryTaskStore::new(10, 1);
        assert_eq!(
            store.create(&alice, "s1", vec![], short).await.unwrap(),
            Ok(())
        );
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(
            store.create(&alice, "s2", vec![], hour).await.unwrap(),
            Ok(())
        );
    }

    #[tokio::test]
    async fn a_full_store_refuses_new_records() {
        let store = MemoryTaskStore::new(2, 2);
        let (hour, minute) = (Duration::from_secs(3600), Duration::from_secs(60));
        for (owner, id, ttl) in [("a", "1", hour), ("b", "2", minute)] {
            let owner = Owner::new(owner);
            assert_eq!(store.create(&owner, id, vec![], ttl).await.unwrap(), Ok(()));
        }
        let refused = store.create(&Owner::new("c"), "3", vec![], hour).await;
        let Ok(Err(NoRoom::Store {
            frees_in: Some(frees_in),
        })) = refused
        else {
            panic!("no room: {refused:?}");
        };
        assert!(
            frees_in <= minute && frees_in > minute - Duration::from_secs(30),
            "told when the store's first record expires: {frees_in:?}"
        );
        assert_eq!(store.read("3").await.ok(), Some(None), "nothing stored");
    }

    #[tokio::test]
    async fn expired_records_are_dropped_as_new_ones_come_though_the_store_has_room() {
        let store = MemoryTaskStore::new(100, 100);
        let alice = Owner::new("alice");
        for id in ["a", "b", "c"] {
            let created = store.create(&alice, id, vec![], Duration::from_millis(20));
            assert_eq!(created.await.unwrap(), Ok(()));
        }
        let created = store.create(&alice, "long", vec![], Duration::from_secs(60));
        assert_eq!(created.await.unwrap(), Ok(()));
        tokio::time::sleep(Duration::from_millis(40)).await;
        let created = store.create(&alice, "d", vec![], Duration::from_secs(60));
        assert_eq!(created.await.unwrap(), Ok(()));
        let records = store.lock();
        let mut kept: Vec<&str> = records.by_id.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["d", "long"]);
        assert_eq!(records.by_deadline.len(), 2);
        assert_eq!(records.held_by(&alice), 2);
    }
}
