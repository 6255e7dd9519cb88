//! What the example programs that run servers share: free ports, random secrets, waiting for a
//! child process to listen, and stopping it politely. Each includes this file with
//! `#[path = "../common/mod.rs"] mod common;`.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use rand::RngCore;
use tokio::process::{Child, Command};

/// A port of 127.0.0.1 that was free a moment ago, and not handed out before in this process:
/// the kernel may give a released port again, and nginx and a replica would be told the same one.
pub fn free_port() -> anyhow::Result<u16> {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("cannot find a free port")?;
        let port = listener.local_addr()?.port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
}

/// Lower-case hex of `bytes` random bytes.
pub fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// Waits until `child` accepts connections on `addr`; fails if it exits first or `limit` passes.
pub async fn wait_until_listening(
    child: &mut Child,
    addr: SocketAddr,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("it exited ({status}) before listening on {addr}");
        }
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("it did not listen on {addr} within {limit:?}")
}

/// SIGTERM, so the process finishes what it is doing; SIGKILL if it is still there after `grace`.
/// Returns whether it stopped on SIGTERM.
pub async fn stop(child: &mut Child, pid: u32, grace: Duration) -> bool {
    let asked = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .await
        .is_ok_and(|status| status.success());
    if asked && tokio::time::timeout(grace, child.wait()).await.is_ok() {
        return true;
    }
    let _ = child.kill().await;
    false
}
