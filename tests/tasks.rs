//! The Tasks extension (`io.modelcontextprotocol/tasks`) end to end, against real processes: the
//! `moviedb-mcp` binary (alone on SQLite, or replicas sharing Redis and PostgreSQL) with a local
//! OpenAI-compatible provider, and, for a task that asks its user a question, replicas of the
//! library's conformance fixture server sharing Redis.
//!
//! `summarizeMovieReviews` becomes a task for a client that takes tasks when the summary needs a
//! provider call; its final result is the tool's usual result.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::{Replicas, SharedSettings, example_binary};
use support::movies::{Backend, Launch, MovieServer, Session, structured};
use support::net::{accepts_connections, free_port, random_hex, shared_redis_url};
use support::openai::{Answer, FakeProvider};
use support::redis::PrivateRedis;
use support::{Client, Reply, checked_client};

const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// A movie with enough reviews for the provider to be asked.
const MOVIE: i64 = 6;
const MODEL: &str = "review-writer-test";
const ANSWER: &str = "SUMMARY: Reviewers adore its heart and its lead performances.\n\
                      THEMES: heart, performances";
/// How long anything asynchronous may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// Capabilities of a client that takes tasks and can show forms.
fn taking_tasks() -> Value {
    json!({"elicitation": {"form": {}}, "extensions": {TASKS_EXTENSION: {}}})
}

fn summarize_args() -> Value {
    json!({"movieId": MOVIE.to_string()})
}

fn provider_args(provider: &FakeProvider) -> Vec<String> {
    [
        "--llm-base-url".to_owned(),
        provider.base_url(),
        "--llm-model".to_owned(),
        MODEL.to_owned(),
        "--llm-api-key".to_owned(),
        "sk-test-0123456789abcdef".to_owned(),
    ]
    .to_vec()
}

async fn movie_server(provider: &FakeProvider, more: &[&str]) -> MovieServer {
    let mut args = provider_args(provider);
    args.extend(more.iter().map(|arg| (*arg).to_owned()));
    MovieServer::start_with(
        Backend::Sqlite,
        Launch {
            args,
            ..Launch::default()
        },
    )
    .await
}

/// Calls summarizeMovieReviews as a client that takes tasks and checks it got a task; returns
/// the `CreateTaskResult`.
async fn summarize_as_task(session: &Session) -> Value {
    let reply = session
        .call_with("summarizeMovieReviews", summarize_args(), taking_tasks())
        .await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
    assert_eq!(
        reply.result_type(),
        "task",
        "an uncached summary is a task for a client that takes tasks: {}",
        reply.body_text()
    );
    reply.result().clone()
}

/// A `tasks/update` or `tasks/cancel` acknowledgement: a complete result with nothing in it but
/// its `_meta`.
fn assert_acknowledged(ack: &Reply) {
    let mut result = ack.result().clone();
    if let Some(object) = result.as_object_mut() {
        object.remove("_meta");
    }
    assert_eq!(
        result,
        json!({"resultType": "complete"}),
        "{}",
        ack.body_text()
    );
}

fn task_id(created: &Value) -> String {
    created["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a CreateTaskResult has a taskId: {created}"))
        .to_owned()
}

async fn task_request(session: &Session, method: &str, params: Value) -> Reply {
    session
        .request(method)
        .params(params)
        .capabilities(taking_tasks())
        .send()
        .await
}

async fn get_task(session: &Session, id: &str) -> Reply {
    task_request(session, "tasks/get", json!({"taskId": id})).await
}

/// Polls with `get` (a `tasks/get`) until `wanted` holds for the task; returns it.
async fn poll_task<Get, Sent>(mut get: Get, wanted: impl Fn(&Value) -> bool) -> Value
where
    Get: FnMut() -> Sent,
    Sent: std::future::Future<Output = Reply>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let reply = get().await;
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
        let task = reply.result().clone();
        if wanted(&task) {
            return task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task did not get there within {PATIENCE:?}; last seen: {task}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `session`'s `tasks/get` until `wanted` holds for task `id`; returns it.
async fn wait_for_task(session: &Session, id: &str, wanted: impl Fn(&Value) -> bool) -> Value {
    poll_task(|| get_task(session, id), wanted).await
}

fn status_is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |task| task["status"] == status
}

/// Checks that `task` failed with -32603, its message saying `why`.
fn assert_failed_saying(task: &Value, why: &str) {
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["error"]["code"], -32603, "{task}");
    assert!(
        task["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(why)),
        "the error says {why:?}: {task}"
    );
}

fn is_terminal(task: &Value) -> bool {
    ["completed", "failed", "cancelled"].contains(&task["status"].as_str().unwrap_or_default())
}

