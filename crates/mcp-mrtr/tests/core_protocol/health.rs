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

/// A server with `readiness`, a client, and the server's `/readyz` URL.
async fn serve_readiness(readiness: Readiness) -> (TestServer, reqwest::Client, String) {
    let server = TestServer::start_with(ServerOptions {
        readiness,
        ..ServerOptions::default()
    })
    .await;
    let url = format!("http://{}/readyz", server.addr());
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    (server, http, url)
}

/// Asks `/readyz` and hangs up before the round of checks (held) ends.
async fn give_up_on_a_round(http: &reqwest::Client, url: &str) {
    let impatient = http
        .get(url)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(impatient.is_err(), "the round is held: {impatient:?}");
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
    let (_server, http, url) = serve_readiness(counted_check(&runs, &release)).await;
    // A probe that gives up while the round runs (a balancer's short timeout) does not end it.
    give_up_on_a_round(&http, &url).await;
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

#[tokio::test]
async fn a_round_every_prober_gave_up_on_is_not_served_a_second_later() {
    let runs = Arc::new(AtomicUsize::new(0));
    let (release, released) = watch::channel(false);
    let counted = runs.clone();
    // The first round finds the database down; later ones find it back.
    let readiness = Readiness::default().with("database", move || {
        let round = counted.fetch_add(1, Ordering::SeqCst) + 1;
        let mut released = released.clone();
        async move {
            let _ = released.wait_for(|go| *go).await;
            if round == 1 {
                Err("down in the first round".to_owned())
            } else {
                Ok(())
            }
        }
    });
    let (_server, http, url) = serve_readiness(readiness).await;
    give_up_on_a_round(&http, &url).await;
    // The round ends with nobody waiting for it; a second after its start it is old news.
    release.send_replace(true);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        readyz(&http, &url).await,
        (
            200,
            json!({"status": "ready", "checks": {"database": "ok"}})
        ),
        "a fresh round, not the first one's outcome"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
