//! `summarizeMovieReviews` with an LLM provider, tested the way an operator and a user meet it:
//! the real `moviedb-mcp` binary, started as a child process on a fresh SQLite catalogue and
//! pointed at a local OpenAI-compatible server (`support/openai.rs`) that answers as each test
//! scripts it. The shared 2026-07-28 client talks to the binary over HTTP and checks every message
//! against the official schema.
//!
//! Each test checks what the user gets (the tool result), how many calls reached the provider
//! (cache hits and single flight included), and, where the operator would look, the log.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use moviedb_mcp::moviedb::model::Review;
use moviedb_mcp::moviedb::summary;
use serde_json::{Value, json};
use sqlx::Connection as _;
use sqlx::sqlite::SqliteConnection;
use support::movies::structured;
use support::net::{free_port, random_hex, shared_redis_url as redis_url};
use support::openai::{Answer, FakeProvider};
use support::{Client, EventStream, Reply};

/// The model the tests configure; the provider sees it in every request.
const MODEL: &str = "review-writer-test";
/// The API key the tests configure; it must reach the provider and never the log.
const API_KEY: &str = "sk-test-0123456789abcdef";
/// A movie with 13 seeded reviews.
const MOVIE: i64 = 6;
/// Another movie with enough reviews to summarize (26).
const OTHER_MOVIE: i64 = 5;
/// The line the log carries for each fallback.
const FALLBACK_LOG: &str = "LLM provider failed, answering with the server-side summary";
/// Longest a test waits for something that should happen at once.
const PATIENCE: Duration = Duration::from_secs(15);

const WELL_FORMED: &str = "SUMMARY: Reviewers adore its heart and its lead performances.\n\
                           THEMES: performances; story; music";

