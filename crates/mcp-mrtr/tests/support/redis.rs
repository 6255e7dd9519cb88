//! A redis-server of the test's own, to stop, crash and restart under a running server; and the
//! check every test's own redis-server passes before it is used ([`answers_as`]).

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::net::{accepts_connections, free_port, random_hex, wait_until_closed};

/// Waits until the `redis-server` started as `child` accepts connections on `port`, then tells
/// whether the process answering there is `child`: a free port may be taken by another test's
/// server before `child` binds it. `info_server` reads `INFO server` over that port. False too
/// when `child` exits or `deadline` passes first.
pub fn answers_as(
    child: &mut Child,
    port: u16,
    deadline: Instant,
    info_server: impl FnOnce() -> String,
) -> bool {
    let ours = format!("process_id:{}", child.id());
    while !accepts_connections(port) {
        let exited = !matches!(child.try_wait(), Ok(None));
        if exited || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    info_server().lines().any(|line| line.trim() == ours)
}

/// How long a `redis-cli` call may take: a node that accepts connections but never answers
/// would otherwise hold the test up for good.
const CLI_LIMIT_SECS: &str = "30";

/// `redis-cli`, stopped by coreutils' `timeout` when it runs past [`CLI_LIMIT_SECS`]; add its
/// arguments.
pub fn redis_cli() -> Command {
    let mut command = Command::new("timeout");
    command.args([CLI_LIMIT_SECS, "redis-cli"]);
    command
}

/// Runs a [`redis_cli`] command. A `redis-cli` that cannot be run fails the test saying so, where
/// its empty output would fail a later check with a puzzling reason.
pub fn cli_output(command: &mut Command) -> Output {
    let output = command.output().expect("coreutils' timeout runs");
    // `timeout` exits with 127 when the command is not found, 126 when it cannot be run.
    assert!(
        !matches!(output.status.code(), Some(126 | 127)),
        "redis-cli could not be run (is it installed?): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Has the cluster node that `cli` talks to serve every slot, as a one-node cluster does
/// (`redis-cli --cluster create` wants three masters).
pub fn serve_every_slot(cli: impl FnOnce(&[&str]) -> String) {
    let assigned = cli(&["cluster", "addslotsrange", "0", "16383"]);
    assert_eq!(assigned.trim(), "OK", "CLUSTER ADDSLOTSRANGE failed");
}

/// How long redis-server may take to accept connections.
const STARTUP_LIMIT: Duration = Duration::from_secs(30);

/// A redis-server of the test's own on a free port, with an append-only file synced on every
/// write, so it can be killed and restarted with its data as a crashed Redis would be.
pub struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("mcp-private-redis-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).expect("create the Redis folder");
        let mut redis = Self {
            port: free_port(),
            dir,
            child: None,
        };
        redis.restart();
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts redis-server again on the same port and folder; returns once it accepts connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "Redis is already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        self.child = Some(child);
        let deadline = Instant::now() + STARTUP_LIMIT;
        while !accepts_connections(self.port) {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills redis-server (SIGKILL, as a crash would).
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until_closed(self.port, "the killed redis-server").await;
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Has `owner` park `count` continuations in `store`, then takes each back: `true` for those still
/// there, oldest first.
pub async fn flood_and_take_back(
    store: &impl mcp_mrtr::store::ContinuationStore,
    owner: &mcp_mrtr::store::Owner,
    count: usize,
) -> Vec<bool> {
    use mcp_mrtr::store::ContinuationId;
    let ttl = Duration::from_secs(60);
    let flood: Vec<ContinuationId> = (0..count).map(|_| ContinuationId::random()).collect();
    for id in &flood {
        store
            .put(owner, *id, b"flood".to_vec(), ttl)
            .await
            .expect("parked");
    }
    let mut left = Vec::new();
    for id in &flood {
        left.push(store.take(owner, *id).await.expect("taken").is_some());
    }
    left
}

/// Has `owner` park one continuation, then park and take back `count` more one after the other
/// while the first waits: `true` when the first is still there at the end, as it should be
/// whatever the owner's share (what an owner has taken back holds no place in it).
pub async fn parks_taken_back_leave_the_share_free(
    store: &impl mcp_mrtr::store::ContinuationStore,
    owner: &mcp_mrtr::store::Owner,
    count: usize,
) -> bool {
    use mcp_mrtr::store::ContinuationId;
    let ttl = Duration::from_secs(60);
    let waiting = ContinuationId::random();
    store
        .put(owner, waiting, b"waiting".to_vec(), ttl)
        .await
        .expect("parked");
    for _ in 0..count {
        let id = ContinuationId::random();
        store
            .put(owner, id, b"answered".to_vec(), ttl)
            .await
            .expect("parked");
        let taken = store.take(owner, id).await.expect("taken");
        assert_eq!(taken.as_deref(), Some(&b"answered"[..]), "just parked");
    }
    store.take(owner, waiting).await.expect("taken").is_some()
}

/// A session in `store` is replaced only over the record it holds, and one deleted stays so.
pub async fn sessions_change_only_over_what_they_hold(
    store: &impl mcp_mrtr::store::SessionStore,
    owner: &mcp_mrtr::store::Owner,
) {
    let ttl = Duration::from_secs(60);
    let id = format!("replaced-{}", super::net::random_hex(6));
    store
        .write_session(owner, &id, b"one".to_vec(), ttl)
        .await
        .expect("written");
    let replace = |expected: &'static [u8], record: &'static [u8]| {
        store.replace_session(owner, &id, expected, record.to_vec(), ttl)
    };
    assert!(!replace(b"zero", b"two").await.expect("answered"));
    assert!(replace(b"one", b"two").await.expect("answered"));
    assert!(
        !replace(b"one", b"three").await.expect("answered"),
        "not over what it held before"
    );
    let held = store.read_session(&id).await.expect("read");
    assert_eq!(held.as_deref(), Some(&b"two"[..]));
    store.delete_session(owner, &id).await.expect("deleted");
    assert!(!replace(b"two", b"three").await.expect("answered"));
    let held = store.read_session(&id).await.expect("read");
    assert_eq!(held, None, "a deleted session stays so");
}

/// In `store`, where an owner holds at most three sessions, the sessions an owner ended hold no
/// place in its share, and when it opens one past its share the session it left idle the
/// longest goes: a touch or a change to a session renews its place.
pub async fn sessions_share_counts_what_the_owner_holds(
    store: &impl mcp_mrtr::store::SessionStore,
) {
    let owner = mcp_mrtr::store::Owner::new(&format!("user:{}", super::net::random_hex(6)));
    let ttl = Duration::from_secs(60);
    let open = |name: &str| {
        let id = format!("{name}-{}", super::net::random_hex(6));
        let owner = &owner;
        async move {
            store
                .write_session(owner, &id, b"s".to_vec(), ttl)
                .await
                .expect("written");
            id
        }
    };
    let held = |ids: &[&String]| {
        let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
        async move {
            let mut held = Vec::new();
            for id in ids {
                held.push(store.read_session(&id).await.expect("read").is_some());
            }
            held
        }
    };
    let touched = open("touched").await;
    for _ in 0..3 {
        let ended = open("ended").await;
        store.delete_session(&owner, &ended).await.expect("deleted");
    }
    let (first_idle, changed) = (open("idle").await, open("changed").await);
    assert_eq!(
        held(&[&touched]).await,
        [true],
        "the ended sessions held no place"
    );

    assert!(
        store
            .touch_session(&owner, &touched, ttl)
            .await
            .expect("touched")
    );
    let newer = open("newer").await;
    assert_eq!(
        held(&[&first_idle, &changed, &touched, &newer]).await,
        [false, true, true, true],
        "the session touched stays; the one idle the longest went"
    );

    let replacing = store.replace_session(&owner, &changed, b"s", b"t".to_vec(), ttl);
    assert!(replacing.await.expect("replaced"));
    let newest = open("newest").await;
    assert_eq!(
        held(&[&touched, &newer, &changed, &newest]).await,
        [false, true, true, true],
        "the session changed stays; the one idle the longest went"
    );
}

/// Has an owner whose index of continuations Redis cannot add to park one: `clobber` is given the
/// index's key (named as the store names it: the owner's SHA-256, 12 bytes in hex, under
/// `prefix`) and turns it into a plain string, as an operator's mistake or a key clash would.
/// The put fails, and no entry is left behind for a state nobody was given; a continuation parked
/// before is still taken whole (its index is best effort). Returns the key.
pub async fn a_put_refused_half_way_leaves_nothing(
    store: &impl mcp_mrtr::store::ContinuationStore,
    prefix: &str,
    clobber: impl FnOnce(&str),
) -> String {
    use mcp_mrtr::store::{ContinuationId, Owner};
    use sha2::{Digest, Sha256};
    let owner = Owner::new("user:clobbered");
    let digest = Sha256::digest(owner.as_str().as_bytes());
    let index = format!("{prefix}owner:continuations:{}", hex::encode(&digest[..12]));
    let ttl = Duration::from_secs(60);
    let parked_before = ContinuationId::random();
    store
        .put(&owner, parked_before, b"before".to_vec(), ttl)
        .await
        .expect("parked while the index was sound");
    clobber(&index);
    let id = ContinuationId::random();
    let refused = store.put(&owner, id, b"half".to_vec(), ttl).await;
    assert!(refused.is_err(), "Redis refuses the index: {refused:?}");
    assert_eq!(
        store.take(&owner, id).await.expect("take"),
        None,
        "no entry is left behind"
    );
    let taken = store.take(&owner, parked_before).await;
    assert_eq!(
        taken
            .expect("a take does not fail over its index")
            .as_deref(),
        Some(&b"before"[..]),
        "taken whole"
    );
    index
}

/// A TCP forwarder to `127.0.0.1:<target>` whose connections opened so far can be made to fall
/// silent: they stay open and their bytes are still taken in, but nothing more goes through, as
/// when a server's address moves without a reset. Connections opened after are forwarded.
pub struct SilenceableProxy {
    /// Where the proxy listens.
    pub port: u16,
    silenced: tokio::sync::watch::Sender<u64>,
}

impl SilenceableProxy {
    pub async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (silenced, watching) = tokio::sync::watch::channel(0_u64);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut silence = watching.clone();
                let opened_in = *silence.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let fell_silent = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
                        _ = silence.wait_for(|era| *era != opened_in) => true,
                    };
                    if fell_silent {
                        // Hold both sockets open, reading what comes and passing nothing on.
                        let mut sink = tokio::io::sink();
                        let _ = tokio::io::copy(&mut client, &mut sink).await;
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Self { port, silenced }
    }

    /// Makes every connection open now fall silent.
    pub fn silence(&self) {
        self.silenced.send_modify(|era| *era += 1);
    }
}
