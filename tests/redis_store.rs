//! The Redis continuation store with real Redis: any server sharing it resumes a call, a state is
//! used once even across servers, and an outage gives clear errors and heals by itself.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use moviedb_mcp::mrtr::StateSealer;
use serde_json::json;
use support::{ServerOptions, TestServer, accept};

/// The shared Redis of this machine (CI starts it).
fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

async fn replica(keys: &str, redis: String) -> TestServer {
    TestServer::start_with(ServerOptions {
        redis_url: Some(redis),
        state_keys: Some(keys.to_owned()),
        ..ServerOptions::default()
    })
    .await
}

#[tokio::test]
async fn a_call_started_on_one_server_finishes_on_another_and_only_once() {
    let keys = StateSealer::generate_spec("shared");
    let first = replica(&keys, redis_url()).await;
    let second = replica(&keys, redis_url()).await;

    let round1 = first.client().call_tool("greet", json!({})).await;
    assert_eq!(round1.result()["resultType"], "input_required");
    let state = round1.result()["requestState"]
        .as_str()
        .expect("a state")
        .to_owned();

    let answers = json!({"user_name": accept(json!({"name": "Ada"}))});
    let round2 = second
        .client()
        .retry("greet", json!({}), answers.clone(), Some(&state))
        .await;
    assert_eq!(round2.result()["resultType"], "complete");
    assert_eq!(round2.text(), "Hello, Ada!");

    for server in [&first, &second] {
        let replay = server
            .client()
            .retry("greet", json!({}), answers.clone(), Some(&state))
            .await;
        assert_eq!(replay.error_code(), -32602);
        assert!(
            replay.error()["message"]
                .as_str()
                .unwrap_or_default()
                .contains("already been used")
        );
    }
}

#[tokio::test]
async fn the_same_state_sent_to_two_servers_at_once_completes_exactly_once() {
    let keys = StateSealer::generate_spec("shared");
    let first = replica(&keys, redis_url()).await;
    let second = replica(&keys, redis_url()).await;
    for _ in 0..10 {
        let round1 = first.client().call_tool("greet", json!({})).await;
        let state = round1.result()["requestState"]
            .as_str()
            .expect("a state")
            .to_owned();
        let answers = json!({"user_name": accept(json!({"name": "Grace"}))});
        let (a, b) = (first.client(), second.client());
        let (left, right) = tokio::join!(
            a.retry("greet", json!({}), answers.clone(), Some(&state)),
            b.retry("greet", json!({}), answers.clone(), Some(&state)),
        );
        let completed = [&left, &right]
            .iter()
            .filter(|r| r.response().get("result").is_some())
            .count();
        let refused = [&left, &right]
            .iter()
            .filter(|r| r.response().get("error").is_some())
            .count();
        assert_eq!((completed, refused), (1, 1));
    }
}

/// A private redis-server on its own port, so the test can stop and restart it.
struct PrivateRedis {
    port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start_on(port: u16) -> Self {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed");
        let mut redis = Self {
            port,
            child: Some(child),
        };
        redis.wait_until_up();
        redis
    }

    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        Self::start_on(port)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn wait_until_up(&mut self) {
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

#[tokio::test]
async fn a_redis_outage_gives_a_clear_error_and_service_returns_with_redis() {
    let mut redis = PrivateRedis::start();
    let server = TestServer::start_with(ServerOptions {
        redis_url: Some(redis.url()),
        ..ServerOptions::default()
    })
    .await;
    let client = server.client();
    let round1 = client.call_tool("greet", json!({})).await;
    let state = round1.result()["requestState"]
        .as_str()
        .expect("a state")
        .to_owned();

    redis.stop();
    // Bounded by the store's own timeout; the guard only keeps a broken build from hanging CI.
    let during = tokio::time::timeout(
        Duration::from_secs(20),
        client.retry(
            "greet",
            json!({}),
            json!({"user_name": accept(json!({"name": "Lin"}))}),
            Some(&state),
        ),
    )
    .await
    .expect("the server answers during the outage");
    assert_eq!(during.status, 500);
    assert_eq!(during.error_code(), -32603);
    assert!(
        during.error()["message"]
            .as_str()
            .unwrap_or_default()
            .contains("continuation store unavailable")
    );
    let new_call = client.call_tool("greet", json!({})).await;
    assert_eq!(new_call.error_code(), -32603, "asking needs the store too");

    let _restarted = PrivateRedis::start_on(redis.port);
    let mut recovered = None;
    for _ in 0..50 {
        let reply = client.call_tool("greet", json!({})).await;
        if reply.response().get("result").is_some() {
            recovered = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let round1 = recovered.expect("service returns once Redis is back");
    let state = round1.result()["requestState"]
        .as_str()
        .expect("a state")
        .to_owned();
    let done = client
        .retry(
            "greet",
            json!({}),
            json!({"user_name": accept(json!({"name": "Lin"}))}),
            Some(&state),
        )
        .await;
    assert_eq!(done.text(), "Hello, Lin!");
}
