//! What an operator sees of a running server, read with the real tools: a real Prometheus
//! (Debian's `prometheus`; `.ci/run` installs it) scrapes the real `moviedb-mcp` while MRTR
//! conversations run, and the figures are read back through Prometheus's HTTP query API.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::movies::{Backend, Launch, MovieServer, Session, eliciting};
use support::net::{accepts_connections, free_port, random_hex};

/// How long Prometheus may take to start, scrape and answer.
const PATIENCE: Duration = Duration::from_secs(40);

/// A Prometheus server scraping `target` every second, with its data in a folder of its own;
/// stopped and removed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn binary() -> PathBuf {
        let path = std::env::var_os("PROMETHEUS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"));
        assert!(
            path.is_file(),
            "Prometheus is not installed at {} (apt-get install prometheus, or set PROMETHEUS; \
             .ci/run installs it)",
            path.display()
        );
        path
    }

    async fn scraping(target: &str, metrics_path: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("moviedb-prometheus-{}", random_hex(6)));
        std::fs::create_dir_all(&dir).expect("create Prometheus's folder");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: moviedb\n    scrape_interval: 1s\n    \
                 metrics_path: {metrics_path}\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write Prometheus's configuration");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("create its log");
        let child = Command::new(Self::binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .expect("start Prometheus");
        let prometheus = Self { child, port, dir };
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if accepts_connections(port)
                && reqwest::get(prometheus.url("/-/ready"))
                    .await
                    .is_ok_and(|r| r.status().is_success())
            {
                return prometheus;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Prometheus did not get ready; its log:\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The value of the instant query `query` (a single series), if it has one.
    async fn value(&self, query: &str) -> Option<f64> {
        let answer: Value = reqwest::Client::new()
            .get(self.url("/api/v1/query"))
            .query(&[("query", query)])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        answer["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
    }

    /// Waits until `query` reads `expected`; fails with what it read last.
    async fn expect(&self, query: &str, expected: f64) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            last = self.value(query).await;
            if last == Some(expected) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!(
            "Prometheus read {last:?} for {query}, expected {expected}; its log:\n{}",
            self.log()
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn add(movie_id: i64) -> Value {
    json!({"subject": {"movieId": movie_id.to_string()}})
}

/// One addToWatchlist conversation: the question, then the answer; returns the state used.
async fn converse(session: &Session, movie_id: i64) -> String {
    let asked = session.call("addToWatchlist", add(movie_id)).await;
    assert_eq!(
        asked.result_type(),
        "input_required",
        "{}",
        asked.body_text()
    );
    let state = asked.request_state();
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let done = session
        .retry("addToWatchlist", add(movie_id), answer, &state)
        .await;
    assert_eq!(done.result_type(), "complete", "{}", done.body_text());
    state
}

#[tokio::test]
async fn prometheus_reads_the_conversations_rounds_and_refusals_of_a_running_server() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let target = server
        .url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let prometheus = Prometheus::scraping(&target, "/metrics").await;
    let alice = server.user("alice");

    converse(&alice, 6).await;
    let state = converse(&alice, 7).await;
    // The second conversation's state, sent again: refused as a replay.
    let replay = alice
        .retry(
            "addToWatchlist",
            add(7),
            json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}}),
            &state,
        )
        .await;
    assert_eq!(replay.error_code(), -32602, "{}", replay.body_text());
    // And one that is not ours at all.
    let forged = alice
        .retry("addToWatchlist", add(8), json!({}), "bm90IGEgc3RhdGU")
        .await;
    assert_eq!(forged.error_code(), -32602, "{}", forged.body_text());

    prometheus
        .expect("mcp_mrtr_conversations_started_total", 2.0)
        .await;
    prometheus
        .expect("mcp_mrtr_conversations_completed_total", 2.0)
        .await;
    prometheus
        .expect("mcp_mrtr_rounds_per_conversation_sum", 4.0)
        .await;
    prometheus
        .expect("mcp_mrtr_state_refusals_total{reason=\"replayed\"}", 1.0)
        .await;
    prometheus
        .expect("mcp_mrtr_state_refusals_total{reason=\"tampered\"}", 1.0)
        .await;
    prometheus
        .expect(
            "mcp_requests_total{method=\"tools/call\",outcome=\"input_required\"}",
            2.0,
        )
        .await;
    prometheus
        .expect("mcp_continuations_pending{store=\"memory\"}", 0.0)
        .await;
    prometheus
        .expect("mcp_mrtr_answer_wait_seconds_count", 2.0)
        .await;
    prometheus
        .expect(
            "moviedb_sql_batch_seconds_count{batch=\"watchlist_additions\"}",
            2.0,
        )
        .await;
    // An unanswered question is a pending continuation.
    let waiting = alice.call_with("addToWatchlist", add(9), eliciting()).await;
    assert_eq!(waiting.result_type(), "input_required");
    prometheus
        .expect("mcp_continuations_pending{store=\"memory\"}", 1.0)
        .await;
}

#[tokio::test]
async fn metrics_can_move_to_an_address_of_their_own() {
    let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let server = MovieServer::start_with(
        Backend::Sqlite,
        Launch::with_args(["--metrics-bind", &metrics.to_string()]),
    )
    .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !accepts_connections(metrics.port()) {
        assert!(tokio::time::Instant::now() < deadline, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.user("alice").call("getWatchlist", json!({})).await;
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    assert!(
        text.contains("mcp_requests_total{method=\"tools/call\",outcome=\"complete\"} 1"),
        "{text}"
    );
    let on_mcp_port = reqwest::get(server.url().replace("/mcp", "/metrics"))
        .await
        .expect("an answer");
    assert_eq!(on_mcp_port.status().as_u16(), 404, "not on the public port");
}