#[tokio::test]
async fn an_uncached_summary_is_a_task_whose_result_is_the_tools_usual_result() {
    let provider = FakeProvider::start(Answer::Text(ANSWER.into())).await;
    let server = movie_server(
        &provider,
        &["--task-ttl-secs", "120", "--task-poll-ms", "250"],
    )
    .await;
    let alice = server.user("alice");

    let created = summarize_as_task(&alice).await;
    assert_eq!(created["ttlMs"], 120_000, "{created}");
    assert_eq!(created["pollIntervalMs"], 250, "{created}");
    let id = task_id(&created);
    let done = wait_for_task(&alice, &id, is_terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
    let summary = &done["result"]["structuredContent"];
    assert_eq!(
        summary["summary"], "Reviewers adore its heart and its lead performances.",
        "the provider's words: {done}"
    );
    assert_eq!(provider.call_count(), 1);

    // The same call now finds the summary cached: it answers at once, with the same result,
    // whether the client takes tasks or not.
    let cached = alice
        .call_with("summarizeMovieReviews", summarize_args(), taking_tasks())
        .await;
    assert_eq!(structured(&cached), summary, "{}", cached.body_text());
    let plain = alice.call("summarizeMovieReviews", summarize_args()).await;
    assert_eq!(structured(&plain), summary);
    assert_eq!(provider.call_count(), 1, "served from the cache");

    // A task stays readable after it ended (until its time-to-live).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let again = get_task(&alice, &id).await;
    assert_eq!(
        again.result()["status"],
        "completed",
        "{}",
        again.body_text()
    );
}

/// Checks that `reply` is the summary itself, answered in its request, not a task.
fn assert_summarized_in_the_request(reply: &Reply) {
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
    assert_eq!(
        reply.result_type(),
        "complete",
        "answered in the request: {}",
        reply.body_text()
    );
    assert_eq!(
        structured(reply)["summary"],
        "Reviewers adore its heart and its lead performances.",
        "the provider's words: {}",
        reply.body_text()
    );
}

#[tokio::test]
async fn a_call_too_large_to_keep_as_a_task_is_answered_in_its_request() {
    let provider = FakeProvider::start(Answer::Text(ANSWER.into())).await;
    let server = movie_server(&provider, &[]).await;
    let ivy = server.user("ivy");
    // A client whose clientInfo alone would make a 100 KB task record in every replica's store.
    let bulky = json!({"name": "bulky-client", "version": "1.0.0", "title": "x".repeat(100_000)});
    let answered = ivy
        .request("tools/call")
        .params(json!({"name": "summarizeMovieReviews", "arguments": summarize_args()}))
        .capabilities(taking_tasks())
        .meta("io.modelcontextprotocol/clientInfo", bulky)
        .send()
        .await;
    assert_summarized_in_the_request(&answered);
    assert_eq!(provider.call_count(), 1);
}

#[tokio::test]
async fn when_the_task_store_is_full_a_call_is_answered_in_its_request_and_no_task_is_lost() {
    let provider = FakeProvider::start(Answer::Text(ANSWER.into())).await;
    // Room for one task (the in-memory store's capacity is the continuations').
    let server = movie_server(&provider, &["--continuation-capacity", "1"]).await;
    let (alice, bob) = (server.user("alice"), server.user("bob"));
    let kept = task_id(&summarize_as_task(&alice).await);
    wait_for_task(&alice, &kept, is_terminal).await;

    // Another movie's summary, by another user: no room for its task, so it runs in the request,
    // reporting each step once (the tool ran up to its task point before it was run again).
    let answered = bob
        .request("tools/call")
        .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": "5"}}))
        .capabilities(taking_tasks())
        .progress_token(json!("bobs-summary"))
        .send()
        .await;
    assert_summarized_in_the_request(&answered);
    let progress: Vec<Value> = answered
        .notifications()
        .into_iter()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| n["params"]["progress"].clone())
        .collect();
    assert_eq!(
        progress,
        [json!(0.0), json!(0.4), json!(1.0)],
        "progress only increases: {}",
        answered.body_text()
    );
    assert_eq!(provider.call_count(), 2, "both summaries were written");
    let done = get_task(&alice, &kept).await;
    assert_eq!(
        done.result()["status"],
        "completed",
        "the task kept before is still there: {}",
        done.body_text()
    );
}

#[tokio::test]
async fn a_replica_holding_as_many_tasks_as_it_may_answers_the_next_call_in_its_request() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    // One task runs at once; four are held in all, running or waiting.
    let server = movie_server(&provider, &["--task-max-running", "1"]).await;
    let alice = server.user("alice");
    let summarize = |movie: i64| {
        alice
            .request("tools/call")
            .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": movie.to_string()}}))
            .capabilities(taking_tasks())
            .send()
    };
    let mut held = Vec::new();
    for movie in [4, 5, 6, 7] {
        let created = summarize(movie).await;
        assert_eq!(created.result_type(), "task", "{}", created.body_text());
        held.push(task_id(created.result()));
    }
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "one task runs, three wait"
    );

    // The fifth goes on in its request, and is answered once the provider answers.
    let release_once_asked = async {
        assert!(
            provider.wait_until(PATIENCE, |p| p.call_count() == 2).await,
            "the fifth call asks the provider itself"
        );
        provider.release();
    };
    let (answered, ()) = tokio::join!(summarize(9), release_once_asked);
    assert_summarized_in_the_request(&answered);
    for id in &held {
        let done = wait_for_task(&alice, id, is_terminal).await;
        assert_eq!(done["status"], "completed", "{done}");
    }
}

