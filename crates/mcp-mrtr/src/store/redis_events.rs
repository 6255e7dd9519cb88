//! Messages between replicas over Redis pub/sub (sharded pub/sub on a Redis Cluster, see
//! [`redis_sharded`](super::redis_sharded)). Every replica publishes on a channel,
//! `<prefix><topic>`, and subscribes to it: change events (`events`), so a `subscriptions/listen`
//! stream on one replica hears about a change made through another, and legacy clients' answers
//! (`answers`), so an answer POSTed to one replica reaches the call waiting on another. A
//! [`RelayPublisher`] can also claim a name once among all replicas (a marker key
//! `<channel>:<name>`, set only if absent), so that one message is published by one replica.
//!
//! The subscription lives in a background task that checks the connection now and then and
//! subscribes again after a failure. Pub/sub keeps nothing: an event published while a replica was
//! disconnected does not reach that replica's listeners.

use std::time::Duration;

use futures::StreamExt;
use redis::aio::{ConnectionLike as _, PubSub};
use tokio::sync::mpsc;

use super::StoreError;
use super::redis_connection::{RedisConnection, RedisStoreConfig, bounded, connect, query};

/// How often an idle subscription is checked with a PING.
const HEALTH_CHECK_EVERY: Duration = Duration::from_secs(5);
/// First and longest wait between attempts to subscribe again.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(2);
/// Messages received but not yet handed on; more wait in Redis's client buffer.
const INCOMING_BUFFER: usize = 256;

/// A replica's end of the event channel: publishes, and yields every message any replica
/// published (its own included). Dropping it ends the subscription.
pub struct RedisEventRelay {
    publisher: RelayPublisher,
    incoming: mpsc::Receiver<Vec<u8>>,
}

/// The publishing side of a [`RedisEventRelay`], for a task of its own.
#[derive(Clone)]
pub struct RelayPublisher {
    connection: RedisConnection,
    /// On a Redis Cluster: sharded pub/sub (`SPUBLISH`).
    sharded: bool,
    channel: String,
    timeout: Duration,
}

impl RedisEventRelay {
    /// Connects and subscribes to `topic`, failing at once if Redis cannot be reached now.
    pub async fn connect(config: &RedisStoreConfig, topic: &str) -> Result<Self, StoreError> {
        let connected = connect(config).await?;
        // Pub/sub ignores database numbers: deployments kept apart only by theirs would hear
        // each other, so a database other than 0 is part of the channel's name.
        let channel = match connected.connection.get_db() {
            0 => format!("{}{topic}", config.prefix),
            db => format!("{}db{db}:{topic}", config.prefix),
        };
        let (deliver, incoming) = mpsc::channel(INCOMING_BUFFER);
        let sharded = connected.is_cluster();
        if sharded {
            super::redis_sharded::relay(config, &channel, deliver).await?;
        } else {
            let (subscription, node) =
                subscribe_any(&connected.nodes, 0, &channel, config.timeout).await?;
            let subscriber = Subscriber {
                nodes: connected.nodes,
                node,
                channel: channel.clone(),
                timeout: config.timeout,
                deliver,
            };
            tokio::spawn(subscriber.run(subscription));
        }
        Ok(Self {
            publisher: RelayPublisher {
                connection: connected.connection,
                sharded,
                channel,
                timeout: config.timeout,
            },
            incoming,
        })
    }

    /// The channel every replica publishes on.
    pub fn channel(&self) -> &str {
        &self.publisher.channel
    }

    /// Publishes `payload`; returns how many subscribers (replicas, this one included) got it.
    pub async fn publish(&self, payload: &[u8]) -> Result<u64, StoreError> {
        self.publisher.publish(payload).await
    }

    /// A publisher on the same channel, for a task of its own.
    pub fn publisher(&self) -> RelayPublisher {
        self.publisher.clone()
    }

    /// The next message published by any replica; `None` only once the subscription has ended.
    pub async fn next_message(&mut self) -> Option<Vec<u8>> {
        self.incoming.recv().await
    }
}

impl RelayPublisher {
    /// Publishes `payload`; returns how many subscribers (replicas, this one included) got it.
    pub async fn publish(&self, payload: &[u8]) -> Result<u64, StoreError> {
        let verb = if self.sharded { "SPUBLISH" } else { "PUBLISH" };
        let command = redis::cmd(verb).arg(&self.channel).arg(payload).clone();
        query(&self.connection, self.timeout, &command).await
    }

