//! Catalogue reads kept in memory for as long as the catalogue's version stays the same. The
//! database bumps the version (`catalogue_version`, by triggers) with every change to movies,
//! moods, TV shows or reviews, whoever makes it; a reader that learned the current version after
//! its request arrived and finds an entry for that version has what a query would have given.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

/// Entries kept for one version at most; past it the copy starts empty again.
const MOST_ENTRIES: usize = 10_000;

pub struct Fresh<K, V> {
    kept: Mutex<Kept<K, V>>,
}

struct Kept<K, V> {
    version: i64,
    entries: HashMap<K, V>,
}

impl<K: Hash + Eq, V: Clone> Fresh<K, V> {
    pub fn new() -> Self {
        Self {
            kept: Mutex::new(Kept {
                version: i64::MIN,
                entries: HashMap::new(),
            }),
        }
    }

    /// What was read for `key` at `version`, if anything.
    pub fn get(&self, version: i64, key: &K) -> Option<V> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.version != version {
            return None;
        }
        kept.entries.get(key).cloned()
    }

    /// Keeps `value`, read for `key` after the catalogue was at `version`. A newer version
    /// drops everything read before it; a value read at an older one is not kept.
    pub fn put(&self, version: i64, key: K, value: V) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if version < kept.version {
            return;
        }
        if version > kept.version || kept.entries.len() >= MOST_ENTRIES {
            kept.version = version;
            kept.entries.clear();
        }
        kept.entries.insert(key, value);
    }
}
