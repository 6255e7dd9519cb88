//! The MRTR benchmark. One round trip is `tools/call` → `input_required` → the retry with
//! `inputResponses` and `requestState` → `complete`. In one run it starts, each in its own process,
//! (a) the floor: a bare axum server answering those two requests with fixed bytes, (b) the
//! conformance example on the in-memory store (and beside it, given `--earlier-conformance`, an
//! earlier build of it: row memory-base), (c) the same on the Redis store (`REDIS_URL`, or
//! Redis on the default port if it answers; beside it the earlier build: row redis-base), (d) `moviedb-mcp` on its embedded SQLite database
//! for `addToWatchlist` end to end (two rounds and the SQL write, a new signed-in user each time),
//! (e) the same on PostgreSQL (`DATABASE_URL`, skipped when unset), and (f) `moviedb-mcp` for
//! single calls of `recommendMoviesForMood` and of `summarizeMovieReviews` (summaries cached from
//! a stand-in provider), measured against the floor answering single calls of the same shape.
//! C client loops, each on its own keep-alive connection, drive one server at a time; the servers
//! take turns in slices so that drift in the machine's speed affects all alike. Every response is
//! checked. For each server it prints round trips (or calls) per second, p50, p99, errors, the
//! server's CPU time per round trip, and the ratios to its floor; then whether the goals hold, and
//! the Redis bytes one pending continuation takes.
//!
//! ```sh
//! cargo build --release --bins --examples && target/release/examples/bench_mrtr
//! target/release/examples/bench_mrtr --memory --round-trips 1000000   # resident set over time
//! target/release/examples/bench_mrtr --scenario mrtr --earlier-conformance /tmp/conformance_server-old
//! ```
//!
//! Absolute figures depend on the machine; only the ratios to the floor carry across machines.

mod client;
#[path = "../common/mod.rs"]
mod common;
mod floor;
mod footprint;
mod load;
mod provider;
mod report;
mod servers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use client::{Connection, SEEDED_MOVIES, Turns, Users, Workload};
use load::{Round, Target, Until};
use moviedb_mcp::mrtr::StateSealer;
use servers::{Binaries, Kind, Server};

/// Redis tried when REDIS_URL is not set.
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

/// Measures MRTR round trips against a bare HTTP floor, in one run.
#[derive(Debug, Parser)]
struct Cli {
    /// Concurrent client loops, each on its own keep-alive connection.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured seconds per server (after a warm-up of a fifth of that).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Slices the measured time is cut into, the servers taking turns.
    #[arg(long, default_value_t = 10)]
    slices: u32,
    /// Which servers to measure besides the floor.
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// Instead of the table: the server's resident set after 10,000 round trips and after
    /// --round-trips, then while the in-memory store is full of unanswered first rounds.
    #[arg(long)]
    memory: bool,
    /// Round trips of the --memory check.
    #[arg(long, default_value_t = 1_000_000)]
    round_trips: u64,
    /// First rounds of addToWatchlist parked to measure the Redis bytes per pending continuation.
    #[arg(long, default_value_t = 1000)]
    pending: u64,
    /// Redis for the Redis store; when unset, the default is used if it answers.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
    /// PostgreSQL for the watchlist-pg row (this run's users are added to it, named
    /// bench-<run>-<n>: point it at a scratch database); the row is skipped when unset.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// An earlier build of the conformance example, measured on the memory store and on Redis
    /// beside this build's (rows memory-base and redis-base), to see what a change costs in the
    /// same run.
    #[arg(long, value_name = "PATH")]
    earlier_conformance: Option<PathBuf>,
    /// Serve the floor on this address (used by the benchmark itself).
    #[arg(long, hide = true)]
    serve_floor: Option<SocketAddr>,
    /// Serve the stand-in LLM provider on this address (used by the benchmark itself).
    #[arg(long, hide = true)]
    serve_provider: Option<SocketAddr>,
    /// Serve the stand-in OTLP trace sink on this address (used by the benchmark itself).
    #[arg(long, hide = true)]
    serve_otlp_sink: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// All of the below.
    All,
    /// The conformance example on the memory and Redis stores.
    Mrtr,
    /// addToWatchlist on moviedb-mcp, on SQLite and on PostgreSQL.
    Watchlist,
    /// Single calls of recommendMoviesForMood and summarizeMovieReviews on moviedb-mcp.
    Calls,
}

