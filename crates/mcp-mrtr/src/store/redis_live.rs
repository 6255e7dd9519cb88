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
//! command touches one of them only.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;

use super::StoreError;
use super::redis_connection::{RedisConnection, query};
use crate::observe::Held;

/// Keys each index is split over.
const SHARDS: u8 = 16;
/// How far replicas' clocks may disagree: an entry is swept this long after its deadline.
const CLOCK_SKEW: Duration = Duration::from_secs(1);
/// The longest pace between sweeps: a longer one is taken as this.
const LONGEST_PACE: Duration = Duration::from_secs(24 * 60 * 60);
/// How often a replica sweeps when not told otherwise.
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(15);

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
    ) -> Result<(), StoreError> {
        let overdue = unix_millis(SystemTime::now()).saturating_sub(millis(CLOCK_SKEW));
        let shards = (0..SHARDS).map(|shard| async move {
            let key = self.shard_key(shard);
            let removing = redis::cmd("ZREMRANGEBYSCORE")
                .arg(&key)
                .arg("-inf")
                .arg(overdue)
                .clone();
            let lapsed = match query::<u64>(connection, timeout, &removing).await {
                Ok(lapsed) => lapsed,
                Err(e) => return (0, Err(e)),
            };
            let live = query::<u64>(connection, timeout, redis::cmd("ZCARD").arg(&key)).await;
            if matches!(live, Ok(count) if count > 0)
                && let Err(e) = expire_after_the_last(connection, timeout, &key).await
            {
                tracing::debug!("setting {key} to expire: {e}");
            }
            (lapsed, live)
        });
        let (mut lapsed, mut live, mut failure) = (0, Some(0), None);
        for (shard_lapsed, shard_live) in join_all(shards).await {
            // What a shard removed is counted even when another shard failed: it is gone.
            lapsed += shard_lapsed;
            match shard_live {
                Ok(count) => live = live.map(|total| total + count),
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

/// Has the index shard `key` expire a day (the longest pace between sweeps) after the last
/// deadline it holds: each sweep pushes that on, and an index no replica sweeps any more (its
/// metrics turned off, its deployment retired) leaves Redis once its entries would all have.
async fn expire_after_the_last(
    connection: &RedisConnection,
    timeout: Duration,
    key: &str,
) -> Result<(), StoreError> {
    let last = redis::cmd("ZREVRANGE")
        .arg(key)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .clone();
    let last: Vec<(String, f64)> = query(connection, timeout, &last).await?;
    let Some(&(_, deadline)) = last.first() else {
        return Ok(());
    };
    // Scores are whole milliseconds: the cast loses nothing.
    let expiry = (deadline.max(0.0) as u64)
        .saturating_add(millis(CLOCK_SKEW))
        .saturating_add(millis(LONGEST_PACE));
    let expiring = redis::cmd("PEXPIREAT").arg(key).arg(expiry).clone();
    query::<i64>(connection, timeout, &expiring).await.map(drop)
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
    loop {
        for index in &indexes {
            if let Err(e) = index.sweep(&connection, timeout).await {
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
