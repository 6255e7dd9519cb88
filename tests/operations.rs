//! What an operator relies on: health endpoints, a graceful stop on SIGTERM, and rolling restarts
//! of replicas behind nginx (with the repository's `deploy/nginx.conf`) under a load of MRTR
//! conversations, with the real binary, PostgreSQL and Redis.

mod support;

#[allow(dead_code)]
#[path = "../examples/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "../examples/common/nginx.rs"]
mod nginx;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::cluster::{Replicas, Session};
use support::movies::{Backend, Launch, MovieServer};
use support::net::{free_port, shared_redis_url};
use support::openai::{Answer, FakeProvider};
use support::redis::PrivateRedis;

const PATIENCE: Duration = Duration::from_secs(15);

async fn get_json(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = http.get(url).send().await.expect("the server answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// `/readyz` until its status is `want`, or the last answer after [`PATIENCE`].
async fn readiness_until(http: &reqwest::Client, url: &str, want: u16) -> (u16, Value) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = get_json(http, url).await;
        if answer.0 == want || Instant::now() > deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn readiness_follows_redis_and_the_database_while_liveness_stays() {
    let mut redis = PrivateRedis::start();
    let launch = Launch::with_args(["--redis-url", &redis.url()]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let base = server.url().trim_end_matches("/mcp").to_owned();
    let (healthz, readyz) = (format!("{base}/healthz"), format!("{base}/readyz"));
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");

    assert_eq!(
        get_json(&http, &healthz).await,
        (200, json!({"status": "serving"}))
    );
    let ready = get_json(&http, &readyz).await;
    assert_eq!(
        ready,
        (
            200,
            json!({"status": "ready", "checks": {"database": "ok", "redis": "ok"}})
        )
    );

    redis.kill().await;
    let (status, body) = readiness_until(&http, &readyz, 503).await;
    assert_eq!(status, 503, "not ready without Redis: {body}");
    assert_eq!(body["status"], "not ready", "{body}");
    assert_eq!(body["checks"]["database"], "ok", "{body}");
    assert_ne!(
        body["checks"]["redis"], "ok",
        "the failing check is named: {body}"
    );
    assert_eq!(
        get_json(&http, &healthz).await.0,
        200,
        "the process still serves"
    );

    redis.restart();
    let (status, body) = readiness_until(&http, &readyz, 200).await;
    assert_eq!(status, 200, "ready again once Redis is back: {body}");
}

#[tokio::test]
async fn sigterm_finishes_a_streamed_call_ends_listen_streams_and_exits_cleanly() {
    let provider = FakeProvider::start(Answer::Held(
        "SUMMARY: Loved by all.\nTHEMES: acting; music".into(),
    ))
    .await;
    let (mut server, mut summary) = support::movies::summarizing_with(&provider).await;
    let mut listen = server.listen_for_tool_changes().await;
    let base = server.url().trim_end_matches("/mcp").to_owned();
    let readyz = format!("{base}/readyz");
    // One pooled connection, as a balancer keeps.
    let pooled = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    assert_eq!(get_json(&pooled, &readyz).await.0, 200);

    server.terminate();
    let draining = readiness_until(&pooled, &readyz, 503).await;
    assert_eq!(
        draining,
        (503, json!({"status": "draining"})),
        "a pooled connection hears the replica is draining"
    );
    let address = base.trim_start_matches("http://").to_owned();
    // Readiness turns at once; the listener closes when the accept loop next runs, after taking
    // the connections already queued (which are served), so a connect may still land just then.
    let refused = async {
        while tokio::net::TcpStream::connect(&address).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(2), refused)
            .await
            .is_ok(),
        "new connections are refused soon after readiness says draining"
    );
    // The spec's graceful closure: the listen request's own response, then the end.
    let closing = listen.expect_message(PATIENCE).await;
    assert_eq!(
        (&closing["id"], &closing["result"]["resultType"]),
        (
            listen.request_id.as_ref().expect("an id"),
            &json!("complete")
        ),
        "the listen stream ends with the response to its request: {closing}"
    );
    assert_eq!(
        closing["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], closing["id"],
        "tagged with its subscription: {closing}"
    );
    assert!(
        listen.ends_within(PATIENCE).await,
        "the listen stream then ends; its client may listen again, elsewhere"
    );

    provider.release();
    let result = loop {
        let message = summary.expect_message(PATIENCE).await;
        if let Some(result) = message.get("result") {
            break result.clone();
        }
    };
    assert_eq!(
        result["structuredContent"]["summary"], "Loved by all.",
        "the call in flight finishes with the provider's summary: {result}"
    );
    let status = server.exit_status(Duration::from_secs(25)).await;
    assert!(
        status.is_some_and(|status| status.success()),
        "the server exits 0 once its call is answered: {status:?}"
    );
}

#[tokio::test]
async fn a_second_stop_signal_stops_a_draining_server_at_once() {
    let provider = FakeProvider::start(Answer::Held("SUMMARY: Held.\nTHEMES: none".into())).await;
    let (mut server, _summary) = support::movies::summarizing_with(&provider).await;
    server.terminate();
    assert_eq!(
        server.exit_status(Duration::from_secs(1)).await,
        None,
        "the first SIGTERM drains: the summary under way keeps the server up"
    );
    server.terminate();
    let status = server.exit_status(Duration::from_secs(5)).await;
    assert_eq!(
        status.and_then(|status| status.code()),
        Some(143),
        "the second SIGTERM stops it at once, as a process killed by SIGTERM reports: {status:?}"
    );
    assert!(
        server.log().contains("a second stop signal"),
        "the log says why the call under way went unanswered"
    );
    provider.release();
}

/// What the load generator saw.
#[derive(Debug, Default)]
struct LoadReport {
    conversations: usize,
    requests: usize,
    failures: Vec<String>,
    latencies: Vec<Duration>,
    /// Conversations completed, per user.
    completed: BTreeMap<String, i64>,
    /// Every user the load signed in as.
    users: Vec<String>,
}

impl LoadReport {
    fn p99(&mut self) -> Duration {
        self.latencies.sort();
        let index = (self.latencies.len() * 99 / 100).min(self.latencies.len().saturating_sub(1));
        self.latencies.get(index).copied().unwrap_or_default()
    }
}

/// The response in a reply, if the server gave one (a balancer may answer 502 with HTML).
fn response_in(reply: &support::Reply) -> Option<&Value> {
    reply
        .messages
        .iter()
        .find(|message| message.get("result").is_some() || message.get("error").is_some())
}

/// Movies a load user adds before the worker goes on as a new user (the seed has 355).
const MOVIES_PER_USER: usize = 350;

/// One worker: a user adds movie after movie, each in two rounds; once it has added
/// [`MOVIES_PER_USER`] the worker goes on as the next user (`load-<worker>-<n>`), until `stop`,
/// so that the load lasts however long the test takes. `completed` counts every worker's
/// completed conversations as they happen.
async fn converse_until(
    worker: usize,
    sign_in: impl Fn(&str) -> Session,
    stop: Arc<AtomicBool>,
    completed: Arc<AtomicUsize>,
) -> LoadReport {
    let mut report = LoadReport::default();
    for round in 0.. {
        let user = format!("load-{worker}-{round}");
        let session = sign_in(&user);
        report.users.push(user.clone());
        for movie in 1..=MOVIES_PER_USER {
            if stop.load(Ordering::Relaxed) {
                return report;
            }
            if converse(&session, &user, movie, &mut report).await {
                *report.completed.entry(user.clone()).or_default() += 1;
                completed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    report
}

/// One conversation: `user` adds `movie` and answers that it watched it. Whether it was saved;
/// what failed goes into the report.
async fn converse(session: &Session, user: &str, movie: usize, report: &mut LoadReport) -> bool {
    let arguments = json!({"subject": {"movieId": movie.to_string()}});
    report.conversations += 1;
    let started = Instant::now();
    let first = session.call("addToWatchlist", arguments.clone()).await;
    report.requests += 1;
    report.latencies.push(started.elapsed());
    let state = match response_in(&first).and_then(|response| response.get("result")) {
        Some(result) if result["resultType"] == "input_required" => first.request_state(),
        _ => {
            let failure = format!("{user}: round 1 of movie {movie}: HTTP {}", first.status);
            report.failures.push(failure);
            return false;
        }
    };
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let started = Instant::now();
    let done = session
        .retry("addToWatchlist", arguments, answer, &state)
        .await;
    report.requests += 1;
    report.latencies.push(started.elapsed());
    let saved = response_in(&done)
        .and_then(|response| response.get("result"))
        .filter(|result| result["isError"] != json!(true))
        .is_some_and(|result| result["structuredContent"]["status"] == "WATCHED");
    if !saved {
        let failure = format!("{user}: round 2 of movie {movie}: HTTP {}", done.status);
        report.failures.push(failure);
    }
    saved
}

/// `workers` users' conversations running through nginx in front of the replicas.
struct Load {
    balancer: nginx::Nginx,
    stop: Arc<AtomicBool>,
    completed: Arc<AtomicUsize>,
    running: Vec<tokio::task::JoinHandle<LoadReport>>,
}

impl Load {
    async fn start(cluster: &Replicas, workers: usize) -> Self {
        let balancer = nginx::Nginx::start(free_port(), &cluster.addresses(), false)
            .await
            .expect("nginx starts");
        let stop = Arc::new(AtomicBool::new(false));
        let completed = Arc::new(AtomicUsize::new(0));
        let running = (0..workers)
            .map(|worker| {
                let (url, settings) = (balancer.url(), cluster.settings.clone());
                let sign_in =
                    move |user: &str| Session::signed_in(url.clone(), settings.token(user));
                tokio::spawn(converse_until(
                    worker,
                    sign_in,
                    stop.clone(),
                    completed.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(1)).await;
        Self {
            balancer,
            stop,
            completed,
            running,
        }
    }

    /// Conversations completed so far, by every worker.
    fn completed(&self) -> usize {
        self.completed.load(Ordering::Relaxed)
    }

    /// Lets the load run a second more, stops it, and gathers what the users saw. Fails the
    /// test unless conversations completed in that second: the load must outlast what the test
    /// did to the replicas, or it would show nothing about it.
    async fn finish(mut self) -> LoadReport {
        let before = self.completed();
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.stop.store(true, Ordering::Relaxed);
        let mut report = LoadReport::default();
        for worker in self.running.drain(..) {
            let seen = worker.await.expect("a load worker ran");
            report.conversations += seen.conversations;
            report.requests += seen.requests;
            report.failures.extend(seen.failures);
            report.latencies.extend(seen.latencies);
            report.completed.extend(seen.completed);
            report.users.extend(seen.users);
        }
        self.balancer.stop().await;
        assert!(
            self.completed() > before,
            "the load still ran after the replicas were restarted ({before} conversations \
             completed by then)"
        );
        report
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_behind_nginx_fails_no_request_and_loses_no_write() {
    rolling_restart(shared_redis_url(), "one Redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_on_a_redis_cluster_fails_no_request_and_loses_no_write() {
    let redis = support::redis_cluster::RedisCluster::start();
    rolling_restart(redis.url(), "a six-node Redis Cluster").await;
}

/// Each of 3 replicas on `redis_url` stopped with SIGTERM and started again, under load.
async fn rolling_restart(redis_url: String, redis: &str) {
    let mut cluster = Replicas::start(3, redis_url).await;
    let load = Load::start(&cluster, 8).await;
    for number in 1..=3 {
        let status = cluster.replica(number).terminate().await;
        assert!(
            status.success(),
            "replica {number} exits 0 on SIGTERM: {status}"
        );
        cluster.restart(number).await;
        // nginx skips a replica that refused it for 2 s (`fail_timeout`): as an operator's
        // rolling restart would, wait until it is back in rotation before the next one.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let mut report = load.finish().await;
    let p99 = report.p99();
    println!(
        "rolling restart (SIGTERM) of 3 replicas behind nginx on {redis}: {} conversations, {} \
         requests, {} failed, p99 {p99:.1?}",
        report.conversations,
        report.requests,
        report.failures.len()
    );
    assert!(
        report.failures.is_empty(),
        "no request failed: {:?}",
        report.failures
    );
    for user in &report.users {
        let completed = report.completed.get(user).copied().unwrap_or(0);
        assert_eq!(
            cluster.database.watchlist_rows(user).await,
            completed,
            "{user}: exactly one row per completed conversation"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_killed_behind_nginx_fail_only_calls_in_flight_and_double_nothing() {
    const WORKERS: usize = 8;
    // Each replica is killed once.
    const KILLS: usize = 3;
    let mut cluster = Replicas::start(KILLS, shared_redis_url()).await;
    let load = Load::start(&cluster, WORKERS).await;
    for number in 1..=KILLS {
        cluster.replica(number).kill().await;
        cluster.restart(number).await;
        // nginx skips a replica that refused it for 2 s (`fail_timeout`): as an operator's
        // rolling restart would, wait until it is back in rotation before the next one.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let mut report = load.finish().await;
    let p99 = report.p99();
    println!(
        "rolling kill -9 of 3 replicas behind nginx: {} conversations, {} requests, {} failed, \
         p99 {p99:.1?}",
        report.conversations,
        report.requests,
        report.failures.len()
    );
    for failure in &report.failures {
        println!("  failed: {failure}");
    }
    // Each worker has one request in flight at a time: a kill fails at most one per worker
    // (nginx sends the rest to the live replicas).
    assert!(
        report.failures.len() <= WORKERS * KILLS,
        "{} calls failed, more than were in flight at the {KILLS} kills: {:?}",
        report.failures.len(),
        report.failures
    );
    for user in &report.users {
        let completed = report.completed.get(user).copied().unwrap_or(0);
        let rows = cluster.database.watchlist_rows(user).await;
        // A retry whose answer was lost with its replica may have been saved: never more.
        let failed = report
            .failures
            .iter()
            .filter(|failure| failure.starts_with(&format!("{user}: round 2")))
            .count() as i64;
        assert!(
            rows >= completed && rows <= completed + failed,
            "{user}: {rows} rows for {completed} completed conversations ({failed} failed)"
        );
    }
}

/// deploy/nginx.conf passes the client's `Host` on. Replicas on loopback refuse a `Host` that is
/// not local (DNS rebinding) unless `--allowed-origins` names it: reached under a public name,
/// they answer 403 without it and serve with it, as the README's configuration table says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_loopback_replicas_serve_a_public_name_only_when_it_is_allowed() {
    use support::cluster::SharedSettings;
    const PUBLIC: &str = "movies.example.com";
    let discover = json!({
        "jsonrpc": "2.0", "id": 1, "method": "server/discover",
        "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        }}
    });
    for (allowed, expected) in [(None, 403), (Some(format!("https://{PUBLIC}")), 200)] {
        let mut settings = SharedSettings::new(shared_redis_url());
        if let Some(allowed) = &allowed {
            settings.extra_env = vec![("MOVIEDB_ALLOWED_ORIGINS".into(), allowed.clone())];
        }
        let replicas = Replicas::start_with(1, settings).await;
        let mut balancer = nginx::Nginx::start(free_port(), &replicas.addresses(), false)
            .await
            .expect("nginx starts");
        let answer = reqwest::Client::new()
            .post(balancer.url())
            .header("host", PUBLIC)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "server/discover")
            .json(&discover)
            .send()
            .await
            .expect("nginx answers");
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap_or_default();
        assert_eq!(status, expected, "allowed {allowed:?}: {body}");
        if expected == 403 {
            assert!(
                body.contains("Host movies.example.com is not allowed"),
                "{body}"
            );
        } else {
            assert!(body.contains("\"result\""), "{body}");
        }
        // The replicas' metrics (no token asked) are not served to the public through nginx.
        let metrics = |base: String| {
            let url = base.replace("/mcp", "/metrics");
            async move {
                let answer = reqwest::Client::new().get(&url).send().await;
                answer.expect("metrics answer").status().as_u16()
            }
        };
        let direct = format!("http://{}/mcp", replicas.addresses()[0]);
        assert_eq!(
            (metrics(direct).await, metrics(balancer.url()).await),
            (200, 404),
            "metrics from the replica, then through nginx"
        );
        balancer.stop().await;
    }
}
