//! A Redis of the test's own that speaks only TLS (`rediss://`), its certificate for `localhost`
//! issued by a certificate authority made for the test (with the `openssl` command): a client
//! reaches it only when it trusts that authority's file. It can also run as a one-node Redis
//! Cluster that speaks TLS on its cluster bus too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::net::{free_port, random_hex};
use super::redis::{answers_as, cli_output, redis_cli, serve_every_slot};

/// How long `redis-server` may take to listen.
const STARTUP_LIMIT: Duration = Duration::from_secs(20);

/// Ports tried before giving up.
const ATTEMPTS: usize = 5;

/// The TLS-only Redis; killed, and its folder removed, on drop.
pub struct TlsRedis {
    port: u16,
    child: Child,
    dir: PathBuf,
}

/// Runs `openssl` with `args` in `dir`, failing the test if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let ran = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("openssl is installed");
    assert!(
        ran.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// `openssl req` with a new P-256 key written to `<name>.key`, for `common_name`, and `args`.
fn with_new_key(dir: &Path, name: &str, args: &[&str], common_name: &str) {
    let key = format!("{name}.key");
    let subject = format!("/CN={common_name}");
    let mut all = vec![
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
    ];
    all.extend(["-nodes", "-keyout", &key, "-subj", &subject]);
    all.extend(args);
    openssl(dir, &all);
}

impl TlsRedis {
    pub fn start() -> Self {
        Self::spawn(false)
    }

    /// One node in cluster mode, serving every slot, TLS on its bus as on its clients' port.
    pub fn one_node_cluster() -> Self {
        let redis = Self::spawn(true);
        serve_every_slot(|args| redis.cli(args));
        let deadline = Instant::now() + STARTUP_LIMIT;
        while !redis.cli(&["cluster", "info"]).contains("cluster_state:ok") {
            assert!(Instant::now() < deadline, "the TLS cluster did not settle");
            std::thread::sleep(Duration::from_millis(50));
        }
        redis
    }

    /// Starts `redis-server`, in cluster mode when asked, and waits until it listens. A free
    /// port can be taken by another test's server before this one binds it: a server that exits,
    /// or a port answered by another process, means another try (ports and folder chosen anew).
    fn spawn(cluster: bool) -> Self {
        let mut log = String::new();
        for _ in 0..ATTEMPTS {
            let mut redis = Self::launch(cluster);
            let deadline = Instant::now() + STARTUP_LIMIT;
            let port = redis.port;
            let authority = redis.authority();
            let ours = answers_as(&mut redis.child, port, deadline, || {
                cli_over_tls(&authority, port, &["info", "server"])
            });
            if ours {
                return redis;
            }
            log = std::fs::read_to_string(redis.dir.join("redis.log")).unwrap_or_default();
        }
        panic!("the TLS Redis did not start in {ATTEMPTS} tries: {log}");
    }

    /// A new folder with the authority and the server's certificate, and `redis-server` started
    /// there on a free port.
    fn launch(cluster: bool) -> Self {
        let dir = std::env::temp_dir().join(format!("moviedb-tls-redis-{}", random_hex(6)));
        std::fs::create_dir_all(&dir).expect("create the folder of the TLS Redis");
        // The authority (self-signed), then the request for the server's certificate.
        with_new_key(
            &dir,
            "ca",
            &["-x509", "-out", "ca.pem", "-days", "2"],
            "moviedb test CA",
        );
        with_new_key(&dir, "redis", &["-out", "redis.csr"], "localhost");
        std::fs::write(
            dir.join("names.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("write the certificate's names");
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "redis.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "redis.pem",
                "-days",
                "2",
                "-extfile",
                "names.ext",
            ],
        );
        // The bus port is named: by default it is the client port + 10000, which may not exist.
        let bus_port = free_port().to_string();
        let cluster_mode = [
            "--cluster-enabled",
            "yes",
            "--tls-cluster",
            "yes",
            "--cluster-port",
            &bus_port,
            "--cluster-config-file",
            "nodes.conf",
        ];
        let extra: &[&str] = if cluster { &cluster_mode } else { &[] };
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                "redis.pem",
                "--tls-key-file",
                "redis.key",
            ])
            .args(["--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .args(["--logfile", "redis.log"])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        Self { port, child, dir }
    }

    /// Its URL: TLS, to the name its certificate is for.
    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    /// What `redis-cli` answers to `args`.
    fn cli(&self, args: &[&str]) -> String {
        cli_over_tls(&self.authority(), self.port, args)
    }

    /// The file of the authority that issued its certificate.
    pub fn authority(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What `redis-cli` answers to `args` from the TLS Redis on `port`, trusting `authority`.
fn cli_over_tls(authority: &Path, port: u16, args: &[&str]) -> String {
    let output = cli_output(
        redis_cli()
            .args(["--tls", "--cacert"])
            .arg(authority)
            .args(["-h", "localhost", "-p", &port.to_string()])
            .args(args),
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
