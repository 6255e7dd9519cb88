//! The Redis continuation store, shared by every replica, on one Redis server or a Redis
//! Cluster: `SET … PX` to park, `GETDEL` to take (atomic, so a state is used once even when two
//! replicas race; on a single server inside a script that also takes the entry off its owner's
//! index), every call bounded by a timeout. Task records are hashes (version and record)
//! changed by a compare-and-swap script, so replicas racing on one task never overwrite each
//! other.
//!
//! Each owner has an index (a sorted set by deadline) of what it wrote, one per kind of entry
//! (continuations, sessions, tasks); past its share, its earliest continuations or sessions are
//! deleted, and a new task is refused (a task is a promise to its client, so none is evicted).
//! A continuation leaves the index when its owner takes it, a session when it ends, anything
//! else when it expires; a session's deadline there moves with each renewal. So the index
//! counts what the owner holds: an owner who takes back what it parks never loses a
//! continuation to its share, however many it parks, and the session an owner's share evicts is
//! the one due to expire first (of sessions with equal lifetimes, the one left idle the
//! longest). On a cluster the index is updated apart, best effort. On a single server one script
//! writes the entry, updates the index and deletes the evicted entries: one command per write.
//! On a cluster an entry and its owner's index live on different nodes, so they are written by
//! two commands sent together, and no command or script ever touches two slots.
//!
//! When metrics are enabled before the store connects, continuations and sessions are also
//! counted for them ([`super::redis_live`]): one more command beside each write and each
//! delete, one after each renewal of a session, and, on a cluster, one after a take that got
//! its entry (on a single server the take's script does it); and a background sweep every 15 s unless [`RedisStore::sweeping_every`] says otherwise.

use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::redis_connection::{RedisConnection, RedisStoreConfig, connect, query};
use super::redis_live::{DEFAULT_SWEEP_EVERY, LiveIndex, sweep_forever};
use super::tasks::{NoRoom, TaskStore, Versioned};
use super::{ContinuationId, ContinuationStore, Owner, SessionStore, StoreError};
use crate::log_budget::LogBudget;
use crate::observe::{self, Held};

/// The Lua that records `member` in the owner's index `index` with a deadline `ARGV[2]` ms from
/// now, then runs `added`, drops what has expired, runs `evict` on each of the owner's earliest
/// entries beyond its share `ARGV[3]` (`earliest[i]`), and returns them. Scored by deadline in
/// microseconds, so entries written in the same millisecond keep their order.
fn index_within_share(index: &str, member: &str, added: &str, evict: &str) -> String {
    format!(
        r"
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
-- Written out whole: Lua's default number format keeps only 14 digits.
local deadline = string.format('%.0f', now + tonumber(ARGV[2]) * 1000)
redis.call('ZADD', {index}, deadline, {member})
{added}
redis.call('ZREMRANGEBYSCORE', {index}, '-inf', string.format('%.0f', now))
local evicted = {{}}
local over = redis.call('ZCARD', {index}) - tonumber(ARGV[3])
if over > 0 then
  local earliest = redis.call('ZPOPMIN', {index}, over)
  for i = 1, #earliest, 2 do
    evicted[#evicted + 1] = earliest[i]
    {evict}
  end
end
-- The index lives at least as long as the entry just added (with equal lifetimes, the latest).
if redis.call('PTTL', {index}) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', {index}, ARGV[2])
end
return evicted
"
    )
}

/// Adds `ARGV[1]` to the owner's index `KEYS[1]` and returns the entries evicted past the share,
/// which the caller deletes (on a cluster, where the entries live on other nodes).
fn index_script() -> redis::Script {
    redis::Script::new(&index_within_share("KEYS[1]", "ARGV[1]", "", ""))
}

/// On a single Redis (or Valkey) server, where a script may touch keys it did not declare:
/// writes entry `KEYS[1]` with value `ARGV[1]` for `ARGV[2]` ms, records it in the owner's index
/// `KEYS[2]`, deletes the entries evicted past the share and returns those that were still
/// there. One command per write instead of three.
fn put_script() -> redis::Script {
    // Written after the index entry: a script stopped by an error keeps what it already wrote,
    // so an index Redis refuses (a key of another type) must stop it before the entry exists.
    let put = "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])";
    // Only what was still there is returned: an entry already taken needs no more accounting.
    let evict = "if redis.call('DEL', earliest[i]) == 0 then evicted[#evicted] = nil end";
    redis::Script::new(&index_within_share("KEYS[2]", "KEYS[1]", put, evict))
}

/// Takes continuation `KEYS[1]` and, when it was there, takes it off its owner's index `KEYS[2]`
/// and, given `KEYS[3]` (metrics on), member `ARGV[1]` off that live index: on a single server,
/// one command that gives the owner's share its place back and counts the entry out only for the
/// take that got it (a refused replay's must not uncount a continuation put back since; one that
/// expired unread is left for the sweep to count as lapsed). The indexes are best effort: one
/// Redis refuses (a key of another type) must not fail a take whose entry is already deleted,
/// so their errors are caught.
const TAKE_FROM_SHARE: &str = r"
local taken = redis.call('GETDEL', KEYS[1])
if taken then
  redis.pcall('ZREM', KEYS[2], KEYS[1])
  if KEYS[3] then
    redis.pcall('ZREM', KEYS[3], ARGV[1])
  end
end
return taken
";

/// Lines about Redis refusing writes for want of memory.
static OUT_OF_MEMORY: LogBudget = LogBudget::new("redis_out_of_memory");

/// Records task `ARGV[1]` in its owner's index `KEYS[1]` for `ARGV[2]` ms and returns 1, unless
/// the owner already holds its share `ARGV[3]` of tasks not yet expired: then, with nothing
/// changed, minus the milliseconds until the first of them expires (at least one). A task is a
/// promise to its client, so none is evicted to make room.
const ADMIT_TASK: &str = r"
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return -math.max(1, math.ceil((tonumber(first[2]) - now) / 1000))
end
redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2]) * 1000), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
";

