//! Health endpoints for orchestrators and balancers: `GET /healthz` says the process serves;
//! `GET /readyz` says it can do its work (every readiness check answers within a deadline) and is
//! not draining, with a JSON body naming each check's outcome. The checks run one round at a
//! time, on a task of their own (a probe that hangs up does not cut its round short), and a round
//! answers every `/readyz` that comes while it runs or within a second of its start: probes from
//! balancers, or from anyone who can reach the port, never start more than one round a second
//! against the database and the store.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use serde_json::{Map, Value, json};

use super::Drain;

/// How long each readiness check may take before it counts as failed.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(2);

/// How long after its start a round of checks answers `/readyz`, once it has ended.
const REUSED_FOR: Duration = Duration::from_secs(1);

/// What one check returns: `Err` with why the dependency is not usable.
pub type CheckOutcome = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

type Check = Arc<dyn Fn() -> CheckOutcome + Send + Sync>;

/// The named checks `/readyz` runs: a database, a store, a provider the server cannot work without.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<(String, Check)>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.checks.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_tuple("Readiness").field(&names).finish()
    }
}

impl Readiness {
    /// Adds a check named `name` (as shown in the `/readyz` body).
    pub fn with<F, Fut>(mut self, name: &str, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.checks
            .push((name.to_owned(), Arc::new(move || Box::pin(check()))));
        self
    }
}

impl Readiness {
    /// Runs every check at once, each within [`CHECK_DEADLINE`].
    async fn run(&self) -> Outcomes {
        futures::future::join_all(self.checks.iter().map(|(name, check)| async move {
            let outcome = match tokio::time::timeout(CHECK_DEADLINE, check()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(why)) => Err(why),
                Err(_) => Err(format!(
                    "no answer within {} ms",
                    CHECK_DEADLINE.as_millis()
                )),
            };
            (name.clone(), outcome)
        }))
        .await
    }
}

struct Health {
    readiness: Readiness,
    drain: Drain,
    /// The last round of checks, and when it started.
    last: Mutex<Option<(Round, Instant)>>,
}

/// A round of checks running on its own task, awaited by every probe that wants its outcome.
type Round = Shared<BoxFuture<'static, Arc<Outcomes>>>;

/// Each check's name and outcome.
type Outcomes = Vec<(String, Result<(), String>)>;

impl Health {
    /// The outcome of the last round of checks while it runs or is recent, of a new one
    /// otherwise.
    async fn outcomes(&self) -> Arc<Outcomes> {
        let round = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            match &*last {
                Some((round, started))
                    if round.peek().is_none() || started.elapsed() < REUSED_FOR =>
                {
                    round.clone()
                }
                _ => {
                    let round = self.start_round();
                    *last = Some((round.clone(), Instant::now()));
                    round
                }
            }
        };
        round.await
    }

    fn start_round(&self) -> Round {
        let readiness = self.readiness.clone();
        let running = tokio::spawn(async move { readiness.run().await });
        async move {
            let outcomes = running.await.unwrap_or_else(|_| {
                vec![(
                    "checks".to_owned(),
                    Err("the checks failed to run".to_owned()),
                )]
            });
            Arc::new(outcomes)
        }
        .boxed()
        .shared()
    }
}

/// `/healthz` and `/readyz`.
pub(crate) fn routes(readiness: Readiness, drain: Drain) -> Router {
    Router::new()
        .route("/healthz", get(live))
        .route("/readyz", get(ready))
        .with_state(Arc::new(Health {
            readiness,
            drain,
            last: Mutex::new(None),
        }))
}

async fn live() -> Json<Value> {
    Json(json!({"status": "serving"}))
}

async fn ready(State(health): State<Arc<Health>>) -> Response {
    let draining = || {
        let body = json!({"status": "draining"});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    };
    if health.drain.has_begun() {
        return draining();
    }
    let outcomes = health.outcomes().await;
    // Asked again: a drain that began during the checks is what this answer must report, as the
    // connection will close after it (a balancer that heard "ready" would come back to a closed
    // door).
    if health.drain.has_begun() {
        return draining();
    }
    let ready = outcomes.iter().all(|(_, outcome)| outcome.is_ok());
    let checks: Map<String, Value> = outcomes
        .iter()
        .map(|(name, outcome)| {
            let shown = match outcome {
                Ok(()) => json!("ok"),
                Err(why) => json!(crate::protocol::error::shortened(why.clone(), 256)),
            };
            (name.clone(), shown)
        })
        .collect();
    let (status, word) = if ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    };
    (status, Json(json!({"status": word, "checks": checks}))).into_response()
}
