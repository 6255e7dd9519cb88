//! The in-process continuation store: bounded and expiring, for a server running alone.
//!
//! Entries live in a few shards (hash maps behind their own mutex, so concurrent requests rarely
//! wait for each other), each with its entries in the order they were written. Writing first drops
//! what has expired from the front of that order, then the oldest entries while the shard is full:
//! a new continuation is always kept, and the ones evicted are those a client has left unanswered
//! the longest. Reads check the deadline themselves, so an expired entry is never handed out.
//!
//! Each entry also counts against its [`Owner`]'s share: an owner past its share loses its own
//! oldest entries, so one caller flooding the store cannot push out everybody else's.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{ContinuationId, ContinuationStore, Owner, SessionStore, StoreError};
use crate::observe::Held;

/// Most shards per table (fewer when the capacity is smaller).
const SHARDS: usize = 16;
/// Positions in a write order that may refer to entries already gone before the order is
/// compacted (taken continuations leave theirs behind).
const STALE_SLACK: usize = 64;

/// A bounded, expiring store inside this process. When a shard is full its oldest entry is evicted,
/// and when an owner holds more than its share its own oldest entry is; an evicted continuation is
/// reported like an expired one.
pub struct MemoryStore {
    parked: Table<ContinuationId>,
    sessions: Table<String>,
}

impl MemoryStore {
    /// A store holding at most `capacity` continuations (and, apart, `capacity` sessions), of
    /// which one owner holds at most `share`.
    pub fn new(capacity: u64, share: u64) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX).max(1);
        let share = usize::try_from(share)
            .unwrap_or(usize::MAX)
            .clamp(1, capacity);
        Self {
            parked: Table::new(capacity, share, Held::Continuations),
            sessions: Table::new(capacity, share, Held::Sessions),
        }
    }
}

#[async_trait]
impl ContinuationStore for MemoryStore {
    async fn put(
        &self,
        owner: &Owner,
        id: ContinuationId,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.parked.insert(owner, id, payload, ttl);
        Ok(())
    }

    /// The entry knows whose share it counts against, whoever takes it.
    async fn take(&self, _: &Owner, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.parked.take(&id))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    /// A rewritten session starts its time-to-live afresh.
    async fn write_session(
        &self,
        owner: &Owner,
        session_id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.sessions
            .insert(owner, session_id.to_owned(), record, ttl);
        Ok(())
    }

    async fn read_session(&self, session_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.sessions.get(session_id))
    }

    /// The entry knows whose share it counts against (here and in the two calls below).
    async fn touch_session(
        &self,
        _: &Owner,
        session_id: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.sessions.renew(session_id.to_owned(), ttl, None))
    }

    async fn replace_session(
        &self,
        _: &Owner,
        session_id: &str,
        expected: &[u8],
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let replacing = Some((expected, record));
        Ok(self.sessions.renew(session_id.to_owned(), ttl, replacing))
    }

    async fn delete_session(&self, _: &Owner, session_id: &str) -> Result<(), StoreError> {
        self.sessions.take(session_id);
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

/// Entries by key, in shards, with what each owner holds.
struct Table<K> {
    shards: Box<[Mutex<Shard<K>>]>,
    hasher: RandomState,
    /// Locked after a shard is released, or before one is locked: never while holding one.
    owners: Mutex<HashMap<Owner, Holdings<K>>>,
    share: usize,
    /// Entries held now: the sum of the changes the metrics' gauge is given, taken off the
    /// gauge again when the table goes (a process may make and drop several stores).
    live: AtomicI64,
    /// What the table's entries are, in the metrics.
    held: Held,
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
    owner: Owner,
}

/// One owner's entries: how many are live, and their positions in the order written (stale
/// positions are skipped, as in a shard's order).
struct Holdings<K> {
    live: usize,
    order: VecDeque<(Instant, K)>,
}

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        self.held.changed("memory", -*self.live.get_mut());
    }
}