#[tokio::test]
async fn a_client_without_the_extension_gets_no_task_and_cannot_use_the_task_methods() {
    let provider = FakeProvider::start(Answer::Text(ANSWER.into())).await;
    let server = movie_server(&provider, &[]).await;
    let alice = server.user("alice");

    let reply = alice.call("summarizeMovieReviews", summarize_args()).await;
    let summary = structured(&reply);
    assert_eq!(
        summary["summary"],
        "Reviewers adore its heart and its lead performances."
    );
    assert_eq!(provider.call_count(), 1, "answered within the request");

    for (method, params) in [
        ("tasks/get", json!({"taskId": "0".repeat(32)})),
        (
            "tasks/update",
            json!({"taskId": "0".repeat(32), "inputResponses": {}}),
        ),
        ("tasks/cancel", json!({"taskId": "0".repeat(32)})),
    ] {
        let refused = alice.request(method).params(params).send().await;
        assert_eq!(
            refused.error_code(),
            -32021,
            "{method}: {}",
            refused.body_text()
        );
        assert_eq!(
            refused.error()["data"]["requiredCapabilities"]["extensions"][TASKS_EXTENSION],
            json!({}),
            "{method} names the extension it needs: {}",
            refused.body_text()
        );
    }
}

#[tokio::test]
async fn another_users_task_cannot_be_read_answered_or_cancelled() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let server = movie_server(&provider, &[]).await;
    let (alice, mallory) = (server.user("alice"), server.user("mallory"));
    let id = task_id(&summarize_as_task(&alice).await);

    let unknown = get_task(&mallory, &"0".repeat(32)).await;
    unknown.assert_error(200, -32602);
    for (method, params) in [
        ("tasks/get", json!({"taskId": id})),
        ("tasks/update", json!({"taskId": id, "inputResponses": {}})),
        ("tasks/cancel", json!({"taskId": id})),
    ] {
        let refused = task_request(&mallory, method, params).await;
        assert_eq!(
            refused.error_code(),
            -32602,
            "{method}: {}",
            refused.body_text()
        );
        assert_eq!(
            refused.error_message(),
            unknown.error_message(),
            "{method} on another user's task answers exactly as for an unknown one"
        );
    }

    let still = get_task(&alice, &id).await;
    assert_eq!(still.result()["status"], "working", "{}", still.body_text());
    provider.release();
    let done = wait_for_task(&alice, &id, is_terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test]
async fn cancelling_a_summary_task_drops_its_provider_request() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let server = movie_server(&provider, &[]).await;
    let alice = server.user("alice");
    let id = task_id(&summarize_as_task(&alice).await);
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "the task asks the provider"
    );

    let ack = task_request(&alice, "tasks/cancel", json!({"taskId": id})).await;
    assert_acknowledged(&ack);
    assert!(
        provider.wait_until(PATIENCE, |p| p.hang_ups() == 1).await,
        "the provider sees its caller hang up"
    );
    let task = get_task(&alice, &id).await.result().clone();
    assert_eq!(task["status"], "cancelled", "{task}");
    assert!(task.get("result").is_none(), "{task}");

    // Cancelling again is acknowledged the same way and changes nothing.
    let again = task_request(&alice, "tasks/cancel", json!({"taskId": id})).await;
    assert_acknowledged(&again);
    assert_eq!(get_task(&alice, &id).await.result()["status"], "cancelled");
}

#[tokio::test]
async fn a_task_is_gone_once_its_time_to_live_has_passed() {
    let provider = FakeProvider::start(Answer::Text(ANSWER.into())).await;
    let server = movie_server(&provider, &["--task-ttl-secs", "2"]).await;
    let alice = server.user("alice");
    let created = summarize_as_task(&alice).await;
    assert_eq!(created["ttlMs"], 2_000);
    let id = task_id(&created);
    wait_for_task(&alice, &id, status_is("completed")).await;

    tokio::time::sleep(Duration::from_millis(2_500)).await;
    get_task(&alice, &id).await.assert_error(200, -32602);
}

// ---------------------------------------------------------------------------------------------
// Replicas
// ---------------------------------------------------------------------------------------------

/// Replicas of `moviedb-mcp` sharing Redis and PostgreSQL, all pointed at `provider`, with
/// `lease` as the task lease.
async fn replicas(count: usize, provider: &FakeProvider, lease: Duration) -> Replicas {
    replicas_with(count, provider, lease, &[]).await
}

/// [`replicas`] with more environment settings.
async fn replicas_with(
    count: usize,
    provider: &FakeProvider,
    lease: Duration,
    more_env: &[(&str, &str)],
) -> Replicas {
    let mut settings = SharedSettings::new(shared_redis_url());
    settings.extra_env = vec![
        ("MOVIEDB_LLM_BASE_URL".into(), provider.base_url()),
        ("MOVIEDB_LLM_MODEL".into(), MODEL.into()),
        (
            "MOVIEDB_LLM_API_KEY".into(),
            "sk-test-0123456789abcdef".into(),
        ),
        (
            "MOVIEDB_TASK_LEASE_MS".into(),
            lease.as_millis().to_string(),
        ),
    ];
    settings.extra_env.extend(
        more_env
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned())),
    );
    Replicas::start_with(count, settings).await
}