    /// Whether this is the first claim on `name` (among every replica's claims on this channel)
    /// in the last `lasting`: a marker `<channel>:<name>` set only if absent, kept that long.
    pub async fn first_claim(&self, name: &str, lasting: Duration) -> Result<bool, StoreError> {
        let millis = u64::try_from(lasting.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let command = redis::cmd("SET")
            .arg(format!("{}:{name}", self.channel))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(millis)
            .clone();
        let set: Option<String> = query(&self.connection, self.timeout, &command).await?;
        Ok(set.is_some())
    }

    /// Gives up the claim on `name`, so that another claim can be the first.
    pub async fn release_claim(&self, name: &str) -> Result<(), StoreError> {
        let command = redis::cmd("DEL")
            .arg(format!("{}:{name}", self.channel))
            .clone();
        query::<u64>(&self.connection, self.timeout, &command)
            .await
            .map(|_| ())
    }
}

async fn subscribe(
    client: &redis::Client,
    channel: &str,
    timeout: Duration,
) -> Result<PubSub, StoreError> {
    let attempt = async {
        let mut subscription = client.get_async_pubsub().await?;
        subscription.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(subscription)
    };
    bounded(timeout, attempt).await
}

/// Subscribes on the first of `nodes` (starting at `from`, in turn) that accepts; returns the
/// subscription and which node took it. On a cluster any node will do: a message published on one
/// node reaches the subscribers of all of them.
async fn subscribe_any(
    nodes: &[redis::Client],
    from: usize,
    channel: &str,
    timeout: Duration,
) -> Result<(PubSub, usize), StoreError> {
    let mut failure = StoreError("no Redis node to subscribe on".into());
    for offset in 0..nodes.len() {
        let node = (from + offset) % nodes.len();
        match subscribe(&nodes[node], channel, timeout).await {
            Ok(subscription) => return Ok((subscription, node)),
            Err(e) => failure = e,
        }
    }
    Err(failure)
}

/// Why a subscription stopped forwarding.
enum Stopped {
    /// The relay was dropped: nobody wants the messages any more.
    RelayDropped,
    /// The connection failed; subscribe again.
    ConnectionLost(String),
}

/// The background task that keeps one subscription alive and hands its messages on.
struct Subscriber {
    /// The listed nodes, tried in turn from the one after `node` when a subscription fails.
    nodes: Vec<redis::Client>,
    node: usize,
    channel: String,
    timeout: Duration,
    deliver: mpsc::Sender<Vec<u8>>,
}

impl Subscriber {
    async fn run(mut self, mut subscription: PubSub) {
        loop {
            match self.forward(subscription).await {
                Stopped::RelayDropped => return,
                Stopped::ConnectionLost(reason) => tracing::warn!(
                    channel = %self.channel,
                    "change-event subscription lost ({reason}); subscribing again"
                ),
            }
            match self.subscribe_again().await {
                Some(fresh) => subscription = fresh,
                None => return,
            }
            tracing::info!(channel = %self.channel, "change-event subscription restored");
        }
    }

    /// Hands every message on until the connection fails or the relay is dropped.
    async fn forward(&self, subscription: PubSub) -> Stopped {
        let (mut sink, mut messages) = subscription.split();
        let mut health_check = tokio::time::interval(HEALTH_CHECK_EVERY);
        health_check.reset();
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else {
                        return Stopped::ConnectionLost("connection closed".into());
                    };
                    let payload = message.get_payload_bytes().to_vec();
                    if self.deliver.send(payload).await.is_err() {
                        return Stopped::RelayDropped;
                    }
                }
                _ = health_check.tick() => {
                    let ping = sink.ping::<redis::Value>();
                    match tokio::time::timeout(self.timeout, ping).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Stopped::ConnectionLost(e.to_string()),
                        Err(_) => return Stopped::ConnectionLost("no answer to PING".into()),
                    }
                }
                () = self.deliver.closed() => return Stopped::RelayDropped,
            }
        }
    }

    /// Retries with a growing delay until subscribed; `None` when the relay was dropped meanwhile.
    async fn subscribe_again(&mut self) -> Option<PubSub> {
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.deliver.closed() => return None,
            }
            let next = self.node + 1;
            match subscribe_any(&self.nodes, next, &self.channel, self.timeout).await {
                Ok((subscription, node)) => {
                    self.node = node;
                    return Some(subscription);
                }
                Err(e) => tracing::debug!(channel = %self.channel, "subscribing failed: {e}"),
            }
            delay = (delay * 2).min(LONGEST_RETRY_DELAY);
        }
    }
}
