//! Several replicas of the real `moviedb-mcp` binary sharing Redis and one PostgreSQL database, as
//! child processes a test can address one by one or kill; the cluster launcher
//! (`examples/cluster`) with its balancer in front of its own replicas; and a signed-in
//! [`Session`] (the movie support's) of any of them.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use moviedb_mcp::mrtr::StateSealer;
use rand::RngCore;
use serde_json::{Value, json};

pub use super::movies::Session;
use super::net::{accepts_connections, free_port, random_hex, shared_redis_url, wait_until_closed};
use super::postgres::TestDatabase;
use super::{Client, Reply, RpcRequest};

/// How long a replica or the launcher may take to serve (the first replica seeds the database).
const STARTUP_LIMIT: Duration = Duration::from_secs(90);
/// How long a stopped process may take to close its ports.
const STOP_LIMIT: Duration = Duration::from_secs(15);

/// What every replica of one cluster shares.
#[derive(Debug, Clone)]
pub struct SharedSettings {
    pub redis_url: String,
    /// Unique per cluster, so tests sharing one Redis never see each other's keys or events.
    pub redis_prefix: String,
    pub state_keys: String,
    pub jwt_secret: String,
    /// More settings every replica gets, e.g. `MOVIEDB_LEGACY_REQUEST_TIMEOUT`.
    pub extra_env: Vec<(String, String)>,
}

impl SharedSettings {
    pub fn new(redis_url: String) -> Self {
        Self {
            redis_url,
            redis_prefix: format!("moviedb-cluster-test-{}:", random_hex(6)),
            state_keys: StateSealer::generate_spec("cluster"),
            jwt_secret: random_hex(24),
            extra_env: Vec::new(),
        }
    }

    /// A token signing `user` in on every replica.
    pub fn token(&self, user: &str) -> String {
        moviedb_mcp::auth::mint_token(self.jwt_secret.as_bytes(), user, Duration::from_secs(3600))
            .expect("mint a test token")
    }
}

