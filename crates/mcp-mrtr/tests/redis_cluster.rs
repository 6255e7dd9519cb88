//! The stores on a real Redis Cluster (six `redis-server` processes, three masters with a replica
//! each): calls resume across servers, a state is used once, shares hold, messages reach every
//! replica, and a master's death costs at most the continuations it had not replicated yet, which
//! are answered with the clear "start over" error, never run twice. And a single URL naming a
//! cluster node (of that cluster, or of a one-node cluster) is served as the cluster.

mod support;

use std::time::Duration;

use mcp_mrtr::mrtr::StateSealer;
use mcp_mrtr::store::{Owner, RedisEventRelay, RedisStore, RedisStoreConfig};
use serde_json::json;
use support::redis_cluster::RedisCluster;
use support::{ServerOptions, TestServer, accept};

async fn server_on(cluster: &RedisCluster, keys: &str) -> TestServer {
    TestServer::start_with(ServerOptions {
        redis_url: Some(cluster.url()),
        state_keys: Some(keys.to_owned()),
        ..ServerOptions::default()
    })
    .await
}

fn config_of(cluster: &RedisCluster) -> RedisStoreConfig {
    RedisStoreConfig {
        url: cluster.url(),
        prefix: format!("mcp-cluster-test-{}:", support::net::random_hex(6)),
        timeout: Duration::from_secs(2),
        cluster: true,
    }
}

/// Two replicas' ends of the `events` channel.
async fn two_relays(config: &RedisStoreConfig) -> Vec<RedisEventRelay> {
    let mut relays = Vec::new();
    for _ in 0..2 {
        let relay = RedisEventRelay::connect(config, "events").await;
        relays.push(relay.expect("subscribed"));
    }
    relays
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_calls_resume_anywhere_once_and_shares_and_messages_hold() {
    let cluster = RedisCluster::start();
    let keys = StateSealer::generate_spec("cluster");
    let (first, second) = (
        server_on(&cluster, &keys).await,
        server_on(&cluster, &keys).await,
    );

    // Conversations spread over every master's slots, each answered on the other server.
    for _ in 0..20 {
        converse_across(&first, &second).await;
    }

    // An owner past its share loses its own oldest entries, whatever node they live on.
    only_the_oldest_go_past_the_share(config_of(&cluster)).await;

    // An entry written on one node whose index entry Redis refuses on another is not left behind.
    let config = config_of(&cluster);
    let store = RedisStore::connect(config.clone(), 3).await.expect("Redis");
    let node = cluster.one_url();
    support::redis::a_put_refused_half_way_leaves_nothing(&store, &config.prefix, |index| {
        let mut cli = support::redis::redis_cli();
        cli.args(["-c", "-u", &node, "SET", index, "not an index"]);
        assert!(support::redis::cli_output(&mut cli).status.success());
    })
    .await;

    // The URL of one node, not said to be a cluster, reaches every master's slots all the same.
    let one_node = RedisStoreConfig {
        url: cluster.one_url(),
        cluster: false,
        ..config_of(&cluster)
    };
    only_the_oldest_go_past_the_share(one_node).await;

    // A message published through one relay reaches every relay.
    relays_reach_each_other(&config_of(&cluster), &cluster).await;
}

/// A single URL naming a node of a Redis Cluster is served as the cluster, without being told: on
/// a node that serves every slot, the single-server script (which names an entry and its owner's
/// index, two slots) would be refused with CROSSSLOT and every call that parks would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_url_naming_a_cluster_node_is_served_as_the_cluster() {
    let cluster = RedisCluster::one_node();
    let config = RedisStoreConfig {
        cluster: false,
        ..config_of(&cluster)
    };
    assert!(
        !config.is_cluster(),
        "one URL, and not said to be a cluster"
    );

    only_the_oldest_go_past_the_share(config.clone()).await;

    // A user whose ACL refuses `INFO` (managed services often refuse `@dangerous`) too.
    let without_info = RedisStoreConfig {
        url: cluster.one_url_as("no-info", "-info"),
        ..config.clone()
    };
    only_the_oldest_go_past_the_share(without_info).await;

    let keys = StateSealer::generate_spec("one-node");
    let (first, second) = (
        server_on(&cluster, &keys).await,
        server_on(&cluster, &keys).await,
    );
    for _ in 0..5 {
        converse_across(&first, &second).await;
    }
    relays_reach_each_other(&config, &cluster).await;
}

/// An owner with a share of 3 that parks 6 continuations through a store on `config` finds only
/// its 3 latest when it takes them back, whatever node they live on; parking and taking back 10
/// more one at a time costs it none it left waiting. Its sessions change only over what they
/// hold, and its share of them counts only those it holds, the one idle the longest going first.
async fn only_the_oldest_go_past_the_share(config: RedisStoreConfig) {
    let store = RedisStore::connect(config, 3).await.expect("Redis answers");
    let owner = Owner::new("user:mallory");
    let left = support::redis::flood_and_take_back(&store, &owner, 6).await;
    assert_eq!(left, [false, false, false, true, true, true]);
    assert!(
        support::redis::parks_taken_back_leave_the_share_free(&store, &owner, 10).await,
        "what the owner took back holds no place in its share"
    );
    support::redis::sessions_change_only_over_what_they_hold(&store, &owner).await;
    support::redis::sessions_share_counts_what_the_owner_holds(&store).await;
}