/// Lua reading the clock into `now`, in microseconds, as the indexes score deadlines.
const NOW: &str = r"
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
";

/// Lua that gives `member` of the owner's index `index` the deadline `ttl` ms after `now`, as
/// its renewed entry has, if the index still lists it with an earlier one (a session's deadline
/// only moves on, so renewals arriving out of order cannot bring it back), and keeps the index at
/// least that long. Best effort (`pcall`): an index Redis refuses must not undo the renewal of
/// the entry itself.
fn renew_in_index(index: &str, member: &str, ttl: &str) -> String {
    format!(
        r"
local deadline = string.format('%.0f', now + tonumber({ttl}) * 1000)
redis.pcall('ZADD', {index}, 'XX', 'GT', deadline, {member})
if redis.call('PTTL', {index}) < tonumber({ttl}) then
  redis.pcall('PEXPIRE', {index}, {ttl})
end
"
    )
}

/// Gives session `KEYS[1]` `ARGV[1]` ms more to live and returns 1, or 0 when it is gone; on a
/// single server (given `index`, the owner's index) its place in the index moves with it, so
/// that a session in use is the last its owner's share evicts, as in the memory store.
fn touch_session_script(index: Option<&str>) -> redis::Script {
    let renewal = index.map_or_else(String::new, |index| {
        NOW.to_owned() + &renew_in_index(index, "KEYS[1]", "ARGV[1]")
    });
    redis::Script::new(&format!(
        "if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then return 0 end\n{renewal}return 1\n"
    ))
}

/// Replaces session record `KEYS[1]` with `ARGV[2]` for `ARGV[3]` ms if it still holds
/// `ARGV[1]`, returning 1 (else 0); on a single server (given `index`) its place in the owner's
/// index moves with it, as for a touch.
fn replace_session_script(index: Option<&str>) -> redis::Script {
    let renewal = index.map_or_else(String::new, |index| {
        NOW.to_owned() + &renew_in_index(index, "KEYS[1]", "ARGV[3]")
    });
    redis::Script::new(&format!(
        r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
{renewal}return 1
"
    ))
}

/// On a single server: deletes session `KEYS[1]` and takes it off its owner's index `KEYS[2]` in
/// one step, so that no write in between counts the ended session in the owner's share.
const DELETE_SESSION: &str = r"
redis.call('DEL', KEYS[1])
redis.pcall('ZREM', KEYS[2], KEYS[1])
";

/// On a cluster, where a session and its owner's index live on different nodes: gives member
/// `ARGV[1]` of index `KEYS[1]` the deadline `ARGV[2]` ms from now, after its session was renewed.
fn renew_in_index_script() -> redis::Script {
    redis::Script::new(&(NOW.to_owned() + &renew_in_index("KEYS[1]", "ARGV[1]", "ARGV[2]")))
}

