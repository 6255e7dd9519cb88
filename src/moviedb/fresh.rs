//! Catalogue reads kept in memory for as long as the catalogue's version stays the same. The
//! database bumps the version (`catalogue_version`, by triggers) with every change to movies,
//! moods, TV shows or reviews, whoever makes it; a reader that learned the current version after
//! its request arrived and finds an entry for that version has what a query would have given.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

/// Entries kept for one version at most; past it, one entry makes room for the next.
const MOST_ENTRIES: usize = 10_000;

/// A version of the catalogue as this server saw it. `epoch` counts the times the database's
/// counter went backwards (a restore from a backup, a database swapped under the server), so
/// that versions compare in the order they were seen: an entry read from the database before
/// it went back is never served once the counter climbs past it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub epoch: u64,
    pub counter: i64,
}

pub struct Fresh<K, V> {
    kept: Mutex<Kept<K, V>>,
}

struct Kept<K, V> {
    version: Option<Version>,
    entries: HashMap<K, V>,
}

impl<K: Hash + Eq + Clone, V: Clone> Fresh<K, V> {
    pub fn new() -> Self {
        Self {
            kept: Mutex::new(Kept {
                version: None,
                entries: HashMap::new(),
            }),
        }
    }

    /// What was read for `key` at `version`, if anything.
    pub fn get(&self, version: Version, key: &K) -> Option<V> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.version != Some(version) {
            return None;
        }
        kept.entries.get(key).cloned()
    }

    /// Keeps `value`, read for `key` after the catalogue was at `version`. A newer version
    /// drops everything read before it; a value read at an older one is not kept. When full,
    /// one entry (whichever the map yields first) makes room, so that callers asking for keys
    /// no one asks for again cannot empty the copy for everyone else.
    pub fn put(&self, version: Version, key: K, value: V) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.version.is_some_and(|kept| version < kept) {
            return;
        }
        if kept.version != Some(version) {
            kept.version = Some(version);
            kept.entries.clear();
        }
        if kept.entries.len() >= MOST_ENTRIES && !kept.entries.contains_key(&key) {
            let evicted = kept.entries.keys().next().cloned();
            if let Some(evicted) = evicted {
                kept.entries.remove(&evicted);
            }
        }
        kept.entries.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(epoch: u64, counter: i64) -> Version {
        Version { epoch, counter }
    }

    #[test]
    fn a_full_copy_makes_room_for_one_entry_and_keeps_the_rest() {
        let fresh = Fresh::new();
        for key in 0..MOST_ENTRIES {
            fresh.put(at(0, 1), key, key);
        }
        fresh.put(at(0, 1), MOST_ENTRIES, MOST_ENTRIES);
        let kept = (0..=MOST_ENTRIES)
            .filter(|key| fresh.get(at(0, 1), key) == Some(*key))
            .count();
        assert_eq!(kept, MOST_ENTRIES, "one entry left for the new one");
        assert_eq!(fresh.get(at(0, 1), &MOST_ENTRIES), Some(MOST_ENTRIES));
    }

    #[test]
    fn entries_read_before_the_counter_went_back_are_not_served_when_it_climbs_again() {
        let fresh = Fresh::new();
        fresh.put(at(0, 10), "drama", "old database");
        // The database was restored to counter 5, then changed back up to 10.
        fresh.put(at(1, 5), "comedy", "new database");
        assert_eq!(fresh.get(at(1, 10), &"drama"), None);
        assert_eq!(fresh.get(at(1, 5), &"comedy"), Some("new database"));
        // A late reader of the old epoch does not bring its entries back.
        fresh.put(at(0, 10), "drama", "old database");
        assert_eq!(fresh.get(at(0, 10), &"drama"), None);
        assert_eq!(fresh.get(at(1, 5), &"comedy"), Some("new database"));
    }
}
