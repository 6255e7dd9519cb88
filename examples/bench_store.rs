//! What the Redis continuation store costs against the in-memory one, measured in one run: full
//! MRTR round trips (call → `input_required` → retry with the answer and the `requestState` →
//! `complete`) per second from concurrent clients over keep-alive HTTP, with latency percentiles
//! and errors, for an in-process server on each store; then the Redis bytes one pending
//! continuation takes. The tool remembers a title and asks one question, so its continuation is
//! the size of `addToWatchlist`'s.
//!
//! ```sh
//! cargo run --release --example bench_store -- --seconds 10 --concurrency 32
//! ```
//!
//! Absolute figures depend on the machine; compare the ratios, measured in the same run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use futures::StreamExt;
use moviedb_mcp::app;
use moviedb_mcp::auth::AnonymousOnly;
use moviedb_mcp::config::ServeArgs;
use moviedb_mcp::moviedb::tools::STATUS_QUESTION;
use moviedb_mcp::mrtr::StateSealer;
use moviedb_mcp::protocol::content::CallToolResult;
use moviedb_mcp::protocol::input::Elicitation;
use moviedb_mcp::registry::{NoArguments, Registry, Tool};
use moviedb_mcp::server::{Events, ServerInfo};
use serde_json::{Value, json};

/// Redis tried when REDIS_URL is not set.
const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// The tool every round trip calls.
const TOOL: &str = "add_title";
/// What the tool remembers between rounds (addToWatchlist remembers the title).
const TITLE: &str = "The Godfather";

/// Measures MRTR round trips on the memory and the Redis continuation stores.
#[derive(Debug, Parser)]
struct Cli {
    /// Concurrent client loops.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Measured seconds per store (after a warm-up of a fifth of that).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Slices the measured time is cut into, the stores taking turns, so that drift in the
    /// machine's speed affects both alike.
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// First rounds parked to measure the Redis bytes per pending continuation.
    #[arg(long, default_value_t = 1000)]
    pending: usize,
    /// Redis for the Redis store; when unset, the default is used if it answers.
    #[arg(long, env = "REDIS_URL")]
    redis_url: Option<String>,
}

/// The server's own settings, parsed from an argument list so every default applies.
#[derive(Debug, Parser)]
struct ServeDefaults {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.concurrency > 0 && cli.rounds > 0,
        "--concurrency and --rounds must be at least 1"
    );
    let measured = Duration::from_secs_f64(cli.seconds.max(0.1));
    let redis_url = match cli.redis_url.clone() {
        Some(url) => Some(url),
        None => answers(DEFAULT_REDIS_URL)
            .await
            .then(|| DEFAULT_REDIS_URL.to_owned()),
    };
    let prefix = format!("moviedb-bench-{}:", std::process::id());

    println!(
        "MRTR round trips (call -> input_required -> retry -> complete), {} concurrent clients, \
         {:.1} s per store in {} alternating slices\n",
        cli.concurrency,
        measured.as_secs_f64(),
        cli.rounds
    );
    let memory_server = BenchServer::start(None).await?;
    let redis_server = match &redis_url {
        Some(url) => Some(BenchServer::start(Some((url, &prefix))).await?),
        None => None,
    };
    let mut stores = vec![Store::new("memory", &memory_server, cli.concurrency)?];
    if let Some(server) = &redis_server {
        stores.push(Store::new("redis", server, cli.concurrency)?);
    }
    for store in &stores {
        run_loops(&store.client, cli.concurrency, measured / 5).await;
    }
    for _ in 0..cli.rounds {
        for store in &mut stores {
            store.run(cli.concurrency, measured / cli.rounds).await;
        }
    }
    println!(
        "{:<8} {:>14} {:>9} {:>9} {:>8} {:>10}",
        "store", "round trips/s", "p50 ms", "p99 ms", "errors", "vs memory"
    );
    let baseline = stores[0].measurement();
    for store in &stores {
        store.measurement().print(store.name, &baseline);
    }
    if redis_server.is_none() {
        println!("redis    (skipped: set REDIS_URL or start Redis on {DEFAULT_REDIS_URL})");
    }

    if let (Some(url), Some(server)) = (&redis_url, &redis_server) {
        let size = pending_size(server, url, &prefix, cli.pending, cli.concurrency).await?;
        println!(
            "\nRedis per pending continuation ({} parked first rounds): MEMORY USAGE {:.1} bytes per key \
             (key {} bytes, payload {:.1} bytes)",
            size.keys, size.memory_usage, size.key_length, size.payload_length
        );
    }
    Ok(())
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

