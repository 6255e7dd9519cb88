//! Named claims held by guards: a newer claim under a name replaces the one before it, and a
//! guard, when dropped, lets go of its own claim only, never of a newer one under its name. What
//! the legacy wire keeps per session of what runs here: its latest GET stream.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The claims in force, each under its name.
pub(super) struct Claims<K, T> {
    inner: Mutex<Inner<K, T>>,
}

struct Inner<K, T> {
    /// Per name: the number of the claim in force, and what it holds.
    by_name: HashMap<K, (u64, T)>,
    issued: u64,
}

impl<K, T> Default for Claims<K, T> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                by_name: HashMap::new(),
                issued: 0,
            }),
        }
    }
}

impl<K: Hash + Eq + Clone, T> Claims<K, T> {
    /// Puts `value` under `name`, in force until the guard is dropped or a newer claim replaces
    /// it; returns the guard and what the claim it replaced held.
    pub(super) fn claim(self: &Arc<Self>, name: K, value: T) -> (Claim<K, T>, Option<T>) {
        let mut inner = self.lock();
        inner.issued += 1;
        let number = inner.issued;
        let replaced = inner.by_name.insert(name.clone(), (number, value));
        let claim = Claim {
            claims: self.clone(),
            name,
            number,
        };
        (claim, replaced.map(|(_, value)| value))
    }

    /// Withdraws the claim in force under `name`, if any, and returns what it held; its guard
    /// then lets go of nothing.
    pub(super) fn release(&self, name: &K) -> Option<T> {
        self.lock().by_name.remove(name).map(|(_, value)| value)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K, T>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    pub(super) fn in_force(&self) -> usize {
        self.lock().by_name.len()
    }
}

/// One claim, given up when dropped (unless a newer one replaced it already).
pub(super) struct Claim<K: Hash + Eq + Clone, T> {
    claims: Arc<Claims<K, T>>,
    name: K,
    number: u64,
}

impl<K: Hash + Eq + Clone, T> Drop for Claim<K, T> {
    fn drop(&mut self) {
        let mut inner = self.claims.lock();
        if inner
            .by_name
            .get(&self.name)
            .is_some_and(|(number, _)| *number == self.number)
        {
            inner.by_name.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_claim_replaces_the_older_whose_drop_leaves_it_in_force() {
        let claims: Arc<Claims<&str, u32>> = Arc::default();
        let (older, none) = claims.claim("s1", 1);
        assert_eq!(none, None);
        let (newer, replaced) = claims.claim("s1", 2);
        assert_eq!(replaced, Some(1));
        let (other, _) = claims.claim("s2", 3);
        drop(older);
        assert_eq!(claims.in_force(), 2, "the newer claim stays in force");
        assert_eq!(claims.release(&"s1"), Some(2));
        drop((newer, other));
        assert_eq!(claims.in_force(), 0);
    }
}
