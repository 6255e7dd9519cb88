//! Memory: whether the server's resident set stays flat over many round trips and while clients
//! leave continuations parked (the in-memory store must stay bounded), and how many bytes of Redis
//! one pending continuation takes.

use crate::client::Workload;
use crate::load::{Round, Target, Until};
use crate::servers::{Binaries, Kind, Server};

/// The in-memory store's capacity (the server's default, given explicitly).
const STORE_CAPACITY: u64 = 100_000;
/// Times the store's capacity in unanswered first rounds sent once it is full.
const OVERFLOW_ROUNDS: u64 = 4;
/// Round trips before the first reading.
const WARM_ROUND_TRIPS: u64 = 10_000;
/// Most the resident set may grow between the readings.
const FLAT_MIB: f64 = 10.0;

const MIB: f64 = 1024.0 * 1024.0;

/// Resident set after 10,000 round trips and after `total`; then after filling the store with
/// first rounds nobody answers, and after four times as many more.
pub async fn rss_check(
    bins: &Binaries,
    state_keys: &str,
    concurrency: usize,
    total: u64,
) -> anyhow::Result<()> {
    let server = Server::start(bins, &Kind::Memory, state_keys).await?;
    let mut target = Target::connect("memory", server, Workload::Elicitation, concurrency).await?;
    println!(
        "Resident set of the conformance example (memory store, capacity {STORE_CAPACITY}), {concurrency} concurrent clients\n"
    );
    let warm = WARM_ROUND_TRIPS.min(total);
    target.run(&Until::count(warm), Round::Full, true).await?;
    let after_warm = target.server.rss_bytes()?;
    println!(
        "after {warm:>9} round trips: {:>7.1} MiB",
        after_warm as f64 / MIB
    );
    let step = (total / 10).max(1);
    let mut done = warm;
    while done < total {
        let now = step.min(total - done);
        target.run(&Until::count(now), Round::Full, true).await?;
        done += now;
        eprintln!(
            "  {done} round trips: {:.1} MiB",
            target.server.rss_bytes()? as f64 / MIB
        );
    }
    let after_all = target.server.rss_bytes()?;
    let growth = (after_all as f64 - after_warm as f64) / MIB;
    println!(
        "after {total:>9} round trips: {:>7.1} MiB  (growth {growth:+.1} MiB; target within {FLAT_MIB} MiB: {})",
        after_all as f64 / MIB,
        holds(growth.abs() <= FLAT_MIB)
    );

    target
        .run(&Until::count(STORE_CAPACITY), Round::FirstOnly, true)
        .await?;
    println!(
        "\nafter {STORE_CAPACITY} first rounds left unanswered (the store is full): {:>7.1} MiB",
        target.server.rss_bytes()? as f64 / MIB
    );
    // From here on every new continuation evicts the oldest: the resident set must stay put.
    let mut readings = Vec::new();
    for more in 1..=OVERFLOW_ROUNDS {
        target
            .run(&Until::count(STORE_CAPACITY), Round::FirstOnly, true)
            .await?;
        let rss = target.server.rss_bytes()?;
        println!(
            "after {:>6} more:                                  {:>7.1} MiB",
            more * STORE_CAPACITY,
            rss as f64 / MIB
        );
        readings.push(rss);
    }
    let (first, last) = (readings[0] as f64, readings[readings.len() - 1] as f64);
    let growth = (last - first) / MIB;
    println!(
        "growth while full: {growth:+.1} MiB (bounded within {FLAT_MIB} MiB: {})",
        holds(growth.abs() <= FLAT_MIB)
    );
    let errors = target.tally.figures().errors;
    println!("errors: {errors}");
    target.server.stop().await;
    Ok(())
}

pub fn holds(condition: bool) -> &'static str {
    if condition { "holds" } else { "DOES NOT HOLD" }
}

/// The keys under `prefix`, of `kind` when given.
async fn scan(
    redis: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    kind: Option<&str>,
) -> anyhow::Result<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let mut command = redis::cmd("SCAN");
        command
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000);
        if let Some(kind) = kind {
            command.arg("TYPE").arg(kind);
        }
        let (next, batch): (u64, Vec<String>) = command.query_async(redis).await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Average Redis footprint of one parked continuation.
pub struct PendingSize {
    pub keys: usize,
    pub memory_usage: f64,
    pub key_length: usize,
    pub payload_length: f64,
    /// Bytes of the store's index of live continuations (kept for the metrics), per continuation.
    pub live_index: f64,
}

/// Parks `count` first rounds on the Redis-backed `target`, reads the size of the keys under
/// `prefix`, and deletes them.
pub async fn pending_size(
    target: &mut Target,
    redis_url: &str,
    prefix: &str,
    count: u64,
) -> anyhow::Result<PendingSize> {
    target
        .run(&Until::count(count), Round::FirstOnly, false)
        .await?;
    let mut redis = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    // Continuations are strings; each caller's index of them is a sorted set.
    let keys = scan(&mut redis, prefix, Some("string")).await?;
    anyhow::ensure!(
        !keys.is_empty(),
        "no parked continuation found under {prefix}"
    );
    let (mut memory, mut payload) = (0_u64, 0_u64);
    for key in &keys {
        memory += memory_usage(&mut redis, key).await?;
        payload += redis::cmd("STRLEN")
            .arg(key)
            .query_async::<u64>(&mut redis)
            .await?;
    }
    let mut live_index = 0_u64;
    for key in scan(
        &mut redis,
        &format!("{prefix}live:continuations:"),
        Some("zset"),
    )
    .await?
    {
        live_index += memory_usage(&mut redis, &key).await?;
    }
    for batch in scan(&mut redis, prefix, None).await?.chunks(500) {
        redis::cmd("DEL")
            .arg(batch)
            .query_async::<()>(&mut redis)
            .await?;
    }
    let parked = keys.len() as f64;
    Ok(PendingSize {
        keys: keys.len(),
        memory_usage: memory as f64 / parked,
        key_length: keys[0].len(),
        payload_length: payload as f64 / parked,
        live_index: live_index as f64 / parked,
    })
}

/// The bytes Redis holds for `key`, all of its elements counted.
async fn memory_usage(
    redis: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> anyhow::Result<u64> {
    let usage = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async::<Option<u64>>(redis)
        .await?;
    Ok(usage.unwrap_or_default())
}