#[tokio::test]
async fn a_task_created_on_one_replica_is_read_and_cancelled_on_another() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let replicas = replicas(2, &provider, Duration::from_secs(15)).await;
    let (on_a, on_b) = (replicas.session(1, "alice"), replicas.session(2, "alice"));

    let id = task_id(&summarize_as_task(&on_a).await);
    let seen = get_task(&on_b, &id).await;
    assert_eq!(seen.result()["status"], "working", "{}", seen.body_text());
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "replica A asks the provider"
    );

    let ack = task_request(&on_b, "tasks/cancel", json!({"taskId": id})).await;
    assert_eq!(
        ack.result()["resultType"],
        "complete",
        "{}",
        ack.body_text()
    );
    assert!(
        provider.wait_until(PATIENCE, |p| p.hang_ups() == 1).await,
        "the cancel sent to B stops A's provider request"
    );
    assert_eq!(get_task(&on_a, &id).await.result()["status"], "cancelled");
    assert_eq!(get_task(&on_b, &id).await.result()["status"], "cancelled");
}

#[tokio::test]
async fn a_task_whose_replica_dies_is_reported_failed_as_lost_not_left_working() {
    let lease = Duration::from_millis(1_500);
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let mut replicas = replicas(2, &provider, lease).await;
    let on_b = replicas.session(2, "alice");
    let id = task_id(&summarize_as_task(&replicas.session(1, "alice")).await);
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "replica A works on it"
    );

    replicas.replica(1).kill().await;
    // Seen on B once the lease lapses (the wait gives up long before the task's time to live
    // would end it): never `working` forever.
    let failed = wait_for_task(&on_b, &id, is_terminal).await;
    assert_failed_saying(&failed, "lost");
}

#[tokio::test]
async fn a_replica_shutting_down_lets_its_task_finish_and_another_replica_gives_the_result() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let mut replicas = replicas(2, &provider, Duration::from_secs(15)).await;
    let on_b = replicas.session(2, "alice");
    let id = task_id(&summarize_as_task(&replicas.session(1, "alice")).await);
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "replica A works on it"
    );

    // Stopped while its task waits for the provider, which answers once A says it waits.
    replicas.replica(1).stop();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let log = replicas.replica(1).log();
        if log.contains("letting the tasks running here finish") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica A says it waits for its task: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    provider.release();
    let exit = replicas.replica(1).exited().await;
    assert!(exit.success(), "replica A stops cleanly: {exit}");

    // Finished before A exited: B reads the result at once.
    let done = get_task(&on_b, &id).await;
    let done = done.result();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["summary"],
        "Reviewers adore its heart and its lead performances.",
        "{done}"
    );
}

#[tokio::test]
async fn a_task_still_running_when_its_replica_stops_is_reported_failed_saying_why() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    // A lease far longer than the test: only the shutdown can end the task in time.
    let lease = Duration::from_secs(120);
    let grace = [("MOVIEDB_SHUTDOWN_GRACE_SECS", "1")];
    let mut replicas = replicas_with(2, &provider, lease, &grace).await;
    let on_b = replicas.session(2, "alice");
    let id = task_id(&summarize_as_task(&replicas.session(1, "alice")).await);
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "replica A works on it"
    );

    // A listener on replica B, which reads the task again only every lease (two minutes here),
    // hears of the failure from A before A exits.
    let (mut followed, _) = follow_tasks(&on_b, &[&id]).await;
    let exit = replicas.replica(1).terminate().await;
    assert!(exit.success(), "replica A stops cleanly: {exit}");
    let heard = notification_of(&mut followed, "failed").await;
    assert_eq!(heard["taskId"], id, "{heard}");
    let failed = get_task(&on_b, &id).await;
    assert_failed_saying(failed.result(), "shut down before the task finished");
    assert!(
        provider.wait_until(PATIENCE, |p| p.hang_ups() == 1).await,
        "the stopped task's provider request was dropped"
    );
}

/// The library's conformance fixture server (examples/conformance_server), on Redis or alone.
struct Fixture {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Fixture {
    /// A fixture replica sharing Redis under `redis_prefix`.
    fn on_redis(redis_prefix: &str, state_keys: &str, port: u16, log: PathBuf) -> Self {
        let store = [
            "--redis-url",
            &shared_redis_url(),
            "--redis-prefix",
            redis_prefix,
        ];
        Self::start(&store, state_keys, port, log)
    }

    /// A fixture replica on its own started with `args` (in memory unless they name a store),
    /// and its log.
    fn single(args: &[&str]) -> (Self, PathBuf) {
        let (keys, log) = keys_and_log();
        (Self::start(args, &keys, free_port(), log.clone()), log)
    }

