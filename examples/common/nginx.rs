//! A real nginx in front of replicas, run with the repository's `deploy/nginx.conf`: this file
//! writes the two files that config includes (the replicas, and where to listen) into a folder of
//! its own and runs nginx in the foreground there. Used by `examples/cluster` and the tests, which
//! include it beside `common` (`#[path = "../common/nginx.rs"] mod nginx;`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::{Child, Command};

/// Names the replica (its address) that served a response, when asked for.
pub const UPSTREAM_HEADER: &str = "x-moviedb-upstream";

/// How long nginx may take to listen.
const STARTUP_LIMIT: Duration = Duration::from_secs(20);

/// A running nginx; stopped (and its folder removed) on drop.
pub struct Nginx {
    pub port: u16,
    child: Child,
    /// Dropped after the child is told to stop.
    _folder: Folder,
}

/// nginx's folder, removed when dropped: also when nginx fails to start.
struct Folder(PathBuf);

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Nginx {
    /// Starts nginx on 127.0.0.1:`port` in front of `replicas`, saying in [`UPSTREAM_HEADER`]
    /// which replica served each response when `name_upstream` is set.
    pub async fn start(
        port: u16,
        replicas: &[SocketAddr],
        name_upstream: bool,
    ) -> anyhow::Result<Self> {
        let folder = Folder(
            std::env::temp_dir().join(format!("moviedb-nginx-{}", crate::common::random_hex(8))),
        );
        std::fs::create_dir_all(&folder.0)
            .with_context(|| format!("cannot create {}", folder.0.display()))?;
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx.conf");
        std::fs::copy(&config, folder.0.join("nginx.conf"))
            .with_context(|| format!("cannot copy {}", config.display()))?;
        let upstreams: String = replicas
            .iter()
            .map(|addr| format!("server {addr} max_fails=2 fail_timeout=2s;\n"))
            .collect();
        std::fs::write(folder.0.join("moviedb-upstreams.conf"), upstreams)?;
        let mut listen = format!("listen 127.0.0.1:{port};\n");
        if name_upstream {
            listen.push_str(&format!(
                "add_header {UPSTREAM_HEADER} $upstream_addr always;\n"
            ));
        }
        std::fs::write(folder.0.join("moviedb-listen.conf"), listen)?;
        let pid_file = folder.0.join("nginx.pid");
        let child = Command::new(nginx_binary())
            .arg("-p")
            .arg(&folder.0)
            .arg("-c")
            .arg(folder.0.join("nginx.conf"))
            .arg("-e")
            .arg("stderr")
            .arg("-g")
            .arg(format!("daemon off; pid {};", pid_file.display()))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start nginx (install Debian's nginx package, or set NGINX)")?;
        let mut nginx = Self {
            port,
            child,
            _folder: folder,
        };
        match nginx.ready(&pid_file).await {
            Ok(()) => Ok(nginx),
            Err(e) => {
                // Stopped and waited for: a master killed by the drop would leave its workers.
                nginx.stop().await;
                Err(e)
            }
        }
    }

    /// Waits until nginx listens.
    async fn ready(&mut self, pid_file: &Path) -> anyhow::Result<()> {
        let port = self.port;
        // nginx writes its pid file once it holds its listening socket: until then, whatever
        // answers on the port is someone else's (and nginx exits, unable to bind).
        let deadline = tokio::time::Instant::now() + STARTUP_LIMIT;
        while !pid_file.exists() {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "nginx exited ({status}) before listening on 127.0.0.1:{port} (is the port \
                     taken?)"
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "nginx did not start within {STARTUP_LIMIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        crate::common::wait_until_listening(&mut self.child, addr, STARTUP_LIMIT)
            .await
            .context("nginx did not start")
    }

    /// The MCP endpoint through nginx.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Resolves when nginx exits by itself (a stop asked by [`Self::stop`] aside).
    pub async fn exited(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Stops nginx (SIGQUIT would wait for streams; SIGTERM is its fast stop).
    pub async fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            crate::common::stop(&mut self.child, pid, Duration::from_secs(5)).await;
        }
    }
}

impl Drop for Nginx {
    /// SIGTERM, not SIGKILL: a killed master leaves its workers running.
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
}

/// `$NGINX`, or nginx from `PATH`, or Debian's `/usr/sbin/nginx`.
fn nginx_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NGINX") {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/sbin/nginx");
    if debian.is_file() {
        return debian.to_path_buf();
    }
    PathBuf::from("nginx")
}