/// Creates task record `KEYS[1]` (a hash: version `v`, record `r`) to live `ARGV[2]` ms.
const CREATE_TASK: &str = r"
redis.call('HSET', KEYS[1], 'v', 1, 'r', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
";

/// Replaces task record `KEYS[1]` with `ARGV[3]` if it is at version `ARGV[1]`, moving it to
/// `ARGV[2]`; `HSET` keeps the key's deadline.
const REPLACE_TASK: &str = r"
if redis.call('HGET', KEYS[1], 'v') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'r', ARGV[3])
  return 1
end
return 0
";

/// Continuations, sessions and task records kept in Redis, so every replica can resume any call
/// and read any task.
pub struct RedisStore {
    connection: RedisConnection,
    prefix: String,
    timeout: Duration,
    share: u64,
    /// Whether writes go through [`put_script`] and takes through [`TAKE_FROM_SHARE`] (a single
    /// server), or as a write beside [`index_script`] on the index's own node, and a take then
    /// its index's update (a cluster).
    one_script_puts: bool,
    index_within_share: redis::Script,
    put_within_share: redis::Script,
    take_from_share: redis::Script,
    admit_task: redis::Script,
    create_task: redis::Script,
    replace_task: redis::Script,
    touch_session: redis::Script,
    replace_session: redis::Script,
    delete_session: redis::Script,
    /// On a cluster, a renewed session's place in its owner's index, moved apart.
    renew_in_index: redis::Script,
    /// The indexes of live entries, when metrics are enabled.
    live: Option<Live>,
}

/// The indexes of live continuations and sessions, and the background sweep that counts them.
struct Live {
    continuations: LiveIndex,
    sessions: LiveIndex,
    /// How often the sweep runs; the one sweep task of the store's life follows it.
    pace: watch::Sender<Duration>,
    sweeping: tokio::task::AbortHandle,
}

impl Live {
    fn start(connection: &RedisConnection, config: &RedisStoreConfig, every: Duration) -> Self {
        let continuations = LiveIndex::new(&config.prefix, "continuations", Held::Continuations);
        let sessions = LiveIndex::new(&config.prefix, "sessions", Held::Sessions);
        let (pace, paced) = watch::channel(every);
        let sweeping = tokio::spawn(sweep_forever(
            connection.clone(),
            config.timeout,
            vec![continuations.clone(), sessions.clone()],
            paced,
        ))
        .abort_handle();
        Self {
            continuations,
            sessions,
            pace,
            sweeping,
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.sweeping.abort();
    }
}

impl RedisStore {
    /// Connects (failing at once if Redis cannot be reached now); one owner holds at most `share`
    /// continuations (and, apart, `share` sessions).
    pub async fn connect(config: RedisStoreConfig, share: u64) -> Result<Self, StoreError> {
        let connected = connect(&config).await?;
        let one_script_puts = !connected.is_cluster();
        let live = observe::enabled()
            .then(|| Live::start(&connected.connection, &config, DEFAULT_SWEEP_EVERY));
        Ok(Self {
            connection: connected.connection,
            prefix: config.prefix,
            timeout: config.timeout,
            share: share.max(1),
            one_script_puts,
            index_within_share: index_script(),
            put_within_share: put_script(),
            take_from_share: redis::Script::new(TAKE_FROM_SHARE),
            admit_task: redis::Script::new(ADMIT_TASK),
            create_task: redis::Script::new(CREATE_TASK),
            replace_task: redis::Script::new(REPLACE_TASK),
            // On a single server the session's scripts move its place in the index too (the
            // index is their second key).
            touch_session: touch_session_script(one_script_puts.then_some("KEYS[2]")),
            replace_session: replace_session_script(one_script_puts.then_some("KEYS[2]")),
            delete_session: redis::Script::new(DELETE_SESSION),
            renew_in_index: renew_in_index_script(),
            live,
        })
    }

    /// Counts the live continuations and sessions, and those that lapsed, every `every` (15 s by
    /// default): how fresh `mcp_continuations_pending` and `mcp_legacy_sessions_open` are.
    pub fn sweeping_every(self, every: Duration) -> Self {
        if let Some(live) = &self.live {
            // An unchanged pace leaves the next sweep where it was.
            live.pace
                .send_if_modified(|pace| std::mem::replace(pace, every) != every);
        }
        self
    }

    /// Awaits `call` with `counting` (a command on a live index) sent beside it; only `call`'s
    /// outcome counts: the metrics are not worth failing a request for.
    async fn counted<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
        counting: Option<redis::Cmd>,
    ) -> Result<T, StoreError> {
        match counting {
            None => call.await,
            Some(command) => tokio::join!(call, self.run::<redis::Value>(&command)).0,
        }
    }