    /// A fixture started with `args` (where it keeps continuations and tasks, how many it runs).
    fn start(args: &[&str], state_keys: &str, port: u16, log: PathBuf) -> Self {
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the fixture's log");
        let child = Command::new(example_binary("conformance_server"))
            .env("MCP_STATE_KEYS", state_keys)
            .env_remove("REDIS_URL")
            .args([
                "--bind",
                &SocketAddr::from((Ipv4Addr::LOCALHOST, port)).to_string(),
            ])
            .args(args)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("clone the log handle"))
            .stderr(output)
            .spawn()
            .expect("start the conformance fixture server");
        let fixture = Self { child, port, log };
        let deadline = std::time::Instant::now() + PATIENCE;
        while !accepts_connections(port) {
            assert!(
                std::time::Instant::now() < deadline,
                "the fixture did not serve; its log:\n{}",
                std::fs::read_to_string(&fixture.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        fixture
    }

    fn client(&self) -> Client {
        checked_client(format!("http://127.0.0.1:{}/mcp", self.port))
    }
}

/// New state keys for fixtures, and a new log file for them.
fn keys_and_log() -> (String, PathBuf) {
    let keys = moviedb_mcp::mrtr::StateSealer::generate_spec("tasks");
    let log = std::env::temp_dir().join(format!("moviedb-tasks-fixture-{}.log", random_hex(6)));
    (keys, log)
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn fixture_task_request(client: &Client, method: &str, params: Value) -> Reply {
    client
        .request(method)
        .params(params)
        .capabilities(taking_tasks())
        .send()
        .await
}

#[tokio::test]
async fn a_task_waiting_for_its_user_is_answered_on_another_replica_after_its_creator_restarted() {
    let prefix = format!("moviedb-tasks-test-{}:", random_hex(6));
    let (keys, log) = keys_and_log();
    let port_a = free_port();
    let mut replica_a = Fixture::on_redis(&prefix, &keys, port_a, log.clone());
    let replica_b = Fixture::on_redis(&prefix, &keys, free_port(), log.clone());

    let created = fixture_task_request(
        &replica_a.client(),
        "tools/call",
        json!({"name": "confirm_delete", "arguments": {"filename": "notes.txt"}}),
    )
    .await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let id = task_id(created.result());

    // The question is visible on B; A holds nothing for it while it waits.
    let on_b = replica_b.client();
    let get_on_b = || fixture_task_request(&on_b, "tasks/get", json!({"taskId": id}));
    let question = poll_task(get_on_b, status_is("input_required")).await;
    let keys_asked: Vec<&String> = question["inputRequests"]
        .as_object()
        .expect("inputRequests is a map")
        .keys()
        .collect();
    assert_eq!(keys_asked.len(), 1, "{question}");
    let key = keys_asked[0].clone();
    assert_eq!(
        question["inputRequests"][&key]["method"],
        "elicitation/create"
    );

    // A goes away and comes back; the answer goes to B, which resumes the task.
    let _ = replica_a.child.kill();
    let _ = replica_a.child.wait();
    replica_a = Fixture::on_redis(&prefix, &keys, port_a, log.clone());
    let ack = fixture_task_request(
        &replica_b.client(),
        "tasks/update",
        json!({"taskId": id, "inputResponses": {key: {"action": "accept", "content": {"confirm": true}}}}),
    )
    .await;
    assert_acknowledged(&ack);

    let on_a = replica_a.client();
    let get_on_a = || fixture_task_request(&on_a, "tasks/get", json!({"taskId": id}));
    let done = poll_task(get_on_a, is_terminal).await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Deleted notes.txt",
        "{done}"
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn an_answer_that_does_not_fit_brought_by_the_request_that_became_a_task_is_asked_again() {
    let (fixture, log) = Fixture::single(&[]);
    let client = fixture.client();
    // The question comes in a round of the request, to a client that does not take tasks yet.
    let call = json!({"name": "confirm_delete", "arguments": {"filename": "plan.txt"}});
    let asked = client
        .request("tools/call")
        .params(call.clone())
        .capabilities(json!({"elicitation": {"form": {}}}))
        .send()
        .await;
    assert_eq!(
        asked.result_type(),
        "input_required",
        "{}",
        asked.body_text()
    );
    let key = asked
        .input_requests()
        .keys()
        .next()
        .cloned()
        .expect("a question");

    // Its retry takes tasks, and its answer does not fit: the tool reaches its task point
    // before it reads the answer, so the call becomes a task, which asks the question again.
    let mut retry = call;
    retry["requestState"] = json!(asked.request_state());
    retry["inputResponses"] = json!({&key: {"action": "accept", "content": "yes"}});
    let created = fixture_task_request(&client, "tools/call", retry).await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let id = task_id(created.result());
    let get = || fixture_task_request(&client, "tasks/get", json!({"taskId": id}));
    let question = poll_task(get, |task| task["status"] != "working").await;
    assert_eq!(question["status"], "input_required", "{question}");
    assert_eq!(
        question["inputRequests"][&key]["method"], "elicitation/create",
        "{question}"
    );

    // An answer whose value does not fit the form is refused, and nothing of it recorded.
    let misfit = fixture_task_request(
        &client,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {&key: {"action": "accept", "content": {"confirm": "yes"}}}}),
    )
    .await;
    assert_eq!(misfit.error_code(), -32602, "{}", misfit.body_text());
    assert!(
        misfit.body_text().contains("confirm must be true or false"),
        "{}",
        misfit.body_text()
    );
    let still = fixture_task_request(&client, "tasks/get", json!({"taskId": id})).await;
    assert_eq!(
        still.result()["status"],
        "input_required",
        "{}",
        still.body_text()
    );

    let ack = fixture_task_request(
        &client,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {&key: {"action": "accept", "content": {"confirm": true}}}}),
    )
    .await;
    assert_acknowledged(&ack);
    let done = poll_task(get, is_terminal).await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Deleted plan.txt",
        "{done}"
    );
    let _ = std::fs::remove_file(&log);
}

