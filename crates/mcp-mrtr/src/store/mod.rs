//! The continuation store: where a call's continuation waits between MRTR rounds. Put with a
//! time-to-live, take at most once.
//!
//! The in-memory store serves a single process; the Redis store lets any replica resume a call.
//! Both make `take` atomic, which is what makes a `requestState` single-use. With Redis, change
//! events travel between replicas through it as well ([`RedisEventRelay`]). Both also keep the
//! records of sessions ([`SessionStore`]), for the eras that have them, and the records of
//! Tasks-extension tasks ([`TaskStore`]).

mod memory;
mod redis;
mod redis_connection;
mod redis_events;
mod redis_live;
mod redis_sharded;
mod tasks;

pub use memory::MemoryStore;
pub use redis::RedisStore;
pub use redis_connection::{
    Connected as ConnectedRedis, RedisConnection, RedisStoreConfig, Renewable,
    connect as connect_redis, query as redis_query,
};
pub use redis_events::{RedisEventRelay, RelayPublisher};
pub use redis_live::DEFAULT_SWEEP_EVERY;
pub use tasks::{MemoryTaskStore, NoRoom, TaskStore, Versioned};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::RngCore;

use crate::protocol::ProtocolError;

/// The random name of one parked continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContinuationId([u8; 16]);

impl ContinuationId {
    /// A fresh id from 128 random bits, infeasible to guess.
    pub fn random() -> Self {
        let mut id = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut id);
        Self(id)
    }

    /// The id held in `bytes`, if they are exactly 16 bytes long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The id's 16 raw bytes, as sealed into a `requestState`.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Lower-case hex, for use in store keys.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// Whose share of a store an entry counts against: a signed-in principal, or for an anonymous
/// caller the address it calls from. Each owner holds at most its share of entries, so one
/// caller filling its share pushes out only its own oldest ones (or, for tasks, gets no more).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// The owner named `name` (a principal id, or an address for anonymous callers).
    pub fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }

    /// The owner's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The store could not be reached or answered with an error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("continuation store unavailable: {0}")]
pub struct StoreError(pub String);

/// A store that fails fails the request with -32603.
impl From<StoreError> for ProtocolError {
    fn from(error: StoreError) -> Self {
        ProtocolError::internal(error.to_string())
    }
}

/// Where continuations wait between rounds, each taken at most once (see the module docs).
#[async_trait]
pub trait ContinuationStore: Send + Sync + 'static {
    /// Parks `payload` under `id` for at most `ttl`, counted against `owner`'s share.
    async fn put(
        &self,
        owner: &Owner,
        id: ContinuationId,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// Removes and returns the payload; `None` if it was never stored, expired or already taken.
    /// `owner` is who resumes the call (normally the owner it was parked for): taken, the entry
    /// no longer counts against that owner's share.
    async fn take(&self, owner: &Owner, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError>;

    /// The store's name in metrics (`memory`, `redis`).
    fn kind(&self) -> &'static str {
        "custom"
    }
}

/// Where sessions live (2025-11-25 clients' `Mcp-Session-Id`): small records every replica must
/// see, each with a lifetime that a rewrite or a touch starts afresh. `owner` is always the one
/// the session was written for: past its share, an owner loses the session it left idle the
/// longest, and one it ended no longer counts.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Writes `record` under `session_id` for at most `ttl`, counted against `owner`'s share.
    async fn write_session(
        &self,
        owner: &Owner,
        session_id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// Reads a session; `None` if it was never written, expired or was deleted.
    async fn read_session(&self, session_id: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Gives a session `ttl` more to live from now; `false` if it is gone.
    async fn touch_session(
        &self,
        owner: &Owner,
        session_id: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Replaces a session's record with `record`, giving it `ttl` more to live from now, if it
    /// still reads `expected`; `false`, with nothing written, when it changed, expired or was
    /// deleted since (the caller reads it again). Two replicas changing one session at once
    /// thus never lose each other's change, and a deleted session stays deleted.
    async fn replace_session(
        &self,
        owner: &Owner,
        session_id: &str,
        expected: &[u8],
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Ends a session, giving its place in `owner`'s share back.
    async fn delete_session(&self, owner: &Owner, session_id: &str) -> Result<(), StoreError>;

    /// The store's name in metrics (`memory`, `redis`).
    fn kind(&self) -> &'static str {
        "custom"
    }
}
