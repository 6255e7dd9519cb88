//! The authorization server's signing keys, as the resource server holds them: fetched from its
//! `jwks_uri`, looked up by a token's key id and algorithm, fetched again when a token names a key
//! id they do not hold, or (where key ids tell nothing) bears a signature none of them verifies
//! (a rotation), and in the background once they are older than their most age (a key the
//! authorization server withdrew), so that no request waits for that fetch (but one of those,
//! which waits for the fetch under way).

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

use crate::bounded::read_at_most;

/// The largest metadata document or key set read from the authorization server.
const MOST_FETCHED_BYTES: usize = 256 * 1024;

/// How often the log says again that the keys still cannot be fetched: an outage is told once
/// when it begins, then at most this often (each failed try at `debug`), and once when it ends.
const STILL_FAILING_EVERY: Duration = Duration::from_secs(600);

/// The authorization server's keys, by key id (`""` for a key without one).
type Keys = HashMap<String, Vec<(Algorithm, DecodingKey)>>;

/// When the authorization server's keys are fetched again.
#[derive(Debug, Clone, Copy)]
pub struct KeyRefresh {
    /// The least time between two fetches, whatever asks for them.
    pub least_between: Duration,
    /// The longest keys are trusted as fetched.
    pub most_age: Duration,
}

/// The keys, and when they were fetched.
struct KeySet {
    keys: Keys,
    fetched: Instant,
}

/// The keys published at one `jwks_uri` (see the module docs).
pub(super) struct KeySource {
    http: reqwest::Client,
    jwks_uri: String,
    refresh: KeyRefresh,
    set: RwLock<KeySet>,
    /// When the keys were last fetched or tried, and since when they cannot be; held while
    /// fetching, so fetches never overlap.
    fetches: tokio::sync::Mutex<Fetches>,
}

/// The fetches of the keys so far.
struct Fetches {
    /// When the last one began.
    last: Instant,
    /// The failures since the last fetch that succeeded, if the last one failed.
    outage: Option<Outage>,
}

/// Fetches that failed in a row.
struct Outage {
    since: Instant,
    failed: u32,
    last_told: Instant,
}

impl KeySource {
    /// The keys at `jwks_uri`, fetched now, then again as `refresh` says, by a task that stops
    /// at its next wake-up once the source is dropped. Fails when they cannot be fetched.
    pub(super) async fn fetch(
        http: reqwest::Client,
        jwks_uri: String,
        refresh: KeyRefresh,
    ) -> anyhow::Result<Arc<Self>> {
        let keys = fetch_keys(&http, &jwks_uri).await?;
        let source = Arc::new(Self {
            http,
            jwks_uri,
            refresh,
            set: RwLock::new(KeySet {
                keys,
                fetched: Instant::now(),
            }),
            fetches: tokio::sync::Mutex::new(Fetches {
                last: Instant::now(),
                outage: None,
            }),
        });
        tokio::spawn(renew_when_old(Arc::downgrade(&source)));
        Ok(source)
    }

    /// How many keys are held.
    pub(super) fn count(&self) -> usize {
        self.read().keys.values().map(Vec::len).sum()
    }

    /// The keys for `kid` that sign with `alg`, fetching the keys again first when `kid` is
    /// unknown (only when the last fetch is old enough); for a `kid` still unknown then, the keys
    /// published without an id.
    pub(super) async fn for_token(&self, kid: &str, alg: Algorithm) -> Vec<DecodingKey> {
        let known = self.lookup(kid, alg);
        if !known.is_empty() {
            return known;
        }
        // In a key set that names none of its keys, a token's key id is no sign of a rotation:
        // its keys are tried without a fetch, and without waiting for one.
        if self.names_no_key() {
            return self.unnamed(alg);
        }
        let fetches = self.fetches.lock().await;
        let known = self.lookup(kid, alg);
        if !known.is_empty() {
            return known;
        }
        self.fetch_again(fetches, "unknown key id").await;
        let known = self.lookup(kid, alg);
        // A key id is optional in a key set and only a hint in a token: a token naming a key the
        // authorization server publishes without an id is checked with those keys.
        if known.is_empty() && !kid.is_empty() {
            return self.unnamed(alg);
        }
        known
    }