/// The retry of a call of the fixture's `test_tool_with_task` (which asks its user's name, then
/// can only go on as a task), answered with `name`.
async fn answered_greeting(client: &Client, name: &str) -> Value {
    let call = json!({"name": "test_tool_with_task", "arguments": {}});
    let asked = fixture_task_request(client, "tools/call", call.clone()).await;
    assert_eq!(
        asked.result_type(),
        "input_required",
        "{}",
        asked.body_text()
    );
    let mut retry = call;
    retry["requestState"] = json!(asked.request_state());
    retry["inputResponses"] = json!({"user_name": {"action": "accept", "content": {"name": name}}});
    retry
}

#[tokio::test]
async fn work_that_needs_a_task_when_none_can_be_kept_is_refused_and_its_state_still_works() {
    let (fixture, log) = Fixture::single(&[]);
    let client = fixture.client();

    // A tool that asks its user first, then can only go on as a task.
    let retry = answered_greeting(&client, "Ada").await;
    // A client whose clientInfo alone would make a 100 KB task record: none is kept for it.
    let bulky = json!({"name": "bulky-client", "version": "1.0.0", "title": "x".repeat(100_000)});
    for attempt in ["the retry", "the same retry again"] {
        let refused = client
            .request("tools/call")
            .params(retry.clone())
            .capabilities(taking_tasks())
            .meta("io.modelcontextprotocol/clientInfo", bulky.clone())
            .send()
            .await;
        refused.assert_error(500, -32603);
        assert_eq!(
            refused.error_message(),
            "No task can be kept for this call: it is too large to keep as a task",
            "{attempt}"
        );
    }
    // The same retry from a client whose task fits.
    let created = fixture_task_request(&client, "tools/call", retry).await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let id = task_id(created.result());
    let get = || fixture_task_request(&client, "tasks/get", json!({"taskId": id}));
    let done = poll_task(get, is_terminal).await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Hello, Ada! Your task is done.",
        "{done}"
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_caller_at_its_share_of_tasks_is_answered_in_its_request_or_told_when_room_comes() {
    let (fixture, log) = Fixture::single(&["--share-per-caller", "1"]);
    let client = fixture.client();
    let call = json!({"name": "slow_compute", "arguments": {"seconds": 120, "label": "long"}});
    let created = fixture_task_request(&client, "tools/call", call).await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let long = task_id(created.result());

    // A call that may become a task is answered in its request instead.
    let call = json!({"name": "slow_compute", "arguments": {"seconds": 1, "label": "short"}});
    let answered = fixture_task_request(&client, "tools/call", call).await;
    assert_eq!(
        answered.result_type(),
        "complete",
        "{}",
        answered.body_text()
    );
    assert_eq!(
        answered.result()["content"][0]["text"],
        "Computed short in 1s"
    );

    // Work that can only run as a task is refused, and told when the caller's task expires
    // (an hour after its creation).
    let call = json!({"name": "failing_job", "arguments": {}});
    let refused = fixture_task_request(&client, "tools/call", call).await;
    refused.assert_error(429, -32603);
    assert_eq!(
        refused.error_message(),
        "No task can be kept for this call now (the caller holds its share of tasks): call \
         again later"
    );
    let retry_after: u64 = refused
        .header("retry-after")
        .and_then(|seconds| seconds.parse().ok())
        .expect("a Retry-After in seconds");
    assert!(
        (3_300..=3_600).contains(&retry_after),
        "room comes when the first task expires: {retry_after} s"
    );

    // The task the caller holds was kept.
    let get = fixture_task_request(&client, "tasks/get", json!({"taskId": long})).await;
    assert_eq!(get.result()["status"], "working", "{}", get.body_text());
    let cancelled = fixture_task_request(&client, "tasks/cancel", json!({"taskId": long})).await;
    assert_acknowledged(&cancelled);
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn work_that_needs_a_task_when_the_server_has_no_room_now_is_told_to_call_again() {
    // One task runs at once, four are held: four slow computations take every place.
    let (fixture, log) = Fixture::single(&["--task-max-running", "1"]);
    let client = fixture.client();
    let mut slow = Vec::new();
    for label in ["a", "b", "c", "d"] {
        let call = json!({"name": "slow_compute", "arguments": {"seconds": 120, "label": label}});
        let created = fixture_task_request(&client, "tools/call", call).await;
        assert_eq!(created.result_type(), "task", "{}", created.body_text());
        slow.push(task_id(created.result()));
    }

    let retry = answered_greeting(&client, "Grace").await;
    let refused = fixture_task_request(&client, "tools/call", retry.clone()).await;
    refused.assert_error(503, -32603);
    assert_eq!(
        refused.error_message(),
        "No task can be kept for this call now (this server holds as many tasks as it may): \
         call again later"
    );
    assert_eq!(
        refused.header("retry-after"),
        Some("1"),
        "the client is told when to call again"
    );

    // Once a place is free (the cancelled task's worker has stopped), the same retry becomes a
    // task, and it finishes once the other computations, which have the running slot before
    // it, are cancelled too.
    let cancel = |id: String| fixture_task_request(&client, "tasks/cancel", json!({"taskId": id}));
    assert_acknowledged(&cancel(slow[0].clone()).await);
    let deadline = std::time::Instant::now() + PATIENCE;
    let created = loop {
        let reply = fixture_task_request(&client, "tools/call", retry.clone()).await;
        if reply.result_type() == "task" || std::time::Instant::now() > deadline {
            break reply;
        }
        reply.assert_error(503, -32603);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let id = task_id(created.result());
    for id in &slow[1..] {
        assert_acknowledged(&cancel(id.clone()).await);
    }
    let get = || fixture_task_request(&client, "tasks/get", json!({"taskId": id}));
    let done = poll_task(get, is_terminal).await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Hello, Grace! Your task is done.",
        "{done}"
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_task_running_through_a_redis_outage_finishes_once_redis_is_back() {
    let mut redis = PrivateRedis::start();
    let url = redis.url();
    let (fixture, log) = Fixture::single(&["--redis-url", &url, "--redis-prefix", "outage:"]);
    let client = fixture.client();
    let call = json!({"name": "slow_compute", "arguments": {"seconds": 8, "label": "through"}});
    let created = fixture_task_request(&client, "tools/call", call).await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let id = task_id(created.result());

    // Redis is gone past a renewal of the task's lease (every 5 s): the renewal fails, and the
    // task goes on.
    redis.kill().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    redis.restart();
    let get = || fixture_task_request(&client, "tasks/get", json!({"taskId": id}));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while get().await.status.as_u16() != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the fixture did not reach Redis again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = poll_task(get, is_terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"], "Computed through in 8s",
        "{done}"
    );
    let _ = std::fs::remove_file(&log);
}

/// A `subscriptions/listen` stream of `session` following `task_ids`, its acknowledgement read.
async fn follow_tasks(session: &Session, task_ids: &[&str]) -> (support::EventStream, Value) {
    let mut stream = session
        .request("subscriptions/listen")
        .params(json!({"notifications": {"taskIds": task_ids}}))
        .capabilities(taking_tasks())
        .open_stream()
        .await;
    let ack = stream.expect_message(PATIENCE).await;
    (stream, ack)
}

/// The next `notifications/tasks` on `stream`.
async fn next_task_notification(stream: &mut support::EventStream) -> Value {
    loop {
        let message = stream.expect_message(PATIENCE).await;
        if message["method"] == "notifications/tasks" {
            return message["params"].clone();
        }
    }
}

/// The first `notifications/tasks` on `stream` that shows the task in `status`.
async fn notification_of(stream: &mut support::EventStream, status: &str) -> Value {
    loop {
        let task = next_task_notification(stream).await;
        if task["status"] == status {
            return task;
        }
    }
}

#[tokio::test]
async fn a_listener_on_another_replica_hears_its_tasks_change_and_nobody_else_does() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let replicas = replicas(2, &provider, Duration::from_secs(15)).await;
    let on_a = replicas.session(1, "alice");
    let first = task_id(&summarize_as_task(&on_a).await);

    let on_b = replicas.session(2, "alice");
    let (mut alices, ack) = follow_tasks(&on_b, &[&first, "no-such-task", &first]).await;
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([first]),
        "the acknowledgement names the tasks followed, each once, and no unknown one: {ack}"
    );
    let (mut mallorys, mallorys_ack) =
        follow_tasks(&replicas.session(2, "mallory"), &[&first]).await;
    assert!(
        mallorys_ack["params"]["notifications"]
            .get("taskIds")
            .is_none(),
        "another user's task is not followed: {mallorys_ack}"
    );

    let now = next_task_notification(&mut alices).await;
    assert_eq!(
        now["status"], "working",
        "first, the task as it stands: {now}"
    );
    provider.release();
    let done = notification_of(&mut alices, "completed").await;
    assert_eq!(done["taskId"], json!(first), "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["summary"],
        "Reviewers adore its heart and its lead performances.",
        "the notification carries the task as tasks/get shows it: {done}"
    );
    assert!(done.get("resultType").is_none(), "{done}");

    // A listener that comes late hears how the task stands at once.
    let (mut late, _) = follow_tasks(&on_a, &[&first]).await;
    let now = next_task_notification(&mut late).await;
    assert_eq!(now["status"], "completed", "{now}");

    // Another user following the same id hears nothing of it.
    let mut heard = Vec::new();
    while let Some(message) = mallorys.next_message(Duration::from_secs(1)).await {
        heard.push(message);
    }
    assert!(
        heard.iter().all(|m| m["method"] != "notifications/tasks"),
        "mallory heard alice's task: {heard:?}"
    );

    // A listener must take part in the extension to follow tasks.
    let refused = on_b
        .request("subscriptions/listen")
        .params(json!({"notifications": {"taskIds": [first]}}))
        .send()
        .await;
    assert_eq!(refused.error_code(), -32021, "{}", refused.body_text());
}

#[cfg(feature = "legacy")]
#[tokio::test]
async fn a_legacy_session_gets_no_tasks_whatever_it_declares() {
    use support::legacy::LegacyClient;
    let provider = FakeProvider::start(Answer::Text(ANSWER.into())).await;
    let server = movie_server(&provider, &[]).await;
    let declaring = json!({"extensions": {TASKS_EXTENSION: {}}});
    // The handshake offers no extension to a 2025-11-25 session.
    let hello = LegacyClient::new(server.url().to_owned(), None)
        .send_raw(
            "initialize",
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": declaring,
                "clientInfo": {"name": "t", "version": "1"}}}),
            false,
        )
        .await;
    let offered = &hello.result()["capabilities"];
    assert!(offered.get("tools").is_some(), "{offered}");
    assert!(offered.get("extensions").is_none(), "{offered}");
    let session = LegacyClient::new(server.url().to_owned(), None)
        .initialize(declaring)
        .await;

    let reply = session
        .request(
            "tools/call",
            json!({"name": "summarizeMovieReviews", "arguments": summarize_args()}),
        )
        .await;
    let result = reply.result();
    assert!(result.get("taskId").is_none(), "no task: {result}");
    assert_eq!(
        result["structuredContent"]["summary"],
        "Reviewers adore its heart and its lead performances.",
        "the summary, within the call: {result}"
    );
    let refused = session
        .request("tasks/get", json!({"taskId": "0".repeat(32)}))
        .await;
    assert_eq!(refused.error_code(), Some(-32601), "{:?}", refused.messages);
}