impl<K: Hash + Eq + Clone> Table<K> {
    /// Shards whose capacities add up to exactly `capacity`.
    fn new(capacity: usize, share: usize, held: Held) -> Self {
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
            owners: Mutex::new(HashMap::new()),
            share,
            live: AtomicI64::new(0),
            held,
        }
    }

    /// Counts `added` entries in, `taken` ones out (read, deleted or rewritten) and `dropped`
    /// unread ones out (expired or evicted), for the metrics.
    fn count(&self, added: usize, taken: usize, dropped: usize) {
        let change = added as i64 - taken as i64 - dropped as i64;
        self.live.fetch_add(change, Ordering::Relaxed);
        // The change, not the new total: totals set by two threads could land in either order.
        self.held.changed("memory", change);
        self.held.lapsed("memory", dropped as u64);
    }

    fn shard<Q: Hash + ?Sized>(&self, key: &Q) -> MutexGuard<'_, Shard<K>> {
        let index = (self.hasher.hash_one(key) % self.shards.len() as u64) as usize;
        // A panic while holding the lock leaves plain data behind; keep using it.
        lock(&self.shards[index])
    }

    fn insert(&self, owner: &Owner, key: K, payload: Vec<u8>, ttl: Duration) {
        let now = Instant::now();
        let expires_at = deadline(now, ttl);
        let entry = Entry {
            payload,
            expires_at,
            owner: owner.clone(),
        };
        let (replaced, removed) = self.shard(&key).insert(key.clone(), entry, now);
        // A rewritten entry (a session touched) was not dropped unread.
        let mut dropped = removed.len() - usize::from(replaced);
        let mut owners = lock(&self.owners);
        release(&mut owners, removed);
        let holdings = owners.entry(owner.clone()).or_insert_with(|| Holdings {
            live: 0,
            order: VecDeque::new(),
        });
        holdings.live += 1;
        holdings.order.push_back((expires_at, key));
        while holdings.live > self.share {
            let Some((at, key)) = holdings.order.pop_front() else {
                break;
            };
            let mut shard = self.shard(&key);
            if shard.entries.get(&key).is_some_and(|e| e.expires_at == at) {
                shard.entries.remove(&key);
                holdings.live -= 1;
                dropped += 1;
            }
        }
        self.prune_holdings(holdings);
        drop(owners);
        self.count(1, usize::from(replaced), dropped);
    }

    /// Gives a live entry a new time-to-live where it is, so that a write or a delete racing the
    /// renewal is not undone by it; given `replacing` (what the entry should hold, and what it
    /// is to hold instead), only if it holds that, and with its new payload. Returns whether the
    /// entry was live (and held what was expected).
    fn renew(&self, key: K, ttl: Duration, replacing: Option<(&[u8], Vec<u8>)>) -> bool {
        let now = Instant::now();
        let expires_at = deadline(now, ttl);
        let mut shard = self.shard(&key);
        let owner = match shard.entries.get_mut(&key) {
            Some(entry) if now < entry.expires_at => {
                if let Some((expected, payload)) = replacing {
                    if entry.payload != expected {
                        return false;
                    }
                    entry.payload = payload;
                }
                entry.expires_at = expires_at;
                entry.owner.clone()
            }
            Some(_) => {
                drop(shard);
                // Lapsed: counted out as a read past its deadline is. Whatever may be there
                // by now is not what a replacement expected.
                let live = self.get_owned(&key).is_some();
                return live && replacing.is_none();
            }
            None => return false,
        };
        // The entry's earlier positions no longer match its deadline: they are stale now.
        shard.order.push_back((expires_at, key.clone()));
        shard.prune_order();
        drop(shard);
        let mut owners = lock(&self.owners);
        if let Some(holdings) = owners.get_mut(&owner) {
            holdings.order.push_back((expires_at, key));
            self.prune_holdings(holdings);
        }
        true
    }

    /// Drops an owner's stale positions once they outnumber its live ones.
    fn prune_holdings(&self, holdings: &mut Holdings<K>) {
        if holdings.order.len() > 2 * holdings.live + STALE_SLACK {
            // Recounted rather than trusted: a take racing an insert may have been counted
            // before the entry was.
            holdings
                .order
                .retain(|(at, key)| lock_entry_matches(self, key, *at));
            holdings.live = holdings.order.len();
        }
    }

    /// Removes and returns a live entry.
    fn take<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<Vec<u8>>
    where
        K: Borrow<Q>,
    {
        let entry = self.shard(key).entries.remove(key)?;
        release(&mut lock(&self.owners), [entry.owner]);
        let live = Instant::now() < entry.expires_at;
        // Taken too late, it was abandoned all the same.
        self.count(0, usize::from(live), usize::from(!live));
        live.then_some(entry.payload)
    }

    /// Returns a copy of a live entry.
    fn get<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<Vec<u8>>
    where
        K: Borrow<Q>,
    {
        self.get_owned(key).map(|(_, payload)| payload)
    }

    /// Returns a copy of a live entry, with its owner.
    fn get_owned<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<(Owner, Vec<u8>)>
    where
        K: Borrow<Q>,
    {
        let mut shard = self.shard(key);
        let entry = shard.entries.get(key)?;
        if Instant::now() < entry.expires_at {
            return Some((entry.owner.clone(), entry.payload.clone()));
        }
        // Read past its deadline: it lapsed unread. Gone now and counted at once, rather than
        // when a later write happens to sweep it out.
        let lapsed = shard.entries.remove(key)?;
        drop(shard);
        release(&mut lock(&self.owners), [lapsed.owner]);
        self.count(0, 0, 1);
        None
    }
}