impl Scenario {
    fn runs(self, part: Self) -> bool {
        self == Self::All || self == part
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(bind) = cli.serve_floor {
        return floor::serve(bind).await;
    }
    if let Some(bind) = cli.serve_provider {
        return provider::serve(bind).await;
    }
    if let Some(bind) = cli.serve_otlp_sink {
        return provider::serve_otlp_sink(bind).await;
    }
    anyhow::ensure!(
        cli.concurrency > 0 && cli.slices > 0,
        "--concurrency and --slices must be at least 1"
    );
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; measure with --release");
    }
    let bins = Binaries::locate()?;
    let state_keys = StateSealer::generate_spec("bench");
    if cli.memory {
        return footprint::rss_check(&bins, &state_keys, cli.concurrency, cli.round_trips).await;
    }
    throughput(&cli, &bins, &state_keys).await
}

/// The table, then the Redis bytes per pending continuation.
async fn throughput(cli: &Cli, bins: &Binaries, state_keys: &str) -> anyhow::Result<()> {
    let measured = Duration::from_secs_f64(cli.seconds.max(0.1));
    let redis_url = match &cli.redis_url {
        Some(url) => Some(url.clone()),
        None => answers(DEFAULT_REDIS_URL)
            .await
            .then(|| DEFAULT_REDIS_URL.to_owned()),
    };
    let run = std::process::id();
    let prefix = format!("moviedb-bench-{run}:");
    let jwt_secret = common::random_hex(32);
    let scratch = Scratch(std::env::temp_dir().join(format!("moviedb-bench-{run}")));
    let c = cli.concurrency;

    let moviedb = |data_dir: PathBuf, database_url: Option<String>, provider, otlp| {
        let jwt_secret = &jwt_secret;
        async move {
            let kind = Kind::Moviedb {
                data_dir: &data_dir,
                jwt_secret,
                redis: None,
                database_url: database_url.as_deref(),
                provider,
                otlp,
            };
            Server::start(bins, &kind, state_keys).await
        }
    };
    let mut provider = None;
    let mut calls = Vec::new();
    if cli.scenario.runs(Scenario::Calls) {
        let stand_in = Server::start(bins, &Kind::Provider, state_keys).await?;
        let summarizing =
            moviedb(scratch.0.join("summarize"), None, Some(stand_in.addr), None).await?;
        provider = Some(stand_in);
        // Summarizes every seeded movie once: the ones with a summary are the workload, and their
        // summaries are cached from then on. Done before any connection is opened, so that none
        // sits idle long enough for the server to close it.
        let summarized = Turns::new(summarized_movies(summarizing.addr).await?)?;
        let floor = Server::start(bins, &Kind::Floor, state_keys).await?;
        let recommending = moviedb(scratch.0.join("recommend"), None, None, None).await?;
        calls = vec![
            ("floor-call", floor, Workload::Calls(summarized.clone())),
            (
                "recommend",
                recommending,
                Workload::Recommend(Default::default()),
            ),
            ("summarize", summarizing, Workload::Summarize(summarized)),
        ];
    }
    let mut targets = Vec::new();
    if cli.scenario != Scenario::Calls {
        let floor = Server::start(bins, &Kind::Floor, state_keys).await?;
        targets.push(Target::connect("floor", floor, Workload::Elicitation, c).await?);
    }
    if cli.scenario.runs(Scenario::Mrtr) {
        let memory = Server::start(bins, &Kind::Memory, state_keys).await?;
        targets.push(Target::connect("memory", memory, Workload::Elicitation, c).await?);
        if let Some(path) = &cli.earlier_conformance {
            let kind = Kind::Earlier {
                binary: path,
                redis: None,
            };
            let earlier = Server::start(bins, &kind, state_keys).await?;
            targets.push(Target::connect("memory-base", earlier, Workload::Elicitation, c).await?);
        }
        if let Some(url) = &redis_url {
            let kind = Kind::Redis {
                url,
                prefix: &prefix,
            };
            let redis = Server::start(bins, &kind, state_keys).await?;
            targets.push(Target::connect("redis", redis, Workload::Elicitation, c).await?);
            if let Some(path) = &cli.earlier_conformance {
                // Keys of their own: what one build leaves in an owner's index must not weigh on
                // the other's writes.
                let earlier_prefix = format!("{prefix}base:");
                let kind = Kind::Earlier {
                    binary: path,
                    redis: Some((url, &earlier_prefix)),
                };
                let earlier = Server::start(bins, &kind, state_keys).await?;
                targets
                    .push(Target::connect("redis-base", earlier, Workload::Elicitation, c).await?);
            }
        }
    }
    let tag = format!("{run}-{}", common::random_hex(4));
    let mut otlp_sink = None;
    if cli.scenario.runs(Scenario::Watchlist) {
        let server = moviedb(scratch.0.join("watchlist"), None, None, None).await?;
        let users = Workload::Watchlist(Users::new(&jwt_secret, &tag).into());
        targets.push(Target::connect("watchlist", server, users, c).await?);
        // The same server exporting every span over OTLP/HTTP: what tracing costs.
        let sink = Server::start(bins, &Kind::OtlpSink, state_keys).await?;
        let server = moviedb(
            scratch.0.join("watchlist-otel"),
            None,
            None,
            Some(sink.addr),
        )
        .await?;
        otlp_sink = Some(sink);
        let users = Workload::Watchlist(Users::new(&jwt_secret, &tag).into());
        targets.push(Target::connect("watchlist-otel", server, users, c).await?);
        if let Some(url) = &cli.database_url {
            let server = moviedb(
                scratch.0.join("watchlist-pg"),
                Some(url.clone()),
                None,
                None,
            )
            .await?;
            let users = Workload::Watchlist(Users::new(&jwt_secret, &tag).into());
            targets.push(Target::connect("watchlist-pg", server, users, c).await?);
        }
    }
    for (name, server, workload) in calls {
        targets.push(Target::connect(name, server, workload, c).await?);
    }
    println!(
        "MRTR round trips (tools/call -> input_required -> retry -> complete) and single calls, {c} \
         concurrent keep-alive clients, {:.1} s per server in {} alternating slices, {} cores\n",
        measured.as_secs_f64(),
        cli.slices,
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    // Warm-up and measurement both take turns in slices: a connection left unused for longer than
    // the server's header-read timeout (10 s) would be closed.
    for _ in 0..cli.slices {
        for target in &mut targets {
            let warm_up = Until::Deadline(Instant::now() + measured / 5 / cli.slices);
            target.run(&warm_up, Round::Full, false).await?;
        }
    }
    for _ in 0..cli.slices {
        for target in &mut targets {
            let slice = Until::Deadline(Instant::now() + measured / cli.slices);
            target.run(&slice, Round::Full, true).await?;
        }
    }
    let rows: Vec<(&str, load::Figures)> = targets
        .iter()
        .map(|target| (target.name, target.tally.figures()))
        .collect();
    report::table(&rows);
    if cli.scenario.runs(Scenario::Mrtr) && redis_url.is_none() {
        println!("redis      (skipped: set REDIS_URL or start Redis on {DEFAULT_REDIS_URL})");
    }
    if cli.scenario.runs(Scenario::Watchlist) && cli.database_url.is_none() {
        println!("watchlist-pg (skipped: set DATABASE_URL to a PostgreSQL database)");
    }
    println!();
    report::goals(&rows);
    for target in targets {
        target.server.stop().await;
    }
    for stand_in in provider.into_iter().chain(otlp_sink) {
        stand_in.stop().await;
    }

    let pending_redis = redis_url
        .as_ref()
        .filter(|_| cli.scenario.runs(Scenario::Watchlist));
    if let Some(url) = pending_redis {
        let kind = Kind::Moviedb {
            data_dir: &scratch.0.join("pending"),
            jwt_secret: &jwt_secret,
            redis: Some((url, &prefix)),
            database_url: None,
            provider: None,
            otlp: None,
        };
        let server = Server::start(bins, &kind, state_keys).await?;
        let users = Workload::Watchlist(Users::new(&jwt_secret, &tag).into());
        let mut target = Target::connect("pending", server, users, c).await?;
        let size = footprint::pending_size(&mut target, url, &prefix, cli.pending).await?;
        target.server.stop().await;
        println!(
            "\nRedis per pending addToWatchlist continuation ({} parked first rounds): MEMORY USAGE \
             {:.1} bytes per key (key {} bytes, payload {:.1} bytes), and {:.1} bytes in the index of \
             live continuations",
            size.keys, size.memory_usage, size.key_length, size.payload_length, size.live_index
        );
    }
    Ok(())
}

/// The seeded movies that get a written summary, each summarized once through `addr`.
async fn summarized_movies(addr: SocketAddr) -> anyhow::Result<Vec<u64>> {
    let mut connection = Connection::open(addr).await?;
    let mut movies = Vec::new();
    for movie in 1..=SEEDED_MOVIES {
        if client::summary_of(&mut connection, movie).await?.is_some() {
            movies.push(movie);
        }
    }
    Ok(movies)
}

/// A folder for this run's databases, removed at the end.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn answers(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let ping = async {
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ping).await,
        Ok(Ok(_))
    )
}
