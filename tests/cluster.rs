//! Replicas behave as one server. Three processes of the real `moviedb-mcp` binary share the
//! machine's Redis (a private redis-server where a test crashes Redis) and a fresh PostgreSQL
//! database; tests address them one by one, or go through the cluster launcher's balancer
//! (`examples/cluster`, built by `cargo build --examples`). Change events are tested with two
//! in-process servers sharing Redis, since only the test tools can trigger a change.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::{Launcher, Replicas, SharedSettings};
use support::net::shared_redis_url;
use support::redis::PrivateRedis;
use support::{EventStream, Reply, ServerOptions, TestServer, accept};

/// The question addToWatchlist asks when no status is given, word for word.
const STATUS_QUESTION: &str = "Have you already watched this title, or is it one to watch later?";
/// Bounds the wait for a change notification, so a lost event fails the test instead of hanging it.
const EVENT_WAIT: Duration = Duration::from_secs(10);

fn add_movie(movie_id: i64) -> Value {
    json!({"subject": {"movieId": movie_id.to_string()}})
}

fn status_answer(status: &str) -> Value {
    json!({"status": accept(json!({"status": status}))})
}

/// Checks that round one asks the status question; returns its `requestState`.
fn asks_for_status(reply: &Reply) -> String {
    assert_eq!(
        reply.result_type(),
        "input_required",
        "expected the status question: {}",
        reply.body_text()
    );
    assert_eq!(
        reply.input_requests()["status"]["params"]["message"],
        STATUS_QUESTION,
        "{}",
        reply.body_text()
    );
    reply.request_state()
}

/// The item a finished addToWatchlist saved.
fn saved_item(reply: &Reply) -> &Value {
    assert_eq!(
        reply.result_type(),
        "complete",
        "expected a finished call: {}",
        reply.body_text()
    );
    assert_ne!(
        reply.result()["isError"],
        true,
        "expected the item to be saved: {}",
        reply.body_text()
    );
    &reply.result()["structuredContent"]
}

/// The movies on a watch list.
fn movie_ids(items: &[Value]) -> BTreeSet<i64> {
    items
        .iter()
        .map(|item| {
            assert_eq!(item["content"]["type"], "movie", "{item}");
            support::movies::id_of(&item["content"]["id"])
        })
        .collect()
}

/// Asserts the error of a request that needed Redis while it was down.
fn assert_store_unavailable(reply: &Reply) {
    assert_eq!(reply.status.as_u16(), 500, "{}", reply.body_text());
    assert_eq!(reply.error_code(), -32603, "{}", reply.body_text());
    assert!(
        reply
            .error_message()
            .contains("continuation store unavailable"),
        "the message says the continuation store is unavailable: {}",
        reply.body_text()
    );
}

/// Asserts the refusal of a `requestState` whose continuation was already taken.
fn assert_already_used(reply: &Reply) {
    assert_eq!(reply.error_code(), -32602, "{}", reply.body_text());
    assert!(
        reply.error_message().contains("already been used"),
        "the message says the state was used: {}",
        reply.body_text()
    );
}

#[tokio::test]
async fn each_round_of_a_call_and_the_read_back_can_land_on_a_different_replica() {
    rounds_land_anywhere(shared_redis_url()).await;
}

#[tokio::test]
async fn on_a_redis_cluster_each_round_can_land_on_a_different_replica() {
    let redis = support::redis_cluster::RedisCluster::start();
    rounds_land_anywhere(redis.url()).await;
}

/// Replicas reach a Redis that speaks only TLS (`rediss://`), verifying its certificate against
/// the authorities they trust (the system's, or those in `SSL_CERT_FILE`): with its authority's
/// file they resume each other's calls through it; without, a replica refuses to start and says
/// why.
#[tokio::test]
async fn over_tls_each_round_can_land_on_a_different_replica_and_an_unknown_authority_is_refused() {
    let redis = support::tls_redis::TlsRedis::start();
    let mut settings = trusting(&redis);
    rounds_land_anywhere_with(settings.clone()).await;

    settings.extra_env.clear();
    let refusal = support::cluster::failed_start(&settings);
    assert!(refusal.contains("cannot reach Redis"), "{refusal}");
    assert!(refusal.contains("UnknownIssuer"), "{refusal}");
    assert!(refusal.contains("SSL_CERT_FILE"), "{refusal}");
}

