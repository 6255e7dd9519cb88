//! What a Redis store holds now, for the metrics (kept only when they are enabled). Redis lets
//! keys expire unseen, so each kind of entry the metrics count (continuations, sessions) also
//! has an index of live entries scored by deadline: written beside the entry, renewed after a
//! session's touch, removed when the entry is taken or deleted, and when it is evicted past its
//! owner's share (then counted as lapsed). Every replica sweeps the indexes now and then: what
//! it removes as past its deadline left unread (abandoned or expired; counted once, by
//! whichever replica removed it), and what stays is the store's count of live entries (the
//! same on every replica). A sweep also has each index expire a day after the last deadline it
//! holds, so that indexes nobody sweeps any more do not stay in Redis forever.
//!
//! Each index is split over [`SHARDS`] keys so that on a cluster it spreads over the nodes; a
//! command or script touches one of them only, and a sweep is one script per key.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;

use super::StoreError;
use super::redis_connection::RedisConnection;
use crate::observe::Held;

/// Keys each index is split over.
const SHARDS: u8 = 16;
/// How far replicas' clocks may disagree: an entry is swept this long after its deadline.
const CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The longest pace between sweeps: a longer one is taken as this.
const LONGEST_PACE: Duration = Duration::from_secs(24 * 60 * 60);
/// How often a replica sweeps when not told otherwise.
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(15);

/// Sweeps one index shard (`KEYS[1]`) in one round trip: removes what is due by `ARGV[1]`,
/// counts what stays, and has the shard expire `ARGV[2]` ms after the last deadline it holds
/// (each sweep pushes that on, so an index no replica sweeps any more, its metrics turned off or
/// its deployment retired, leaves Redis once its entries would all have). Answers
/// `{removed, left}`. Redis keeps what a script wrote before an error, so the expiry, which
/// comes after the removal, is set with `pcall`: a failure there cannot lose the count of what
/// was removed.
const SWEEP_SHARD: &str = r"
local removed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local left = redis.call('ZCARD', KEYS[1])
if left > 0 then
  local last = redis.pcall('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local score = type(last) == 'table' and tonumber(last[2])
  if score then
    local expiry = math.max(0, score) + tonumber(ARGV[2])
    redis.pcall('PEXPIREAT', KEYS[1], string.format('%d', expiry))
  end
end
return {removed, left}
";

/// The index of one kind of entry.
#[derive(Debug, Clone)]
pub(super) struct LiveIndex {
    /// The keys' common start: `<prefix>live:<kind>:`.
    stem: String,
    held: Held,
}

impl LiveIndex {
    pub(super) fn new(prefix: &str, kind: &str, held: Held) -> Self {
        Self {
            stem: format!("{prefix}live:{kind}:"),
            held,
        }
    }

    /// The shard key holding `member`.
    pub(super) fn key(&self, member: &str) -> String {
        self.shard_key(member.bytes().fold(0u8, u8::wrapping_add) % SHARDS)
    }

    /// The key of shard `shard` (below [`SHARDS`]).
    fn shard_key(&self, shard: u8) -> String {
        format!("{}{shard:x}", self.stem)
    }

    /// Records `member` as live for `ttl` from now (again, when it was already).
    pub(super) fn add(&self, member: &str, ttl: Duration) -> redis::Cmd {
        redis::cmd("ZADD")
            .arg(self.key(member))
            .arg(deadline_millis(ttl))
            .arg(member)
            .clone()
    }

    /// Gives `member` `ttl` more from now, if it is recorded with an earlier deadline (renewals
    /// arriving out of order do not move it back).
    pub(super) fn renew(&self, member: &str, ttl: Duration) -> redis::Cmd {
        redis::cmd("ZADD")
            .arg(self.key(member))
            .arg("XX")
            .arg("GT")
            .arg(deadline_millis(ttl))
            .arg(member)
            .clone()
    }

    /// Forgets `member`: it was read or deleted.
    pub(super) fn remove(&self, member: &str) -> redis::Cmd {
        redis::cmd("ZREM").arg(self.key(member)).arg(member).clone()
    }

    /// Removes what is past its deadline and reports it, with what is left, to the metrics.
    async fn sweep(
        &self,
        connection: &RedisConnection,
        timeout: Duration,
        script: &redis::Script,
    ) -> Result<(), StoreError> {
        let overdue = unix_millis(SystemTime::now()).saturating_sub(millis(CLOCK_SKEW));
        let keep_after_the_last = millis(CLOCK_SKEW).saturating_add(millis(LONGEST_PACE));
        let shards = (0..SHARDS).map(|shard| async move {
            let mut sweeping = script.key(self.shard_key(shard));
            sweeping.arg(overdue).arg(keep_after_the_last);
            let mut calling = connection.clone();
            connection
                .bounded(timeout, sweeping.invoke_async::<(u64, u64)>(&mut calling))
                .await
        });
        let (mut lapsed, mut live, mut failure) = (0, Some(0), None);
        for swept in join_all(shards).await {
            match swept {
                Ok((removed, left)) => {
                    lapsed += removed;
                    live = live.map(|total| total + left);
                }
                Err(e) => {
                    live = None;
                    failure = Some(e);
                }
            }
        }
        self.held.lapsed("redis", lapsed);
        // A total with a shard missing would be wrong: the gauge keeps its last value.
        if let Some(live) = live {
            self.held.now("redis", live);
        }
        failure.map_or(Ok(()), Err)
    }

    /// Counts `count` entries taken off the index before their deadline without being read
    /// (evicted past their owner's share).
    pub(super) fn lapsed(&self, count: u64) {
        self.held.lapsed("redis", count);
    }
}

/// Sweeps `indexes` at once, then `pace` (at most a day) after each sweep ended (the pace may
/// change meanwhile: the next sweep is then due one new pace after the last), until aborted or
/// until the pace's sender is gone.
pub(super) async fn sweep_forever(
    connection: RedisConnection,
    timeout: Duration,
    indexes: Vec<LiveIndex>,
    mut pace: watch::Receiver<Duration>,
) {
    let script = redis::Script::new(SWEEP_SHARD);
    loop {
        for index in &indexes {
            if let Err(e) = index.sweep(&connection, timeout, &script).await {
                // The counts wait for the next sweep; the store's own calls report the outage.
                tracing::debug!("sweeping {}: {e}", index.stem);
            }
        }
        let swept = Instant::now();
        loop {
            // Within bounds, so that a huge pace cannot overflow the deadline.
            let every = (*pace.borrow_and_update()).clamp(Duration::from_millis(10), LONGEST_PACE);
            tokio::select! {
                () = tokio::time::sleep_until(swept + every) => break,
                changed = pace.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The Unix time in milliseconds `ttl` from now.
fn deadline_millis(ttl: Duration) -> u64 {
    unix_millis(SystemTime::now()).saturating_add(millis(ttl))
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, millis)
}

fn millis(span: Duration) -> u64 {
    u64::try_from(span.as_millis()).unwrap_or(u64::MAX)
}
