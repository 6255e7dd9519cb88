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

/// The first round of an addToWatchlist conversation: the question, left unanswered.
async fn ask(session: &Session, movie_id: i64) -> String {
    let asked = session.call("addToWatchlist", add(movie_id)).await;
    assert_eq!(
        asked.result_type(),
        "input_required",
        "{}",
        asked.body_text()
    );
    asked.request_state()
}

/// One addToWatchlist conversation: the question, then the answer; returns the state used.
async fn converse(session: &Session, movie_id: i64) -> String {
    let state = ask(session, movie_id).await;
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let done = session
        .retry("addToWatchlist", add(movie_id), answer, &state)
        .await;
    assert_eq!(done.result_type(), "complete", "{}", done.body_text());
    state
}

/// The `host:port` a server's MCP endpoint is on, where it also serves `/metrics`.
fn host_of(server: &MovieServer) -> String {
    server
        .url()
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

#[tokio::test]
async fn prometheus_reads_the_conversations_rounds_and_refusals_of_a_running_server() {
    // Legacy sessions left unused for 2 s expire: the one below is kept busy for longer.
    let launch = Launch::with_args(["--legacy-session-idle-secs", "2"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let target = host_of(&server);
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
    ask(&alice, 9).await;
    prometheus
        .expect("mcp_continuations_pending{store=\"memory\"}", 1.0)
        .await;

    // A 2025-11-25 session is open, and stays counted once when its requests renew it.
    #[cfg(feature = "legacy")]
    {
        let legacy = support::legacy::LegacyClient::new(server.url().to_owned(), None)
            .initialize(json!({}))
            .await;
        // Used twice a second for twice its idle lifetime: each request renews it.
        let busy_until = std::time::Instant::now() + Duration::from_secs(4);
        while std::time::Instant::now() < busy_until {
            let listed = legacy.request("tools/list", json!({})).await;
            assert_eq!(listed.status, 200, "the renewed session is still open");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        prometheus
            .expect("mcp_legacy_sessions_open{store=\"memory\"}", 1.0)
            .await;
        assert_eq!(
            prometheus
                .value("mcp_legacy_sessions_expired_total{store=\"memory\"}")
                .await,
            None,
            "a renewed session did not expire"
        );
    }
}

/// A 2025-11-25 session kept busy still ends at its longest lifetime, and counts as expired.
#[cfg(feature = "legacy")]
#[tokio::test]
async fn a_busy_legacy_session_ends_at_its_longest_lifetime_and_counts_as_expired() {
    let launch = Launch::with_args(["--legacy-session-max-secs", "3"]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let target = host_of(&server);
    let prometheus = Prometheus::scraping(&target, "/metrics").await;
    // Taken before the session opens, so that what it measures is at least the session's life.
    let opened = std::time::Instant::now();
    let legacy = support::legacy::LegacyClient::new(server.url().to_owned(), None)
        .initialize(json!({}))
        .await;
    // Used five times a second, so it never idles; yet it ends.
    let lasted = loop {
        let listed = legacy.request("tools/list", json!({})).await;
        if listed.status == 404 {
            break opened.elapsed();
        }
        assert_eq!(listed.status, 200, "{:?}", listed.messages);
        assert!(
            opened.elapsed() < Duration::from_secs(20),
            "the session outlived its longest lifetime of 3 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Ages are counted in whole seconds.
    assert!(
        lasted >= Duration::from_secs(2),
        "the session ended after {lasted:?}, before its longest lifetime of 3 s"
    );
    prometheus
        .expect("mcp_legacy_sessions_expired_total{store=\"memory\"}", 1.0)
        .await;
    prometheus
        .expect("mcp_legacy_sessions_open{store=\"memory\"}", 0.0)
        .await;
}

/// Continuations and legacy sessions in Redis expire without telling anyone: the replica counts
/// them by sweeping the store's live indexes, and Prometheus reads what is pending, what was
/// abandoned and which sessions are open.
#[tokio::test]
async fn prometheus_reads_what_the_redis_store_holds_and_what_lapsed_in_it() {
    use support::cluster::{Replicas, SharedSettings};
    let mut settings = SharedSettings::new(support::net::shared_redis_url());
    settings.extra_env = vec![
        ("MOVIEDB_REDIS_COUNT_SECS".into(), "1".into()),
        ("MOVIEDB_STATE_TTL".into(), "8".into()),
        ("MOVIEDB_LEGACY_SESSION_IDLE".into(), "8".into()),
        ("MOVIEDB_SHARE_PER_CALLER".into(), "2".into()),
    ];
    let replicas = Replicas::start_with(1, settings).await;
    let target = replicas.addresses()[0].to_string();
    let prometheus = Prometheus::scraping(&target, "/metrics").await;
    // Scraping already, so that what lives only a few seconds is seen.
    prometheus.expect("up", 1.0).await;
    let alice = replicas.session(1, "alice");

    // Two questions left unanswered, then a third conversation, answered: its question pushes
    // the oldest unanswered one out of alice's share of two.
    for movie_id in [6, 7] {
        ask(&alice, movie_id).await;
    }
    converse(&alice, 8).await;
    prometheus
        .expect("mcp_continuations_pending{store=\"redis\"}", 1.0)
        .await;
    // The evicted one is abandoned at once, well before its time-to-live.
    prometheus
        .expect(
            "mcp_mrtr_conversations_abandoned_total{store=\"redis\"}",
            1.0,
        )
        .await;
    // Past the time-to-live, the other is abandoned too: each counted once.
    prometheus
        .expect(
            "mcp_mrtr_conversations_abandoned_total{store=\"redis\"}",
            2.0,
        )
        .await;
    prometheus
        .expect("mcp_continuations_pending{store=\"redis\"}", 0.0)
        .await;

    #[cfg(feature = "legacy")]
    {
        use support::legacy::LegacyClient;
        let url = format!("http://{target}/mcp");
        let open = LegacyClient::new(url.clone(), None)
            .initialize(json!({}))
            .await;
        let closed = LegacyClient::new(url, None).initialize(json!({})).await;
        let deleted = closed.delete_session().await;
        assert!(deleted < 300, "DELETE answered {deleted}");
        prometheus
            .expect("mcp_legacy_sessions_open{store=\"redis\"}", 1.0)
            .await;
        let expired = "mcp_legacy_sessions_expired_total{store=\"redis\"}";
        assert_eq!(
            prometheus.value(expired).await.unwrap_or(0.0),
            0.0,
            "a session its client deleted did not expire"
        );
        // Left unused past its idle lifetime, the open one expires.
        drop(open);
        prometheus.expect(expired, 1.0).await;
        prometheus
            .expect("mcp_legacy_sessions_open{store=\"redis\"}", 0.0)
            .await;
    }

    // Two sweeps and scrapes later, nothing was counted twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let abandoned = "mcp_mrtr_conversations_abandoned_total{store=\"redis\"}";
    assert_eq!(
        prometheus.value(abandoned).await,
        Some(2.0),
        "each counted once"
    );
    #[cfg(feature = "legacy")]
    assert_eq!(
        prometheus
            .value("mcp_legacy_sessions_expired_total{store=\"redis\"}")
            .await,
        Some(1.0),
        "the expired session counted once"
    );
}

/// A replica counts what Redis already holds as soon as it starts, however long its pace between
/// sweeps: restarted under a pace of an hour, it reads the two conversations left waiting at once.
#[tokio::test]
async fn a_replica_counts_what_redis_holds_as_soon_as_it_starts() {
    use support::cluster::{Replicas, SharedSettings};
    let mut settings = SharedSettings::new(support::net::shared_redis_url());
    settings.extra_env = vec![("MOVIEDB_REDIS_COUNT_SECS".into(), "3600".into())];
    let (redis_url, prefix) = (settings.redis_url.clone(), settings.redis_prefix.clone());
    let mut replicas = Replicas::start_with(1, settings).await;
    let alice = replicas.session(1, "alice");
    for movie_id in [6, 7] {
        ask(&alice, movie_id).await;
    }
    replicas.replica(1).terminate().await;
    replicas.restart(1).await;

    let metrics = format!("http://{}/metrics", replicas.addresses()[0]);
    let series = "mcp_continuations_pending{store=\"redis\"}";
    let counted = metric_until(&metrics, series, "2", Duration::from_secs(10)).await;
    assert_eq!(
        counted.as_deref(),
        Some("2"),
        "the restarted replica counts the 2 conversations waiting"
    );

    // The indexes it counts from leave Redis by themselves once no replica sweeps them.
    let mut redis = redis::Client::open(redis_url)
        .expect("a Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    let indexes: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}live:*"))
        .query_async(&mut redis)
        .await
        .expect("list the live indexes");
    assert!(!indexes.is_empty(), "the waiting conversations are indexed");
    for index in indexes {
        let left: i64 = redis::cmd("PTTL")
            .arg(&index)
            .query_async(&mut redis)
            .await
            .expect("read an expiry");
        assert!(
            left > 0 && left <= 25 * 3600 * 1000,
            "{index} expires, a day or so after its last entry: {left} ms"
        );
    }
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

/// One span as an OTLP/HTTP receiver got it.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    /// The W3C trace state the span carries.
    trace_state: String,
    /// The exporting process's `service.instance.id`.
    instance: String,
    service: String,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A real OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf), decoding what it gets with
/// `opentelemetry-proto`.
struct OtlpReceiver {
    addr: SocketAddr,
    spans: std::sync::Arc<std::sync::Mutex<Vec<Received>>>,
}

impl OtlpReceiver {
    async fn start() -> Self {
        use axum::body::Bytes;
        use opentelemetry_proto::tonic::collector::trace::v1::{
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        };
        use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
        use prost::Message as _;

        let spans = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let store = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let store = store.clone();
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return (axum::http::StatusCode::BAD_REQUEST, Vec::new());
                    };
                    let text =
                        |value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| {
                            match value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(Any::StringValue(s)) => s.clone(),
                                Some(Any::IntValue(i)) => i.to_string(),
                                Some(Any::BoolValue(b)) => b.to_string(),
                                Some(other) => format!("{other:?}"),
                                None => String::new(),
                            }
                        };
                    let mut received = store.lock().unwrap_or_else(|p| p.into_inner());
                    for resource_spans in request.resource_spans {
                        let resource = resource_spans.resource.unwrap_or_default();
                        let of_resource = |key: &str| {
                            resource
                                .attributes
                                .iter()
                                .find(|kv| kv.key == key)
                                .map(|kv| text(&kv.value))
                                .unwrap_or_default()
                        };
                        let (instance, service) = (
                            of_resource("service.instance.id"),
                            of_resource("service.name"),
                        );
                        for scope in resource_spans.scope_spans {
                            for span in scope.spans {
                                received.push(Received {
                                    name: span.name.clone(),
                                    trace_id: hex(&span.trace_id),
                                    span_id: hex(&span.span_id),
                                    parent_span_id: hex(&span.parent_span_id),
                                    trace_state: span.trace_state.clone(),
                                    instance: instance.clone(),
                                    service: service.clone(),
                                    attributes: span
                                        .attributes
                                        .iter()
                                        .map(|kv| (kv.key.clone(), text(&kv.value)))
                                        .collect(),
                                });
                            }
                        }
                    }
                    (
                        axum::http::StatusCode::OK,
                        ExportTraceServiceResponse::default().encode_to_vec(),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the OTLP receiver");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, spans }
    }

    /// Replicas' settings that export their spans here, in batches sent every 100 ms.
    fn exported_to(&self) -> support::cluster::SharedSettings {
        let mut settings = support::cluster::SharedSettings::new(support::net::shared_redis_url());
        settings.extra_env = vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                format!("http://{}", self.addr),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
        ];
        settings
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until `wanted` holds for what was received; returns it.
    async fn wait_for(&self, wanted: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let spans = self.spans();
            if wanted(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the spans never arrived; got: {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn both_rounds_of_a_conversation_on_two_replicas_are_one_trace_under_the_clients_span() {
    use support::cluster::Replicas;
    let receiver = OtlpReceiver::start().await;
    let settings = receiver.exported_to();
    let replicas = Replicas::start_with(2, settings).await;
    let (on_a, on_b) = (replicas.session(1, "alice"), replicas.session(2, "alice"));

    let trace_id = random_hex(16);
    let client_span = random_hex(8);
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let asked = on_a
        .request("tools/call")
        .params(json!({"name": "addToWatchlist", "arguments": add(6)}))
        .capabilities(eliciting())
        .meta("traceparent", json!(traceparent))
        .meta("tracestate", json!("moviedb-test=round-1"))
        .meta("baggage", json!("tenant=acme,plan=trial"))
        .send()
        .await;
    assert_eq!(
        asked.result_type(),
        "input_required",
        "{}",
        asked.body_text()
    );
    // The retry goes to the other replica, without any trace context of its own.
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let done = on_b
        .retry("addToWatchlist", add(6), answer, &asked.request_state())
        .await;
    assert_eq!(done.result_type(), "complete", "{}", done.body_text());

    let round = |spans: &[Received], n: &str| {
        spans
            .iter()
            .find(|s| s.name == "mcp.round" && s.attribute("mcp.round") == Some(n))
            .cloned()
    };
    // Where the time went, in the same trace: the store and the SQL of both rounds. Each span
    // is exported when it ends, in batches: wait for all of them.
    let wanted = ["mcp.store put", "watchlist_checks", "watchlist_additions"];
    let spans = receiver
        .wait_for(|spans| {
            round(spans, "1").is_some()
                && round(spans, "2").is_some()
                && wanted.iter().all(|name| {
                    spans
                        .iter()
                        .any(|s| s.name == *name && s.trace_id == trace_id)
                })
        })
        .await;
    let (first, second) = (
        round(&spans, "1").expect("round 1"),
        round(&spans, "2").expect("round 2"),
    );
    assert_eq!(
        first.trace_id, trace_id,
        "round 1 continues the client's trace"
    );
    assert_eq!(
        second.trace_id, trace_id,
        "round 2 as well, on the other replica"
    );
    assert_ne!(first.instance, second.instance, "served by two replicas");
    assert_eq!(first.service, "moviedb-mcp");
    assert_eq!(first.attribute("mcp.name"), Some("addToWatchlist"));
    assert_eq!(
        second.parent_span_id, first.span_id,
        "round 2 follows round 1"
    );
    // The client's trace state and baggage travel with the conversation to the other replica.
    for round in [&first, &second] {
        assert_eq!(round.trace_state, "moviedb-test=round-1", "{round:#?}");
        assert_eq!(
            round.attribute("baggage.tenant"),
            Some("acme"),
            "{round:#?}"
        );
        assert_eq!(round.attribute("baggage.plan"), Some("trial"), "{round:#?}");
    }
    let request = spans
        .iter()
        .find(|s| s.name == "tools/call" && s.span_id == first.parent_span_id)
        .unwrap_or_else(|| panic!("round 1 runs in its request's span: {spans:#?}"));
    assert_eq!(
        request.parent_span_id, client_span,
        "the request's span is the child of the client's"
    );
    // No answer of the user's is in any attribute.
    assert!(
        spans
            .iter()
            .flat_map(|s| &s.attributes)
            .all(|(_, v)| !v.contains("WATCHED")),
        "{spans:#?}"
    );
}

/// W3C trace context is taken whole or not at all: a `traceparent` not of the exact form (short
/// ids the propagator would pad with zeros) starts a trace of its own; `tracestate` on two header
/// lines is one list; and a 2025-11-25 session's request continues the trace its headers name.
#[tokio::test]
async fn trace_context_is_taken_whole_on_both_wires() {
    use support::cluster::Replicas;
    let receiver = OtlpReceiver::start().await;
    let settings = receiver.exported_to();
    #[cfg(feature = "legacy")]
    let token = settings.token("alice");
    let replicas = Replicas::start_with(1, settings).await;
    let alice = replicas.session(1, "alice");

    let listed = alice
        .request("tools/list")
        .header("traceparent", "00-1-2-01")
        .send()
        .await;
    assert_eq!(listed.status, 200, "{}", listed.body_text());
    let (whole_trace, client_span) = (random_hex(16), random_hex(8));
    let listed = alice
        .request("tools/list")
        .header("traceparent", format!("00-{whole_trace}-{client_span}-01"))
        .extra_header_line("tracestate", "vendor-a=1")
        .extra_header_line("tracestate", "vendor-b=2")
        .send()
        .await;
    assert_eq!(listed.status, 200, "{}", listed.body_text());

    #[cfg(feature = "legacy")]
    let (legacy_trace, legacy_span) = (random_hex(16), random_hex(8));
    #[cfg(feature = "legacy")]
    {
        let url = format!("http://{}/mcp", replicas.addresses()[0]);
        let legacy = support::legacy::LegacyClient::new(url, Some(token.clone()))
            .initialize(json!({}))
            .await;
        let body = json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {}});
        let answered = reqwest::Client::new()
            .post(&legacy.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header(
                "mcp-session-id",
                legacy.session_id.clone().expect("a session"),
            )
            .header("mcp-protocol-version", "2025-11-25")
            .header("traceparent", format!("00-{legacy_trace}-{legacy_span}-01"))
            .bearer_auth(&token)
            .body(body.to_string())
            .send()
            .await
            .expect("a legacy request");
        assert_eq!(answered.status().as_u16(), 200);
    }
    let expected = if cfg!(feature = "legacy") { 3 } else { 2 };

    let lists = |spans: &[Received]| -> Vec<Received> {
        spans
            .iter()
            .filter(|span| span.name == "tools/list")
            .cloned()
            .collect()
    };
    let spans = receiver
        .wait_for(|spans| lists(spans).len() >= expected)
        .await;
    let lists = lists(&spans);
    let padded = format!("{:0>32}", "1");
    assert!(
        lists.iter().all(|span| span.trace_id != padded),
        "00-1-2-01 continues no trace: {lists:#?}"
    );
    let whole = lists
        .iter()
        .find(|span| span.trace_id == whole_trace)
        .unwrap_or_else(|| panic!("the whole traceparent is continued: {lists:#?}"));
    assert_eq!(whole.parent_span_id, client_span);
    assert_eq!(
        whole.trace_state, "vendor-a=1,vendor-b=2",
        "both tracestate lines: {whole:#?}"
    );
    #[cfg(feature = "legacy")]
    {
        let legacy_list = lists
            .iter()
            .find(|span| span.trace_id == legacy_trace)
            .unwrap_or_else(|| panic!("the 2025-11-25 request continues its trace: {lists:#?}"));
        assert_eq!(legacy_list.parent_span_id, legacy_span);
    }
}

/// A call dropped unfinished (its client closed the stream) is counted `cancelled`: the calls
/// clients gave up on, often the slowest, are not missing from the counts and the timings.
#[tokio::test]
async fn a_call_its_client_gave_up_on_is_counted_cancelled() {
    use support::openai::{Answer, FakeProvider};
    let provider = FakeProvider::start(Answer::Held("SUMMARY: Held.\nTHEMES: none".into())).await;
    let (server, summary) = support::movies::summarizing_with(&provider).await;
    drop(summary);

    let metrics = server.url().replace("/mcp", "/metrics");
    let series = "mcp_requests_total{method=\"tools/call\",outcome=\"cancelled\"}";
    let counted = metric_until(&metrics, series, "1", PATIENCE).await;
    provider.release();
    assert_eq!(
        counted.as_deref(),
        Some("1"),
        "the call its client gave up on is counted cancelled"
    );
}

/// The value of `series` in the exposition at `metrics`, read again until it is `wanted` or
/// `within` has passed; `None` while the series is absent.
async fn metric_until(
    metrics: &str,
    series: &str,
    wanted: &str,
    within: Duration,
) -> Option<String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let text = reqwest::get(metrics)
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text");
        let value = text
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map(str::to_owned);
        if value.as_deref() == Some(wanted) || tokio::time::Instant::now() >= deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A retry refused for an answer the form does not take, then sent again properly, is one wait
/// for an answer; and the messages the transport refuses before any method runs are counted
/// apart, by status and code, while a tool's own refusal stays with the requests it handled.
#[tokio::test]
async fn mended_retries_count_once_and_transport_refusals_are_counted_apart() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let alice = server.user("alice");
    let state = ask(&alice, 6).await;
    let unoffered = json!({"status": {"action": "accept", "content": {"status": "MAYBE"}}});
    let refused = alice
        .retry("addToWatchlist", add(6), unoffered, &state)
        .await;
    assert_eq!(refused.error_code(), -32602, "{}", refused.body_text());
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let done = alice.retry("addToWatchlist", add(6), answer, &state).await;
    assert_eq!(done.result_type(), "complete", "{}", done.body_text());

    let http = reqwest::Client::new();
    let post = |body: &'static str| {
        http.post(server.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
    };
    let unparsable = post("{\"jsonrpc\": \"2.0\", ")
        .send()
        .await
        .expect("an answer");
    assert_eq!(unparsable.status().as_u16(), 400);
    // The header names one revision, the body another.
    let mismatched = r#"{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta":
        {"io.modelcontextprotocol/protocolVersion": "2025-06-18"}}}"#;
    let mismatched = post(mismatched)
        .header("mcp-protocol-version", "2026-07-28")
        .send()
        .await
        .expect("an answer");
    assert_eq!(mismatched.status().as_u16(), 400);

    let metrics = server.url().replace("/mcp", "/metrics");
    for (series, wanted) in [
        ("mcp_mrtr_answer_wait_seconds_count", "1"),
        ("mcp_mrtr_conversations_started_total", "1"),
        ("mcp_mrtr_conversations_completed_total", "1"),
        (
            "mcp_requests_total{method=\"tools/call\",outcome=\"-32602\"}",
            "1",
        ),
        (
            "mcp_requests_refused_total{status=\"400\",outcome=\"-32700\"}",
            "1",
        ),
        (
            "mcp_requests_refused_total{status=\"400\",outcome=\"-32020\"}",
            "1",
        ),
    ] {
        let value = metric_until(&metrics, series, wanted, PATIENCE).await;
        assert_eq!(value.as_deref(), Some(wanted), "{series}");
    }
    let text = reqwest::get(&metrics)
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let refusals: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("mcp_requests_refused_total{"))
        .collect();
    assert_eq!(
        refusals.len(),
        2,
        "only the transport's refusals: {refusals:?}"
    );
}

/// Spans that cannot reach the OTLP collector are not lost in silence: the log says so.
#[tokio::test]
async fn a_collector_that_cannot_be_reached_is_reported_in_the_log() {
    use support::cluster::{Replicas, SharedSettings};
    let mut settings = SharedSettings::new(support::net::shared_redis_url());
    settings.extra_env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            format!("http://127.0.0.1:{}", free_port()),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()),
    ];
    let mut replicas = Replicas::start_with(1, settings).await;
    let listed = replicas
        .session(1, "alice")
        .request("tools/list")
        .send()
        .await;
    assert_eq!(listed.status.as_u16(), 200, "{}", listed.body_text());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let log = replicas.replica(1).log();
        // The line of a batch that could not be sent (not of an exporter that could not be made).
        if log
            .lines()
            .any(|line| line.contains("cannot export traces over OTLP") && line.contains("spans="))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no word of the failed export: {log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A call that goes on as a task stays in its trace: the task's run is a span under the round
/// that made it.
#[tokio::test]
async fn a_task_runs_in_the_trace_of_the_call_that_made_it() {
    use support::cluster::Replicas;
    use support::openai::{Answer, FakeProvider};
    let provider = FakeProvider::start(Answer::Text("SUMMARY: Loved.\nTHEMES: heart".into())).await;
    let receiver = OtlpReceiver::start().await;
    let mut settings = receiver.exported_to();
    settings.extra_env.extend([
        ("MOVIEDB_LLM_BASE_URL".into(), provider.base_url()),
        ("MOVIEDB_LLM_MODEL".into(), "review-writer-test".into()),
        (
            "MOVIEDB_LLM_API_KEY".into(),
            "sk-test-0123456789abcdef".into(),
        ),
    ]);
    let replicas = Replicas::start_with(1, settings).await;
    let alice = replicas.session(1, "alice");

    let trace_id = random_hex(16);
    let traceparent = format!("00-{trace_id}-{}-01", random_hex(8));
    let created = alice
        .request("tools/call")
        .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": "6"}}))
        .capabilities(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
        .meta("traceparent", json!(traceparent))
        .send()
        .await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());

    let spans = receiver
        .wait_for(|spans| {
            spans
                .iter()
                .any(|span| span.name == "mcp.task" && span.trace_id == trace_id)
        })
        .await;
    let in_trace = |name: &str| {
        spans
            .iter()
            .find(|span| span.name == name && span.trace_id == trace_id)
            .unwrap_or_else(|| panic!("no {name} span in the call's trace: {spans:#?}"))
    };
    let (task, round) = (in_trace("mcp.task"), in_trace("mcp.round"));
    assert_eq!(
        task.parent_span_id, round.span_id,
        "the task's run is under the round that made it"
    );
}