/// A Redis Cluster over TLS, named by one `rediss://` URL: the replicas find it is a cluster
/// through the TLS connection and follow its slot map over TLS (a cluster refuses the
/// single-server put, whose keys span slots, so rounds that resume prove the cluster path).
#[tokio::test]
async fn over_tls_a_redis_cluster_lets_each_round_land_on_a_different_replica() {
    let redis = support::tls_redis::TlsRedis::one_node_cluster();
    let mut replicas = rounds_land_anywhere_with(trusting(&redis)).await;
    for number in 1..=3 {
        let log = replicas.replica(number).log();
        assert!(
            log.contains("the Redis URL names a node of a Redis Cluster"),
            "replica {number} did not find the cluster: {log}"
        );
    }
}

/// A Redis that accepts connections but never answers (a hung server, a wrong port behind a
/// proxy) stops a replica's start with the reason once the time limits of connecting run out,
/// rather than leaving it hanging.
#[test]
fn a_redis_that_accepts_but_never_answers_stops_the_start_with_the_reason() {
    let address = hold_silent_port();
    let mut settings = SharedSettings::new(format!("redis://{address}"));
    settings.extra_env = vec![("MOVIEDB_REDIS_TIMEOUT_MS".into(), "300".into())];
    let refusal = support::cluster::failed_start(&settings);
    assert!(refusal.contains("cannot reach Redis"), "{refusal}");
    assert!(refusal.contains("timed out"), "{refusal}");
}

/// The same on the way to a Redis Cluster: nodes that accept connections and never answer stop
/// the start with the reason once discovering the cluster runs out of time.
#[test]
fn redis_cluster_nodes_that_accept_but_never_answer_stop_the_start_with_the_reason() {
    let nodes: Vec<String> = (0..2)
        .map(|_| format!("redis://{}", hold_silent_port()))
        .collect();
    let mut settings = SharedSettings::new(nodes.join(","));
    settings.extra_env = vec![("MOVIEDB_REDIS_TIMEOUT_MS".into(), "300".into())];
    let refusal = support::cluster::failed_start(&settings);
    assert!(refusal.contains("cannot reach Redis"), "{refusal}");
    assert!(refusal.contains("timed out"), "{refusal}");
}

/// The address of a port that accepts every connection and holds it open, answering nothing,
/// for as long as the test binary runs (a Redis behind a broken proxy, say).
fn hold_silent_port() -> std::net::SocketAddr {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a silent port");
    let address = silent.local_addr().expect("the silent port's address");
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().flatten() {
            held.push(stream);
        }
    });
    address
}

/// Settings for replicas on `redis` that trust its certificate authority (and only it).
fn trusting(redis: &support::tls_redis::TlsRedis) -> SharedSettings {
    let mut settings = SharedSettings::new(redis.url());
    let authority = redis.authority().display().to_string();
    settings.extra_env = vec![("SSL_CERT_FILE".into(), authority)];
    settings
}

/// Round one on replica 1, the answer on replica 2, the list read on replica 3, all sharing
/// the Redis at `redis_url`.
async fn rounds_land_anywhere(redis_url: String) {
    rounds_land_anywhere_with(SharedSettings::new(redis_url)).await;
}

/// [`rounds_land_anywhere`], the replicas sharing `settings`; returns them, still running.
async fn rounds_land_anywhere_with(settings: SharedSettings) -> Replicas {
    let cluster = Replicas::start_with(3, settings).await;
    let godfather = add_movie(6);

    let round_one = cluster
        .session(1, "alice")
        .call("addToWatchlist", godfather.clone())
        .await;
    let state = asks_for_status(&round_one);

    let done = cluster
        .session(2, "alice")
        .retry(
            "addToWatchlist",
            godfather,
            status_answer("WATCHED"),
            &state,
        )
        .await;
    let item = saved_item(&done);
    assert_eq!(item["status"], "WATCHED", "{item}");
    assert_eq!(item["content"]["title"], "The Godfather", "{item}");

    let list = cluster.session(3, "alice").watchlist().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["id"], item["id"], "{list:?}");
    assert_eq!(list[0]["status"], "WATCHED", "{list:?}");
    assert_eq!(list[0]["content"]["title"], "The Godfather", "{list:?}");
    cluster
}