/// When an entry written `now` to live `ttl` expires; a time-to-live beyond what the clock can
/// represent is as good as a year.
fn deadline(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl)
        .unwrap_or(now + Duration::from_secs(365 * 86_400))
}

/// Whether `key`'s entry is still the one written with deadline `at`.
fn lock_entry_matches<K: Hash + Eq + Clone>(table: &Table<K>, key: &K, at: Instant) -> bool {
    table
        .shard(key)
        .entries
        .get(key)
        .is_some_and(|e| e.expires_at == at)
}

/// Counts entries that left the table off their owners' holdings.
fn release<K>(owners: &mut HashMap<Owner, Holdings<K>>, removed: impl IntoIterator<Item = Owner>) {
    for owner in removed {
        if let Some(holdings) = owners.get_mut(&owner) {
            holdings.live = holdings.live.saturating_sub(1);
            if holdings.live == 0 {
                owners.remove(&owner);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<K: Hash + Eq + Clone> Shard<K> {
    /// Inserts `entry`, returning whether it replaced one under the same key, and the owners of
    /// the entries it replaced or pushed out.
    fn insert(&mut self, key: K, entry: Entry, now: Instant) -> (bool, Vec<Owner>) {
        let mut removed: Vec<Owner> = self
            .entries
            .remove(&key)
            .map(|e| e.owner)
            .into_iter()
            .collect();
        let replaced = !removed.is_empty();
        self.evict(now, &mut removed);
        self.order.push_back((entry.expires_at, key.clone()));
        self.entries.insert(key, entry);
        self.prune_order();
        (replaced, removed)
    }

    /// Drops stale positions once they outnumber the entries.
    fn prune_order(&mut self) {
        if self.order.len() > 2 * self.entries.len() + STALE_SLACK {
            let entries = &self.entries;
            self.order
                .retain(|(at, key)| entries.get(key).is_some_and(|e| e.expires_at == *at));
        }
    }

    /// Drops stale positions and expired entries from the front of the order, then the oldest
    /// entries until there is room for one more.
    fn evict(&mut self, now: Instant, removed: &mut Vec<Owner>) {
        while let Some((at, key)) = self.order.front() {
            let current = self.entries.get(key).is_some_and(|e| e.expires_at == *at);
            if current && *at > now && self.entries.len() < self.capacity {
                break;
            }
            if current && let Some(entry) = self.entries.remove(key) {
                removed.push(entry.owner);
            }
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Owner {
        Owner::new("user:alice")
    }

    #[tokio::test]
    async fn a_continuation_is_taken_once() {
        let store = MemoryStore::new(100, 100);
        let id = ContinuationId::random();
        store
            .put(&alice(), id, b"state".to_vec(), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            store.take(&alice(), id).await.unwrap(),
            Some(b"state".to_vec())
        );
        assert_eq!(store.take(&alice(), id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_expired_continuation_is_gone() {
        let store = MemoryStore::new(100, 100);
        let id = ContinuationId::random();
        store
            .put(&alice(), id, b"state".to_vec(), Duration::from_millis(20))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(store.take(&alice(), id).await.unwrap(), None);
    }

    /// Entries held, and positions in the shards' orders.
    fn entries<K>(table: &Table<K>) -> (usize, usize) {
        table.shards.iter().fold((0, 0), |(entries, order), shard| {
            let shard = shard.lock().unwrap();
            (entries + shard.entries.len(), order + shard.order.len())
        })
    }

    #[tokio::test]
    async fn the_store_stays_within_its_capacity_and_keeps_the_newest() {
        let store = MemoryStore::new(50, 50);
        let mut last = ContinuationId::random();
        for _ in 0..500 {
            last = ContinuationId::random();
            store
                .put(&alice(), last, vec![0; 8], Duration::from_secs(60))
                .await
                .unwrap();
        }
        assert!(
            entries(&store.parked).0 <= 50,
            "{:?}",
            entries(&store.parked)
        );
        assert_eq!(store.take(&alice(), last).await.unwrap(), Some(vec![0; 8]));
    }

    #[tokio::test]
    async fn taken_and_expired_entries_do_not_pile_up() {
        let store = MemoryStore::new(1000, 1000);
        for _ in 0..10_000 {
            let id = ContinuationId::random();
            store
                .put(&alice(), id, vec![1], Duration::from_secs(60))
                .await
                .unwrap();
            store.take(&alice(), id).await.unwrap();
            store
                .put(&alice(), ContinuationId::random(), vec![2], Duration::ZERO)
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
        let store = MemoryStore::new(100, 100);
        let ttl = Duration::from_millis(800);
        store
            .write_session(&alice(), "s", b"one".to_vec(), ttl)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        store
            .write_session(&alice(), "s", b"two".to_vec(), ttl)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            store.read_session("s").await.unwrap(),
            Some(b"two".to_vec())
        );
        assert_eq!(
            store.read_session("s").await.unwrap(),
            Some(b"two".to_vec())
        );
        store.delete_session(&alice(), "s").await.unwrap();
        assert_eq!(store.read_session("s").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_session_is_replaced_only_over_the_record_read_and_lives_on() {
        let store = MemoryStore::new(100, 100);
        store
            .write_session(&alice(), "s", b"one".to_vec(), Duration::from_millis(400))
            .await
            .unwrap();
        let (owner, hour) = (alice(), Duration::from_secs(3600));
        let over_another = store.replace_session(&owner, "s", b"zero", b"two".to_vec(), hour);
        assert!(!over_another.await.unwrap());
        assert!(
            store
                .replace_session(&alice(), "s", b"one", b"two".to_vec(), hour)
                .await
                .unwrap()
        );
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(
            store.read_session("s").await.unwrap(),
            Some(b"two".to_vec()),
            "replaced, it lives its new time"
        );
        store.delete_session(&alice(), "s").await.unwrap();
        let over_nothing = store.replace_session(&owner, "s", b"two", b"three".to_vec(), hour);
        assert!(!over_nothing.await.unwrap(), "a deleted session stays so");
        assert_eq!(store.read_session("s").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_flooding_owner_evicts_only_its_own_oldest_entries() {
        let store = MemoryStore::new(1000, 100);
        let bob = Owner::new("user:bob");
        let bobs = ContinuationId::random();
        store
            .put(&bob, bobs, b"bob".to_vec(), Duration::from_secs(60))
            .await
            .unwrap();
        let mut alices = Vec::new();
        for _ in 0..5_000 {
            let id = ContinuationId::random();
            store
                .put(&alice(), id, vec![0; 8], Duration::from_secs(60))
                .await
                .unwrap();
            alices.push(id);
        }
        let (live, _) = entries(&store.parked);
        assert_eq!(live, 101, "alice's share plus bob's one entry");
        assert_eq!(store.take(&bob, bobs).await.unwrap(), Some(b"bob".to_vec()));
        assert_eq!(
            store.take(&alice(), alices[0]).await.unwrap(),
            None,
            "alice's oldest went"
        );
        assert!(store.take(&alice(), alices[4_999]).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn what_an_owner_took_back_holds_no_place_in_its_share() {
        let store = MemoryStore::new(1000, 3);
        let ttl = Duration::from_secs(60);
        let waiting = ContinuationId::random();
        store.put(&alice(), waiting, vec![1], ttl).await.unwrap();
        for _ in 0..10 {
            let id = ContinuationId::random();
            store.put(&alice(), id, vec![2], ttl).await.unwrap();
            assert_eq!(store.take(&alice(), id).await.unwrap(), Some(vec![2]));
        }
        assert_eq!(store.take(&alice(), waiting).await.unwrap(), Some(vec![1]));
    }

    #[tokio::test]
    async fn an_ended_session_holds_no_place_in_its_owners_share() {
        let store = MemoryStore::new(100, 2);
        let ttl = Duration::from_secs(60);
        let ended: Vec<String> = (0..5).map(|number| format!("ended-{number}")).collect();
        let opened = ["in-use"]
            .into_iter()
            .chain(ended.iter().map(String::as_str))
            .chain(["newer"]);
        for id in opened {
            store
                .write_session(&alice(), id, b"s".to_vec(), ttl)
                .await
                .unwrap();
            if id.starts_with("ended") {
                store.delete_session(&alice(), id).await.unwrap();
            }
        }
        assert_eq!(
            store.read_session("in-use").await.unwrap(),
            Some(b"s".to_vec())
        );
    }

    #[test]
    fn a_store_dropped_with_entries_takes_them_off_the_gauge() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        // The second store outlives the recording.
        let _second = metrics::with_local_recorder(&recorder, || {
            crate::observe::enable();
            let first = Table::new(100, 10, Held::Continuations);
            let second = Table::new(100, 10, Held::Continuations);
            for (table, key) in [(&first, 1), (&first, 2), (&second, 3)] {
                table.insert(&alice(), key, b"p".to_vec(), Duration::from_secs(60));
            }
            drop(first);
            second
        });
        let pending: Vec<f64> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| key.key().name() == "mcp_continuations_pending")
            .filter_map(|(.., value)| match value {
                DebugValue::Gauge(value) => Some(value.into_inner()),
                _ => None,
            })
            .collect();
        assert_eq!(pending, [1.0], "only the entry of the store still there");
    }

    #[tokio::test]
    async fn a_session_read_past_its_deadline_is_counted_out_at_once() {
        let store = MemoryStore::new(100, 10);
        store
            .write_session(&alice(), "left", b"l".to_vec(), Duration::from_millis(20))
            .await
            .unwrap();
        assert_eq!(store.sessions.live.load(Ordering::Relaxed), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(store.read_session("left").await.unwrap(), None);
        // No write came to sweep it out: the read did.
        assert_eq!(store.sessions.live.load(Ordering::Relaxed), 0);
        assert_eq!(entries(&store.sessions).0, 0);
    }

    #[tokio::test]
    async fn a_touched_session_lives_on_and_an_untouched_one_expires() {
        let store = MemoryStore::new(100, 10);
        let ttl = Duration::from_millis(800);
        store
            .write_session(&alice(), "kept", b"k".to_vec(), ttl)
            .await
            .unwrap();
        store
            .write_session(&alice(), "left", b"l".to_vec(), ttl)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(store.touch_session(&alice(), "kept", ttl).await.unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            store.read_session("kept").await.unwrap(),
            Some(b"k".to_vec())
        );
        assert_eq!(store.read_session("left").await.unwrap(), None);
        assert!(!store.touch_session(&alice(), "left", ttl).await.unwrap());
    }

    #[tokio::test]
    async fn touches_renew_a_session_in_place_and_leave_no_pile_of_positions() {
        let store = MemoryStore::new(100, 2);
        let ttl = Duration::from_secs(60);
        for (id, record) in [("a", b"a"), ("b", b"b")] {
            store
                .write_session(&alice(), id, record.to_vec(), ttl)
                .await
                .unwrap();
        }
        for _ in 0..10_000 {
            assert!(store.touch_session(&alice(), "a", ttl).await.unwrap());
        }
        assert_eq!(store.sessions.live.load(Ordering::Relaxed), 2);
        let (_, positions) = entries(&store.sessions);
        assert!(
            positions <= 2 * 2 + SHARDS * (STALE_SLACK + 1),
            "{positions} positions"
        );
        let held = lock(&store.sessions.owners)[&alice()].order.len();
        assert!(held <= 2 * 2 + STALE_SLACK + 1, "{held} owner positions");

        // Alice's share is two: a third session pushes out the one touched least recently.
        store
            .write_session(&alice(), "c", b"c".to_vec(), ttl)
            .await
            .unwrap();
        assert_eq!(store.read_session("b").await.unwrap(), None);
        assert_eq!(store.read_session("a").await.unwrap(), Some(b"a".to_vec()));
    }
}
