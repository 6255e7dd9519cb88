//! Health endpoints for orchestrators and balancers: `GET /healthz` says the process serves;
//! `GET /readyz` says it can do its work (every readiness check answers within a deadline) and is
//! not draining, with a JSON body naming each check's outcome.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use super::Drain;

/// How long each readiness check may take before it counts as failed.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(2);

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

struct Health {
    readiness: Readiness,
    drain: Drain,
}

/// `/healthz` and `/readyz`.
pub(crate) fn routes(readiness: Readiness, drain: Drain) -> Router {
    Router::new()
        .route("/healthz", get(live))
        .route("/readyz", get(ready))
        .with_state(Arc::new(Health { readiness, drain }))
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
    let outcomes = futures::future::join_all(health.readiness.checks.iter().map(
        |(name, check)| async move {
            let outcome = match tokio::time::timeout(CHECK_DEADLINE, check()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(why)) => Err(why),
                Err(_) => Err(format!(
                    "no answer within {} ms",
                    CHECK_DEADLINE.as_millis()
                )),
            };
            (name.clone(), outcome)
        },
    ))
    .await;
    // Asked again: a drain that began during the checks is what this answer must report, as the
    // connection will close after it (a balancer that heard "ready" would come back to a closed
    // door).
    if health.drain.has_begun() {
        return draining();
    }
    let ready = outcomes.iter().all(|(_, outcome)| outcome.is_ok());
    let checks: Map<String, Value> = outcomes
        .into_iter()
        .map(|(name, outcome)| {
            let shown = match outcome {
                Ok(()) => json!("ok"),
                Err(why) => json!(crate::protocol::error::shortened(why, 256)),
            };
            (name, shown)
        })
        .collect();
    let (status, word) = if ready {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    };
    (status, Json(json!({"status": word, "checks": checks}))).into_response()
}
