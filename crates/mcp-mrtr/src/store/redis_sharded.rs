//! Relay messages on a Redis Cluster over sharded pub/sub (`SSUBSCRIBE`, `SPUBLISH`, Redis 7):
//! a channel lives on the shard that owns its slot, so a message crosses one shard rather than
//! the whole cluster bus.
//!
//! The subscription is a RESP3 cluster connection whose pushes come to a background task. The
//! client resubscribes by itself after a reconnection, but a shard whose master died may leave it
//! waiting on the dead address, so the task also checks its own subscription: now and then it
//! publishes a probe on the channel and expects to hear it back; when it does not, it subscribes
//! afresh from the listed nodes.

use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::mpsc;

use super::StoreError;
use super::redis_connection::{RedisStoreConfig, bounded, tcp_settings};

/// How often the subscription checks that it still hears the channel.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// First and longest wait between attempts to subscribe again.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);
const LONGEST_RETRY_DELAY: Duration = Duration::from_secs(2);
/// Marks a probe; relayed messages (change events: `T`, `U<uri>`, …) never start with a NUL byte.
const PROBE_MARK: &[u8] = b"\0probe:";

/// A sharded subscription to `channel`: its connection (also used to publish probes) and the
/// pushes it receives.
struct Subscription {
    connection: ClusterConnection,
    pushes: mpsc::UnboundedReceiver<PushInfo>,
}

async fn subscribe(config: &RedisStoreConfig, channel: &str) -> Result<Subscription, StoreError> {
    let nodes = config.nodes();
    let (sender, pushes) = mpsc::unbounded_channel();
    let opening = async {
        let client = ClusterClientBuilder::new(nodes)
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(sender)
            .connection_timeout(config.timeout)
            .response_timeout(config.timeout)
            .tcp_settings(tcp_settings(config.timeout))
            .build()?;
        let mut connection = client.get_async_connection().await?;
        connection.ssubscribe(channel).await?;
        Ok(connection)
    };
    let connection = bounded(config.timeout * 3, opening).await?;
    Ok(Subscription { connection, pushes })
}

/// Subscribes to `channel`, failing at once if the cluster cannot be reached now, and hands every
/// message published on it to `deliver` from a background task, until `deliver` closes.
pub(super) async fn relay(
    config: &RedisStoreConfig,
    channel: &str,
    deliver: mpsc::Sender<Vec<u8>>,
) -> Result<(), StoreError> {
    let subscription = subscribe(config, channel).await?;
    let subscriber = Subscriber {
        config: config.clone(),
        channel: channel.to_owned(),
        deliver,
    };
    tokio::spawn(subscriber.run(subscription));
    Ok(())
}

struct Subscriber {
    config: RedisStoreConfig,
    channel: String,
    deliver: mpsc::Sender<Vec<u8>>,
}

impl Subscriber {
    async fn run(self, mut subscription: Subscription) {
        loop {
            match self.forward(&mut subscription).await {
                None => return,
                Some(reason) => tracing::warn!(
                    channel = %self.channel,
                    "sharded subscription lost ({reason}); subscribing again"
                ),
            }
            let mut delay = FIRST_RETRY_DELAY;
            subscription = loop {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = self.deliver.closed() => return,
                }
                match subscribe(&self.config, &self.channel).await {
                    Ok(fresh) => break fresh,
                    Err(e) => tracing::debug!(channel = %self.channel, "subscribing failed: {e}"),
                }
                delay = (delay * 2).min(LONGEST_RETRY_DELAY);
            };
            tracing::info!(channel = %self.channel, "sharded subscription restored");
        }
    }

    /// Hands messages on until the subscription stops hearing its own probe (`Some(why)`) or the
    /// relay is dropped (`None`).
    async fn forward(&self, subscription: &mut Subscription) -> Option<String> {
        let mut probes = tokio::time::interval(PROBE_EVERY);
        probes.reset();
        let mut awaited: Option<Vec<u8>> = None;
        loop {
            tokio::select! {
                push = subscription.pushes.recv() => {
                    let push = push?;
                    let Some(payload) = self.payload_of(push) else { continue };
                    if payload.starts_with(PROBE_MARK) {
                        if awaited.as_deref() == Some(payload.as_slice()) {
                            awaited = None;
                        }
                        continue;
                    }
                    if self.deliver.send(payload).await.is_err() {
                        return None;
                    }
                }
                _ = probes.tick() => {
                    if awaited.is_some() {
                        return Some("its own probe did not come back".into());
                    }
                    let probe = [PROBE_MARK, super::ContinuationId::random().to_hex().as_bytes()].concat();
                    let command = redis::cmd("SPUBLISH").arg(&self.channel).arg(&probe).clone();
                    let sent = bounded(self.config.timeout, command.query_async::<u64>(&mut subscription.connection)).await;
                    if let Err(e) = sent {
                        return Some(e.to_string());
                    }
                    awaited = Some(probe);
                }
                () = self.deliver.closed() => return None,
            }
        }
    }

    /// The payload of a message on this relay's channel.
    fn payload_of(&self, push: PushInfo) -> Option<Vec<u8>> {
        if push.kind != PushKind::SMessage {
            return None;
        }
        let mut data = push.data.into_iter();
        let channel = data.next()?;
        let payload = data.next()?;
        let on_channel =
            matches!(&channel, Value::BulkString(name) if name == self.channel.as_bytes());
        match payload {
            Value::BulkString(bytes) if on_channel => Some(bytes),
            _ => None,
        }
    }
}
