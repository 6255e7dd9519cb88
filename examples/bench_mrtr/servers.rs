//! The servers under test, each in its own process so that its CPU time can be read on its own
//! (utime + stime from `/proc/<pid>/stat`) and the load generator's does not count: the floor (this
//! binary again, in its hidden `--serve-floor` mode), the conformance example on the memory or the
//! Redis store, and `moviedb-mcp` on its embedded SQLite database or on PostgreSQL; and beside
//! them the stand-in LLM provider (`--serve-provider`).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::common::{free_port, stop, wait_until_listening};

/// How long a server may take to accept connections (moviedb-mcp migrates and seeds first).
const STARTUP_LIMIT: Duration = Duration::from_secs(60);
/// How long a server may take to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Ports tried per server (another process may take a free port before the server binds it).
const PORT_ATTEMPTS: usize = 3;
/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on every mainstream Linux).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// The binaries of this build: this one, the conformance example and `moviedb-mcp`.
pub struct Binaries {
    this: PathBuf,
    conformance: PathBuf,
    moviedb: PathBuf,
}

impl Binaries {
    /// Finds them next to this binary (`target/<profile>/examples/`, the server binary one level up).
    pub fn locate() -> anyhow::Result<Self> {
        let this = std::env::current_exe().context("cannot find this binary")?;
        let examples = this.parent().context("this binary has no folder")?;
        let profile = examples.parent().context("this binary is not in target/")?;
        Ok(Self {
            conformance: examples.join("conformance_server"),
            moviedb: profile.join("moviedb-mcp"),
            this,
        })
    }
}

/// The server binary at `path`, which must exist; a warning when `library` (the crate it is built
/// from) was built after it (`cargo run --example bench_mrtr` rebuilds the library but not the
/// servers).
fn built<'p>(path: &'p Path, library: &str) -> anyhow::Result<&'p Path> {
    let modified = |path: &Path| path.metadata().and_then(|m| m.modified()).ok();
    let Some(server) = modified(path) else {
        anyhow::bail!(
            "{} is not built: run `cargo build --release --bins --examples` first",
            path.display()
        );
    };
    let deps = path.ancestors().find(|dir| dir.join("deps").is_dir());
    let newest_library = deps
        .and_then(|dir| std::fs::read_dir(dir.join("deps")).ok())
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&format!("lib{library}-")) && name.ends_with(".rlib")
        })
        .filter_map(|entry| modified(&entry.path()))
        .max();
    if newest_library.is_some_and(|library| library > server) {
        eprintln!(
            "warning: {} is older than the last build of the library; if the library changed since, \
             run `cargo build --release --bins --examples`",
            path.display()
        );
    }
    Ok(path)
}

/// What to start.
pub enum Kind<'a> {
    /// Fixed bytes, no MCP logic.
    Floor,
    /// The conformance example on the in-memory continuation store.
    Memory,
    /// An earlier build of the conformance example (the binary at `binary`), on the in-memory
    /// store or on Redis at `(url, prefix)`.
    Earlier {
        binary: &'a Path,
        redis: Option<(&'a str, &'a str)>,
    },
    /// The conformance example on the Redis store, its keys under `prefix`.
    Redis { url: &'a str, prefix: &'a str },
    /// `moviedb-mcp` on an embedded SQLite database in `data_dir` (or on `database_url`),
    /// checking tokens signed with `jwt_secret`, its continuations in memory or in Redis at
    /// `(url, prefix)`, its summaries from the stand-in `provider` when given, its traces
    /// exported over OTLP/HTTP to `otlp` when given.
    Moviedb {
        data_dir: &'a Path,
        jwt_secret: &'a str,
        redis: Option<(&'a str, &'a str)>,
        database_url: Option<&'a str>,
        provider: Option<SocketAddr>,
        otlp: Option<SocketAddr>,
    },
    /// The stand-in LLM provider.
    Provider,
    /// The stand-in OTLP/HTTP trace sink.
    OtlpSink,
}

/// A running server process.
pub struct Server {
    pub addr: SocketAddr,
    pid: u32,
    child: Child,
}