    /// The keys for a token none of whose keys (from [`for_token`](Self::for_token), asked at
    /// `asked`) verified its signature, when those were not picked by its key id (it names
    /// none, or the key set names none): such a token is the only sign of a rotation there is,
    /// so the keys are fetched again (no sooner than the last fetch allows) and the token's keys
    /// in the new set returned; `None` when no key set newer than `asked` is held.
    pub(super) async fn after_failed_signature(
        &self,
        kid: &str,
        alg: Algorithm,
        asked: Instant,
    ) -> Option<Vec<DecodingKey>> {
        if !kid.is_empty() && !self.names_no_key() {
            return None;
        }
        let fetches = self.fetches.lock().await;
        // Another request's fetch may have renewed them meanwhile.
        if self.read().fetched <= asked {
            self.fetch_again(fetches, "a token's signature no key held verifies")
                .await;
        }
        if self.read().fetched <= asked {
            return None;
        }
        let known = self.lookup(kid, alg);
        Some(if known.is_empty() {
            self.unnamed(alg)
        } else {
            known
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, KeySet> {
        self.set.read().unwrap_or_else(|p| p.into_inner())
    }

    /// How long until the keys reach their most age (zero once they have).
    fn time_left(&self) -> Duration {
        self.refresh
            .most_age
            .saturating_sub(self.read().fetched.elapsed())
    }

    /// Fetches the keys again, unless the last fetch (held in `fetches`) was too recent. Keys
    /// that cannot be fetched are kept as they are, and tried again after the interval.
    async fn fetch_again(&self, mut fetches: tokio::sync::MutexGuard<'_, Fetches>, why: &str) {
        if fetches.last.elapsed() < self.refresh.least_between {
            return;
        }
        fetches.last = Instant::now();
        match fetch_keys(&self.http, &self.jwks_uri).await {
            Ok(keys) => {
                match fetches.outage.take() {
                    Some(outage) => tracing::info!(
                        "fetched the authorization server's keys again ({why}), after {} failed \
                         tries over {} s",
                        outage.failed,
                        outage.since.elapsed().as_secs()
                    ),
                    None => tracing::info!("fetched the authorization server's keys again ({why})"),
                }
                *self.set.write().unwrap_or_else(|p| p.into_inner()) = KeySet {
                    keys,
                    fetched: Instant::now(),
                };
            }
            Err(e) => match &mut fetches.outage {
                None => {
                    tracing::warn!(
                        "cannot fetch the authorization server's keys ({why}): {e:#}; the keys \
                         held are kept, and fetched again when they are past their most age or a \
                         token may have been signed by a newer key, at most every {} s (the log \
                         says again every {} min while this lasts)",
                        self.refresh.least_between.as_secs(),
                        STILL_FAILING_EVERY.as_secs() / 60
                    );
                    let now = Instant::now();
                    fetches.outage = Some(Outage {
                        since: now,
                        failed: 1,
                        last_told: now,
                    });
                }
                Some(outage) => {
                    outage.failed += 1;
                    if outage.last_told.elapsed() >= STILL_FAILING_EVERY {
                        outage.last_told = Instant::now();
                        tracing::warn!(
                            "still cannot fetch the authorization server's keys, {} tries over \
                             {} s ({why}): {e:#}",
                            outage.failed,
                            outage.since.elapsed().as_secs()
                        );
                    } else {
                        tracing::debug!(
                            "cannot fetch the authorization server's keys ({why}): {e:#}"
                        );
                    }
                }
            },
        }
    }

    /// The published keys that sign with `alg`: those named `kid`, or all of them for a token
    /// naming no key.
    fn lookup(&self, kid: &str, alg: Algorithm) -> Vec<DecodingKey> {
        let set = self.read();
        let keys = &set.keys;
        let candidates: Box<dyn Iterator<Item = &Vec<(Algorithm, DecodingKey)>>> = if kid.is_empty()
        {
            Box::new(keys.values())
        } else {
            Box::new(keys.get(kid).into_iter())
        };
        signing_with(candidates, alg)
    }

    /// The keys published without a key id that sign with `alg`.
    fn unnamed(&self, alg: Algorithm) -> Vec<DecodingKey> {
        signing_with(self.read().keys.get("").into_iter(), alg)
    }

    /// Whether every published key is without a key id.
    fn names_no_key(&self) -> bool {
        let set = self.read();
        set.keys.len() == 1 && set.keys.contains_key("")
    }
}

/// Fetches the keys again whenever they reach their most age, until `source` is dropped. A fetch
/// that fails keeps the old keys and is tried again after the least time between fetches.
async fn renew_when_old(source: Weak<KeySource>) {
    loop {
        let Some(wait) = source.upgrade().map(|source| {
            // Never sooner than a fetch may follow the last: after a failed one, or with a most
            // age shorter than that, which is then the least age in effect.
            source.time_left().max(source.refresh.least_between)
        }) else {
            return;
        };
        tokio::time::sleep(wait).await;
        let Some(source) = source.upgrade() else {
            return;
        };
        if source.time_left().is_zero() {
            let fetches = source.fetches.lock().await;
            // A fetch for an unknown key id may have renewed them while this one waited.
            if source.time_left().is_zero() {
                source
                    .fetch_again(fetches, "the keys were past their most age")
                    .await;
            }
        }
    }
}

/// The keys among `candidates` that sign with `alg`.
fn signing_with<'a>(
    candidates: impl Iterator<Item = &'a Vec<(Algorithm, DecodingKey)>>,
    alg: Algorithm,
) -> Vec<DecodingKey> {
    candidates
        .flatten()
        .filter(|(signs, _)| *signs == alg)
        .map(|(_, key)| key.clone())
        .collect()
}

/// The JSON document at `url` on the authorization server, read up to [`MOST_FETCHED_BYTES`].
pub(super) async fn fetch_json(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let mut response = http.get(url).send().await?.error_for_status()?;
    let body = read_at_most(&mut response, MOST_FETCHED_BYTES)
        .await?
        .with_context(|| format!("the document is larger than {MOST_FETCHED_BYTES} bytes"))?;
    Ok(serde_json::from_slice(&body)?)
}

/// The keys at `jwks_uri` this server can verify with, each with the algorithm it signs with.
async fn fetch_keys(http: &reqwest::Client, jwks_uri: &str) -> anyhow::Result<Keys> {
    let document = fetch_json(http, jwks_uri)
        .await
        .with_context(|| format!("fetching the keys at {jwks_uri}"))?;
    let set: JwkSet = serde_json::from_value(document)
        .with_context(|| format!("reading the keys at {jwks_uri}"))?;
    let mut keys: Keys = HashMap::new();
    for jwk in &set.keys {
        let Some(alg) = signing_algorithm(jwk) else {
            continue;
        };
        let Ok(key) = DecodingKey::from_jwk(jwk) else {
            continue;
        };
        let kid = jwk.common.key_id.clone().unwrap_or_default();
        keys.entry(kid).or_default().push((alg, key));
    }
    Ok(keys)
}

/// The algorithm a published key signs with, among those this server accepts; `None` for an
/// encryption key or another algorithm.
fn signing_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|usage| *usage != jsonwebtoken::jwk::PublicKeyUse::Signature)
    {
        return None;
    }
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Algorithm::ES256
        }
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(by_type),
        Some(declared) => {
            let declared = format!("{declared:?}");
            (declared == format!("{by_type:?}")).then_some(by_type)
        }
    }
}
