//! The watch-list walkthrough (`examples/watchlist_walkthrough`), run as a reader of the README
//! runs it: against the real server, with a token, several times in a row. Every run must show
//! both MRTR rounds, so it picks a title that is not on the list yet.

mod support;

use std::process::Command;
use std::time::Duration;

use support::cluster::example_binary;
use support::movies::{Backend, MovieServer};

fn walkthrough(args: &[&str]) -> (bool, String) {
    let output = Command::new(example_binary("watchlist_walkthrough"))
        .args(args)
        .output()
        .expect("run the walkthrough");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[tokio::test]
async fn every_run_shows_the_question_and_the_retry() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let token = moviedb_mcp::auth::mint_token(
        server.secret.as_bytes(),
        "walker",
        Duration::from_secs(3600),
    )
    .expect("a token");
    let mut added = Vec::new();
    for run in 1..=3 {
        let (ok, text) = walkthrough(&["--url", server.url(), "--token", &token]);
        assert!(ok, "run {run} failed:\n{text}");
        for expected in [
            "== Round 1",
            "\"resultType\": \"input_required\"",
            "The server asks (status): \"Have you already watched this title, or is it one to watch later?\"",
            "== Round 2",
            "\"requestState\"",
            "\"status\": \"WATCHED\"",
        ] {
            assert!(
                text.contains(expected),
                "run {run} shows {expected:?}:\n{text}"
            );
        }
        assert!(
            !text.contains("already in your watch list"),
            "run {run} picked a title already listed:\n{text}"
        );
        let title = text
            .lines()
            .find_map(|line| line.strip_prefix("== addToWatchlist for movie "))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("run {run} names its movie:\n{text}"));
        added.push(title);
    }
    added.sort();
    added.dedup();
    assert_eq!(added.len(), 3, "each run added another movie: {added:?}");
    let listed = server.user("walker").watchlist().await;
    assert_eq!(listed.len(), 3, "three items on the list: {listed:?}");
}

#[test]
fn help_says_how_to_use_it() {
    let (ok, text) = walkthrough(&["--help"]);
    assert!(ok, "--help succeeds:\n{text}");
    for flag in ["--token", "--url", "--movie-id", "--answer"] {
        assert!(text.contains(flag), "--help names {flag}:\n{text}");
    }
    let (ok, text) = walkthrough(&["--url", "http://127.0.0.1:9/mcp"]);
    assert!(!ok, "no token is an error");
    assert!(
        text.contains("--token") && text.contains("\nusage: watchlist_walkthrough"),
        "and says what is missing, then how to use it, as text:\n{text}"
    );
}

#[tokio::test]
async fn a_refused_token_is_said_in_words() {
    let server = MovieServer::start(Backend::Sqlite).await;
    let (ok, text) = walkthrough(&["--url", server.url(), "--token", "not-a-token"]);
    assert!(!ok, "a refused token is an error:\n{text}");
    assert!(
        text.contains("refused the token (HTTP 401)") && !text.contains("panicked"),
        "said in words, not as a panic:\n{text}"
    );
}
