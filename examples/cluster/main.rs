//! Runs several replicas of an MCP server behind nginx (with the repository's `deploy/nginx.conf`),
//! sharing Redis (and PostgreSQL when given), the way a deployment would: for the tests, and for
//! trying it by hand.
//!
//! ```sh
//! cargo build --examples
//! target/debug/examples/cluster --replicas 3 --database-url postgres://postgres@127.0.0.1/moviedb
//! target/debug/examples/cluster --bin target/debug/examples/conformance_server -- --redis-prefix conf:
//! ```
//!
//! Every replica gets the same `MOVIEDB_STATE_KEYS` and `MOVIEDB_JWT_SECRET` (taken from the
//! environment, or generated for this run), so any of them opens any `requestState` and accepts any
//! token. nginx sends each request to the next replica (round robin, no stickiness) and says which
//! replica served it in `X-Moviedb-Upstream`. SIGTERM stops nginx and the replicas, which drain;
//! Ctrl-C at the terminal reaches the replicas too, and they stop at once (see the README).

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/nginx.rs"]
mod nginx;
mod replicas;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use common::random_hex;
use moviedb_mcp::app;
use moviedb_mcp::mrtr::StateSealer;
use replicas::{Launch, Replica, Supervisor};

/// Starts N replicas of an MCP server sharing Redis, and nginx in front of them.
#[derive(Debug, Parser)]
struct Cli {
    /// How many replicas to run.
    #[arg(long, default_value_t = 3)]
    replicas: usize,

    /// Port of nginx on 127.0.0.1 (0 picks a free one); it serves http://localhost:PORT/mcp.
    #[arg(long, default_value_t = 3000)]
    port: u16,

    /// The server binary to replicate; it must accept `--bind HOST:PORT`. Default: the
    /// `moviedb-mcp` binary of the same build (e.g. target/debug/moviedb-mcp).
    #[arg(long)]
    bin: Option<PathBuf>,

    /// Redis shared by every replica (continuations and change events).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    redis_url: String,

    /// Database shared by every replica (`postgres://…`); passed on as DATABASE_URL. Without it a
    /// moviedb-mcp replica uses the embedded SQLite file of its data folder.
    #[arg(long, hide_env_values = true)]
    database_url: Option<String>,

    /// Arguments for every replica, after `--` (e.g. `-- --redis-prefix test:`).
    #[arg(last = true)]
    replica_args: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = moviedb_mcp::telemetry::init_logging();
    let cli = Cli::parse();
    anyhow::ensure!(cli.replicas > 0, "--replicas must be at least 1");
    let launch = Launch {
        bin: match cli.bin {
            Some(bin) => bin,
            None => binary_next_to_this_one()?,
        },
        env: shared_environment(&cli.redis_url, cli.database_url.as_deref()),
        args: cli.replica_args,
    };
    let port = match cli.port {
        0 => common::free_port()?,
        port => port,
    };

    let shutdown = moviedb_mcp::app::shutdown_signal();
    tokio::pin!(shutdown);
    let replicas = tokio::select! {
        started = replicas::start_all(&launch, cli.replicas) => started?,
        () = &mut shutdown => return Ok(()),
    };
    for replica in &replicas {
        println!("{}", replica_line(replica));
    }
    let addresses: Vec<_> = replicas.iter().map(|replica| replica.addr).collect();
    let supervisor = Supervisor::watch(replicas);
    let mut balancer = match nginx::Nginx::start(port, &addresses, true).await {
        Ok(balancer) => balancer,
        Err(e) => {
            supervisor.stop().await;
            return Err(e.context(format!("nginx cannot serve on 127.0.0.1:{port}")));
        }
    };
    println!("balancer: {}", balancer.url());
    tokio::select! {
        // A Ctrl-C at the terminal stops nginx too: the signal is looked at first.
        biased;
        () = shutdown => {}
        exited = balancer.exited() => {
            supervisor.stop().await;
            let status = exited.map_or_else(|e| e.to_string(), |status| status.to_string());
            anyhow::bail!("nginx exited ({status}); the replicas were stopped");
        }
    }
    tracing::info!("stopping nginx and the replicas");
    balancer.stop().await;
    supervisor.stop().await;
    Ok(())
}

fn replica_line(replica: &Replica) -> String {
    format!(
        "replica {}: http://{}{} (pid {})",
        replica.number,
        replica.addr,
        app::MCP_PATH,
        replica.pid
    )
}

/// `moviedb-mcp` of the build this example belongs to (target/<profile>/examples/cluster →
/// target/<profile>/moviedb-mcp).
fn binary_next_to_this_one() -> anyhow::Result<PathBuf> {
    let this = std::env::current_exe().context("cannot locate the cluster launcher itself")?;
    let profile_dir = this
        .parent()
        .and_then(|examples| examples.parent())
        .context("the cluster launcher is not inside a target folder")?;
    let bin = profile_dir.join(format!("moviedb-mcp{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        bin.is_file(),
        "{} not found: build it (cargo build) or pass --bin",
        bin.display()
    );
    Ok(bin)
}

/// What every replica must share: Redis, the database, the sealing keys and the token secret.
/// Keys and secret come from the environment when set there, or are generated for this run.
fn shared_environment(redis_url: &str, database_url: Option<&str>) -> Vec<(String, String)> {
    let state_keys = std::env::var("MOVIEDB_STATE_KEYS")
        .unwrap_or_else(|_| StateSealer::generate_spec("cluster"));
    let jwt_secret = std::env::var("MOVIEDB_JWT_SECRET").unwrap_or_else(|_| {
        let secret = random_hex(32);
        println!("generated MOVIEDB_JWT_SECRET={secret} (sign users in with `moviedb-mcp token`)");
        secret
    });
    let mut env = vec![
        ("REDIS_URL".to_owned(), redis_url.to_owned()),
        // The movie server's name for the keys, and the library's conformance server's.
        ("MOVIEDB_STATE_KEYS".to_owned(), state_keys.clone()),
        ("MCP_STATE_KEYS".to_owned(), state_keys),
        ("MOVIEDB_JWT_SECRET".to_owned(), jwt_secret),
    ];
    if let Some(url) = database_url {
        env.push(("DATABASE_URL".to_owned(), url.to_owned()));
    }
    env
}
