//! `/readyz` as balancers and the public meet it: however many ask at once, and whether or not
//! they wait for the answer, the database and the store are checked once, and what the checks
//! say is reused for a second only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mcp_mrtr::transport::Readiness;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::PATIENCE;
use crate::support::{ServerOptions, TestServer};

/// A readiness check that counts its runs and answers once released.
fn counted_check(runs: &Arc<AtomicUsize>, released: &watch::Sender<bool>) -> Readiness {
    let (runs, released) = (runs.clone(), released.subscribe());
    Readiness::default().with("database", move || {
        runs.fetch_add(1, Ordering::SeqCst);
        let mut released = released.clone();
        async move {
            let _ = released.wait_for(|go| *go).await;
            Ok(())
        }
    })
}

async fn readyz(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = http.get(url).send().await.expect("/readyz answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[tokio::test]
async fn readiness_asked_by_many_at_once_and_by_quitters_checks_its_dependencies_once() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (release, _) = watch::channel(false);
    let server = TestServer::start_with(ServerOptions {
        readiness: counted_check(&runs, &release),
        ..ServerOptions::default()
    })
    .await;
    let url = format!("http://{}/readyz", server.addr());
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    // A probe that gives up while the round runs (a balancer's short timeout) does not end it.
    let impatient = http
        .get(&url)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(impatient.is_err(), "the round is held: {impatient:?}");
    let asking: Vec<_> = (0..50)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move { readyz(&http, &url).await })
        })
        .collect();
    let started = async {
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(PATIENCE, started)
        .await
        .expect("the check runs");
    // Time for every request to reach the server and wait for the round in progress.
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.send_replace(true);
    for answer in asking {
        let answer = answer.await.expect("the request task");
        assert_eq!(
            answer,
            (
                200,
                json!({"status": "ready", "checks": {"database": "ok"}})
            )
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "fifty probes at once and one that hung up, one round of checks"
    );
    // A second later the dependencies are asked again: an outage is not hidden for long.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(readyz(&http, &url).await.0, 200);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "checked again after a second"
    );
}
