//! The Redis continuation store with real Redis: any server sharing it resumes a call, a state is
//! used once even across servers, and an outage gives clear errors and heals by itself.

mod support;

use std::time::Duration;

use mcp_mrtr::mrtr::StateSealer;
use serde_json::json;
use support::net::shared_redis_url;
use support::redis::{PrivateRedis, SilenceableProxy};
use support::{ServerOptions, TestServer, accept};

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
    let first = replica(&keys, shared_redis_url()).await;
    let second = replica(&keys, shared_redis_url()).await;

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
    let first = replica(&keys, shared_redis_url()).await;
    let second = replica(&keys, shared_redis_url()).await;
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

    redis.kill().await;
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

    redis.restart();
    completes_a_call_once_service_returns(&client, "once Redis is back").await;
}

/// Calls `greet` every 200 ms until it is served (10 s at most), then completes that call:
/// service has returned, `when`.
async fn completes_a_call_once_service_returns(client: &support::Client, when: &str) {
    let mut recovered = None;
    for _ in 0..50 {
        let reply = client.call_tool("greet", json!({})).await;
        if reply.response().get("result").is_some() {
            recovered = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let round1 = recovered.unwrap_or_else(|| panic!("service returns {when}"));
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

/// A Redis connection that falls silent (the server's address moved, a firewall dropped the
/// flow: no reset comes) is opened anew after a call times out on it, so service returns within
/// seconds rather than when the kernel gives up on the socket.
#[tokio::test]
async fn a_redis_connection_fallen_silent_is_opened_anew() {
    let shared: url::Url = shared_redis_url().parse().expect("the shared Redis URL");
    let proxy = SilenceableProxy::start(shared.port().unwrap_or(6379)).await;
    let server = TestServer::start_with(ServerOptions {
        redis_url: Some(format!("redis://127.0.0.1:{}", proxy.port)),
        ..ServerOptions::default()
    })
    .await;
    let client = server.client();
    let before = client.call_tool("greet", json!({})).await;
    assert_eq!(before.result()["resultType"], "input_required");

    proxy.silence();
    let silent = client.call_tool("greet", json!({})).await;
    assert_eq!(silent.error_code(), -32603, "{}", silent.body_text());

    completes_a_call_once_service_returns(&client, "over a new connection within seconds").await;
}

/// Deployments sharing a Redis under the same prefix but kept apart by their database numbers
/// do not hear each other's events: pub/sub knows no databases, so the number is in the channel.
#[tokio::test]
async fn event_relays_on_two_databases_do_not_hear_each_other() {
    let prefix = format!("dbs-{}:", support::net::random_hex(6));
    let relay_on = |db: u8| {
        let mut url: url::Url = shared_redis_url().parse().expect("the shared Redis URL");
        url.set_path(&format!("/{db}"));
        let config = mcp_mrtr::store::RedisStoreConfig {
            url: url.to_string(),
            prefix: prefix.clone(),
            timeout: Duration::from_secs(2),
            cluster: false,
        };
        async move {
            mcp_mrtr::store::RedisEventRelay::connect(&config, "events")
                .await
                .expect("a relay")
        }
    };
    let mut first = relay_on(1).await;
    let mut second = relay_on(2).await;
    assert_ne!(first.channel(), second.channel());
    assert_eq!(
        first.publish(b"Utest://one").await.expect("published"),
        1,
        "only the first deployment's relay hears it"
    );
    let heard = tokio::time::timeout(Duration::from_secs(2), first.next_message()).await;
    assert_eq!(heard.ok().flatten().as_deref(), Some(&b"Utest://one"[..]));
    let overheard = tokio::time::timeout(Duration::from_millis(300), second.next_message()).await;
    assert!(
        overheard.is_err(),
        "the other database's relay heard {overheard:?}"
    );
}

#[tokio::test]
async fn past_its_share_an_owner_loses_only_its_own_oldest_entries_in_redis() {
    use mcp_mrtr::store::{
        ContinuationId, ContinuationStore, Owner, RedisStore, RedisStoreConfig, SessionStore,
    };
    let config = RedisStoreConfig {
        url: shared_redis_url(),
        prefix: format!("mcp-share-test-{}:", support::net::random_hex(6)),
        timeout: Duration::from_secs(1),
        cluster: false,
    };
    let prefix = config.prefix.clone();
    let store = RedisStore::connect(config, 3).await.expect("Redis answers");
    let ttl = Duration::from_secs(60);
    let (flooder, neighbour) = (Owner::new("user:mallory"), Owner::new("address:127.0.0.2"));
    let kept = ContinuationId::random();
    store
        .put(&neighbour, kept, b"kept".to_vec(), ttl)
        .await
        .unwrap();
    let left = support::redis::flood_and_take_back(&store, &flooder, 5).await;
    assert_eq!(
        left,
        [false, false, true, true, true],
        "the flooder keeps its newest 3"
    );
    assert_eq!(
        store.take(&neighbour, kept).await.unwrap(),
        Some(b"kept".to_vec())
    );
    assert!(
        support::redis::parks_taken_back_leave_the_share_free(&store, &flooder, 10).await,
        "what the flooder took back holds no place in its share"
    );

    // Sessions have shares of their own, and a touch keeps a session alive.
    for number in 0..4 {
        let id = format!("session-{number}");
        store
            .write_session(&flooder, &id, b"s".to_vec(), ttl)
            .await
            .unwrap();
    }
    assert_eq!(store.read_session("session-0").await.unwrap(), None);
    assert!(
        store
            .touch_session(&flooder, "session-3", ttl)
            .await
            .unwrap()
    );
    assert!(
        !store
            .touch_session(&flooder, "session-0", ttl)
            .await
            .unwrap()
    );
    support::redis::sessions_change_only_over_what_they_hold(&store, &flooder).await;

    // An index emptied by takes goes at once (the flooder took back all its continuations);
    // the others go on their own, no later than their latest entries.
    store
        .put(&neighbour, ContinuationId::random(), b"left".to_vec(), ttl)
        .await
        .unwrap();
    let client = redis::Client::open(shared_redis_url()).expect("a Redis URL");
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let indexes: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}owner:*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(indexes.len(), 2, "{indexes:?}");
    assert!(
        indexes.iter().any(|index| index.contains(":sessions:"))
            && indexes
                .iter()
                .any(|index| index.contains(":continuations:")),
        "the neighbour's continuations and the flooder's sessions: {indexes:?}"
    );
    for index in indexes {
        let left: i64 = redis::cmd("PTTL")
            .arg(&index)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(left > 0 && left <= 60_000, "{index} expires in {left} ms");
    }

    // Ended sessions free their places, and a session in use is the last to go: in Redis as in
    // the memory store.
    support::redis::sessions_share_counts_what_the_owner_holds(&store).await;
    let in_memory = mcp_mrtr::store::MemoryStore::new(100, 3);
    support::redis::sessions_share_counts_what_the_owner_holds(&in_memory).await;
}

/// A store on the shared Redis under a fresh prefix starting with `stem`, with a share of ten;
/// and the prefix.
async fn store_of_ten(stem: &str) -> (mcp_mrtr::store::RedisStore, String) {
    let prefix = format!("{stem}-{}:", support::net::random_hex(6));
    let config = mcp_mrtr::store::RedisStoreConfig {
        url: shared_redis_url(),
        prefix: prefix.clone(),
        timeout: Duration::from_secs(2),
        cluster: false,
    };
    let store = mcp_mrtr::store::RedisStore::connect(config, 10).await;
    (store.expect("Redis"), prefix)
}

#[tokio::test]
async fn a_continuation_whose_index_entry_cannot_be_written_is_not_left_behind() {
    let (store, prefix) = store_of_ten("mcp-put-half-test").await;
    let on_shared_redis = |arguments: &[&str]| {
        let mut cli = support::redis::redis_cli();
        cli.args(["-u", &shared_redis_url()]).args(arguments);
        let output = support::redis::cli_output(&mut cli);
        assert!(output.status.success(), "redis-cli {arguments:?} failed");
    };
    let index = support::redis::a_put_refused_half_way_leaves_nothing(&store, &prefix, |index| {
        on_shared_redis(&["SET", index, "not an index"])
    })
    .await;
    on_shared_redis(&["DEL", &index]);
}

#[tokio::test]
async fn task_records_change_only_from_the_version_read_and_expire_on_their_own() {
    use mcp_mrtr::store::{Owner, RedisStore, RedisStoreConfig, TaskStore};
    let config = RedisStoreConfig {
        url: shared_redis_url(),
        prefix: format!("mcp-task-store-test-{}:", support::net::random_hex(6)),
        timeout: Duration::from_secs(2),
        cluster: false,
    };
    let first = RedisStore::connect(config.clone(), 10)
        .await
        .expect("Redis");
    let second = RedisStore::connect(config, 10).await.expect("Redis");
    let alice = Owner::new("alice");
    let created = first.create(&alice, "t1", b"created".to_vec(), Duration::from_secs(60));
    assert_eq!(created.await.expect("create"), Ok(()), "Redis has room");
    let read = second
        .read("t1")
        .await
        .expect("read")
        .expect("durable once created");
    assert_eq!((read.version, read.record.as_slice()), (1, &b"created"[..]));

    // Two replicas change the record they both read: exactly one change lands.
    let (a, b) = tokio::join!(
        first.replace("t1", 1, b"from first".to_vec()),
        second.replace("t1", 1, b"from second".to_vec()),
    );
    let (a, b) = (a.expect("replace"), b.expect("replace"));
    assert!(a ^ b, "one of the two changes wins: {a} {b}");
    let now = first.read("t1").await.expect("read").expect("still there");
    assert_eq!(now.version, 2);
    let winner: &[u8] = if a { b"from first" } else { b"from second" };
    assert_eq!(now.record, winner);

    let created = first.create(&alice, "short", b"x".to_vec(), Duration::from_millis(300));
    assert_eq!(created.await.expect("create"), Ok(()), "Redis has room");
    assert!(
        first
            .replace("short", 1, b"y".to_vec())
            .await
            .expect("replace")
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(second.read("short").await.expect("read"), None, "expired");
    assert!(
        !second
            .replace("short", 2, b"z".to_vec())
            .await
            .expect("replace")
    );
    assert_eq!(second.read("absent").await.expect("read"), None);
}

#[tokio::test]
async fn an_owner_at_its_share_of_tasks_gets_no_new_one_and_loses_none_in_redis() {
    use mcp_mrtr::store::{NoRoom, Owner, TaskStore};
    let (store, _) = store_of_ten("mcp-task-share-test").await;
    let (alice, bob) = (Owner::new("alice"), Owner::new("bob"));
    let ttl = Duration::from_secs(60);
    for number in 0..10 {
        let id = format!("a{number}");
        let created = store.create(&alice, &id, b"a".to_vec(), ttl);
        assert_eq!(
            created.await.expect("create"),
            Ok(()),
            "task {number} is within the share"
        );
    }
    let refused = store.create(&alice, "a10", b"a".to_vec(), ttl).await;
    let Ok(Err(NoRoom::Share {
        frees_in: Some(frees_in),
    })) = refused
    else {
        panic!("alice holds her share: {refused:?}");
    };
    assert!(
        frees_in <= ttl && frees_in > ttl - Duration::from_secs(30),
        "told when her first task expires: {frees_in:?}"
    );
    assert_eq!(
        store.read("a10").await.expect("read"),
        None,
        "nothing stored"
    );
    assert!(
        store.read("a0").await.expect("read").is_some(),
        "her oldest is kept"
    );
    let created = store.create(&bob, "b0", b"b".to_vec(), ttl).await;
    assert_eq!(
        created.expect("create"),
        Ok(()),
        "bob has a share of his own"
    );

    // Tasks that expired leave room.
    let short = Duration::from_millis(200);
    let carol = Owner::new("carol");
    for number in 0..10 {
        let id = format!("c{number}");
        let created = store.create(&carol, &id, vec![], short).await;
        assert_eq!(created.expect("create"), Ok(()));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let created = store.create(&carol, "c10", vec![], ttl).await;
    assert_eq!(
        created.expect("create"),
        Ok(()),
        "her expired tasks no longer count"
    );
}

#[tokio::test]
async fn a_task_record_whose_index_entry_cannot_be_written_is_not_left_behind() {
    use mcp_mrtr::store::{Owner, TaskStore};
    let (store, prefix) = store_of_ten("mcp-task-half-test").await;
    let alice = Owner::new("alice");
    let ttl = Duration::from_secs(60);
    let created = store.create(&alice, "first", b"created".to_vec(), ttl);
    assert_eq!(created.await.expect("create"), Ok(()), "Redis has room");

    // Alice's index of tasks turns into a plain string (an operator's mistake, a key clash):
    // Redis now refuses to add to it, a real failure half-way through the creation.
    let client = redis::Client::open(shared_redis_url()).expect("a Redis URL");
    let mut redis = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to Redis");
    let indexes: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}owner:tasks:*"))
        .query_async(&mut redis)
        .await
        .expect("list the owners' indexes");
    assert_eq!(indexes.len(), 1, "one index, alice's: {indexes:?}");
    let () = redis::cmd("SET")
        .arg(&indexes[0])
        .arg("not an index")
        .query_async(&mut redis)
        .await
        .expect("overwrite the index");

    let refused = store.create(&alice, "second", b"half".to_vec(), ttl).await;
    assert!(refused.is_err(), "the creation fails: {refused:?}");
    assert_eq!(
        store.read("second").await.expect("read"),
        None,
        "no record is left for a task nobody was told of"
    );
    let records: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}record:task:*"))
        .query_async(&mut redis)
        .await
        .expect("list the task records");
    assert_eq!(records, [format!("{prefix}record:task:first")]);
    let () = redis::cmd("DEL")
        .arg(&indexes[0])
        .arg(&records[0])
        .query_async(&mut redis)
        .await
        .expect("clean up");
}

#[tokio::test]
async fn a_redis_out_of_memory_has_no_room_for_a_task_and_keeps_nothing_of_it() {
    use mcp_mrtr::store::{NoRoom, Owner, RedisStore, RedisStoreConfig, TaskStore};
    let redis = PrivateRedis::start();
    let config = RedisStoreConfig {
        url: redis.url(),
        prefix: "oom:".into(),
        timeout: Duration::from_secs(2),
        cluster: false,
    };
    let store = RedisStore::connect(config, 10).await.expect("Redis");
    let alice = Owner::new("alice");
    let ttl = Duration::from_secs(60);
    let created = store.create(&alice, "before", b"kept".to_vec(), ttl).await;
    assert_eq!(created.expect("create"), Ok(()), "Redis has room");

    // Redis may use no more memory, and evicts nothing (its default policy).
    let set_maxmemory = |bytes: &str| {
        let mut cli = support::redis::redis_cli();
        cli.args(["-u", &redis.url(), "CONFIG", "SET", "maxmemory", bytes]);
        let output = support::redis::cli_output(&mut cli);
        assert!(output.status.success(), "CONFIG SET maxmemory {bytes}");
    };
    set_maxmemory("1");
    let refused = store.create(&alice, "during", b"lost".to_vec(), ttl).await;
    assert_eq!(
        refused.expect("no room is not a failure"),
        Err(NoRoom::Store { frees_in: None })
    );
    let read = store.read("before").await.expect("reads still work");
    assert_eq!(read.map(|kept| kept.record), Some(b"kept".to_vec()));

    set_maxmemory("0");
    assert_eq!(
        store.read("during").await.expect("read"),
        None,
        "nothing kept"
    );
    // Nor a place in alice's share: nine more fit beside "before".
    for number in 0..9 {
        let id = format!("after{number}");
        let created = store.create(&alice, &id, vec![], ttl).await;
        assert_eq!(created.expect("create"), Ok(()), "task {number} fits");
    }
    let full = store.create(&alice, "one-too-many", vec![], ttl).await;
    assert!(
        matches!(full, Ok(Err(NoRoom::Share { .. }))),
        "then her share is full: {full:?}"
    );
}
