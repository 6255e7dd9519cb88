//! Places for 2025-11-25 calls that run on after their clients closed their streams: as many as
//! requests may be handled at once, and at most a quarter of them per owner (a signed-in
//! principal, or an anonymous caller's address), so that one caller's dropped calls cannot take
//! every place and leave everybody else's to be stopped when their streams close.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::store::Owner;

/// The places, and who holds them.
pub(super) struct RunOnRoom {
    total: usize,
    per_owner: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_owner: HashMap<Owner, usize>,
}

impl RunOnRoom {
    /// A room of `total` places (at least one), a quarter of them (at least one) per owner.
    #[cfg_attr(
        all(not(feature = "legacy"), not(test)),
        expect(dead_code, reason = "only legacy sessions")
    )]
    pub(super) fn new(total: usize) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(Self {
            total,
            per_owner: (total / 4).max(1),
            held: Mutex::default(),
        })
    }

    /// A place for one more of `owner`'s calls, held until it is dropped; `None` when the room
    /// is full or `owner` holds its share.
    pub(super) fn take(self: &Arc<Self>, owner: &Owner) -> Option<RunOnPlace> {
        let mut held = self.lock();
        let of_owner = held.by_owner.get(owner).copied().unwrap_or(0);
        if held.total >= self.total || of_owner >= self.per_owner {
            return None;
        }
        held.total += 1;
        held.by_owner.insert(owner.clone(), of_owner + 1);
        Some(RunOnPlace {
            room: self.clone(),
            owner: owner.clone(),
        })
    }

    /// How many places are held.
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A place in a [`RunOnRoom`], given back when dropped.
pub(super) struct RunOnPlace {
    room: Arc<RunOnRoom>,
    owner: Owner,
}

impl Drop for RunOnPlace {
    fn drop(&mut self) {
        let mut held = self.room.lock();
        held.total -= 1;
        if let Some(of_owner) = held.by_owner.get_mut(&self.owner) {
            *of_owner -= 1;
            if *of_owner == 0 {
                held.by_owner.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_holds_a_quarter_of_the_places_at_most() {
        let room = RunOnRoom::new(8);
        let (ann, bob) = (Owner::new("user:ann"), Owner::new("user:bob"));
        let anns: Vec<_> = (0..2).filter_map(|_| room.take(&ann)).collect();
        assert_eq!(anns.len(), 2);
        assert!(room.take(&ann).is_none(), "ann holds her share");
        let mut others: Vec<_> = (0..6)
            .map(|n| room.take(&Owner::new(&format!("user:{n}"))))
            .collect();
        assert!(others.iter().all(Option::is_some));
        assert_eq!(room.held(), 8);
        assert!(room.take(&bob).is_none(), "the room is full");
        others.pop();
        assert!(
            room.take(&bob).is_some(),
            "a place given back is free again"
        );
        drop(anns);
        assert_eq!(room.held(), 5);
        assert!(room.take(&ann).is_some());
        assert!(
            !room.lock().by_owner.contains_key(&bob),
            "bob's dropped place"
        );
    }

    #[test]
    fn a_small_room_gives_every_owner_one_place() {
        let room = RunOnRoom::new(1);
        let ann = Owner::new("user:ann");
        let place = room.take(&ann);
        assert!(place.is_some());
        assert!(room.take(&Owner::new("user:bob")).is_none());
        drop(place);
        assert!(room.take(&Owner::new("user:bob")).is_some());
        assert_eq!(room.held(), 0);
    }
}
