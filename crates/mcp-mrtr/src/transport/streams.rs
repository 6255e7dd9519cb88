//! The long-lived streams open at once (`subscriptions/listen`, a legacy session's GET), counted
//! per owner and in all. Such a stream keeps its connection busy for as long as its client
//! likes, so the connection cap cannot close it to make room: without these bounds one client
//! could hold every connection open with streams and lock everybody else out. A stream past
//! its owner's share is refused (HTTP 429), as is one past the server's (503).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::observe;
use crate::store::Owner;

/// How many long-lived streams may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Most streams open at once on this server.
    pub total: usize,
    /// Most streams one owner (a signed-in principal, or an anonymous caller's address) holds.
    pub per_owner: usize,
}

/// The streams open now, by owner.
pub(super) struct OpenStreams {
    limits: StreamLimits,
    open: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_owner: HashMap<Owner, usize>,
}

impl OpenStreams {
    pub(super) fn new(limits: StreamLimits) -> Arc<Self> {
        Arc::new(Self {
            limits: StreamLimits {
                total: limits.total.max(1),
                per_owner: limits.per_owner.max(1),
            },
            open: Mutex::new(Counts::default()),
        })
    }

    /// A place for one more of `owner`'s streams, held until the slot is dropped; refused when
    /// the owner or the server holds as many as allowed.
    pub(super) fn open(self: &Arc<Self>, owner: &Owner) -> Result<StreamSlot, StreamRefused> {
        let mut counts = self.lock();
        let held = counts.by_owner.get(owner).copied().unwrap_or(0);
        if held >= self.limits.per_owner {
            drop(counts);
            observe::stream_refused("owner");
            return Err(StreamRefused::OwnerShare(self.limits.per_owner));
        }
        if counts.total >= self.limits.total {
            drop(counts);
            observe::stream_refused("server");
            return Err(StreamRefused::ServerFull);
        }
        counts.total += 1;
        counts.by_owner.insert(owner.clone(), held + 1);
        observe::streams_open(counts.total);
        Ok(StreamSlot {
            streams: self.clone(),
            owner: owner.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why a stream could not open.
#[derive(Debug, Clone, Copy)]
pub(super) enum StreamRefused {
    /// Its owner holds this many, its whole share (HTTP 429).
    OwnerShare(usize),
    /// The server holds as many as it may (HTTP 503).
    ServerFull,
}

/// One open stream's place; dropped with the stream's body, when the stream ends.
pub(super) struct StreamSlot {
    streams: Arc<OpenStreams>,
    owner: Owner,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut counts = self.streams.lock();
        counts.total = counts.total.saturating_sub(1);
        if let Some(held) = counts.by_owner.get_mut(&self.owner) {
            *held -= 1;
            if *held == 0 {
                counts.by_owner.remove(&self.owner);
            }
        }
        observe::streams_open(counts.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streams(total: usize, per_owner: usize) -> Arc<OpenStreams> {
        OpenStreams::new(StreamLimits { total, per_owner })
    }

    #[test]
    fn an_owner_past_its_share_is_refused_until_one_of_its_streams_ends() {
        let streams = streams(10, 2);
        let (alice, bob) = (Owner::new("alice"), Owner::new("bob"));
        let first = streams.open(&alice).expect("first");
        let _second = streams.open(&alice).expect("second");
        let refused = streams.open(&alice).err().expect("third refused");
        assert!(
            matches!(refused, StreamRefused::OwnerShare(2)),
            "{refused:?}"
        );
        // Somebody else is not held back by alice's streams.
        let _bobs = streams.open(&bob).expect("bob's");
        drop(first);
        let _again = streams.open(&alice).expect("room again once one ended");
    }

    #[test]
    fn a_full_server_is_refused_whoever_asks() {
        let streams = streams(2, 5);
        let _a = streams.open(&Owner::new("a")).expect("a");
        let b = streams.open(&Owner::new("b")).expect("b");
        let refused = streams.open(&Owner::new("c")).err().expect("c refused");
        assert!(matches!(refused, StreamRefused::ServerFull), "{refused:?}");
        drop(b);
        let _c = streams.open(&Owner::new("c")).expect("room once b ended");
        assert_eq!(
            streams.lock().by_owner.len(),
            2,
            "b's count is gone, not left at zero"
        );
    }
}