#[tokio::test]
async fn an_answer_that_does_not_fit_its_question_is_refused_and_the_task_waits_for_a_good_one() {
    let prefix = format!("moviedb-tasks-test-{}:", random_hex(6));
    let (keys, log) = keys_and_log();
    let fixture = Fixture::on_redis(&prefix, &keys, free_port(), log.clone());
    let client = fixture.client();
    let created = fixture_task_request(
        &client,
        "tools/call",
        json!({"name": "confirm_delete", "arguments": {"filename": "draft.txt"}}),
    )
    .await;
    let id = task_id(created.result());
    let get = || fixture_task_request(&client, "tasks/get", json!({"taskId": id}));
    let question = poll_task(get, status_is("input_required")).await;
    let key = question["inputRequests"]
        .as_object()
        .and_then(|asked| asked.keys().next().cloned())
        .expect("a question");

    let misspelt = fixture_task_request(
        &client,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {&key: {"action": "acept"}}}),
    )
    .await;
    assert_eq!(misspelt.error_code(), -32602, "{}", misspelt.body_text());
    assert!(
        misspelt.error_message().contains(&key),
        "names the answer: {}",
        misspelt.body_text()
    );
    let still = get().await.result().clone();
    assert_eq!(
        still["status"], "input_required",
        "nothing was recorded: {still}"
    );
    assert_eq!(still["inputRequests"], question["inputRequests"]);

    let without = fixture_task_request(&client, "tasks/update", json!({"taskId": id})).await;
    assert_eq!(without.error_code(), -32602, "inputResponses is required");

    // An answer that fits its question but would make the task's record over 256 KiB.
    let bulky =
        json!({"action": "accept", "content": {"confirm": true, "note": "x".repeat(300_000)}});
    let refused = fixture_task_request(
        &client,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {&key: bulky}}),
    )
    .await;
    assert_eq!(refused.error_code(), -32602, "{}", refused.body_text());
    assert!(
        refused.error_message().contains("256 KiB"),
        "{}",
        refused.body_text()
    );
    assert_eq!(
        get().await.result()["status"],
        "input_required",
        "nothing was recorded"
    );

    let ack = fixture_task_request(
        &client,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {&key: {"action": "decline"}}}),
    )
    .await;
    assert_eq!(
        ack.result()["resultType"],
        "complete",
        "{}",
        ack.body_text()
    );
    let done = poll_task(get, is_terminal).await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Kept draft.txt",
        "{done}"
    );
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn a_listener_hears_that_a_dead_replicas_task_failed_without_polling() {
    let provider = FakeProvider::start(Answer::Held(ANSWER.into())).await;
    let mut replicas = replicas(2, &provider, Duration::from_millis(1_500)).await;
    let id = task_id(&summarize_as_task(&replicas.session(1, "alice")).await);
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "replica A works on it"
    );
    let (mut stream, _) = follow_tasks(&replicas.session(2, "alice"), &[&id]).await;
    assert_eq!(
        next_task_notification(&mut stream).await["status"],
        "working"
    );

    replicas.replica(1).kill().await;
    let failed = notification_of(&mut stream, "failed").await;
    assert_eq!(failed["error"]["code"], -32603, "{failed}");
}