impl Server {
    /// Starts `kind` on a free port of 127.0.0.1 with the sealing keys `state_keys`, its own
    /// defaults otherwise (the `MOVIEDB_*`, `REDIS_URL` and `DATABASE_URL` of this environment are
    /// not passed on), and waits until it accepts connections.
    pub async fn start(bins: &Binaries, kind: &Kind<'_>, state_keys: &str) -> anyhow::Result<Self> {
        let mut failure = anyhow::anyhow!("never started");
        for _ in 0..PORT_ATTEMPTS {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
            let mut command = match kind {
                Kind::Floor => {
                    let mut command = Command::new(&bins.this);
                    command.arg("--serve-floor").arg(addr.to_string());
                    command
                }
                Kind::Provider => {
                    let mut command = Command::new(&bins.this);
                    command.arg("--serve-provider").arg(addr.to_string());
                    command
                }
                Kind::OtlpSink => {
                    let mut command = Command::new(&bins.this);
                    command.arg("--serve-otlp-sink").arg(addr.to_string());
                    command
                }
                Kind::Memory | Kind::Redis { .. } => {
                    let mut command = Command::new(built(&bins.conformance, "mcp_mrtr")?);
                    command.arg("--bind").arg(addr.to_string());
                    command
                }
                Kind::Earlier { binary, .. } => {
                    let mut command = Command::new(binary);
                    command.arg("--bind").arg(addr.to_string());
                    command
                }
                Kind::Moviedb { .. } => {
                    let mut command = Command::new(built(&bins.moviedb, "moviedb_mcp")?);
                    command.arg("--bind").arg(addr.to_string());
                    command
                }
            };
            for (name, _) in std::env::vars_os() {
                let name_text = name.to_string_lossy();
                if name_text.starts_with("MOVIEDB_")
                    || name_text.starts_with("MCP_")
                    || name_text.starts_with("OTEL_")
                    || name_text.starts_with("OPENAI_")
                    || name_text == "REDIS_URL"
                    || name_text == "DATABASE_URL"
                {
                    command.env_remove(&name);
                }
            }
            // The movie server's name for the keys, and the conformance server's.
            command
                .env("RUST_LOG", "warn")
                .env("MOVIEDB_STATE_KEYS", state_keys)
                .env("MCP_STATE_KEYS", state_keys);
            let redis = match kind {
                Kind::Redis { url, prefix } => Some((*url, *prefix)),
                Kind::Earlier { redis, .. } => *redis,
                Kind::Moviedb {
                    data_dir,
                    jwt_secret,
                    redis,
                    database_url,
                    provider,
                    otlp,
                } => {
                    command.arg("--data-dir").arg(data_dir);
                    command.env("MOVIEDB_JWT_SECRET", jwt_secret);
                    if let Some(url) = database_url {
                        command.env("DATABASE_URL", url);
                    }
                    if let Some(provider) = provider {
                        command
                            .env("MOVIEDB_LLM_BASE_URL", format!("http://{provider}/v1"))
                            .env("MOVIEDB_LLM_MODEL", "bench-model");
                    }
                    if let Some(otlp) = otlp {
                        // Spans exist at `info`, which the other rows' `warn` leaves out.
                        command
                            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{otlp}"))
                            .env("RUST_LOG", "info");
                    }
                    *redis
                }
                Kind::Floor | Kind::Memory | Kind::Provider | Kind::OtlpSink => None,
            };
            if let Some((url, prefix)) = redis {
                command.arg("--redis-url").arg(url);
                command.arg("--redis-prefix").arg(prefix);
            }
            let mut child = command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .context("cannot start a server")?;
            let pid = child.id().context("the server exited at once")?;
            match wait_until_listening(&mut child, addr, STARTUP_LIMIT).await {
                Ok(()) => return Ok(Self { addr, pid, child }),
                Err(e) => {
                    let _ = child.kill().await;
                    failure = e;
                }
            }
        }
        Err(failure)
    }

    /// CPU time the process has used so far (user + system, every thread), in clock ticks.
    pub fn cpu_ticks(&self) -> anyhow::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .context("cannot read the server's /proc/<pid>/stat")?;
        // The fields after the command name (which may hold spaces) start with the state (field 3);
        // utime and stime are fields 14 and 15.
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let field = |index: usize| -> anyhow::Result<u64> {
            fields
                .get(index)
                .and_then(|f| f.parse().ok())
                .context("unexpected /proc/<pid>/stat format")
        };
        Ok(field(11)? + field(12)?)
    }

    /// Resident set size, in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .context("cannot read the server's /proc/<pid>/status")?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
            .context("no VmRSS in /proc/<pid>/status")
    }

    /// SIGTERM, then SIGKILL if it is still there after a grace period.
    pub async fn stop(mut self) {
        stop(&mut self.child, self.pid, STOP_GRACE).await;
    }
}
