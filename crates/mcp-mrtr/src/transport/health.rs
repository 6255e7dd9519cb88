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
use serde_json::{Map, Value, json};
use tokio::sync::watch;

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
    /// The last round of checks.
    last: Mutex<Option<Round>>,
}

/// Each check's name and outcome.
type Outcomes = Vec<(String, Result<(), String>)>;

/// A round of checks running on its own task, whose outcome every probe that wants it awaits.
#[derive(Clone)]
struct Round {
    /// `None` until the round ends; the sender is dropped without a value if its task fails.
    outcome: watch::Receiver<Option<Arc<Outcomes>>>,
    started: Instant,
}

impl Round {
    fn start(readiness: Readiness) -> Self {
        let (tell, outcome) = watch::channel(None);
        tokio::spawn(async move {
            let outcomes = readiness.run().await;
            tell.send_replace(Some(Arc::new(outcomes)));
        });
        Self {
            outcome,
            started: Instant::now(),
        }
    }

    /// Whether a probe asking now gets this round's outcome: while it runs, and for a while after
    /// its start.
    fn answers_now(&self) -> bool {
        let running = self.outcome.borrow().is_none() && self.outcome.has_changed().is_ok();
        running || self.started.elapsed() < REUSED_FOR
    }

    async fn outcomes(mut self) -> Arc<Outcomes> {
        let ended = self.outcome.wait_for(Option::is_some).await;
        ended
            .ok()
            .and_then(|outcome| outcome.clone())
            .unwrap_or_else(|| {
                Arc::new(vec![(
                    "checks".to_owned(),
                    Err("the checks failed to run".to_owned()),
                )])
            })
    }
}

impl Health {
    /// The outcome of the last round of checks while it runs or is recent, of a new one
    /// otherwise.
    async fn outcomes(&self) -> Arc<Outcomes> {
        let round = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            match &*last {
                Some(round) if round.answers_now() => round.clone(),
                _ => {
                    let round = Round::start(self.readiness.clone());
                    *last = Some(round.clone());
                    round
                }
            }
        };
        round.outcomes().await
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