#[tokio::test]
async fn the_same_state_sent_to_two_replicas_at_once_completes_exactly_once() {
    let cluster = Replicas::start(3, shared_redis_url()).await;
    let (first, second, third) = (
        cluster.session(1, "dana"),
        cluster.session(2, "dana"),
        cluster.session(3, "dana"),
    );
    let movies = [10, 11, 12, 13, 14];
    for movie in movies {
        let state = asks_for_status(&first.call("addToWatchlist", add_movie(movie)).await);
        let answer = status_answer("WATCHED");
        let (left, right) = tokio::join!(
            second.retry("addToWatchlist", add_movie(movie), answer.clone(), &state),
            third.retry("addToWatchlist", add_movie(movie), answer.clone(), &state),
        );
        let (winner, loser) = if left.response().get("result").is_some() {
            (left, right)
        } else {
            (right, left)
        };
        assert_eq!(saved_item(&winner)["status"], "WATCHED");
        assert_already_used(&loser);
    }

    let list = first.watchlist().await;
    assert_eq!(list.len(), movies.len(), "one item per movie: {list:?}");
    let titles: BTreeSet<&str> = list
        .iter()
        .filter_map(|item| item["content"]["title"].as_str())
        .collect();
    assert_eq!(titles.len(), movies.len(), "no title twice: {list:?}");
    assert_eq!(
        cluster.database.watchlist_rows("dana").await,
        movies.len() as i64,
        "exactly one row per call in PostgreSQL"
    );
}

#[tokio::test]
async fn a_replica_killed_between_rounds_is_skipped_and_another_finishes_the_call() {
    let launcher = Launcher::start(3).await;
    let erin = launcher.session("erin");
    let godfather = add_movie(6);

    let round_one = erin.call("addToWatchlist", godfather.clone()).await;
    let state = asks_for_status(&round_one);
    let asked_by = launcher.served_by(&round_one);
    launcher.kill_replica(asked_by).await;

    let done = erin
        .retry(
            "addToWatchlist",
            godfather,
            status_answer("WATCHED"),
            &state,
        )
        .await;
    assert_ne!(
        launcher.served_by(&done),
        asked_by,
        "a dead replica served nothing"
    );
    let item = saved_item(&done).clone();
    assert_eq!(item["status"], "WATCHED", "{item}");

    for _ in 0..4 {
        let reply = erin.call("getWatchlist", json!({})).await;
        assert_ne!(
            launcher.served_by(&reply),
            asked_by,
            "a dead replica served nothing"
        );
        let items = &reply.result()["structuredContent"]["items"];
        assert_eq!(
            items[0]["id"], item["id"],
            "the saved item is listed: {items}"
        );
        assert_eq!(items[0]["status"], "WATCHED", "{items}");
        assert_eq!(items.as_array().map(Vec::len), Some(1), "{items}");
    }
}

#[tokio::test]
async fn the_balancer_sends_each_request_to_the_next_replica_and_stops_them_with_it() {
    let mut launcher = Launcher::start(3).await;
    let frank = launcher.session("frank");
    let mut served = Vec::new();
    for _ in 0..6 {
        let reply = frank.call("getWatchlist", json!({})).await;
        assert_eq!(reply.result_type(), "complete", "{}", reply.body_text());
        served.push(launcher.served_by(&reply));
    }
    let first_turn: BTreeSet<usize> = served[..3].iter().copied().collect();
    assert_eq!(
        first_turn,
        BTreeSet::from([1, 2, 3]),
        "three requests in a row, three replicas: {served:?}"
    );
    assert_eq!(
        served[..3],
        served[3..],
        "the same rotation again: {served:?}"
    );

    let ports: Vec<u16> = launcher.replicas.iter().map(|r| r.port).collect();
    launcher.stop();
    for port in ports {
        support::net::wait_until_closed(port, "a replica of the stopped launcher").await;
    }
}