    /// The index of what `owner` holds of one `kind` of entry. Hashed: owners are names chosen
    /// by callers and authenticators, of any length.
    fn owner_key(&self, kind: &str, owner: &Owner) -> String {
        let digest = Sha256::digest(owner.as_str().as_bytes());
        format!("{}owner:{kind}:{}", self.prefix, hex::encode(&digest[..12]))
    }

    /// Writes `key` and records it in the owner's index, then deletes what the owner holds
    /// beyond its share.
    async fn put_within_share(
        &self,
        key: String,
        owner_key: String,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        if self.one_script_puts {
            let mut putting = self.put_within_share.key(&key);
            putting
                .key(owner_key)
                .arg(value)
                .arg(ttl_millis(ttl))
                .arg(self.share);
            let evicted: Vec<String> = self.invoke(putting).await?;
            for key in evicted {
                self.forget_evicted(&key).await;
            }
            return Ok(());
        }
        let write = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(ttl_millis(ttl))
            .clone();
        self.within_share(self.run::<()>(&write), &key, owner_key, ttl)
            .await
    }

    /// Runs `write` (which writes `key`) together with recording `key` in the owner's index,
    /// then deletes what the owner holds beyond its share.
    async fn within_share<T>(
        &self,
        write: impl std::future::Future<Output = Result<T, StoreError>>,
        key: &str,
        owner_key: String,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let mut indexing = self.index_within_share.key(owner_key);
        indexing.arg(key).arg(ttl_millis(ttl)).arg(self.share);
        // Sent together: one round trip on a single server (its connection pipelines concurrent
        // commands), and on a cluster each to the node of its slot.
        let (_, evicted): (T, Vec<String>) = tokio::try_join!(write, self.invoke(indexing))?;
        for key in evicted {
            // Best effort: an eviction that fails leaves an entry to expire on its own.
            let deleting = redis::cmd("DEL").arg(&key).clone();
            let _ = tokio::join!(self.run::<()>(&deleting), self.forget_evicted(&key));
        }
        Ok(())
    }

    /// Takes an evicted entry off its live index, counting it as lapsed (once, whichever replica
    /// removes it).
    async fn forget_evicted(&self, key: &str) {
        let (Some(live), Some(rest)) = (&self.live, key.strip_prefix(&self.prefix)) else {
            return;
        };
        let (index, member) = match rest.strip_prefix("record:session:") {
            Some(session_id) => (&live.sessions, session_id),
            None if !rest.starts_with("record:") => (&live.continuations, rest),
            None => return,
        };
        if let Ok(removed) = self.run::<u64>(&index.remove(member)).await {
            index.lapsed(removed);
        }
    }

    /// `script` on session record `key`; on a single server with its owner's index beside it
    /// (`KEYS[2]`), which the script then updates in the same step.
    fn on_session<'a>(
        &self,
        script: &'a redis::Script,
        key: &str,
        owner: &Owner,
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.key(key);
        if self.one_script_puts {
            invocation.key(self.owner_key("sessions", owner));
        }
        invocation
    }

    /// Once session `key` has been given `ttl` more to live (`renewed`): on a cluster its place
    /// in the owner's index moves too (on a single server the renewal's script did it), and its
    /// live index entry when metrics are on. After the renewal, not beside it: a session that
    /// has just expired must not be renewed there. Best effort, the two sent together.
    async fn renewed(
        &self,
        owner: &Owner,
        key: &str,
        session_id: &str,
        renewed: bool,
        ttl: Duration,
    ) {
        if !renewed {
            return;
        }
        let reindexing = async {
            if !self.one_script_puts {
                let mut renewing = self.renew_in_index.key(self.owner_key("sessions", owner));
                renewing.arg(key).arg(ttl_millis(ttl));
                let _ = self.invoke::<redis::Value>(renewing).await;
            }
        };
        let recounting = async {
            if let Some(live) = &self.live {
                let _ = self
                    .run::<redis::Value>(&live.sessions.renew(session_id, ttl))
                    .await;
            }
        };
        tokio::join!(reindexing, recounting);
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.run::<()>(&redis::cmd("PING")).await
    }

    fn session_key(&self, session_id: &str) -> String {
        format!("{}record:session:{session_id}", self.prefix)
    }

    fn task_key(&self, id: &str) -> String {
        format!("{}record:task:{id}", self.prefix)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.connection
            .bounded(self.timeout, invocation.invoke_async(&mut connection))
            .await
    }

    /// Like [`invoke`](Self::invoke), but `None` when Redis refuses the script for want of
    /// memory (past its `maxmemory`, with nothing it may evict): `OOM`, or on Redis 6 an `ERR`
    /// that wraps it. Said in the log, as the continuations' and sessions' writes fail too.
    async fn invoke_within_memory<T: redis::FromRedisValue>(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Option<T>, StoreError> {
        let mut connection = self.connection.clone();
        let invoking = async move {
            match invocation.invoke_async(&mut connection).await {
                Err(error)
                    if error.code() == Some("OOM")
                        || error.to_string().contains("OOM command not allowed") =>
                {
                    if let Some(held_back) = OUT_OF_MEMORY.take() {
                        tracing::warn!(
                            held_back,
                            "Redis refused a write for want of memory (past its maxmemory): {error}"
                        );
                    }
                    Ok(None)
                }
                outcome => outcome.map(Some),
            }
        };
        self.connection.bounded(self.timeout, invoking).await
    }

    /// The key of the continuation whose id is `hex`.
    fn key(&self, hex: &str) -> String {
        format!("{}{hex}", self.prefix)
    }

    async fn run<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> Result<T, StoreError> {
        query(&self.connection, self.timeout, command).await
    }
}

