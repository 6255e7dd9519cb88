//! The long-lived streams open at once (`subscriptions/listen`, a legacy session's GET), counted
//! per owner and in all. Such a stream keeps its connection busy for as long as its client
//! likes, so the connection cap cannot close it to make room: without these bounds one client
//! could hold every connection open with streams and lock everybody else out. An owner past its
//! share makes room by ending its own oldest stream (as the stores evict an owner's oldest
//! entries: a client that vanished without closing its streams is not locked out by them, and
//! callers sharing an address behind a proxy are not refused); a stream past the server's cap is
//! refused (HTTP 503).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::observe;
use crate::store::Owner;

/// How many long-lived streams may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Most streams open at once on this server.
    pub total: usize,
    /// Most streams one owner (a signed-in principal, or an anonymous caller's address) holds;
    /// one more ends the owner's oldest.
    pub per_owner: usize,
}

/// The streams open now, by owner, oldest first.
pub(super) struct OpenStreams {
    limits: StreamLimits,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    next_id: u64,
    by_owner: HashMap<Owner, VecDeque<(u64, Arc<Notify>)>>,
}

/// The server holds as many streams as it may.
#[derive(Debug, Clone, Copy)]
pub(super) struct ServerFull;

impl OpenStreams {
    pub(super) fn new(limits: StreamLimits) -> Arc<Self> {
        Arc::new(Self {
            limits: StreamLimits {
                total: limits.total.max(1),
                per_owner: limits.per_owner.max(1),
            },
            open: Mutex::new(Open::default()),
        })
    }

    /// Whether [`open`](Self::open) would find a place for one more of `owner`'s streams (by
    /// ending its oldest, if it must), changing nothing; a refusal counts as one.
    pub(super) fn has_room(&self, owner: &Owner) -> Result<(), ServerFull> {
        let open = self.lock();
        let held = open.by_owner.get(owner).map_or(0, VecDeque::len);
        if held < self.limits.per_owner && open.total >= self.limits.total {
            drop(open);
            observe::stream_refused();
            return Err(ServerFull);
        }
        Ok(())
    }

    /// A place for one more of `owner`'s streams, held until the slot is dropped. An owner that
    /// holds its whole share gets the place of its oldest stream, which is told to end; anyone
    /// else is refused when the server holds as many streams as it may.
    pub(super) fn open(self: &Arc<Self>, owner: &Owner) -> Result<StreamSlot, ServerFull> {
        let mut guard = self.lock();
        let open = &mut *guard;
        let held = open.by_owner.get(owner).map_or(0, VecDeque::len);
        if held < self.limits.per_owner && open.total >= self.limits.total {
            drop(guard);
            observe::stream_refused();
            return Err(ServerFull);
        }
        let streams = open.by_owner.entry(owner.clone()).or_default();
        if held >= self.limits.per_owner
            && let Some((_, end)) = streams.pop_front()
        {
            // A permit is kept if the stream is not waiting yet: it ends as soon as it does.
            end.notify_one();
            open.total -= 1;
            observe::stream_replaced();
        }
        let id = open.next_id;
        open.next_id += 1;
        let end = Arc::new(Notify::new());
        streams.push_back((id, end.clone()));
        open.total += 1;
        observe::streams_open(open.total);
        Ok(StreamSlot {
            streams: self.clone(),
            owner: owner.clone(),
            id,
            end,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One open stream's place; dropped with the stream's body, when the stream ends.
pub(super) struct StreamSlot {
    streams: Arc<OpenStreams>,
    owner: Owner,
    id: u64,
    end: Arc<Notify>,
}

impl StreamSlot {
    /// Notified when the stream must end: its owner opened one more than its share.
    pub(super) fn end_signal(&self) -> Arc<Notify> {
        self.end.clone()
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut guard = self.streams.lock();
        let open = &mut *guard;
        if let Some(streams) = open.by_owner.get_mut(&self.owner) {
            // Not there when a newer stream of its owner already took its place.
            if let Some(at) = streams.iter().position(|(id, _)| *id == self.id) {
                streams.remove(at);
                open.total -= 1;
            }
            if streams.is_empty() {
                open.by_owner.remove(&self.owner);
            }
        }
        observe::streams_open(open.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(total: usize, per_owner: usize) -> Arc<OpenStreams> {
        OpenStreams::new(StreamLimits { total, per_owner })
    }

    fn told_to_end(slot: &StreamSlot) -> bool {
        let signal = slot.end_signal();
        let notified = signal.notified();
        tokio::pin!(notified);
        // Completes at once when a permit was stored for it.
        notified.as_mut().enable()
    }

    #[test]
    fn an_owner_past_its_share_ends_its_own_oldest_stream() {
        let streams = limited(10, 2);
        let (alice, bob) = (Owner::new("alice"), Owner::new("bob"));
        let first = streams.open(&alice).expect("first");
        let second = streams.open(&alice).expect("second");
        let bobs = streams.open(&bob).expect("bob's");
        let third = streams
            .open(&alice)
            .expect("a third takes the first's place");
        assert!(told_to_end(&first), "the oldest is told to end");
        assert!(!told_to_end(&second) && !told_to_end(&third) && !told_to_end(&bobs));
        assert_eq!(streams.lock().total, 3);
        // The replaced stream ending later frees nothing twice.
        drop(first);
        assert_eq!(streams.lock().total, 3);
        drop((second, third));
        assert_eq!(streams.lock().total, 1);
        assert!(
            !streams.lock().by_owner.contains_key(&alice),
            "no empty entry left"
        );
    }

    #[test]
    fn a_full_server_refuses_newcomers_but_lets_an_owner_replace_its_own() {
        let streams = limited(2, 5);
        let a = streams.open(&Owner::new("a")).expect("a");
        let b = streams.open(&Owner::new("b")).expect("b");
        assert!(streams.open(&Owner::new("c")).is_err(), "c is refused");
        assert!(!streams.lock().by_owner.contains_key(&Owner::new("c")));
        drop(b);
        let _c = streams.open(&Owner::new("c")).expect("room once b ended");
        assert_eq!(streams.lock().total, 2);
        drop(a);
        let owner_at_share = limited(2, 1);
        let one = owner_at_share.open(&Owner::new("d")).expect("d");
        let _other = owner_at_share.open(&Owner::new("e")).expect("e");
        let _two = owner_at_share
            .open(&Owner::new("d"))
            .expect("d replaces its own even when the server is full");
        assert!(told_to_end(&one));
    }
}