/// An in-process server with the one bench tool, on a free port of 127.0.0.1.
struct BenchServer {
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl BenchServer {
    /// On the memory store, or on Redis at `(url, key prefix)`.
    async fn start(redis: Option<(&String, &String)>) -> anyhow::Result<Self> {
        let mut args = ServeDefaults::try_parse_from(["bench"])?.serve;
        args.bind = SocketAddr::from(([127, 0, 0, 1], 0));
        args.state_keys = Some(StateSealer::generate_spec("bench"));
        args.redis_url = redis.map(|(url, _)| url.clone());
        if let Some((_, prefix)) = redis {
            args.redis_prefix = prefix.clone();
        }
        let info = ServerInfo {
            name: "moviedb-mcp-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            instructions: None,
        };
        let router = app::router(
            &args,
            bench_registry(),
            info,
            Events::new(),
            Arc::new(AnonymousOnly),
        )
        .await?;
        let listener = tokio::net::TcpListener::bind(args.bind).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(moviedb_mcp::transport::serve(listener, router, async {
            let _ = stopped.await;
        }));
        Ok(Self {
            url: format!("http://{addr}{}", app::MCP_PATH),
            _stop: stop,
        })
    }
}

/// One tool shaped like addToWatchlist: it remembers the title, then asks for the status.
fn bench_registry() -> Registry {
    let mut registry = Registry::new();
    registry.add_tool(Tool::new(
        TOOL,
        "Remembers a title, asks whether it was watched, and echoes both",
        |ctx, _: NoArguments| async move {
            let title: String = ctx
                .remember("title", || async { Ok(TITLE.to_owned()) })
                .await?;
            let form = json!({
                "type": "object",
                "properties": {"status": {"type": "string", "enum": ["WANT_TO_WATCH", "WATCHED"]}},
                "required": ["status"]
            });
            let status = match ctx.elicit("status", STATUS_QUESTION, form).await? {
                Elicitation::Accepted(content) => content
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or("WANT_TO_WATCH")
                    .to_owned(),
                _ => "WANT_TO_WATCH".to_owned(),
            };
            Ok(CallToolResult::text(format!("{title}: {status}")))
        },
    ));
    registry
}

/// A 2026-07-28 client of the bench tool over one keep-alive connection pool.
#[derive(Clone)]
struct BenchClient {
    http: reqwest::Client,
    url: String,
}

impl BenchClient {
    fn new(url: &str, concurrency: usize) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(concurrency)
            .build()?;
        Ok(Self {
            http,
            url: url.to_owned(),
        })
    }

    async fn call(&self, extra: Value) -> anyhow::Result<Value> {
        let mut params = json!({
            "name": TOOL,
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}
            }
        });
        if let (Some(params), Value::Object(extra)) = (params.as_object_mut(), extra) {
            params.extend(extra);
        }
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        let response = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", TOOL)
            .json(&body)
            .send()
            .await?;
        let reply: Value = response.json().await?;
        reply
            .get("result")
            .cloned()
            .with_context(|| format!("no result: {reply}"))
    }

    /// Round one; returns its `requestState`.
    async fn ask(&self) -> anyhow::Result<String> {
        let result = self.call(json!({})).await?;
        anyhow::ensure!(
            result["resultType"] == "input_required",
            "expected input_required: {result}"
        );
        result["requestState"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("no requestState: {result}"))
    }

    /// One full MRTR round trip, every answer checked.
    async fn round_trip(&self) -> anyhow::Result<()> {
        let state = self.ask().await?;
        let answer = json!({"action": "accept", "content": {"status": "WATCHED"}});
        let result = self
            .call(json!({"inputResponses": {"status": answer}, "requestState": state}))
            .await?;
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        anyhow::ensure!(
            result["resultType"] == "complete" && text == format!("{TITLE}: WATCHED"),
            "unexpected final result: {result}"
        );
        Ok(())
    }
}