/// A time-to-live in whole milliseconds, at least one.
fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[async_trait]
impl ContinuationStore for RedisStore {
    async fn put(
        &self,
        owner: &Owner,
        id: ContinuationId,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let owner_key = self.owner_key("continuations", owner);
        let hex = id.to_hex();
        let counting = self.live.as_ref().map(|l| l.continuations.add(&hex, ttl));
        let key = self.key(&hex);
        let parking = self.put_within_share(key.clone(), owner_key, payload, ttl);
        let parked = self.counted(parking, counting).await;
        if parked.is_err() {
            // The entry may be written though the put failed (a cluster writes it apart from its
            // index entry; a timeout does not say whether the script ran). No state will name
            // it, so it goes now rather than count as held until its time to live (best effort).
            let deleting = redis::cmd("DEL").arg(&key).clone();
            let uncounting = self.live.as_ref().map(|l| l.continuations.remove(&hex));
            let _ = self.counted(self.run::<()>(&deleting), uncounting).await;
        }
        parked
    }

    async fn take(&self, owner: &Owner, id: ContinuationId) -> Result<Option<Vec<u8>>, StoreError> {
        let hex = id.to_hex();
        let key = self.key(&hex);
        let owner_key = self.owner_key("continuations", owner);
        if self.one_script_puts {
            let mut taking = self.take_from_share.key(&key);
            taking.key(owner_key);
            if let Some(live) = &self.live {
                taking.key(live.continuations.key(&hex)).arg(&hex);
            }
            return self.invoke(taking).await;
        }
        // On a cluster the indexes live on other nodes: the entry is taken off them after the
        // take, and only by the take that got it, before the call goes on (so never after a put
        // back). Best effort: a place not given back frees up when the entry would have expired,
        // as it does when another owner takes it.
        let taking = redis::cmd("GETDEL").arg(&key).clone();
        let taken: Option<Vec<u8>> = self.run(&taking).await?;
        if taken.is_some() {
            let unindexing = redis::cmd("ZREM").arg(owner_key).arg(&key).clone();
            let uncounting = self.live.as_ref().map(|l| l.continuations.remove(&hex));
            let _ = self.counted(self.run::<()>(&unindexing), uncounting).await;
        }
        Ok(taken)
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    async fn write_session(
        &self,
        owner: &Owner,
        session_id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let owner_key = self.owner_key("sessions", owner);
        let counting = self.live.as_ref().map(|l| l.sessions.add(session_id, ttl));
        let writing = self.put_within_share(self.session_key(session_id), owner_key, record, ttl);
        self.counted(writing, counting).await
    }

    async fn touch_session(
        &self,
        owner: &Owner,
        session_id: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.session_key(session_id);
        let mut touching = self.on_session(&self.touch_session, &key, owner);
        touching.arg(ttl_millis(ttl));
        let touched = self.invoke::<bool>(touching).await?;
        self.renewed(owner, &key, session_id, touched, ttl).await;
        Ok(touched)
    }

    async fn replace_session(
        &self,
        owner: &Owner,
        session_id: &str,
        expected: &[u8],
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.session_key(session_id);
        let mut replacing = self.on_session(&self.replace_session, &key, owner);
        replacing.arg(expected).arg(record).arg(ttl_millis(ttl));
        let replaced = self.invoke::<bool>(replacing).await?;
        self.renewed(owner, &key, session_id, replaced, ttl).await;
        Ok(replaced)
    }

    async fn read_session(&self, session_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.run(redis::cmd("GET").arg(self.session_key(session_id)))
            .await
    }

    async fn delete_session(&self, owner: &Owner, session_id: &str) -> Result<(), StoreError> {
        let key = self.session_key(session_id);
        let owner_key = self.owner_key("sessions", owner);
        let uncounting = self.live.as_ref().map(|l| l.sessions.remove(session_id));
        if self.one_script_puts {
            let mut deleting = self.delete_session.key(&key);
            deleting.key(owner_key);
            return self.counted(self.invoke::<()>(deleting), uncounting).await;
        }
        // On a cluster its place in the owner's share goes by a command of its own, sent
        // together to the index's node. Best effort: a place not given back frees up at the
        // session's deadline.
        let deleting = redis::cmd("DEL").arg(&key).clone();
        let unindexing = redis::cmd("ZREM").arg(owner_key).arg(&key).clone();
        let deleted = self.counted(self.run::<()>(&deleting), uncounting);
        tokio::join!(deleted, self.run::<()>(&unindexing)).0
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}

#[async_trait]
impl TaskStore for RedisStore {
    async fn create(
        &self,
        owner: &Owner,
        id: &str,
        record: Vec<u8>,
        ttl: Duration,
    ) -> Result<Result<(), NoRoom>, StoreError> {
        let key = self.task_key(id);
        let owner_key = self.owner_key("tasks", owner);
        // Admitted first, then written: the index and the record may live on different nodes.
        let mut admitting = self.admit_task.key(&owner_key);
        admitting.arg(&key).arg(ttl_millis(ttl)).arg(self.share);
        // The script's first write cannot be refused for want of memory (it only removes), and
        // Redis lets a script that has written go on: its `ZADD` is never refused so.
        match self.invoke::<i64>(admitting).await {
            Ok(1) => {}
            // Minus the milliseconds until the owner's first task expires (never 0, which would
            // be taken as a wait not known).
            Ok(wait) => {
                let frees_in = (wait < 0).then(|| Duration::from_millis(wait.unsigned_abs()));
                return Ok(Err(NoRoom::Share { frees_in }));
            }
            Err(error) => {
                // The script may have run though Redis did not say so: its place in the share
                // goes, rather than count for the task's whole time to live.
                let unlisting = redis::cmd("ZREM").arg(&owner_key).arg(&key).clone();
                let _ = self.run::<()>(&unlisting).await;
                return Err(error);
            }
        }
        let mut creating = self.create_task.key(&key);
        creating.arg(record).arg(ttl_millis(ttl));
        // Its `HSET` is its first write, so a Redis out of memory refuses it before anything is
        // written; the index entry the admission made goes below.
        let created = self.invoke_within_memory::<i64>(creating).await;
        if !matches!(created, Ok(Some(_))) {
            // The record may be written though Redis did not say so: no one will hear of this
            // task, so it goes, and its place in the share with it, rather than wait out its
            // time to live.
            let deleting = redis::cmd("DEL").arg(&key).clone();
            let unlisting = redis::cmd("ZREM").arg(&owner_key).arg(&key).clone();
            let _ = tokio::join!(self.run::<()>(&deleting), self.run::<()>(&unlisting));
        }
        match created {
            Ok(Some(_)) => Ok(Ok(())),
            Ok(None) => Ok(Err(NoRoom::Store { frees_in: None })),
            Err(error) => Err(error),
        }
    }

    async fn read(&self, id: &str) -> Result<Option<Versioned>, StoreError> {
        let command = redis::cmd("HMGET")
            .arg(self.task_key(id))
            .arg("v")
            .arg("r")
            .clone();
        let (version, record): (Option<u64>, Option<Vec<u8>>) = self.run(&command).await?;
        Ok(version
            .zip(record)
            .map(|(version, record)| Versioned { version, record }))
    }

    async fn replace(&self, id: &str, version: u64, record: Vec<u8>) -> Result<bool, StoreError> {
        let mut invocation = self.replace_task.key(self.task_key(id));
        invocation.arg(version).arg(version + 1).arg(record);
        self.invoke::<i64>(invocation)
            .await
            .map(|replaced| replaced == 1)
    }
}