/// `program` with the environment a test controls: the outer `MOVIEDB_*`, `DATABASE_URL` and
/// `REDIS_URL` removed, the shared keys and secret set.
fn command(program: &Path, settings: &SharedSettings) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("MOVIEDB_")
            || name_text == "DATABASE_URL"
            || name_text == "REDIS_URL"
        {
            command.env_remove(&name);
        }
    }
    command
        .env("MOVIEDB_STATE_KEYS", &settings.state_keys)
        .env("MOVIEDB_JWT_SECRET", &settings.jwt_secret)
        .env("RUST_LOG", "info")
        .envs(settings.extra_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    command
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Replicas started by the test itself
// ---------------------------------------------------------------------------------------------

/// One `moviedb-mcp` process; killed on drop.
pub struct Replica {
    pub number: usize,
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

/// Starts replica `number` of `moviedb-mcp` on `addr`, its output appended to `log`.
fn spawn_replica(
    number: usize,
    addr: SocketAddr,
    settings: &SharedSettings,
    database_url: &str,
    dir: &Path,
    log: &Path,
) -> Child {
    let output = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("open the replica log");
    command(Path::new(env!("CARGO_BIN_EXE_moviedb-mcp")), settings)
        .env("DATABASE_URL", database_url)
        .env("REDIS_URL", &settings.redis_url)
        .env("MOVIEDB_REDIS_PREFIX", &settings.redis_prefix)
        .arg("--data-dir")
        .arg(dir.join(format!("data-{number}")))
        .arg("--bind")
        .arg(addr.to_string())
        .stdout(output.try_clone().expect("clone the log handle"))
        .stderr(output)
        .spawn()
        .expect("start moviedb-mcp")
}

impl Replica {
    fn start(number: usize, settings: &SharedSettings, database_url: &str, dir: &Path) -> Self {
        let log = dir.join(format!("replica-{number}.log"));
        for _ in 0..5 {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
            let _ = std::fs::remove_file(&log);
            let child = spawn_replica(number, addr, settings, database_url, dir, &log);
            let mut replica = Self {
                number,
                addr,
                child,
                log: log.clone(),
            };
            if replica.wait_until_serving() {
                return replica;
            }
            // Someone took the port between our probe and the replica's bind: try another.
            assert!(
                read_log(&log).contains("cannot listen"),
                "replica {number} exited before serving; its log:\n{}",
                read_log(&log)
            );
        }
        panic!("replica {number} found no free port");
    }

    /// `true` once it accepts connections, `false` if it exited first.
    ///
    /// Serving means this run logged its endpoint: a port that accepts connections may belong to
    /// another process that took it first (this replica then exits with "cannot listen").
    fn wait_until_serving(&mut self) -> bool {
        const SERVING: &str = "MCP endpoint on";
        let earlier_runs = read_log(&self.log).matches(SERVING).count();
        let deadline = Instant::now() + STARTUP_LIMIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let logged = read_log(&self.log).matches(SERVING).count() > earlier_runs;
            if logged && TcpStream::connect(self.addr).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "replica {} did not serve on {} within {STARTUP_LIMIT:?}; its log:\n{}",
            self.number,
            self.addr,
            read_log(&self.log)
        );
    }

    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, moviedb_mcp::app::MCP_PATH)
    }

    /// Sends SIGTERM, as an orchestrator stopping it would, and waits for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        self.stop();
        self.exited().await
    }

    /// Sends SIGTERM, as an orchestrator stopping it would.
    pub fn stop(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// Waits for the process to exit.
    pub async fn exited(&mut self) -> std::process::ExitStatus {
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the replica") {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the replica has logged (over all its runs).
    pub fn log(&self) -> String {
        read_log(&self.log)
    }

    /// Kills the process (SIGKILL, as a crash would) and waits until its port is closed.
    pub async fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        wait_until_closed(self.addr.port(), &format!("killed replica {}", self.number)).await;
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// N replicas of `moviedb-mcp` on a fresh PostgreSQL database and one Redis.
pub struct Replicas {
    pub settings: SharedSettings,
    replicas: Vec<Replica>,
    dir: PathBuf,
    /// Dropped after the replicas (fields drop in order).
    pub database: TestDatabase,
}

/// Starts a replica of `moviedb-mcp` with `settings` (on its own SQLite catalogue) that is
/// expected to refuse to start, and returns what it logged once it exited; panics if it is
/// still running after [`STARTUP_LIMIT`] or exits successfully.
pub fn failed_start(settings: &SharedSettings) -> String {
    let dir = std::env::temp_dir().join(format!("moviedb-failed-start-{}", random_hex(8)));
    std::fs::create_dir_all(&dir).expect("create the replica's folder");
    let log = dir.join("replica.log");
    let output = std::fs::File::create(&log).expect("create the replica log");
    let mut child = command(Path::new(env!("CARGO_BIN_EXE_moviedb-mcp")), settings)
        .env("REDIS_URL", &settings.redis_url)
        .env("MOVIEDB_REDIS_PREFIX", &settings.redis_prefix)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--bind")
        .arg(format!("127.0.0.1:{}", free_port()))
        .stdout(output.try_clone().expect("clone the log handle"))
        .stderr(output)
        .spawn()
        .expect("start moviedb-mcp");
    let deadline = Instant::now() + STARTUP_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the replica's status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let logged = read_log(&log);
            let _ = std::fs::remove_dir_all(&dir);
            panic!("the replica started: {logged}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let logged = read_log(&log);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !status.success(),
        "the replica exited successfully: {logged}"
    );
    logged
}

impl Replicas {
    /// Starts `count` replicas together on a fresh database.
    pub async fn start(count: usize, redis_url: String) -> Self {
        Self::start_with(count, SharedSettings::new(redis_url)).await
    }

    /// Starts `count` replicas sharing `settings`.
    pub async fn start_with(count: usize, settings: SharedSettings) -> Self {
        let database = TestDatabase::create().await;
        let dir = std::env::temp_dir().join(format!("moviedb-cluster-test-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).expect("create the replicas' folder");
        let (url, shared, folder) = (database.url.clone(), settings.clone(), dir.clone());
        // All at once, as an orchestrator would start them: they race to migrate and seed the
        // empty database, which the server must survive.
        let replicas = tokio::task::spawn_blocking(move || {
            std::thread::scope(|scope| {
                let starting: Vec<_> = (1..=count)
                    .map(|number| {
                        let (shared, url, folder) = (&shared, &url, &folder);
                        scope.spawn(move || Replica::start(number, shared, url, folder))
                    })
                    .collect();
                starting
                    .into_iter()
                    .map(|handle| handle.join().expect("a replica started"))
                    .collect()
            })
        })
        .await
        .expect("the replicas started");
        Self {
            settings,
            replicas,
            dir,
            database,
        }
    }

    /// Replica `number` (1-based).
    pub fn replica(&mut self, number: usize) -> &mut Replica {
        &mut self.replicas[number - 1]
    }

    /// Starts replica `number` (1-based, stopped before) again on its address.
    pub async fn restart(&mut self, number: usize) {
        let (settings, url, dir) = (
            self.settings.clone(),
            self.database.url.clone(),
            self.dir.clone(),
        );
        let replica = &mut self.replicas[number - 1];
        let deadline = Instant::now() + STARTUP_LIMIT;
        loop {
            replica.child =
                spawn_replica(number, replica.addr, &settings, &url, &dir, &replica.log);
            if replica.wait_until_serving() {
                return;
            }
            // The port is still held by connections of the process that stopped: try again.
            assert!(
                Instant::now() < deadline,
                "replica {number} did not start again; its log:\n{}",
                replica.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The replicas' addresses, in order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.replicas.iter().map(|replica| replica.addr).collect()
    }

    /// `user`, signed in, talking to replica `number` (1-based).
    pub fn session(&self, number: usize, user: &str) -> Session {
        Session::signed_in(self.replicas[number - 1].url(), self.settings.token(user))
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        self.replicas.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// The cluster launcher (examples/cluster) and its balancer
// ---------------------------------------------------------------------------------------------

/// A replica as the launcher announced it.
#[derive(Debug, Clone)]
pub struct LaunchedReplica {
    pub number: usize,
    pub port: u16,
    pub pid: u32,
}

/// `target/<profile>/examples/cluster`, next to the `moviedb-mcp` binary under test.
pub fn launcher_binary() -> PathBuf {
    example_binary("cluster")
}

/// `target/<profile>/examples/<name>`, next to the `moviedb-mcp` binary under test.
pub fn example_binary(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_moviedb-mcp"));
    let example = bin
        .parent()
        .expect("the binary is in a target folder")
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        example.is_file(),
        "the example {name} is not built ({} is missing): run `cargo build --examples` before \
         `cargo test` (.ci/run does)",
        example.display()
    );
    example
}

/// The launcher running `count` replicas of `moviedb-mcp` behind its balancer; stopped with
/// SIGTERM on drop.
pub struct Launcher {
    child: Child,
    pub balancer_url: String,
    pub replicas: Vec<LaunchedReplica>,
    log: PathBuf,
    pub settings: SharedSettings,
    /// Dropped after the launcher stopped.
    pub database: TestDatabase,
}

impl Launcher {
    /// The number of the replica that served a response through nginx, which names its address
    /// in `X-Moviedb-Upstream`.
    pub fn served_by(&self, reply: &Reply) -> usize {
        let upstream = reply
            .header("x-moviedb-upstream")
            .unwrap_or_else(|| panic!("no X-Moviedb-Upstream header: {:?}", reply.headers));
        // After a retry nginx lists every address it tried ("a, b"); the last one answered.
        let port = upstream
            .rsplit(", ")
            .next()
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|port| port.parse::<u16>().ok());
        self.replicas
            .iter()
            .find(|replica| Some(replica.port) == port)
            .map(|replica| replica.number)
            .unwrap_or_else(|| panic!("{upstream} is none of the replicas {:?}", self.replicas))
    }

    /// The launcher's process id (also its process group's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn start(count: usize) -> Self {
        let database = TestDatabase::create().await;
        let settings = SharedSettings::new(shared_redis_url());
        let log =
            std::env::temp_dir().join(format!("moviedb-cluster-launcher-{}.log", random_hex(8)));
        let mut child = command(&launcher_binary(), &settings)
            // Its own process group, with the replicas it starts, so a failing test can end all.
            .process_group(0)
            .args(["--replicas", &count.to_string(), "--port", "0"])
            .args(["--redis-url", &settings.redis_url])
            .args(["--database-url", &database.url])
            .args(["--", "--redis-prefix", &settings.redis_prefix])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("create the launcher log"))
            .spawn()
            .expect("start the cluster launcher");
        let stdout = child.stdout.take().expect("the launcher's stdout is piped");
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        let stdout_log = log.with_extension("stdout");
        std::thread::spawn(move || {
            let mut copy = std::fs::File::create(stdout_log).ok();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(copy) = copy.as_mut() {
                    let _ = writeln!(copy, "{line}");
                }
                let _ = lines_tx.send(line);
            }
        });
        let mut launcher = Self {
            child,
            balancer_url: String::new(),
            replicas: Vec::new(),
            log,
            settings,
            database,
        };
        let deadline = Instant::now() + STARTUP_LIMIT;
        while launcher.balancer_url.is_empty() {
            let line = match lines.try_recv() {
                Ok(line) => line,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    assert!(
                        Instant::now() < deadline,
                        "the launcher did not announce its balancer within {STARTUP_LIMIT:?}; its log:\n{}",
                        read_log(&launcher.log)
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => panic!(
                    "the launcher exited before announcing its balancer; its log:\n{}",
                    read_log(&launcher.log)
                ),
            };
            launcher.read_announcement(&line);
        }
        assert_eq!(launcher.replicas.len(), count, "one line per replica");
        launcher
    }

    /// Reads `replica N: http://127.0.0.1:PORT/mcp (pid PID)` and `balancer: URL` lines.
    fn read_announcement(&mut self, line: &str) {
        if let Some(url) = line.strip_prefix("balancer: ") {
            self.balancer_url = url.trim().to_owned();
        } else if let Some(rest) = line.strip_prefix("replica ") {
            let (number, rest) = rest
                .split_once(": http://127.0.0.1:")
                .expect("replica line");
            let (port, rest) = rest.split_once('/').expect("replica line port");
            let pid = rest
                .split_once("(pid ")
                .and_then(|(_, pid)| pid.strip_suffix(')'))
                .expect("replica line pid");
            self.replicas.push(LaunchedReplica {
                number: number.parse().expect("replica number"),
                port: port.parse().expect("replica port"),
                pid: pid.parse().expect("replica pid"),
            });
        }
    }

    /// `user`, signed in, talking to the balancer.
    pub fn session(&self, user: &str) -> Session {
        Session::signed_in(self.balancer_url.clone(), self.settings.token(user))
    }

    pub fn replica(&self, number: usize) -> &LaunchedReplica {
        self.replicas
            .iter()
            .find(|replica| replica.number == number)
            .unwrap_or_else(|| panic!("the launcher announced no replica {number}"))
    }

    /// Kills replica `number` (SIGKILL, as a crash would) and waits until its port is closed.
    pub async fn kill_replica(&self, number: usize) {
        let replica = self.replica(number);
        signal(replica.pid, "-KILL");
        wait_until_closed(replica.port, &format!("killed replica {number}")).await;
    }

    /// Stops the launcher the way an operator would (SIGTERM) and waits until it exited.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        signal(self.child.id(), "-TERM");
        let deadline = Instant::now() + STOP_LIMIT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!(
            "the launcher did not stop within {STOP_LIMIT:?} of SIGTERM; its log:\n{}",
            read_log(&self.log)
        );
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: end the launcher and every replica it started, at once.
            let group = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = self.child.wait();
        } else {
            self.stop();
        }
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(self.log.with_extension("stdout"));
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}
