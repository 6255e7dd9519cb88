//! A Redis Cluster of the test's own: six `redis-server` processes (three masters, each with a
//! replica) on free ports, joined with `redis-cli --cluster create`, whose masters a test can kill
//! to see a failover; or a single node that serves every slot.

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::net::random_hex;
use super::redis::{answers_as, cli_output, redis_cli, serve_every_slot};

/// How long the cluster may take to form, or to fail over.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);
/// How long a master may be silent before its replica takes over.
const NODE_TIMEOUT_MS: u64 = 1_000;

/// One node's port and process.
struct Node {
    port: u16,
    child: Option<Child>,
}

impl Node {
    /// Kills the node's process, if it still runs, and waits for it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Nodes forming one cluster; every process is killed, and its folder removed, on drop.
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
    /// How many masters the cluster has when it is whole.
    expected_masters: usize,
}

/// A port that is free, and whose cluster bus port (10000 above it) is free too.
fn free_node_port() -> u16 {
    loop {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port on 127.0.0.1");
        let port = listener.local_addr().expect("its address").port();
        if port < 55_000 && TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisCluster {
    /// Six nodes: three masters, each with a replica.
    pub fn start() -> Self {
        let cluster = Self::spawn(6, 3);
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let created = cli_output(
            redis_cli()
                .args(["--cluster", "create"])
                .args(&addresses)
                .args(["--cluster-replicas", "1", "--cluster-yes"]),
        );
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        cluster.wait_until_settled();
        cluster
    }

    /// One node in cluster mode that serves every slot (`redis-cli --cluster create` wants three).
    pub fn one_node() -> Self {
        let cluster = Self::spawn(1, 1);
        serve_every_slot(|args| cluster.cli(cluster.nodes[0].port, args));
        cluster.wait_until_settled();
        cluster
    }

    /// Starts `count` nodes in cluster mode, not yet joined, and waits until each accepts
    /// connections as itself.
    fn spawn(count: usize, expected_masters: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("mcp-redis-cluster-{}", random_hex(8)));
        std::fs::create_dir_all(&dir).expect("create the cluster's folder");
        let mut cluster = Self {
            nodes: Vec::new(),
            dir,
            expected_masters,
        };
        let deadline = Instant::now() + SETTLE_LIMIT;
        while cluster.nodes.len() < count {
            assert!(Instant::now() < deadline, "no cluster node could start");
            let port = free_node_port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
                // A replica takes over however long ago it last heard from its master.
                .args(["--cluster-replica-validity-factor", "0"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&cluster.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut node = Node {
                port,
                child: Some(child),
            };
            // The free port may be taken before the node binds it (another test's node, say):
            // the node then exits, and whoever answers on the port is not ours; try another.
            let port = node.port;
            let ours = node.child.as_mut().is_some_and(|child| {
                answers_as(child, port, deadline, || {
                    cluster.cli(port, &["info", "server"])
                })
            });
            if ours {
                cluster.nodes.push(node);
            } else {
                node.kill();
            }
        }
        cluster
    }

    /// The node URLs, comma-separated, as `REDIS_URL` takes them.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .filter(|node| node.child.is_some())
            .map(|node| format!("redis://127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The URL of one live node only.
    pub fn one_url(&self) -> String {
        let live = self.nodes.iter().find(|node| node.child.is_some());
        let port = live.map(|node| node.port).expect("a live node");
        format!("redis://127.0.0.1:{port}")
    }

    /// The URL of one live node only, as `user` (made on every node, with `user` for password,
    /// allowed everything but `refused`, such as `-info`).
    pub fn one_url_as(&self, user: &str, refused: &str) -> String {
        let password = format!(">{user}");
        for node in self.nodes.iter().filter(|node| node.child.is_some()) {
            let made = self.cli(
                node.port,
                &[
                    "acl", "setuser", user, "on", &password, "~*", "&*", "+@all", refused,
                ],
            );
            assert_eq!(made.trim(), "OK", "ACL SETUSER failed");
        }
        self.one_url()
            .replace("redis://", &format!("redis://{user}:{user}@"))
    }

    /// The shard channels with subscribers on the master of `channel`'s slot.
    pub fn shard_channels(&self, channel: &str) -> String {
        self.cli(self.master_of(channel), &["pubsub", "shardchannels"])
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        let output = cli_output(redis_cli().args(["-p", &port.to_string()]).args(args));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// What a live node says of the cluster's nodes.
    pub fn nodes_view(&self) -> String {
        let live = self.nodes.iter().find(|node| node.child.is_some());
        live.map(|node| self.cli(node.port, &["cluster", "nodes"]))
            .unwrap_or_default()
    }

    /// The port of the master that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> u16 {
        let live = self.nodes.iter().find(|node| node.child.is_some());
        let port = live.map(|node| node.port).expect("a live node");
        let slot: u16 = self
            .cli(port, &["cluster", "keyslot", key])
            .trim()
            .parse()
            .expect("a slot number");
        for line in self.cli(port, &["cluster", "nodes"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if !fields.get(2).is_some_and(|flags| flags.contains("master")) {
                continue;
            }
            let serves = fields.iter().skip(8).any(|range| {
                let mut bounds = range.split('-').filter_map(|b| b.parse::<u16>().ok());
                match (bounds.next(), bounds.next()) {
                    (Some(low), Some(high)) => (low..=high).contains(&slot),
                    (Some(only), None) => only == slot,
                    _ => false,
                }
            });
            if serves && let Some(port) = fields[1].split(['@', ':']).nth(1) {
                return port.parse().expect("a port");
            }
        }
        panic!("no master serves slot {slot}")
    }

    /// The ports of the nodes that are masters now.
    pub fn masters(&self) -> Vec<u16> {
        let live = self.nodes.iter().find(|node| node.child.is_some());
        let Some(live) = live else { return Vec::new() };
        self.cli(live.port, &["cluster", "nodes"])
            .lines()
            .filter(|line| line.contains("master") && !line.contains("fail"))
            .filter_map(|line| line.split_whitespace().nth(1))
            .filter_map(|address| address.split(['@', ':']).nth(1))
            .filter_map(|port| port.parse().ok())
            .collect()
    }

    /// Waits until every live node says the cluster is ok and every slot has a live master.
    pub fn wait_until_settled(&self) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            let settled = self
                .nodes
                .iter()
                .filter(|node| node.child.is_some())
                .all(|node| {
                    self.cli(node.port, &["cluster", "info"])
                        .contains("cluster_state:ok")
                });
            if settled && self.masters().len() == self.expected_masters {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle: {}",
                self.cli(self.nodes[0].port, &["cluster", "nodes"])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the master on `port` (SIGKILL, as a crash would) and waits until its replica has
    /// taken over.
    pub fn kill_master(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|node| node.port == port)
            .expect("a node of this cluster");
        node.kill();
        // The dead master is still listed as one until the others agree it failed.
        let deadline = Instant::now() + SETTLE_LIMIT;
        while self.masters().contains(&port) {
            assert!(
                Instant::now() < deadline,
                "no replica took over from {port}: {}",
                self.nodes_view()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.wait_until_settled();
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