// ---------------------------------------------------------------------------------------------
// Answers from the provider
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_well_formed_answer_becomes_the_summary_and_is_then_served_from_the_cache() {
    let provider = FakeProvider::start(Answer::Text(WELL_FORMED.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let token = json!("summary-with-llm");
    let reply = server
        .client
        .request("tools/call")
        .params(
            json!({"name": "summarizeMovieReviews", "arguments": {"movieId": MOVIE.to_string()}}),
        )
        .progress_token(token.clone())
        .send()
        .await;
    assert_progress_then_result(&reply, &token);
    let first = structured(&reply).clone();
    let reviews = server.reviews(MOVIE).await;
    assert_eq!(
        first,
        with_text(
            &server_side(MOVIE, &reviews),
            Some("Reviewers adore its heart and its lead performances."),
            &["performances", "story", "music"],
        ),
        "the provider's sentence and themes, with the count and average of the reviews"
    );

    let calls = provider.calls();
    assert_eq!(calls.len(), 1, "one provider call");
    let call = &calls[0];
    assert_eq!(call.body["model"], MODEL, "the configured model is asked");
    assert_eq!(
        call.authorization.as_deref(),
        Some(format!("Bearer {API_KEY}").as_str()),
        "the configured key is sent as a bearer token"
    );
    let prompt = call.message("user");
    assert!(
        prompt.contains("1-10 scale"),
        "the prompt states the scale: {prompt}"
    );
    for review in &reviews {
        let line = format!("Score {}/10: {}", review.score, json!(review.comment));
        assert!(
            prompt.contains(&line),
            "the prompt lists {line:?}: {prompt}"
        );
    }
    let instructions = call.message("system");
    assert!(
        instructions.contains("SUMMARY:") && instructions.contains("THEMES:"),
        "the model is asked for the two lines: {instructions}"
    );

    for _ in 0..3 {
        assert_eq!(server.summarize(MOVIE).await, first, "the cached summary");
    }
    assert_eq!(provider.call_count(), 1, "repeated calls are cache hits");

    let other = server.summarize(OTHER_MOVIE).await;
    assert_eq!(
        other["summary"],
        json!("Reviewers adore its heart and its lead performances.")
    );
    assert_eq!(
        provider.call_count(),
        2,
        "another movie is another provider call"
    );

    let log = server.log();
    assert!(
        log.contains("review summaries are written by an LLM provider") && log.contains(MODEL),
        "the log names the provider at start-up:\n{log}"
    );
    assert!(!log.contains(API_KEY), "the key is never logged:\n{log}");
    assert!(!log.contains(FALLBACK_LOG), "no fallback:\n{log}");
}

#[tokio::test]
async fn labels_in_any_case_and_order_among_other_lines_are_read() {
    let answer = "Here is the summary you asked for.\n\nthemes : Visuals; pacing ;\n\
                  Summary:   Gorgeous to look at, slow to watch.  \nThanks!";
    let provider = FakeProvider::start(Answer::Text(answer.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let got = server.summarize(MOVIE).await;
    assert_eq!(got["summary"], json!("Gorgeous to look at, slow to watch."));
    assert_eq!(got["themes"], json!(["Visuals", "pacing"]));
    assert_eq!(provider.call_count(), 1);
}

#[tokio::test]
async fn an_unformatted_answer_gives_no_summary_and_no_themes_and_the_call_succeeds() {
    let provider = FakeProvider::start(Answer::Text(
        "People mostly liked it, I think. The music stood out.".into(),
    ))
    .await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let got = server.summarize(MOVIE).await;
    let reviews = server.reviews(MOVIE).await;
    assert_eq!(
        got,
        with_text(&server_side(MOVIE, &reviews), None, &[]),
        "count and average stay; summary null, no themes"
    );
    assert_eq!(
        server.summarize(MOVIE).await,
        got,
        "the answer is cached like any other"
    );
    assert_eq!(provider.call_count(), 1);
    assert!(
        !server.log().contains(FALLBACK_LOG),
        "an unformatted answer is not a failure"
    );
}

// ---------------------------------------------------------------------------------------------
// Fallback to the server-side summary
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_provider_slower_than_the_timeout_gets_the_server_side_summary() {
    let provider =
        FakeProvider::start(Answer::Slow(Duration::from_secs(5), WELL_FORMED.into())).await;
    let mut flags = provider_flags(&provider.base_url());
    flags.extend(["--llm-timeout-secs".into(), "1".into()]);
    let server = Server::start(&flags).await;

    let got = server.summarize(MOVIE).await;
    assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    // The server gives up after 1 s; on a loaded machine the provider may only then read the
    // request it was sent, so the count is awaited rather than read at once.
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() >= 1).await,
        "the provider was called"
    );
    assert_eq!(provider.call_count(), 1, "one call, not retried");
    server.assert_one_fallback_line("no answer within 1 s");
}

#[tokio::test]
async fn an_http_500_gets_the_server_side_summary_after_a_single_call() {
    // A gateway's error page that echoes the request's headers.
    let page = format!("the model crashed\nAuthorization: Bearer {API_KEY}");
    let provider = FakeProvider::start(Answer::Error(500, page)).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let got = server.summarize(MOVIE).await;
    assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    assert_eq!(provider.call_count(), 1, "a server error is not retried");
    server.assert_one_fallback_line("HTTP 500");
    assert!(
        !server.log().contains(API_KEY),
        "the key the error page echoed is not logged:\n{}",
        server.log()
    );
}

#[tokio::test]
async fn an_http_401_gets_the_server_side_summary_and_the_key_stays_out_of_the_log() {
    let provider = FakeProvider::start(Answer::BadKey).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let got = server.summarize(MOVIE).await;
    assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    assert_eq!(provider.call_count(), 1);
    let line = server.assert_one_fallback_line("HTTP 401");
    assert!(
        line.contains("Incorrect API key provided"),
        "the provider's reason is kept: {line}"
    );
    assert!(
        !server.log().contains(API_KEY),
        "the key the provider echoed is not logged:\n{}",
        server.log()
    );
}

#[tokio::test]
async fn an_unreachable_provider_gets_the_server_side_summary() {
    // Nothing listens there, so no call can be counted on the provider's side: each attempt
    // leaves its fallback line in the log instead.
    let nobody = format!("http://127.0.0.1:{}/v1", free_port());
    let server = Server::start(&provider_flags(&nobody)).await;

    for _ in 0..2 {
        let got = server.summarize(MOVIE).await;
        assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    }
    server.assert_one_fallback_line("unreachable: error sending request");
}

#[tokio::test]
async fn a_refusal_gets_the_server_side_summary() {
    let provider = FakeProvider::start(Answer::Refusal("I can't help with that.".into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let got = server.summarize(MOVIE).await;
    assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    assert_eq!(provider.call_count(), 1);
    server.assert_one_fallback_line("refused");
}

#[tokio::test]
async fn an_answer_cut_short_at_the_token_budget_gets_the_server_side_summary() {
    let provider = FakeProvider::start(Answer::CutShort(
        "SUMMARY: Reviewers adore its heart and".into(),
    ))
    .await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let got = server.summarize(MOVIE).await;
    assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    assert_eq!(provider.call_count(), 1);
    server.assert_one_fallback_line("cut short at the token budget");
}

#[tokio::test]
async fn an_answer_larger_than_a_mebibyte_gets_the_server_side_summary() {
    for (answer, how, reason) in [
        (
            Answer::Oversized(2 << 20),
            "with its length",
            "an answer larger than 1024 KiB",
        ),
        (
            Answer::OversizedStream(2 << 20),
            "in chunks",
            "an answer larger than 1024 KiB",
        ),
        // An error page that large still says what went wrong.
        (
            Answer::Error(503, "x".repeat(2 << 20)),
            "as an error",
            "HTTP 503: an error page larger than 1024 KiB",
        ),
        (
            Answer::Error(429, "x".repeat(2 << 20)),
            "as a client error",
            "HTTP 429: an error page larger than 1024 KiB",
        ),
    ] {
        let provider = FakeProvider::start(answer).await;
        let server = Server::start(&provider_flags(&provider.base_url())).await;

        let got = server.summarize(MOVIE).await;
        assert_eq!(
            got,
            server_side(MOVIE, &server.reviews(MOVIE).await),
            "an answer of 2 MiB sent {how}"
        );
        assert_eq!(provider.call_count(), 1);
        server.assert_one_fallback_line(reason);
    }
    // Just under the limit is read: the summary is cut to its longest kept length.
    let provider = FakeProvider::start(Answer::OversizedStream(900 << 10)).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;
    let got = server.summarize(MOVIE).await;
    assert!(
        got["summary"]
            .as_str()
            .is_some_and(|s| s.starts_with("aaa")),
        "{got}"
    );
}

#[tokio::test]
async fn a_fallback_is_cached_so_a_failing_provider_is_not_asked_again_at_once() {
    let provider = FakeProvider::start(Answer::Error(503, "overloaded".into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let first = server.summarize(MOVIE).await;
    let second = server.summarize(MOVIE).await;
    assert_eq!(first, server_side(MOVIE, &server.reviews(MOVIE).await));
    assert_eq!(second, first);
    assert_eq!(
        provider.call_count(),
        1,
        "the fallback is served from the cache"
    );
    server.assert_one_fallback_line("HTTP 503");
}

#[tokio::test]
async fn once_a_fallback_expires_the_recovered_provider_is_used() {
    let provider = FakeProvider::start(Answer::Error(500, "down".into())).await;
    let mut flags = provider_flags(&provider.base_url());
    flags.extend(["--fallback-cache-ttl-secs".into(), "1".into()]);
    let server = Server::start(&flags).await;

    let fallback = server.summarize(MOVIE).await;
    assert_eq!(fallback, server_side(MOVIE, &server.reviews(MOVIE).await));
    assert_eq!(provider.call_count(), 1);

    provider.answer_with(Answer::Text(WELL_FORMED.into()));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let recovered = loop {
        let got = server.summarize(MOVIE).await;
        if got != fallback {
            break got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the provider was not asked again within {PATIENCE:?} of a 1 s fallback"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        recovered["summary"],
        json!("Reviewers adore its heart and its lead performances.")
    );
    assert_eq!(
        provider.call_count(),
        2,
        "calls while the fallback was fresh were cache hits; then exactly one new call"
    );
}

// ---------------------------------------------------------------------------------------------
// When the provider is asked
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn movies_with_fewer_than_three_reviews_never_reach_the_provider() {
    let provider = FakeProvider::start(Answer::Text(WELL_FORMED.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    for movie_id in [1, 2, 3] {
        let reviews = server.reviews(movie_id).await;
        assert!(
            reviews.len() < 3,
            "movie {movie_id} has {} reviews",
            reviews.len()
        );
        let got = server.summarize(movie_id).await;
        assert_eq!(got, server_side(movie_id, &reviews), "movie {movie_id}");
        assert_eq!(got["summary"], Value::Null, "movie {movie_id}");
    }
    assert_eq!(provider.call_count(), 0);
}

#[tokio::test]
async fn concurrent_calls_for_one_movie_make_one_provider_call() {
    let provider = FakeProvider::start(Answer::Held(WELL_FORMED.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let mut streams = Vec::new();
    for caller in 0..5 {
        let mut stream = server
            .open_summary_stream(MOVIE, &format!("caller-{caller}"))
            .await;
        read_until_progress(&mut stream, 0.4).await;
        streams.push(stream);
    }
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() >= 1).await,
        "the provider is asked"
    );
    // Every caller is past "Summarizing" while the one provider call is held.
    assert_eq!(provider.call_count(), 1, "one call for five callers");
    provider.release();
    for stream in &mut streams {
        let result = read_result(stream).await;
        assert_eq!(
            result["summary"],
            json!("Reviewers adore its heart and its lead performances."),
            "every caller gets the one answer"
        );
    }
    assert_eq!(
        provider.call_count(),
        1,
        "still one call once all are answered"
    );
}

#[tokio::test]
async fn past_the_calls_allowed_at_once_a_summary_is_the_servers_own() {
    let provider = FakeProvider::start(Answer::Held(WELL_FORMED.into())).await;
    let mut flags = provider_flags(&provider.base_url());
    flags.extend(["--llm-max-concurrent".into(), "1".into()]);
    let server = Server::start(&flags).await;

    let mut held = server.open_summary_stream(MOVIE, "first").await;
    read_until_progress(&mut held, 0.4).await;
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() >= 1).await,
        "the provider is asked for the first movie"
    );
    // Another movie while the one call allowed is in flight: the server's words, after the wait.
    let got = server.summarize(OTHER_MOVIE).await;
    assert_eq!(
        got,
        server_side(OTHER_MOVIE, &server.reviews(OTHER_MOVIE).await)
    );
    assert_eq!(
        provider.call_count(),
        1,
        "the provider never had two calls at once"
    );
    server.assert_one_fallback_line("busy: all 1 calls allowed at once");
    provider.release();
    assert_eq!(
        read_result(&mut held).await["summary"],
        json!("Reviewers adore its heart and its lead performances."),
        "the call in flight gets the provider's answer"
    );
}

#[tokio::test]
async fn a_busy_fallback_is_not_served_by_another_replica() {
    let provider = FakeProvider::start(Answer::Held(WELL_FORMED.into())).await;
    let data = Arc::new(DataDir::create());
    let mut flags = provider_flags(&provider.base_url());
    flags.extend([
        "--llm-max-concurrent".into(),
        "1".into(),
        "--redis-url".into(),
        redis_url(),
        "--redis-prefix".into(),
        format!("moviedb-summarizer-test-{}:", random_hex(8)),
    ]);
    let busy = Server::start_in(data.clone(), &flags).await;
    let other = Server::start_in(data, &flags).await;

    let mut held = busy.open_summary_stream(MOVIE, "holding").await;
    read_until_progress(&mut held, 0.4).await;
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() >= 1).await,
        "the provider is asked for the first movie"
    );
    let fallback = busy.summarize(OTHER_MOVIE).await;
    let reviews = busy.reviews(OTHER_MOVIE).await;
    assert_eq!(fallback, server_side(OTHER_MOVIE, &reviews));
    busy.assert_one_fallback_line("busy: all 1 calls allowed at once");
    provider.release();
    read_result(&mut held).await;

    // The other replica had calls to spare: it asks the provider rather than repeat the busy
    // replica's fallback.
    let got = other.summarize(OTHER_MOVIE).await;
    assert_eq!(
        got["summary"],
        json!("Reviewers adore its heart and its lead performances."),
        "{got}"
    );
    assert_eq!(provider.call_count(), 2);
}

#[tokio::test]
async fn a_failed_call_serves_the_summary_another_replica_got_meanwhile_and_leaves_it_in_redis() {
    let provider = FakeProvider::start(Answer::HeldError(500, "the model crashed".into())).await;
    let data = Arc::new(DataDir::create());
    let mut flags = provider_flags(&provider.base_url());
    flags.extend([
        "--redis-url".into(),
        redis_url(),
        "--redis-prefix".into(),
        format!("moviedb-summarizer-test-{}:", random_hex(8)),
    ]);
    let failing = Server::start_in(data.clone(), &flags).await;
    let lucky = Server::start_in(data.clone(), &flags).await;

    // One replica's call is under way (it will fail) when the other's succeeds.
    let mut held = failing.open_summary_stream(MOVIE, "failing").await;
    read_until_progress(&mut held, 0.4).await;
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "the failing replica asked the provider"
    );
    provider.answer_with(Answer::Text(WELL_FORMED.into()));
    let provider_words = json!("Reviewers adore its heart and its lead performances.");
    assert_eq!(lucky.summarize(MOVIE).await["summary"], provider_words);
    provider.release();

    assert_eq!(
        read_result(&mut held).await["summary"],
        provider_words,
        "the failed call answers with the provider's words found in Redis, not a fallback"
    );
    failing.assert_one_fallback_line("HTTP 500");
    assert!(
        failing
            .log()
            .contains("another replica's summary landed in Redis meanwhile"),
        "{}",
        failing.log()
    );
    let latecomer = Server::start_in(data, &flags).await;
    assert_eq!(
        latecomer.summarize(MOVIE).await["summary"],
        provider_words,
        "the fallback did not replace them in Redis"
    );
    assert_eq!(
        provider.call_count(),
        2,
        "the latecomer found them in Redis"
    );
}

#[tokio::test]
async fn a_new_review_changes_the_next_summary_without_waiting_for_the_cache() {
    let provider = FakeProvider::start(Answer::Text(WELL_FORMED.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let before = server.summarize(MOVIE).await;
    assert_eq!(server.summarize(MOVIE).await, before, "cached");
    assert_eq!(provider.call_count(), 1);

    provider.answer_with(Answer::Text(
        "SUMMARY: Opinion has turned after a scathing new review.\nTHEMES: ending".into(),
    ));
    server
        .add_review(
            MOVIE,
            1,
            "The ending ruined everything for me.",
            "late_critic",
        )
        .await;

    let after = server.summarize(MOVIE).await;
    let reviews = server.reviews(MOVIE).await;
    assert_eq!(
        after,
        with_text(
            &server_side(MOVIE, &reviews),
            Some("Opinion has turned after a scathing new review."),
            &["ending"],
        ),
        "the new review is counted, averaged and summarized at once"
    );
    assert_eq!(
        after["reviewCount"],
        json!(before["reviewCount"].as_i64().unwrap_or(0) + 1)
    );
    assert_eq!(
        provider.call_count(),
        2,
        "the new review set was a cache miss"
    );
    let prompt = provider.calls()[1].message("user");
    assert!(
        prompt.contains("Score 1/10: \"The ending ruined everything for me.\""),
        "the new review is in the prompt: {prompt}"
    );
}

#[tokio::test]
async fn closing_the_stream_cancels_the_provider_request() {
    let provider = FakeProvider::start(Answer::Held(WELL_FORMED.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let mut stream = server.open_summary_stream(MOVIE, "to-be-closed").await;
    read_until_progress(&mut stream, 0.4).await;
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "the provider is asked"
    );
    drop(stream);
    assert!(
        provider.wait_until(PATIENCE, |p| p.hang_ups() == 1).await,
        "the provider sees its caller hang up once the client closed the stream"
    );

    // Nothing of the cancelled call was kept: the next call asks the provider afresh.
    provider.answer_with(Answer::Text(WELL_FORMED.into()));
    let got = server.summarize(MOVIE).await;
    assert_eq!(
        got["summary"],
        json!("Reviewers adore its heart and its lead performances.")
    );
    assert_eq!(provider.call_count(), 2);
}

#[tokio::test]
async fn a_caller_leaving_does_not_cancel_the_provider_call_others_wait_for() {
    let provider = FakeProvider::start(Answer::Held(WELL_FORMED.into())).await;
    let server = Server::start(&provider_flags(&provider.base_url())).await;

    let mut leaving = server.open_summary_stream(MOVIE, "leaving").await;
    read_until_progress(&mut leaving, 0.4).await;
    let mut staying = server.open_summary_stream(MOVIE, "staying").await;
    read_until_progress(&mut staying, 0.4).await;
    assert!(
        provider.wait_until(PATIENCE, |p| p.call_count() == 1).await,
        "the provider is asked once for both"
    );
    // The second caller says "Summarizing" just before it joins the call: a moment for it to do.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(leaving);
    // The server notices a closed stream at once (the test above waits for that hang-up): here
    // none comes, and no second call either.
    assert!(
        !provider
            .wait_until(Duration::from_secs(2), |p| p.hang_ups() > 0
                || p.call_count() > 1)
            .await,
        "the call went on for the caller still waiting: {} hang-ups, {} calls",
        provider.hang_ups(),
        provider.call_count()
    );
    provider.release();
    assert_eq!(
        read_result(&mut staying).await["summary"],
        json!("Reviewers adore its heart and its lead performances.")
    );
    assert_eq!((provider.call_count(), provider.hang_ups()), (1, 0));
}

#[tokio::test]
async fn replicas_sharing_redis_ask_the_provider_once() {
    let provider = FakeProvider::start(Answer::Text(WELL_FORMED.into())).await;
    let data = Arc::new(DataDir::create());
    let mut flags = provider_flags(&provider.base_url());
    flags.extend([
        "--redis-url".into(),
        redis_url(),
        "--redis-prefix".into(),
        format!("moviedb-summarizer-test-{}:", random_hex(8)),
    ]);
    let first = Server::start_in(data.clone(), &flags).await;
    let second = Server::start_in(data, &flags).await;

    let from_first = first.summarize(MOVIE).await;
    assert_eq!(provider.call_count(), 1);
    let from_second = second.summarize(MOVIE).await;
    assert_eq!(
        from_second, from_first,
        "the second replica serves the first one's summary"
    );
    assert_eq!(
        provider.call_count(),
        1,
        "the second replica found it in Redis"
    );
    assert!(
        second.log().contains("summary cache shared in Redis"),
        "{}",
        second.log()
    );
}

#[tokio::test]
async fn without_a_provider_the_server_side_summarizer_answers_and_the_log_says_so_once() {
    let server = Server::start(&[]).await;
    for _ in 0..2 {
        let got = server.summarize(MOVIE).await;
        assert_eq!(got, server_side(MOVIE, &server.reviews(MOVIE).await));
    }
    let log = server.log();
    assert_eq!(
        log.matches("no LLM provider configured").count(),
        1,
        "said once, at start-up:\n{log}"
    );
    assert!(!log.contains("written by an LLM provider"), "{log}");
}

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

/// The flags that point the server at a provider at `base_url`.
fn provider_flags(base_url: &str) -> Vec<String> {
    [
        "--llm-base-url",
        base_url,
        "--llm-model",
        MODEL,
        "--llm-api-key",
        API_KEY,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// What the server-side summarizer says about `reviews`, as the tool shows it.
fn server_side(movie_id: i64, reviews: &[Review]) -> Value {
    serde_json::to_value(summary::summarize(movie_id, reviews)).expect("a summary serializes")
}

/// `base` with the sentence and themes replaced.
fn with_text(base: &Value, summary: Option<&str>, themes: &[&str]) -> Value {
    let mut expected = base.clone();
    expected["summary"] = json!(summary);
    expected["themes"] = json!(themes);
    expected
}

/// Progress 0, 0.4 and 1 for `token`, then the result, on one SSE stream.
fn assert_progress_then_result(reply: &Reply, token: &Value) {
    assert!(
        reply.is_event_stream(),
        "a call with a progress token is answered with SSE, got {}",
        reply.content_type()
    );
    let progress: Vec<f64> = reply
        .notifications()
        .into_iter()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| {
            assert_eq!(&n["params"]["progressToken"], token, "{n}");
            n["params"]["progress"].as_f64().unwrap_or(f64::NAN)
        })
        .collect();
    assert_eq!(progress, [0.0, 0.4, 1.0], "progress in order");
    let last = reply.messages.last().expect("messages on the stream");
    assert!(
        last.get("result").is_some(),
        "the result comes after the progress: {}",
        reply.body_text()
    );
}

/// Reads `stream` until the progress notification `progress`.
async fn read_until_progress(stream: &mut EventStream, progress: f64) {
    loop {
        let message = stream.expect_message(PATIENCE).await;
        if message["method"] == "notifications/progress"
            && message["params"]["progress"].as_f64() == Some(progress)
        {
            return;
        }
    }
}

/// Reads `stream` until the final result and returns its `structuredContent`.
async fn read_result(stream: &mut EventStream) -> Value {
    loop {
        let message = stream.expect_message(PATIENCE).await;
        if let Some(result) = message.get("result") {
            assert_ne!(result["isError"], json!(true), "a tool error: {message}");
            return result["structuredContent"].clone();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The server: the real binary as a child process
// ---------------------------------------------------------------------------------------------

/// How long the server may take to accept connections (it migrates and seeds first).
const STARTUP_LIMIT: Duration = Duration::from_secs(30);

/// A data folder (SQLite catalogue, development secret), removed when the last server using it
/// is gone.
struct DataDir(PathBuf);

impl DataDir {
    fn create() -> Self {
        let path = std::env::temp_dir().join(format!(
            "moviedb-mcp-summarizer-{}-{}",
            std::process::id(),
            random_hex(8)
        ));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        Self(path)
    }

    fn database_url(&self) -> String {
        format!("sqlite://{}", self.0.join("moviedb.sqlite3").display())
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `moviedb-mcp`; killed when dropped.
struct Server {
    child: Child,
    client: Client,
    log_path: PathBuf,
    data: Arc<DataDir>,
}

impl Server {
    /// A server with `flags` on a catalogue of its own.
    async fn start(flags: &[String]) -> Self {
        Self::start_in(Arc::new(DataDir::create()), flags).await
    }

    /// A server with `flags` on the catalogue in `data`.
    async fn start_in(data: Arc<DataDir>, flags: &[String]) -> Self {
        let log_path = data.0.join(format!("server-{}.log", random_hex(4)));
        for _attempt in 0..5 {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
            let log = std::fs::File::create(&log_path).expect("create the server log");
            let child = binary()
                .arg("--data-dir")
                .arg(&data.0)
                .arg("--bind")
                .arg(addr.to_string())
                .args(flags)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log handle"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start moviedb-mcp: {e}"));
            let mut server = Self {
                child,
                client: support::checked_client(format!(
                    "http://{addr}{}",
                    moviedb_mcp::app::MCP_PATH
                )),
                log_path: log_path.clone(),
                data: data.clone(),
            };
            if server.wait_until_ready(addr).await {
                return server;
            }
            let log = server.log();
            if !log.contains("cannot listen") {
                panic!("moviedb-mcp did not start serving on {addr}; its log:\n{log}");
            }
            // Someone took the port between our probe and the server's bind: try another.
        }
        panic!("moviedb-mcp found no free port in five attempts");
    }

    /// True once the server accepts connections; false if it exits or takes too long.
    async fn wait_until_ready(&mut self, addr: SocketAddr) -> bool {
        let deadline = tokio::time::Instant::now() + STARTUP_LIMIT;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The one fallback line of the log, which must mention `reason`.
    fn assert_one_fallback_line(&self, reason: &str) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(FALLBACK_LOG)).collect();
        assert_eq!(lines.len(), 1, "one fallback line in the log:\n{log}");
        assert!(
            lines[0].contains(reason),
            "the line says {reason:?}: {}",
            lines[0]
        );
        assert!(lines[0].contains("WARN"), "a warning: {}", lines[0]);
        lines[0].to_owned()
    }

    /// `summarizeMovieReviews` for `movie_id`; its structured result.
    async fn summarize(&self, movie_id: i64) -> Value {
        let reply = self
            .client
            .request("tools/call")
            .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": movie_id.to_string()}}))
            .send()
            .await;
        structured(&reply).clone()
    }

    /// `summarizeMovieReviews` with a progress token, read as it streams.
    async fn open_summary_stream(&self, movie_id: i64, token: &str) -> EventStream {
        let stream = self
            .client
            .request("tools/call")
            .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": movie_id.to_string()}}))
            .progress_token(json!(token))
            .open_stream()
            .await;
        assert!(
            stream.content_type().starts_with("text/event-stream"),
            "a call with a progress token streams, got {}",
            stream.content_type()
        );
        stream
    }

    async fn database(&self) -> SqliteConnection {
        SqliteConnection::connect(&self.data.database_url())
            .await
            .expect("open the server's SQLite catalogue")
    }

    /// The reviews of `movie_id` as the server reads them.
    async fn reviews(&self, movie_id: i64) -> Vec<Review> {
        let mut database = self.database().await;
        let rows: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT score, comment, author FROM reviews WHERE movie_id = $1 ORDER BY id",
        )
        .bind(movie_id)
        .fetch_all(&mut database)
        .await
        .expect("read the reviews");
        rows.into_iter()
            .map(|(score, comment, author)| Review {
                score,
                comment,
                author,
            })
            .collect()
    }

    /// Writes a review straight into the server's database, as another writer would.
    async fn add_review(&self, movie_id: i64, score: i64, comment: &str, author: &str) {
        let mut database = self.database().await;
        sqlx::query(
            "INSERT INTO reviews (movie_id, score, comment, author) VALUES ($1, $2, $3, $4)",
        )
        .bind(movie_id)
        .bind(score)
        .bind(comment)
        .bind(author)
        .execute(&mut database)
        .await
        .expect("add a review");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `moviedb-mcp` binary with only the environment a test sets: no `MOVIEDB_*`, `OPENAI_*`,
/// `DATABASE_URL` or `REDIS_URL` from outside (a developer's real key must not be used), and no
/// proxy for the local provider.
fn binary() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"));
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("MOVIEDB_") || name_text.starts_with("OPENAI_") {
            command.env_remove(&name);
        }
    }
    command
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env("MOVIEDB_JWT_SECRET", random_hex(24))
        .env("RUST_LOG", "info");
    command
}
