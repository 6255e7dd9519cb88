//! The replica processes: each started on a free port of 127.0.0.1 with the shared settings, its
//! output prefixed with its number, watched while it runs, and stopped with SIGTERM (SIGKILL after
//! a grace period). They start together, as an orchestrator would start them; on a fresh database
//! they race to migrate and seed it, which the server settles.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::common::{free_port, stop, wait_until_listening};

/// How long a replica may take to accept connections (it may migrate and seed a database first).
const STARTUP_LIMIT: Duration = Duration::from_secs(60);
/// How long a replica may take to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Ports tried per replica (another process may take a free port before the replica binds it).
const PORT_ATTEMPTS: usize = 3;

/// How to start a replica: the binary, the shared environment, and the extra arguments.
pub struct Launch {
    pub bin: PathBuf,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
}

/// A running replica.
pub struct Replica {
    /// 1-based, as shown in `X-Moviedb-Replica`.
    pub number: usize,
    pub addr: SocketAddr,
    pub pid: u32,
    child: Child,
}

/// Starts replicas 1 to `count`, all at once.
pub async fn start_all(launch: &Launch, count: usize) -> anyhow::Result<Vec<Replica>> {
    futures::future::try_join_all((1..=count).map(|number| start(launch, number))).await
}

async fn start(launch: &Launch, number: usize) -> anyhow::Result<Replica> {
    let mut failure = anyhow::anyhow!("replica {number} was never started");
    for _ in 0..PORT_ATTEMPTS {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let mut child = Command::new(&launch.bin)
            .arg("--bind")
            .arg(addr.to_string())
            .args(&launch.args)
            .envs(launch.env.iter().map(|(name, value)| (name, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", launch.bin.display()))?;
        prefix_lines(number, child.stdout.take());
        prefix_lines(number, child.stderr.take());
        match wait_until_listening(&mut child, addr, STARTUP_LIMIT).await {
            Ok(()) => {
                let pid = child
                    .id()
                    .with_context(|| format!("replica {number} exited at once"))?;
                return Ok(Replica {
                    number,
                    addr,
                    pid,
                    child,
                });
            }
            Err(e) => failure = e.context(format!("replica {number} did not start")),
        }
    }
    Err(failure)
}

/// Copies a replica's output to this process's stderr, each line prefixed with its number.
fn prefix_lines(number: usize, output: Option<impl AsyncRead + Unpin + Send + 'static>) {
    let Some(output) = output else { return };
    tokio::spawn(async move {
        let mut lines = BufReader::new(output).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[replica {number}] {line}");
        }
    });
}

/// Watches the running replicas, and stops them all on request.
pub struct Supervisor {
    stop: watch::Sender<bool>,
    watchers: JoinSet<()>,
}

impl Supervisor {
    pub fn watch(replicas: Vec<Replica>) -> Self {
        let (stop, stopping) = watch::channel(false);
        let mut watchers = JoinSet::new();
        for replica in replicas {
            watchers.spawn(supervise(replica, stopping.clone()));
        }
        Self { stop, watchers }
    }

    /// Stops every replica still running and waits until they are gone.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while self.watchers.join_next().await.is_some() {}
    }
}

/// Reports the replica's death, or stops it when asked, whichever comes first.
async fn supervise(mut replica: Replica, mut stopping: watch::Receiver<bool>) {
    tokio::select! {
        status = replica.child.wait() => tracing::warn!(
            "replica {} (pid {}) exited ({}); the balancer sends its requests to the others",
            replica.number,
            replica.pid,
            status.map_or_else(|e| e.to_string(), |s| s.to_string()),
        ),
        _ = stopping.changed() => terminate(&mut replica).await,
    }
}

/// SIGTERM, so the replica finishes what it is doing; SIGKILL if it is still there after the grace.
async fn terminate(replica: &mut Replica) {
    if !stop(&mut replica.child, replica.pid, STOP_GRACE).await {
        tracing::warn!(
            "replica {} (pid {}) did not stop on SIGTERM; it was killed",
            replica.number,
            replica.pid
        );
    }
}
