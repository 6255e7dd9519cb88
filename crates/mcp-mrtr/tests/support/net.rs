//! Small things every process-level test needs: free ports, random names, waiting for a port to
//! open or close, and the machine's shared Redis.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::RngCore;

/// How long a stopped process may take to close its ports.
const STOP_LIMIT: Duration = Duration::from_secs(15);

/// The shared Redis of this machine (CI starts it).
pub fn shared_redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Lower-case hex of `bytes` random bytes.
pub fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// A port that was free a moment ago, and not handed out before in this process: the kernel
/// may give a released port again, and two servers of one test would be told the same one.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|listener| listener.local_addr())
            .map(|addr| addr.port())
            .expect("bind 127.0.0.1:0 to find a free port");
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// Whether something accepts connections on `port` of 127.0.0.1.
pub fn accepts_connections(port: u16) -> bool {
    TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Waits until nothing listens on `port` any more; panics after [`STOP_LIMIT`].
pub async fn wait_until_closed(port: u16, what: &str) {
    let deadline = Instant::now() + STOP_LIMIT;
    while accepts_connections(port) {
        assert!(
            Instant::now() < deadline,
            "{what} still accepts connections on port {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