/// A conversation started on `first` and answered on `second`; its state cannot be used again.
async fn converse_across(first: &TestServer, second: &TestServer) {
    let answers = json!({"user_name": accept(json!({"name": "Ada"}))});
    let round1 = first.client().call_tool("greet", json!({})).await;
    let state = round1.request_state();
    let round2 = second
        .client()
        .retry("greet", json!({}), answers.clone(), Some(&state))
        .await;
    assert_eq!(round2.text(), "Hello, Ada!");
    let replay = first
        .client()
        .retry("greet", json!({}), answers, Some(&state))
        .await;
    assert_eq!(replay.error_code(), -32602, "a state is used once");
}

/// A message published through one of two relays reaches both, over sharded pub/sub.
async fn relays_reach_each_other(config: &RedisStoreConfig, cluster: &RedisCluster) {
    let mut relays = two_relays(config).await;
    let channel = relays[0].channel().to_owned();
    assert!(
        cluster.shard_channels(&channel).contains(&channel),
        "the relays subscribe to {channel} on its slot's shard"
    );
    let heard = relays[0].publish(b"changed").await.expect("published");
    assert_eq!(heard, 2, "both relays hear it");
    for relay in &mut relays {
        let message = tokio::time::timeout(Duration::from_secs(5), relay.next_message()).await;
        assert_eq!(message.ok().flatten().as_deref(), Some(&b"changed"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_dying_mid_conversation_costs_a_clear_start_over_never_a_double_run() {
    let mut cluster = RedisCluster::start();
    let keys = StateSealer::generate_spec("failover");
    let (first, second) = (
        server_on(&cluster, &keys).await,
        server_on(&cluster, &keys).await,
    );
    let mut states = Vec::new();
    for _ in 0..30 {
        states.push(
            first
                .client()
                .call_tool("greet", json!({}))
                .await
                .request_state(),
        );
    }
    let config = config_of(&cluster);
    let mut relays = two_relays(&config).await;
    // The master of the relays' channel dies: they must subscribe again on its successor.
    let victim = cluster.master_of(&format!("{}events", config.prefix));
    cluster.kill_master(victim);

    let answers = json!({"user_name": accept(json!({"name": "Grace"}))});
    let (mut completed, mut start_over, mut unavailable) = (0, 0, 0);
    for state in &states {
        // While the servers learn the new topology a call may fail with -32603 (the store is
        // unavailable; nothing was taken), and the client sends it again, as on any 5xx.
        let mut reply = second
            .client()
            .retry("greet", json!({}), answers.clone(), Some(state))
            .await;
        for _ in 0..40 {
            if reply.response().get("error").is_none() || reply.error_code() != -32603 {
                break;
            }
            unavailable += 1;
            tokio::time::sleep(Duration::from_millis(250)).await;
            reply = second
                .client()
                .retry("greet", json!({}), answers.clone(), Some(state))
                .await;
        }
        if reply.response().get("result").is_some() {
            assert_eq!(reply.text(), "Hello, Grace!");
            completed += 1;
            let replay = first
                .client()
                .retry("greet", json!({}), answers.clone(), Some(state))
                .await;
            assert_eq!(replay.error_code(), -32602, "never run twice");
        } else {
            assert_eq!(reply.error_code(), -32602, "{}", reply.body_text());
            let message = reply.error()["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(message.contains("start over"), "{message}");
            start_over += 1;
        }
    }
    println!(
        "master on port {victim} killed: {completed} of 30 parked conversations completed on the \
         promoted replica, {start_over} were told to start over; {unavailable} answers of \
         -32603 (store unavailable) while the servers learned the new topology"
    );
    // Messages flow again once the relays have subscribed on the promoted replica.
    let restored = tokio::time::Instant::now();
    for relay in 0..2 {
        loop {
            assert!(
                restored.elapsed() < Duration::from_secs(45),
                "relay {relay} never heard a message after the failover"
            );
            let _ = relays[0].publish(b"after-failover").await;
            let heard =
                tokio::time::timeout(Duration::from_millis(500), relays[relay].next_message());
            if let Ok(Some(message)) = heard.await
                && message == b"after-failover"
            {
                break;
            }
        }
    }
    println!(
        "the relays heard messages again {:.1?} after the failover",
        restored.elapsed()
    );

    // The service goes on: a new conversation completes across servers.
    let round1 = first.client().call_tool("greet", json!({})).await;
    let round2 = second
        .client()
        .retry("greet", json!({}), answers, Some(&round1.request_state()))
        .await;
    assert_eq!(round2.text(), "Hello, Grace!");
}
