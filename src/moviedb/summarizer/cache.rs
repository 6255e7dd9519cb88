//! The cache of review summaries written by the LLM provider (or given in its place).
//!
//! An entry is keyed by the movie and a fingerprint of its reviews and of the model, so a new
//! review makes a new key at once and nothing has to be invalidated. Each entry carries its own
//! expiry: long for the provider's summaries, short for fallbacks.
//!
//! The in-process cache (moka) is always there. When the server runs with Redis, Redis is a
//! second tier shared by every replica, so one replica's provider call serves them all; Redis
//! errors count as misses. Concurrent calls for one key in this process share one computation, a
//! *flight*, that goes on while any of them still waits and is dropped with the last one.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared, WeakShared};
use sha2::{Digest, Sha256};

use self::tiers::{RedisSummaries, Tiers, local_cache};
use super::SummaryText;
use crate::moviedb::model::Review;
use crate::store::RedisStoreConfig;

mod tiers;

/// Most summaries kept in this process.
const LOCAL_CAPACITY: u64 = 10_000;

/// Where a summary is cached: `summary:{movie id}:{fingerprint}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryKey(String);

impl SummaryKey {
    /// The key of `reviews` (in the catalogue's order) of `movie_id` summarized by `writer` (a
    /// provider's [`writer`](super::provider::Provider::writer), or a client's lent model).
    pub fn new(movie_id: i64, writer: &str, reviews: &[Review]) -> Self {
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            // Length-prefixed, so no two different review sets hash the same bytes.
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        field(writer.as_bytes());
        field(&(reviews.len() as u64).to_le_bytes());
        for review in reviews {
            field(&review.score.to_le_bytes());
            field(review.author.as_bytes());
            field(review.comment.as_bytes());
        }
        Self(format!(
            "summary:{movie_id}:{}",
            hex::encode(hash.finalize())
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How long a computed summary is kept, and by whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// By this process and, with Redis, by every replica.
    Everywhere(Duration),
    /// The same, but never in place of an entry Redis already holds, which is served instead:
    /// for the server's words standing in for a provider that failed, which must not replace
    /// the provider's words another replica got meanwhile.
    UnlessShared(Duration),
    /// By this process alone: it stands for something only this replica saw (all its provider
    /// calls taken), which another replica should not repeat.
    HereOnly(Duration),
}

/// Where [`SummaryCache::get_or_share`] found its summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// In a cache tier.
    Cached,
    /// Computed by a flight this caller waited for (one caller per computation is told so).
    Computed,
}

/// A computation shared by the callers asking for one key: its summary and, when the
/// computation ran (Redis did not have it), a claim the first waiter to see it takes, or its error.
type FlightOutput = Result<(SummaryText, Option<Arc<AtomicBool>>), Arc<anyhow::Error>>;
type Flight = Shared<BoxFuture<'static, FlightOutput>>;

pub struct SummaryCache {
    tiers: Tiers,
    /// The flight of each key being computed; weak, so a flight no caller waits for is dropped.
    flights: Mutex<HashMap<String, WeakShared<BoxFuture<'static, FlightOutput>>>>,
}

impl SummaryCache {
    /// A cache in this process only.
    pub fn in_process() -> Self {
        Self::with_tiers(None)
    }

    /// A cache in this process backed by Redis (failing at once if Redis cannot be reached now).
    pub async fn shared_in_redis(config: RedisStoreConfig) -> anyhow::Result<Self> {
        let shared = RedisSummaries::connect(config).await?;
        Ok(Self::with_tiers(Some(Arc::new(shared))))
    }

    fn with_tiers(shared: Option<Arc<RedisSummaries>>) -> Self {
        Self {
            tiers: Tiers {
                local: local_cache(),
                shared,
            },
            flights: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a summary is cached under `key`, here or in Redis (which then fills this
    /// process's tier, so the call that follows finds it here).
    pub async fn contains(&self, key: &SummaryKey) -> bool {
        self.tiers.lookup(key).await.is_some()
    }

    /// The summary cached under `key`, or the one the computation `start` returns produces, kept
    /// as it says. In this process one computation runs per key at a time, shared by every
    /// caller asking meanwhile: it goes on while any of them waits (a caller that leaves does
    /// not cancel it for the others) and is dropped when the last one leaves, so a provider
    /// request nobody waits for is cancelled. An error of the computation reaches every caller
    /// waiting for it and nothing is cached. `start` is only called when a computation starts.
    pub async fn get_or_share<S, F>(
        &self,
        key: &SummaryKey,
        start: S,
    ) -> anyhow::Result<(SummaryText, Found)>
    where
        S: FnOnce() -> F,
        F: Future<Output = anyhow::Result<(SummaryText, Keep)>> + Send + 'static,
    {
        if let Some(entry) = self.tiers.local.get(key.as_str()).await {
            return Ok((entry.text, Found::Cached));
        }
        let flight = {
            let mut flights = lock(&self.flights);
            // A flight that ended in an error is not joined: errors are not kept.
            let live = flights
                .get(key.as_str())
                .and_then(WeakShared::upgrade)
                .filter(|flight| !matches!(flight.peek(), Some(Err(_))));
            match live {
                Some(flight) => flight,
                None => {
                    let flight = self.flight(key, start());
                    if let Some(weak) = flight.downgrade() {
                        flights.insert(key.as_str().to_owned(), weak);
                    }
                    flight
                }
            }
        };
        let outcome = Waiting {
            flights: &self.flights,
            key: key.as_str(),
            flight: Some(flight),
        }
        .await;
        let (text, claim) = outcome.map_err(|error| anyhow::anyhow!("{error:#}"))?;
        let found = match claim {
            Some(claim) if !claim.swap(true, Ordering::SeqCst) => Found::Computed,
            _ => Found::Cached,
        };
        Ok((text, found))
    }

    /// The shared computation of `key`: Redis first, then `compute`, whose summary is stored. A
    /// panic is its error (a shared future that panics would leave its other waiters pending).
    fn flight<F>(&self, key: &SummaryKey, compute: F) -> Flight
    where
        F: Future<Output = anyhow::Result<(SummaryText, Keep)>> + Send + 'static,
    {
        let (tiers, key) = (self.tiers.clone(), key.clone());
        let computation = async move {
            if let Some(entry) = tiers.lookup(&key).await {
                return Ok((entry.text, None));
            }
            let (text, keep) = compute.await.map_err(Arc::new)?;
            let text = tiers.store(&key, text, keep).await;
            Ok((text, Some(Arc::new(AtomicBool::new(false)))))
        };
        AssertUnwindSafe(computation)
            .catch_unwind()
            .map(|outcome| {
                outcome.unwrap_or_else(|_| {
                    Err(Arc::new(anyhow::anyhow!(
                        "the summary computation panicked"
                    )))
                })
            })
            .boxed()
            .shared()
    }

    /// The summary cached under `key`, or the one `compute` produces, computed in the calling
    /// task and not shared: for computations that belong to their caller (a client's own model
    /// answering through that client's request). Errors are returned and nothing is cached.
    pub async fn get_or_compute_here<F>(
        &self,
        key: &SummaryKey,
        compute: F,
    ) -> anyhow::Result<SummaryText>
    where
        F: Future<Output = anyhow::Result<(SummaryText, Keep)>>,
    {
        if let Some(entry) = self.tiers.lookup(key).await {
            return Ok(entry.text);
        }
        let (text, keep) = compute.await?;
        Ok(self.tiers.store(key, text, keep).await)
    }
}

/// A caller's place in a flight, awaited for the flight's outcome. Leaving (done or dropped)
/// removes the flight from the map once no caller is left in it, so the map holds only flights
/// someone waits for.
struct Waiting<'a> {
    flights: &'a Mutex<HashMap<String, WeakShared<BoxFuture<'static, FlightOutput>>>>,
    key: &'a str,
    /// Taken only when dropped.
    flight: Option<Flight>,
}

impl Future for Waiting<'_> {
    type Output = FlightOutput;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FlightOutput> {
        let Some(flight) = self.flight.as_mut() else {
            unreachable!("a waiter's flight is taken only when the waiter is dropped")
        };
        flight.poll_unpin(cx)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Our own hold goes first, or the flight would always look alive.
        drop(self.flight.take());
        let mut flights = lock(self.flights);
        let gone = flights
            .get(self.key)
            .is_some_and(|weak| weak.upgrade().is_none());
        if gone {
            flights.remove(self.key);
        }
    }
}

/// The map of flights, even if a caller panicked while holding it (it is left consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn review(score: i64, author: &str, comment: &str) -> Review {
        Review {
            score,
            author: author.into(),
            comment: comment.into(),
        }
    }

    fn text(summary: &str) -> SummaryText {
        SummaryText {
            summary: Some(summary.into()),
            themes: vec!["story".into()],
        }
    }

    #[test]
    fn the_key_changes_with_any_review_and_with_the_model() {
        let reviews = vec![review(8, "ann", "Great story"), review(6, "bob", "Slow")];
        let key = SummaryKey::new(4, "m", &reviews);
        assert!(key.as_str().starts_with("summary:4:"), "{}", key.as_str());
        assert_eq!(key, SummaryKey::new(4, "m", &reviews.clone()));

        let mut added = reviews.clone();
        added.push(review(7, "cy", "Fine"));
        let mut rescored = reviews.clone();
        rescored[1].score = 7;
        let mut reworded = reviews.clone();
        reworded[0].comment.push('!');
        // The same bytes split differently between author and comment.
        let shifted = vec![review(8, "annG", "reat story"), review(6, "bob", "Slow")];
        for other in [&added, &rescored, &reworded, &shifted] {
            assert_ne!(key, SummaryKey::new(4, "m", other));
        }
        assert_ne!(key, SummaryKey::new(5, "m", &reviews));
        assert_ne!(key, SummaryKey::new(4, "other-model", &reviews));
        // A provider's writer names its address, model, budget and prompt version: any of them
        // changed is another key.
        let config = |base: &str, tokens: u32| crate::moviedb::summarizer::config::ProviderConfig {
            base_url: base.into(),
            model: "m".into(),
            api_key: None,
            timeout: Duration::from_secs(1),
            max_tokens: tokens,
            max_concurrent: 1,
        };
        let writers: Vec<String> = [
            ("http://a/v1", 300),
            ("http://b/v1", 300),
            ("http://a/v1", 301),
        ]
        .into_iter()
        .map(|(base, tokens)| {
            super::super::provider::Provider::new(config(base, tokens))
                .map(|provider| provider.writer().to_owned())
                .unwrap()
        })
        .collect();
        assert!(writers.iter().all(|writer| writer.contains("prompt")));
        let keys: std::collections::HashSet<String> = writers
            .iter()
            .map(|writer| SummaryKey::new(4, writer, &reviews).as_str().to_owned())
            .collect();
        assert_eq!(keys.len(), 3, "{writers:?}");
    }

    /// A computation of `summary` that counts its runs and waits for `released` to open.
    fn held(
        summary: &'static str,
        runs: &Arc<AtomicUsize>,
        released: &tokio::sync::watch::Receiver<bool>,
    ) -> impl Future<Output = anyhow::Result<(SummaryText, Keep)>> + Send + 'static {
        let (runs, mut released) = (runs.clone(), released.clone());
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let _ = released.wait_for(|open| *open).await;
            Ok((text(summary), Keep::Everywhere(Duration::from_secs(60))))
        }
    }

    /// Waits until `runs` reaches `count`.
    async fn until_runs(runs: &AtomicUsize, count: usize) {
        while runs.load(Ordering::SeqCst) < count {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_cached_summary_is_served_without_computing_again() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(1, "m", &[review(5, "a", "b")]);
        let runs = Arc::new(AtomicUsize::new(0));
        let mut found = Vec::new();
        for _ in 0..3 {
            let (got, how) = cache
                .get_or_share(&key, || {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok((text("once"), Keep::Everywhere(Duration::from_secs(60))))
                    }
                })
                .await
                .expect("computed or cached");
            assert_eq!(got, text("once"));
            found.push(how);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(found, [Found::Computed, Found::Cached, Found::Cached]);
    }

    #[tokio::test]
    async fn errors_reach_the_caller_and_are_not_cached() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(1, "m", &[]);
        let failed = cache
            .get_or_share(&key, || async { Err(anyhow::anyhow!("our bug")) })
            .await;
        assert!(
            failed
                .err()
                .is_some_and(|e| e.to_string().contains("our bug"))
        );
        let later = cache
            .get_or_share(&key, || async {
                Ok((text("fine"), Keep::Everywhere(Duration::from_secs(60))))
            })
            .await
            .expect("computed");
        assert_eq!(later, (text("fine"), Found::Computed));
    }

    #[tokio::test]
    async fn concurrent_callers_share_one_computation() {
        let cache = Arc::new(SummaryCache::in_process());
        let key = SummaryKey::new(2, "m", &[]);
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let callers: Vec<_> = (0..5)
            .map(|_| {
                let (cache, key) = (cache.clone(), key.clone());
                let computation = held("shared", &runs, &released);
                tokio::spawn(async move { cache.get_or_share(&key, || computation).await })
            })
            .collect();
        until_runs(&runs, 1).await;
        release.send_replace(true);
        let mut computed = 0;
        for caller in callers {
            let (got, how) = caller.await.expect("no panic").expect("computed");
            assert_eq!(got, text("shared"));
            computed += usize::from(how == Found::Computed);
        }
        assert_eq!((runs.load(Ordering::SeqCst), computed), (1, 1));
    }

    #[tokio::test]
    async fn a_caller_leaving_does_not_cancel_the_computation_others_wait_for() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(3, "m", &[]);
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let first_computation = held("first", &runs, &released);
        let mut first = Box::pin(cache.get_or_share(&key, || first_computation));
        let second_computation = held("second", &runs, &released);
        let mut second = Box::pin(cache.get_or_share(&key, || second_computation));
        assert!(futures::poll!(&mut first).is_pending(), "the first starts");
        assert!(futures::poll!(&mut second).is_pending(), "the second joins");
        drop(first);
        release.send_replace(true);
        let got = second.await.expect("computed");
        assert_eq!(
            got.0,
            text("first"),
            "the first caller's computation went on"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "and was not started again");
        assert!(lock(&cache.flights).is_empty(), "no flight left behind");
    }

    #[tokio::test]
    async fn the_last_caller_leaving_drops_the_computation_and_the_next_starts_over() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(3, "m", &[]);
        /// Says when the computation holding it is dropped.
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(dropped.clone());
        let abandoned = tokio::time::timeout(
            Duration::from_millis(50),
            cache.get_or_share(&key, || async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok((text("never"), Keep::Everywhere(Duration::from_secs(60))))
            }),
        )
        .await;
        assert!(abandoned.is_err(), "the pending computation never finishes");
        assert!(
            dropped.load(Ordering::SeqCst),
            "the computation went with its last caller, not on in the background"
        );
        assert!(lock(&cache.flights).is_empty(), "no flight left behind");
        let got = cache
            .get_or_share(&key, || async {
                Ok((text("fresh"), Keep::Everywhere(Duration::from_secs(60))))
            })
            .await
            .expect("computed");
        assert_eq!(got, (text("fresh"), Found::Computed));
    }

    #[tokio::test]
    async fn a_computation_that_panics_fails_every_waiter_and_the_next_caller_starts_over() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(7, "m", &[]);
        let (release, released) = tokio::sync::watch::channel(false);
        let mut first = Box::pin(cache.get_or_share(&key, || {
            let mut released = released.clone();
            async move {
                let _ = released.wait_for(|open| *open).await;
                panic!("a bug in the computation");
            }
        }));
        let mut second = Box::pin(cache.get_or_share(&key, || async {
            Err(anyhow::anyhow!("joined, never started"))
        }));
        assert!(futures::poll!(&mut first).is_pending());
        assert!(futures::poll!(&mut second).is_pending());
        release.send_replace(true);
        for waiter in [first.await, second.await] {
            assert!(
                waiter
                    .err()
                    .is_some_and(|e| e.to_string().contains("panicked")),
                "every waiter hears of the panic"
            );
        }
        let got = cache
            .get_or_share(&key, || async {
                Ok((text("after"), Keep::Everywhere(Duration::from_secs(60))))
            })
            .await
            .expect("computed afresh");
        assert_eq!(got, (text("after"), Found::Computed));
    }

    #[tokio::test]
    async fn a_caller_finding_a_failed_flight_still_held_starts_a_new_one() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(8, "m", &[]);
        let failed = cache.flight(&key, async { Err(anyhow::anyhow!("provider bug")) });
        // Another waiter still holds the failed flight, so it is still in the map.
        lock(&cache.flights).insert(key.as_str().to_owned(), failed.downgrade().expect("live"));
        assert!(failed.clone().await.is_err());
        let got = cache
            .get_or_share(&key, || async {
                Ok((text("retried"), Keep::Everywhere(Duration::from_secs(60))))
            })
            .await
            .expect("a new flight");
        assert_eq!(got, (text("retried"), Found::Computed));
        drop(failed);
    }

    #[tokio::test]
    async fn a_computation_of_the_caller_is_cached_like_a_shared_one() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(5, "lender", &[]);
        let here = cache
            .get_or_compute_here(&key, async {
                Ok((text("mine"), Keep::HereOnly(Duration::from_secs(60))))
            })
            .await
            .expect("computed");
        assert_eq!(here, text("mine"));
        let again = cache
            .get_or_share(&key, || async { Err(anyhow::anyhow!("not called")) })
            .await
            .expect("cached");
        assert_eq!(again, (text("mine"), Found::Cached));
        let failed = cache
            .get_or_compute_here(&SummaryKey::new(6, "lender", &[]), async {
                Err(anyhow::anyhow!("the client's model failed us"))
            })
            .await;
        assert!(failed.is_err());
    }

    #[tokio::test]
    async fn an_entry_lives_only_as_long_as_it_was_given() {
        let cache = SummaryCache::in_process();
        let key = SummaryKey::new(4, "m", &[]);
        cache
            .get_or_share(&key, || async {
                Ok((text("brief"), Keep::HereOnly(Duration::ZERO)))
            })
            .await
            .expect("computed");
        let next = cache
            .get_or_share(&key, || async {
                Ok((text("next"), Keep::Everywhere(Duration::from_secs(60))))
            })
            .await
            .expect("computed");
        assert_eq!(next, (text("next"), Found::Computed));
    }
}