#[tokio::test]
async fn a_redis_crash_fails_requests_clearly_then_service_returns_without_lost_or_doubled_writes()
{
    let mut redis = PrivateRedis::start();
    let cluster = Replicas::start(3, redis.url()).await;
    let session = |replica: usize| cluster.session(replica, "gus");
    let mut movies = 20_i64..;
    let mut next_movie = || movies.next().expect("an endless range");
    let mut completed = BTreeSet::new();

    // Before: two calls, each answered on another replica than the one that asked.
    for replica in 1..=2 {
        let movie = next_movie();
        let state = asks_for_status(
            &session(replica)
                .call("addToWatchlist", add_movie(movie))
                .await,
        );
        let done = session(replica + 1)
            .retry(
                "addToWatchlist",
                add_movie(movie),
                status_answer("WATCHED"),
                &state,
            )
            .await;
        saved_item(&done);
        completed.insert(movie);
    }
    // Three calls asked, not yet answered, when Redis crashes.
    let mut waiting = Vec::new();
    for replica in 1..=3 {
        let movie = next_movie();
        let state = asks_for_status(
            &session(replica)
                .call("addToWatchlist", add_movie(movie))
                .await,
        );
        waiting.push((replica, movie, state));
    }

    redis.kill().await;
    for (replica, movie, state) in &waiting {
        let answered_on = replica % 3 + 1;
        let reply = session(answered_on)
            .retry(
                "addToWatchlist",
                add_movie(*movie),
                status_answer("WATCHED"),
                state,
            )
            .await;
        assert_store_unavailable(&reply);
    }
    for replica in 1..=3 {
        let reply = session(replica)
            .call("addToWatchlist", add_movie(next_movie()))
            .await;
        assert_store_unavailable(&reply);
    }
    let list = session(1).watchlist().await;
    assert_eq!(
        movie_ids(&list),
        completed,
        "reads that need no Redis still work, and nothing was half written"
    );

    redis.restart();
    // Full service returns on every replica by itself: a new call asks again.
    let mut recovered = Vec::new();
    for replica in 1..=3 {
        let movie = next_movie();
        let mut attempts = 0;
        let state = loop {
            let reply = session(replica)
                .call("addToWatchlist", add_movie(movie))
                .await;
            if reply.response().get("result").is_some() {
                break asks_for_status(&reply);
            }
            assert_store_unavailable(&reply);
            attempts += 1;
            assert!(attempts < 100, "replica {replica} never recovered");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        recovered.push((replica, movie, state));
    }
    // The calls that were waiting when Redis crashed finish (Redis kept their continuations, and
    // the failed retries took nothing), and so do the new ones.
    for (replica, movie, state) in waiting.iter().chain(&recovered) {
        let answered_on = (replica + 1) % 3 + 1;
        let done = session(answered_on)
            .retry(
                "addToWatchlist",
                add_movie(*movie),
                status_answer("WATCHED"),
                state,
            )
            .await;
        assert_eq!(saved_item(&done)["status"], "WATCHED");
        completed.insert(*movie);
    }
    // A finished call cannot run twice, on any replica.
    let (_, movie, state) = &waiting[0];
    for replica in 1..=3 {
        let replay = session(replica)
            .retry(
                "addToWatchlist",
                add_movie(*movie),
                status_answer("WATCHED"),
                state,
            )
            .await;
        assert_already_used(&replay);
    }

    let list = session(2).watchlist().await;
    assert_eq!(list.len(), completed.len(), "{list:?}");
    assert_eq!(movie_ids(&list), completed, "every completed call, once");
    assert_eq!(
        cluster.database.watchlist_rows("gus").await,
        completed.len() as i64,
        "as many rows in PostgreSQL as calls that completed"
    );
}

// ---------------------------------------------------------------------------------------------
// Change events between replicas (in-process servers, which have trigger tools)
// ---------------------------------------------------------------------------------------------

async fn server_on(redis_url: String) -> TestServer {
    TestServer::start_with(ServerOptions {
        redis_url: Some(redis_url),
        ..ServerOptions::default()
    })
    .await
}

/// A `subscriptions/listen` stream for tool and prompt list changes, past its acknowledgement.
async fn listen(server: &TestServer) -> EventStream {
    let mut stream = server
        .client()
        .request("subscriptions/listen")
        .params(json!({"notifications": {"toolsListChanged": true, "promptsListChanged": true}}))
        .open_stream()
        .await;
    let ack = stream.expect_message(EVENT_WAIT).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    stream
}

async fn trigger(server: &TestServer, tool: &str) {
    let reply = server.client().call_tool(tool, json!({})).await;
    assert_eq!(reply.result_type(), "complete", "{}", reply.body_text());
}

#[tokio::test]
async fn a_change_made_through_one_server_reaches_listeners_on_every_server_exactly_once() {
    changes_reach_every_listener_once(shared_redis_url()).await;
}

#[tokio::test]
async fn on_a_redis_cluster_a_change_reaches_listeners_on_every_server_exactly_once() {
    let redis = support::redis_cluster::RedisCluster::start();
    changes_reach_every_listener_once(redis.url()).await;
}

/// A change made through one server, heard once by the listeners of both, over `redis_url`.
async fn changes_reach_every_listener_once(redis_url: String) {
    let first = server_on(redis_url.clone()).await;
    let second = server_on(redis_url).await;
    let mut listeners = [listen(&first).await, listen(&second).await];

    // Alternating kinds: a duplicate would show up where the next kind is expected.
    let changes = [
        (
            &second,
            "trigger_tools_changed",
            "notifications/tools/list_changed",
        ),
        (
            &first,
            "trigger_prompts_changed",
            "notifications/prompts/list_changed",
        ),
        (
            &second,
            "trigger_tools_changed",
            "notifications/tools/list_changed",
        ),
        (
            &first,
            "trigger_prompts_changed",
            "notifications/prompts/list_changed",
        ),
    ];
    for (server, tool, expected) in changes {
        trigger(server, tool).await;
        for (index, listener) in listeners.iter_mut().enumerate() {
            let note = listener.expect_message(EVENT_WAIT).await;
            assert_eq!(
                note["method"], expected,
                "listener {index} after {tool}: {note}"
            );
        }
    }
    // The alternation shows a change heard twice, but for the last: nothing more may come.
    for (index, listener) in listeners.iter_mut().enumerate() {
        let extra = listener.next_message(Duration::from_millis(500)).await;
        assert!(extra.is_none(), "listener {index} heard more: {extra:?}");
    }
}

#[tokio::test]
async fn while_redis_is_down_changes_reach_local_listeners_and_relaying_resumes_after() {
    let mut redis = PrivateRedis::start();
    let first = server_on(redis.url()).await;
    let second = server_on(redis.url()).await;
    let mut listener = listen(&first).await;

    redis.kill().await;
    trigger(&first, "trigger_tools_changed").await;
    let note = listener.expect_message(EVENT_WAIT).await;
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");

    redis.restart();
    let mut attempts = 0;
    loop {
        trigger(&second, "trigger_prompts_changed").await;
        if let Some(note) = listener.next_message(Duration::from_millis(500)).await {
            assert_eq!(
                note["method"], "notifications/prompts/list_changed",
                "{note}"
            );
            break;
        }
        attempts += 1;
        assert!(
            attempts < 60,
            "changes never crossed servers again after Redis returned"
        );
    }
}

/// Replicas started together on an empty database race to migrate and seed it; every one of them
/// must come up, and the catalogue must be there exactly once.
#[tokio::test]
async fn replicas_starting_together_seed_the_catalogue_once() {
    let replicas = Replicas::start(3, shared_redis_url()).await;
    // Every seeded table, each row once: movies alone could not show a double seeding (their
    // ids are given), reviews could (theirs are numbered by the database).
    let seeds = [
        ("movies", include_str!("../src/moviedb/seed/movies.tsv")),
        ("tv_shows", include_str!("../src/moviedb/seed/tv_shows.tsv")),
        ("reviews", include_str!("../src/moviedb/seed/reviews.tsv")),
    ];
    for (table, seed) in seeds {
        let seeded = seed
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .count();
        assert_eq!(
            replicas.database.rows_in(table).await,
            seeded as i64,
            "{table}: each seeded row once"
        );
    }
    for number in 1..=3 {
        let recommended = replicas
            .session(number, "eve")
            .call(
                "recommendMoviesForMood",
                json!({"input": {"mood": "COMFORT"}}),
            )
            .await;
        assert_eq!(
            recommended.result_type(),
            "complete",
            "replica {number} serves"
        );
    }
}

/// Whether process `pid` still runs (a zombie waiting to be reaped does not).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_owned();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn a_test_that_fails_leaves_no_replica_running() {
    let (pids_tx, pids) = tokio::sync::oneshot::channel();
    let failing = tokio::spawn(async move {
        let launcher = Launcher::start(2).await;
        let mut pids: Vec<u32> = launcher.replicas.iter().map(|r| r.pid).collect();
        pids.push(launcher.pid());
        let _ = pids_tx.send(pids);
        panic!("this test fails on purpose while its cluster runs");
    });
    let outcome = failing.await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_panic()),
        "the task panicked"
    );
    let pids = pids.await.expect("the cluster started");
    assert_eq!(pids.len(), 3, "two replicas and the launcher: {pids:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|pid| runs(*pid)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running after the failed test: {:?}",
            pids.iter().filter(|pid| runs(**pid)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("after the failed test: launcher and replicas {pids:?} are all gone");
}