/// Round trips of one store.
struct Measurement {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    errors: usize,
}

impl Measurement {
    fn print(&self, store: &str, baseline: &Measurement) {
        let ratio = if baseline.per_second > 0.0 {
            self.per_second / baseline.per_second
        } else {
            0.0
        };
        println!(
            "{store:<8} {:>14.1} {:>9.2} {:>9.2} {:>8} {:>10.2}",
            self.per_second,
            self.p50.as_secs_f64() * 1000.0,
            self.p99.as_secs_f64() * 1000.0,
            self.errors,
            ratio
        );
    }
}

/// One store under test: its client, and every round trip measured so far.
struct Store {
    name: &'static str,
    client: BenchClient,
    latencies: Vec<Duration>,
    errors: usize,
    elapsed: Duration,
}

impl Store {
    fn new(name: &'static str, server: &BenchServer, concurrency: usize) -> anyhow::Result<Self> {
        Ok(Self {
            name,
            client: BenchClient::new(&server.url, concurrency)?,
            latencies: Vec::new(),
            errors: 0,
            elapsed: Duration::ZERO,
        })
    }

    /// Runs `concurrency` loops of round trips for `slice` and adds them to the tally.
    async fn run(&mut self, concurrency: usize, slice: Duration) {
        let started = Instant::now();
        let (latencies, errors) = run_loops(&self.client, concurrency, slice).await;
        self.elapsed += started.elapsed();
        self.latencies.extend(latencies);
        self.errors += errors;
    }

    fn measurement(&self) -> Measurement {
        let mut latencies = self.latencies.clone();
        latencies.sort_unstable();
        let percentile = |p: usize| {
            latencies
                .get((latencies.len() * p / 100).min(latencies.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Measurement {
            per_second: latencies.len() as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON),
            p50: percentile(50),
            p99: percentile(99),
            errors: self.errors,
        }
    }
}

/// Latencies of the round trips that succeeded, and how many failed.
async fn run_loops(
    client: &BenchClient,
    concurrency: usize,
    duration: Duration,
) -> (Vec<Duration>, usize) {
    let deadline = Instant::now() + duration;
    let loops = (0..concurrency).map(|_| {
        let client = client.clone();
        tokio::spawn(async move {
            let (mut latencies, mut errors) = (Vec::new(), 0);
            while Instant::now() < deadline {
                let started = Instant::now();
                match client.round_trip().await {
                    Ok(()) => latencies.push(started.elapsed()),
                    Err(e) => {
                        errors += 1;
                        if errors == 1 {
                            eprintln!("round trip failed: {e:#}");
                        }
                    }
                }
            }
            (latencies, errors)
        })
    });
    let mut all = (Vec::new(), 0);
    for finished in futures::future::join_all(loops).await {
        let (latencies, errors) = finished.unwrap_or_default();
        all.0.extend(latencies);
        all.1 += errors;
    }
    all
}

/// Average Redis footprint of one parked continuation.
struct PendingSize {
    keys: usize,
    memory_usage: f64,
    key_length: usize,
    payload_length: f64,
}

/// Parks `count` first rounds, reads the size of their keys, and deletes them.
async fn pending_size(
    server: &BenchServer,
    redis_url: &str,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<PendingSize> {
    let client = BenchClient::new(&server.url, concurrency)?;
    let parked: Vec<anyhow::Result<String>> = futures::stream::iter(0..count)
        .map(|_| client.ask())
        .buffer_unordered(concurrency)
        .collect()
        .await;
    parked.into_iter().collect::<anyhow::Result<Vec<_>>>()?;

    let mut redis = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut redis)
            .await?;
        keys.extend(batch);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    anyhow::ensure!(
        !keys.is_empty(),
        "no parked continuation found under {prefix}"
    );
    let (mut memory, mut payload) = (0_u64, 0_u64);
    for key in &keys {
        memory += redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .arg("SAMPLES")
            .arg(0)
            .query_async::<Option<u64>>(&mut redis)
            .await?
            .unwrap_or_default();
        payload += redis::cmd("STRLEN")
            .arg(key)
            .query_async::<u64>(&mut redis)
            .await?;
    }
    for batch in keys.chunks(500) {
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
    })
}
