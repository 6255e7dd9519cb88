//! The movie tools (recommendMoviesForMood, summarizeMovieReviews, addToWatchlist, getWatchlist)
//! and sign-in, tested the way a user meets them: the real `moviedb-mcp` binary started as a
//! child process on a fresh catalogue, spoken to over real HTTP by the shared 2026-07-28 client
//! (which checks every message against the official schema).
//!
//! Every scenario runs twice, on the embedded SQLite database (`sqlite::…`) and on a fresh
//! PostgreSQL database (`postgres::…`). PostgreSQL comes from `TEST_POSTGRES_URL` (an admin
//! connection URL, default `postgres://postgres@127.0.0.1:5432/postgres`); when it is not
//! reachable the PostgreSQL tests fail, they do not skip.
//!
//! Expected data comes from the seed files the server loads (`src/moviedb/seed/*.tsv`).

mod support;

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Map, Value, json};
use support::cluster::random_hex;
use support::postgres::TestDatabase;
use support::{Client, Reply, RpcRequest, accept};

/// Generates one `#[tokio::test]` per backend for each scenario: `sqlite::<name>` and
/// `postgres::<name>`.
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $scenario() {
                    super::$scenario(super::Backend::Postgres).await;
                }
            )*
        }
    };
}

on_both_backends!(
    recommendations_are_the_best_rated_movies_for_the_mood_in_a_stable_order,
    an_unknown_mood_is_a_tool_error,
    exclude_watched_leaves_out_only_what_this_user_watched,
    movies_with_too_few_reviews_get_counts_only,
    reviews_are_summarized_with_their_band_themes_and_average,
    summarizing_with_a_progress_token_streams_progress_before_the_result,
    the_watch_list_needs_a_signed_in_user,
    add_needs_exactly_one_of_movie_and_tv_show,
    adding_an_unknown_title_names_it_without_asking,
    add_with_a_status_saves_at_once,
    add_without_a_status_asks_first_and_saves_watched,
    every_other_answer_saves_want_to_watch,
    a_client_that_cannot_ask_gets_want_to_watch_at_once,
    a_title_already_listed_is_refused_without_a_question,
    a_request_state_is_used_at_most_once,
    users_have_separate_watch_lists_and_states,
    the_watch_list_is_newest_first,
    invalid_and_expired_tokens_are_refused_with_401,
    the_token_subcommand_signs_a_user_in,
    the_seed_subcommand_adds_a_synthetic_catalogue,
);

/// What the tool description promises: up to 20 movies.
const RECOMMENDATION_LIMIT: usize = 20;
const MOODS: [&str; 6] = [
    "COMFORT",
    "ADVENTURE",
    "ROMANCE",
    "HORROR",
    "THOUGHTFUL",
    "COMEDY",
];
/// The question addToWatchlist asks, word for word.
const STATUS_QUESTION: &str = "Have you already watched this title, or is it one to watch later?";
const ALREADY_LISTED: &str = "already in your watch list";

// ---------------------------------------------------------------------------------------------
// recommendMoviesForMood
// ---------------------------------------------------------------------------------------------

async fn recommendations_are_the_best_rated_movies_for_the_mood_in_a_stable_order(
    backend: Backend,
) {
    let server = MovieServer::start(backend).await;
    let user = server.anonymous();

    let schema = server
        .output_schemas()
        .await
        .get("recommendMoviesForMood")
        .expect("tools/list shows an outputSchema for recommendMoviesForMood");
    assert_eq!(schema["type"], "object", "outputSchema: {schema}");
    assert!(
        schema["properties"].get("movies").is_some(),
        "the outputSchema describes movies: {schema}"
    );

    let reply = user
        .call(
            "recommendMoviesForMood",
            json!({"input": {"mood": "HORROR"}}),
        )
        .await;
    let content = structured(&reply).clone();
    let keys: Vec<&String> = content.as_object().expect("an object").keys().collect();
    assert_eq!(keys, ["movies"], "structuredContent is {{movies: […]}}");
    server
        .assert_fits_output_schema("recommendMoviesForMood", &content)
        .await;
    let horror = movies_of(&content);
    assert_recommendations_fit("HORROR", &horror);
    let seed_horror = seed_ranking("HORROR");
    assert_eq!(
        horror.len(),
        RECOMMENDATION_LIMIT.min(seed_horror.len()),
        "as many horror movies as the limit allows"
    );
    assert_eq!(
        ids(&horror),
        top_ids(&seed_horror, RECOMMENDATION_LIMIT),
        "the best-rated horror movies of the catalogue, ties by id"
    );

    for call in 2..=4 {
        let again = recommend(&user, json!({"mood": "HORROR"})).await;
        assert_eq!(
            again, horror,
            "call {call} gives the same movies in the same order"
        );
    }

    for mood in MOODS {
        let movies = recommend(&user, json!({"mood": mood})).await;
        assert_recommendations_fit(mood, &movies);
        assert_eq!(
            ids(&movies),
            top_ids(&seed_ranking(mood), RECOMMENDATION_LIMIT),
            "the best-rated {mood} movies, ties by id"
        );
    }
}

async fn an_unknown_mood_is_a_tool_error(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let user = server.anonymous();
    for mood in ["SCARY", ""] {
        let reply = user
            .call("recommendMoviesForMood", json!({"input": {"mood": mood}}))
            .await;
        tool_error(&reply);
    }
}

async fn exclude_watched_leaves_out_only_what_this_user_watched(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let bob = server.user("bob");
    let ranking = seed_ranking("HORROR");
    let everything = top_ids(&ranking, RECOMMENDATION_LIMIT);
    let watched = everything[0];
    let want = everything[2];

    add(&alice, json!({"movieId": watched}), "WATCHED").await;
    add(&alice, json!({"movieId": want}), "WANT_TO_WATCH").await;

    let filtered = recommend(&alice, json!({"mood": "HORROR", "excludeWatched": true})).await;
    assert_recommendations_fit("HORROR", &filtered);
    let filtered = ids(&filtered);
    assert!(
        !filtered.contains(&watched),
        "movie {watched}, marked WATCHED, is left out: {filtered:?}"
    );
    assert!(
        filtered.contains(&want),
        "movie {want}, only WANT_TO_WATCH, stays: {filtered:?}"
    );
    let without_watched: Vec<SeedMovie> = ranking.into_iter().filter(|m| m.id != watched).collect();
    assert_eq!(
        filtered,
        top_ids(&without_watched, RECOMMENDATION_LIMIT),
        "the next best movie moves up into the list"
    );

    assert_eq!(
        ids(&recommend(&alice, json!({"mood": "HORROR"})).await),
        everything,
        "without excludeWatched nothing is left out"
    );
    assert_eq!(
        ids(&recommend(&alice, json!({"mood": "HORROR", "excludeWatched": false})).await),
        everything,
        "excludeWatched: false leaves nothing out"
    );
    assert_eq!(
        ids(&recommend(&bob, json!({"mood": "HORROR", "excludeWatched": true})).await),
        everything,
        "alice's watched movies do not affect bob"
    );
}

// ---------------------------------------------------------------------------------------------
// summarizeMovieReviews
// ---------------------------------------------------------------------------------------------

async fn movies_with_too_few_reviews_get_counts_only(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let user = server.anonymous();
    assert!(seed_scores(999_999).is_empty() && seed_scores(1).is_empty());
    for movie_id in [999_999, 1] {
        let summary = summarize(&server, &user, movie_id).await;
        assert_eq!(summary["reviewCount"], 0, "movie {movie_id}: {summary}");
        assert_eq!(
            summary["summary"],
            Value::Null,
            "movie {movie_id}: {summary}"
        );
        assert_eq!(
            summary["averageScore"],
            Value::Null,
            "movie {movie_id}: {summary}"
        );
        assert_eq!(summary["themes"], json!([]), "movie {movie_id}: {summary}");
    }
    for (movie_id, count) in [(2, 1), (3, 2)] {
        let scores = seed_scores(movie_id);
        assert_eq!(scores.len(), count, "seed reviews of movie {movie_id}");
        let summary = summarize(&server, &user, movie_id).await;
        assert_eq!(
            summary["reviewCount"],
            json!(count),
            "movie {movie_id}: {summary}"
        );
        assert_average(&summary, &scores, movie_id);
        assert_eq!(
            summary["summary"],
            Value::Null,
            "movie {movie_id}: {summary}"
        );
        assert_eq!(
            summary["themes"],
            json!([]),
            "counts only below three reviews, movie {movie_id}: {summary}"
        );
    }
}

async fn reviews_are_summarized_with_their_band_themes_and_average(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let user = server.anonymous();
    for (movie_id, band, average) in [
        (4, "favourable", None),
        (5, "split", Some(5.65)),
        (6, "favourable", Some(8.85)),
        (7, "unfavourable", Some(2.56)),
    ] {
        let scores = seed_scores(movie_id);
        let summary = summarize(&server, &user, movie_id).await;
        assert_eq!(
            summary["reviewCount"],
            json!(scores.len()),
            "movie {movie_id}: {summary}"
        );
        assert_average(&summary, &scores, movie_id);
        if let Some(average) = average {
            let got = summary["averageScore"].as_f64().unwrap_or(f64::NAN);
            assert!(
                (got - average).abs() < 1e-9,
                "movie {movie_id} averages {average}: {summary}"
            );
        }
        let sentence = summary["summary"]
            .as_str()
            .unwrap_or_else(|| panic!("movie {movie_id} gets a summary: {summary}"))
            .to_lowercase();
        let (must, must_not): (&str, &[&str]) = match band {
            "favourable" => ("favourable", &["unfavourable", "split"]),
            "unfavourable" => ("unfavourable", &["split"]),
            _ => ("split", &["favourable"]),
        };
        assert!(
            sentence.contains(must),
            "movie {movie_id} is {band}: {sentence:?}"
        );
        for word in must_not {
            assert!(
                !sentence.contains(word),
                "movie {movie_id} is {band}, not {word}: {sentence:?}"
            );
        }
        let themes = summary["themes"].as_array().expect("themes is an array");
        assert!(
            (1..=5).contains(&themes.len()),
            "movie {movie_id} has 1 to 5 themes: {summary}"
        );
        let distinct: BTreeSet<&str> = themes
            .iter()
            .map(|t| t.as_str().expect("a theme is a string"))
            .collect();
        assert_eq!(distinct.len(), themes.len(), "themes repeat: {summary}");
        assert!(
            distinct.iter().all(|t| !t.trim().is_empty()),
            "empty theme: {summary}"
        );
    }
}

async fn summarizing_with_a_progress_token_streams_progress_before_the_result(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let token = json!("summary-of-6");
    let reply = server
        .anonymous()
        .request("tools/call")
        .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": 6}}))
        .progress_token(token.clone())
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 200, "body {}", reply.body_text());
    assert!(
        reply.is_event_stream(),
        "a call with a progress token is answered with SSE, got {}",
        reply.content_type()
    );
    let last = reply.messages.last().expect("the stream carries messages");
    assert!(
        last.get("result").is_some(),
        "the result comes last, after every notification: {}",
        reply.body_text()
    );
    let progress: Vec<(f64, &str)> = reply
        .notifications()
        .into_iter()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| {
            assert_eq!(n["params"]["progressToken"], token, "progress token: {n}");
            (
                n["params"]["progress"]
                    .as_f64()
                    .expect("progress is a number"),
                n["params"]["message"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        progress,
        [
            (0.0, "Loading reviews"),
            (0.4, "Summarizing"),
            (1.0, "Done")
        ],
        "progress notifications in order"
    );
    let summary = structured(&reply);
    assert_eq!(summary["reviewCount"], json!(seed_scores(6).len()));
}

// ---------------------------------------------------------------------------------------------
// addToWatchlist and getWatchlist
// ---------------------------------------------------------------------------------------------

async fn the_watch_list_needs_a_signed_in_user(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let anonymous = server.anonymous();
    for arguments in [
        json!({"subject": {"movieId": 6}, "status": "WATCHED"}),
        // No status, from a client that could be asked: still refused at once.
        json!({"subject": {"movieId": 6}}),
    ] {
        let text = tool_error(&anonymous.call("addToWatchlist", arguments.clone()).await);
        assert!(
            text.to_lowercase().contains("sign in"),
            "addToWatchlist {arguments} says to sign in: {text:?}"
        );
    }
    let text = tool_error(&anonymous.call("getWatchlist", json!({})).await);
    assert!(
        text.to_lowercase().contains("sign in"),
        "getWatchlist says to sign in: {text:?}"
    );
    assert!(
        server.user("alice").watchlist().await.is_empty(),
        "a signed-in user can read the list"
    );
}

async fn add_needs_exactly_one_of_movie_and_tv_show(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    for arguments in [
        json!({"subject": {"movieId": 6, "tvShowId": 3}}),
        json!({"subject": {"movieId": 6, "tvShowId": 3}, "status": "WATCHED"}),
        json!({"subject": {}}),
        json!({"subject": {}, "status": "WATCHED"}),
    ] {
        let text = tool_error(&alice.call("addToWatchlist", arguments.clone()).await);
        assert!(
            text.to_lowercase().contains("exactly one"),
            "{arguments} is refused for needing exactly one title: {text:?}"
        );
    }
    assert!(alice.watchlist().await.is_empty(), "nothing was added");
}

async fn adding_an_unknown_title_names_it_without_asking(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    for (subject, id) in [
        (json!({"movieId": 999_999}), "999999"),
        (json!({"tvShowId": 999_998}), "999998"),
    ] {
        // Without a status, from a client that can be asked: the error comes first.
        for arguments in [
            json!({"subject": subject}),
            json!({"subject": subject, "status": "WANT_TO_WATCH"}),
        ] {
            let reply = alice.call("addToWatchlist", arguments.clone()).await;
            let text = tool_error(&reply);
            assert!(
                text.contains(id),
                "{arguments}: the error names {id}: {text:?}"
            );
        }
    }
    assert!(alice.watchlist().await.is_empty(), "nothing was added");
}

async fn add_with_a_status_saves_at_once(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");

    let movie = add(&alice, json!({"movieId": 6}), "WATCHED").await;
    assert_eq!(movie["content"]["title"], seed_movie_title(6), "{movie}");
    assert_eq!(seed_movie_title(6), "The Godfather");
    let show = add(&alice, json!({"tvShowId": 3}), "WANT_TO_WATCH").await;
    assert_eq!(show["content"]["title"], seed_tv_show_title(3), "{show}");
    assert_ne!(movie["id"], show["id"], "each item has its own id");

    let list = alice.watchlist().await;
    assert_eq!(list.len(), 2, "{list:?}");
    for saved in [&movie, &show] {
        let item = list
            .iter()
            .find(|item| item["id"] == saved["id"])
            .unwrap_or_else(|| panic!("{saved} is on the list {list:?}"));
        assert_eq!(item["status"], saved["status"], "{item}");
        assert_eq!(
            item["content"]["title"], saved["content"]["title"],
            "{item}"
        );
    }
}

async fn add_without_a_status_asks_first_and_saves_watched(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let arguments = json!({"subject": {"movieId": 6}});

    let round_one = alice.call("addToWatchlist", arguments.clone()).await;
    let state = status_question(&round_one);
    assert!(
        alice.watchlist().await.is_empty(),
        "nothing is written before the user answers"
    );

    let answer = json!({"status": accept(json!({"status": "WATCHED"}))});
    let done = alice
        .retry("addToWatchlist", arguments, answer, &state)
        .await;
    let saved = saved_item(&done);
    assert_eq!(saved["status"], "WATCHED", "{saved}");
    assert_eq!(saved["content"]["title"], seed_movie_title(6), "{saved}");
    server
        .assert_fits_output_schema("addToWatchlist", saved)
        .await;

    let list = alice.watchlist().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["status"], "WATCHED", "{list:?}");
    assert_eq!(list[0]["content"]["title"], seed_movie_title(6), "{list:?}");
}

async fn every_other_answer_saves_want_to_watch(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let cases = [
        (
            "accept WANT_TO_WATCH",
            2,
            accept(json!({"status": "WANT_TO_WATCH"})),
        ),
        ("decline", 3, json!({"action": "decline"})),
        ("cancel", 4, json!({"action": "cancel"})),
        ("accept with empty content", 5, accept(json!({}))),
        (
            "accept with an invalid status",
            6,
            accept(json!({"status": "MAYBE"})),
        ),
    ];
    let count = cases.len();
    for (case, movie_id, answer) in cases {
        let arguments = json!({"subject": {"movieId": movie_id}});
        let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
        let done = alice
            .retry(
                "addToWatchlist",
                arguments,
                json!({"status": answer}),
                &state,
            )
            .await;
        let saved = saved_item(&done);
        assert_eq!(saved["status"], "WANT_TO_WATCH", "{case}: {saved}");
        let title = seed_movie_title(movie_id);
        assert_eq!(saved["content"]["title"], title, "{case}: {saved}");
        let list = alice.watchlist().await;
        let item = list
            .iter()
            .find(|item| item["content"]["title"] == title)
            .unwrap_or_else(|| panic!("{case}: {title} is on the list {list:?}"));
        assert_eq!(item["status"], "WANT_TO_WATCH", "{case}: {item}");
    }
    assert_eq!(alice.watchlist().await.len(), count, "one item per case");
}

async fn a_client_that_cannot_ask_gets_want_to_watch_at_once(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    for (movie_id, capabilities) in [
        (6, no_capabilities()),
        (7, json!({"sampling": {}, "roots": {}})),
    ] {
        let reply = alice
            .call_with(
                "addToWatchlist",
                json!({"subject": {"movieId": movie_id}}),
                capabilities.clone(),
            )
            .await;
        let saved = saved_item(&reply);
        assert_eq!(saved["status"], "WANT_TO_WATCH", "{capabilities}: {saved}");
        assert_eq!(saved["content"]["title"], seed_movie_title(movie_id));
    }
    let list = alice.watchlist().await;
    assert_eq!(list.len(), 2, "{list:?}");
    assert!(
        list.iter().all(|item| item["status"] == "WANT_TO_WATCH"),
        "{list:?}"
    );
}

async fn a_title_already_listed_is_refused_without_a_question(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    add(&alice, json!({"movieId": 6}), "WATCHED").await;
    add(&alice, json!({"tvShowId": 3}), "WANT_TO_WATCH").await;

    for arguments in [
        // No status, from a client that can be asked: refused at once, not asked.
        json!({"subject": {"movieId": 6}}),
        json!({"subject": {"movieId": 6}, "status": "WANT_TO_WATCH"}),
        json!({"subject": {"tvShowId": 3}}),
        json!({"subject": {"tvShowId": 3}, "status": "WATCHED"}),
    ] {
        let text = tool_error(&alice.call("addToWatchlist", arguments.clone()).await);
        assert!(text.contains(ALREADY_LISTED), "{arguments}: {text:?}");
    }

    // Listed while the question was open: the answer does not add it a second time.
    let arguments = json!({"subject": {"movieId": 7}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
    add(&alice, json!({"movieId": 7}), "WATCHED").await;
    let answer = json!({"status": accept(json!({"status": "WANT_TO_WATCH"}))});
    let late = alice
        .retry("addToWatchlist", arguments, answer, &state)
        .await;
    let text = tool_error(&late);
    assert!(text.contains(ALREADY_LISTED), "late answer: {text:?}");

    let list = alice.watchlist().await;
    assert_eq!(list.len(), 3, "one row per title: {list:?}");
    let status_of = |title: String| {
        list.iter()
            .find(|item| item["content"]["title"] == title)
            .map(|item| item["status"].clone())
    };
    assert_eq!(status_of(seed_movie_title(6)), Some(json!("WATCHED")));
    assert_eq!(
        status_of(seed_tv_show_title(3)),
        Some(json!("WANT_TO_WATCH"))
    );
    assert_eq!(status_of(seed_movie_title(7)), Some(json!("WATCHED")));
}

async fn a_request_state_is_used_at_most_once(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let watched = json!({"status": accept(json!({"status": "WATCHED"}))});

    // One after the other.
    let arguments = json!({"subject": {"movieId": 6}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
    let first = alice
        .retry("addToWatchlist", arguments.clone(), watched.clone(), &state)
        .await;
    assert_eq!(structured(&first)["status"], "WATCHED");
    let second = alice
        .retry("addToWatchlist", arguments, watched.clone(), &state)
        .await;
    assert_rpc_error(&second, -32602);
    let list = alice.watchlist().await;
    assert_eq!(list.len(), 1, "exactly one row: {list:?}");

    // Both at once.
    let arguments = json!({"subject": {"movieId": 7}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
    let (a, b) = tokio::join!(
        alice.retry("addToWatchlist", arguments.clone(), watched.clone(), &state),
        alice.retry("addToWatchlist", arguments, watched, &state),
    );
    let (done, refused) = if a.response().get("error").is_some() {
        (b, a)
    } else {
        (a, b)
    };
    assert_eq!(structured(&done)["status"], "WATCHED");
    assert_rpc_error(&refused, -32602);
    let list = alice.watchlist().await;
    let title = seed_movie_title(7);
    assert_eq!(
        list.iter()
            .filter(|item| item["content"]["title"] == title)
            .count(),
        1,
        "exactly one row for {title}: {list:?}"
    );
    assert_eq!(list.len(), 2, "{list:?}");
}

async fn users_have_separate_watch_lists_and_states(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let bob = server.user("bob");

    add(&alice, json!({"movieId": 6}), "WATCHED").await;
    add(&bob, json!({"movieId": 6}), "WANT_TO_WATCH").await;
    add(&bob, json!({"movieId": 7}), "WATCHED").await;

    let titles_and_statuses = |list: Vec<Value>| -> Vec<(String, String)> {
        list.iter()
            .map(|item| {
                (
                    item["content"]["title"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    item["status"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let alice_before = titles_and_statuses(alice.watchlist().await);
    let bob_before = titles_and_statuses(bob.watchlist().await);
    assert_eq!(
        alice_before,
        [(seed_movie_title(6), "WATCHED".to_owned())],
        "alice's list"
    );
    assert_eq!(
        bob_before,
        [
            (seed_movie_title(7), "WATCHED".to_owned()),
            (seed_movie_title(6), "WANT_TO_WATCH".to_owned()),
        ],
        "bob's list"
    );

    // A state issued to alice cannot be finished by bob.
    let arguments = json!({"subject": {"movieId": 4}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
    let answer = json!({"status": accept(json!({"status": "WATCHED"}))});
    let stolen = bob.retry("addToWatchlist", arguments, answer, &state).await;
    assert_rpc_error(&stolen, -32602);
    assert_eq!(titles_and_statuses(alice.watchlist().await), alice_before);
    assert_eq!(titles_and_statuses(bob.watchlist().await), bob_before);
}

async fn the_watch_list_is_newest_first(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    add(&alice, json!({"movieId": 1}), "WANT_TO_WATCH").await;
    add(&alice, json!({"movieId": 2}), "WATCHED").await;
    add(&alice, json!({"tvShowId": 3}), "WANT_TO_WATCH").await;
    let list = alice.watchlist().await;
    let titles: Vec<&str> = list
        .iter()
        .map(|item| item["content"]["title"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        titles,
        [
            seed_tv_show_title(3),
            seed_movie_title(2),
            seed_movie_title(1)
        ],
        "newest first"
    );
    let reply = alice.call("getWatchlist", json!({})).await;
    server
        .assert_fits_output_schema("getWatchlist", structured(&reply))
        .await;
}

// ---------------------------------------------------------------------------------------------
// Sign-in
// ---------------------------------------------------------------------------------------------

async fn invalid_and_expired_tokens_are_refused_with_401(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let carol = server.user("carol");
    assert!(
        carol.watchlist().await.is_empty(),
        "a valid token is accepted"
    );

    let now = chrono::Utc::now().timestamp();
    let expired = sign_token(server.secret.as_bytes(), "carol", now - 7200, now - 3600);
    let foreign = sign_token(
        b"a different secret, long enough to sign with",
        "carol",
        now,
        now + 3600,
    );
    for (what, token) in [
        ("not a JWT", "not-a-jwt".to_owned()),
        ("signed with another secret", foreign),
        ("expired an hour ago", expired),
    ] {
        let session = server.with_token(&token);
        for (tool, arguments) in [
            (
                "addToWatchlist",
                json!({"subject": {"movieId": 6}, "status": "WATCHED"}),
            ),
            ("getWatchlist", json!({})),
        ] {
            let reply = session.call(tool, arguments).await;
            assert_eq!(
                reply.status.as_u16(),
                401,
                "{tool} with a token {what}: body {}",
                reply.body_text()
            );
            let challenge = reply
                .header("www-authenticate")
                .unwrap_or_else(|| panic!("401 for a token {what} carries WWW-Authenticate"));
            assert!(
                challenge.starts_with("Bearer error=\"invalid_token\""),
                "{tool} with a token {what}: WWW-Authenticate {challenge:?}"
            );
        }
    }
    assert!(
        carol.watchlist().await.is_empty(),
        "refused requests wrote nothing"
    );
}

async fn the_token_subcommand_signs_a_user_in(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let mut command = binary(&server.secret, server.database_url.as_deref());
    command
        .args(["token", "--user", "carol", "--data-dir"])
        .arg(&server.data_dir)
        .stdin(Stdio::null());
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::from(command).output(),
    )
    .await
    .expect("the token subcommand finishes")
    .expect("the token subcommand runs");
    assert!(
        output.status.success(),
        "token --user carol failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).expect("the token is text");
    let token = stdout.trim();
    assert_eq!(
        token.split('.').count(),
        3,
        "token --user carol prints a JWT: {stdout:?}"
    );

    let carol = server.with_token(token);
    add(&carol, json!({"movieId": 6}), "WATCHED").await;
    let list = carol.watchlist().await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["content"]["title"], seed_movie_title(6));
    assert_eq!(
        server.user("carol").watchlist().await,
        list,
        "it is carol's list"
    );
    assert!(
        server.user("alice").watchlist().await.is_empty(),
        "and nobody else's"
    );
}

async fn the_seed_subcommand_adds_a_synthetic_catalogue(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let seeded_movies = seed_movies().len() as i64;
    let seeded_reviews = include_str!("../src/moviedb/seed/reviews.tsv")
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .count() as i64;
    let mut command = binary(&server.secret, server.database_url.as_deref());
    command
        .args(["seed", "--movies", "300", "--reviews", "1500", "--data-dir"])
        .arg(&server.data_dir)
        .stdin(Stdio::null());
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::from(command).output(),
    )
    .await
    .expect("the seed subcommand finishes")
    .expect("the seed subcommand runs");
    assert!(
        output.status.success(),
        "seed failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    let url = match &server.database_url {
        Some(url) => url.clone(),
        None => format!(
            "sqlite://{}",
            server.data_dir.join("moviedb.sqlite3").display()
        ),
    };
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url)
        .await
        .expect("open the server's database");
    let movies: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM movies")
        .fetch_one(&pool)
        .await
        .expect("count movies");
    let reviews: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM reviews")
        .fetch_one(&pool)
        .await
        .expect("count reviews");
    pool.close().await;
    assert_eq!(movies, seeded_movies + 300);
    assert_eq!(reviews, seeded_reviews + 1500);

    // The running server sees the new titles at once.
    let last = seeded_movies + 300;
    let saved = add(
        &server.user("frank"),
        json!({"movieId": last}),
        "WANT_TO_WATCH",
    )
    .await;
    assert_eq!(
        saved["content"]["title"],
        format!("Synthetic Feature {last}")
    );
}

// ---------------------------------------------------------------------------------------------
// Tool helpers
// ---------------------------------------------------------------------------------------------

/// The `movies` of a recommendation for `input` (must succeed).
async fn recommend(session: &Session, input: Value) -> Vec<Value> {
    let reply = session
        .call("recommendMoviesForMood", json!({"input": input}))
        .await;
    movies_of(structured(&reply))
}

fn movies_of(content: &Value) -> Vec<Value> {
    content["movies"]
        .as_array()
        .unwrap_or_else(|| panic!("structuredContent without movies: {content}"))
        .clone()
}

fn ids(movies: &[Value]) -> Vec<i64> {
    movies
        .iter()
        .map(|m| m["id"].as_i64().unwrap_or_else(|| panic!("movie id: {m}")))
        .collect()
}

fn top_ids(ranking: &[SeedMovie], limit: usize) -> Vec<i64> {
    ranking.iter().take(limit).map(|m| m.id).collect()
}

/// Every movie has the documented fields, matches the catalogue and fits `mood`; ratings never
/// increase and equal ratings are in id order.
fn assert_recommendations_fit(mood: &str, movies: &[Value]) {
    assert!(
        !movies.is_empty() && movies.len() <= RECOMMENDATION_LIMIT,
        "1 to {RECOMMENDATION_LIMIT} movies for {mood}, got {}",
        movies.len()
    );
    let catalogue: HashMap<i64, SeedMovie> = seed_movies().into_iter().map(|m| (m.id, m)).collect();
    for movie in movies {
        let keys: BTreeSet<&str> = movie
            .as_object()
            .unwrap_or_else(|| panic!("a movie is an object: {movie}"))
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            BTreeSet::from(["genre", "id", "rating", "releaseYear", "title"]),
            "{movie}"
        );
        let id = movie["id"].as_i64().expect("id is an integer");
        let seed = catalogue
            .get(&id)
            .unwrap_or_else(|| panic!("movie {id} is not in the catalogue"));
        assert!(
            seed.moods.iter().any(|m| m == mood),
            "{} does not fit {mood} (its moods: {:?})",
            seed.title,
            seed.moods
        );
        assert_eq!(movie["title"], seed.title.as_str(), "{movie}");
        assert_eq!(movie["releaseYear"], seed.release_year, "{movie}");
        assert_eq!(movie["genre"], seed.genre.as_str(), "{movie}");
        assert_eq!(movie["rating"].as_f64(), Some(seed.rating), "{movie}");
    }
    for pair in movies.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let (ra, rb) = (a["rating"].as_f64(), b["rating"].as_f64());
        assert!(ra >= rb, "ratings must not increase: {a} then {b}");
        if ra == rb {
            assert!(
                a["id"].as_i64() < b["id"].as_i64(),
                "equal ratings are ordered by id: {a} then {b}"
            );
        }
    }
}

/// The summary of `movie_id` (must succeed and fit the declared output schema).
async fn summarize(server: &MovieServer, session: &Session, movie_id: i64) -> Value {
    let reply = session
        .call("summarizeMovieReviews", json!({"movieId": movie_id}))
        .await;
    let summary = structured(&reply).clone();
    server
        .assert_fits_output_schema("summarizeMovieReviews", &summary)
        .await;
    assert_eq!(summary["movieId"], movie_id, "{summary}");
    summary
}

/// `averageScore` is the mean of the seed scores, to two decimals.
fn assert_average(summary: &Value, scores: &[i64], movie_id: i64) {
    let expected = mean(scores);
    let got = summary["averageScore"]
        .as_f64()
        .unwrap_or_else(|| panic!("movie {movie_id} has an averageScore: {summary}"));
    assert!(
        (got - expected).abs() <= 0.005 + 1e-9,
        "movie {movie_id}: averageScore {got}, mean of the reviews {expected}"
    );
}

/// Adds `subject` with `status` given, which must save at once; returns the saved item.
async fn add(session: &Session, subject: Value, status: &str) -> Value {
    let reply = session
        .call(
            "addToWatchlist",
            json!({"subject": subject, "status": status}),
        )
        .await;
    let saved = saved_item(&reply).clone();
    assert_eq!(saved["status"], status, "{saved}");
    saved
}

/// The item addToWatchlist saved: `{id, status, content: {title}}`.
fn saved_item(reply: &Reply) -> &Value {
    let saved = structured(reply);
    let keys: BTreeSet<&str> = saved
        .as_object()
        .unwrap_or_else(|| panic!("the saved item is an object: {saved}"))
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, BTreeSet::from(["content", "id", "status"]), "{saved}");
    assert!(saved["id"].is_i64(), "the saved item has an id: {saved}");
    assert!(
        saved["content"]["title"].is_string(),
        "the saved item names its title: {saved}"
    );
    saved
}

/// Checks that `reply` asks the status question and returns its `requestState`.
fn status_question(reply: &Reply) -> String {
    assert_eq!(reply.status.as_u16(), 200, "body {}", reply.body_text());
    assert_eq!(
        reply.result_type(),
        "input_required",
        "expected the status question: {}",
        reply.body_text()
    );
    let requests = reply.input_requests();
    let keys: Vec<&String> = requests.keys().collect();
    assert_eq!(keys, ["status"], "one question, keyed status");
    let request = &requests["status"];
    assert_eq!(request["method"], "elicitation/create", "{request}");
    let params = &request["params"];
    assert_eq!(params["message"], STATUS_QUESTION, "{request}");
    let schema = &params["requestedSchema"];
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(required.contains(&"status"), "status is required: {schema}");
    let field = &schema["properties"]["status"];
    let options: BTreeSet<&str> = match (field.get("enum"), field.get("oneOf"), field.get("anyOf"))
    {
        (Some(values), _, _) => values
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect(),
        (None, Some(choices), _) | (None, None, Some(choices)) => choices
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("const").and_then(Value::as_str))
            .collect(),
        _ => BTreeSet::new(),
    };
    assert_eq!(
        options,
        BTreeSet::from(["WANT_TO_WATCH", "WATCHED"]),
        "the status options: {field}"
    );
    reply.request_state()
}

/// An HS256 token for `user` with the given issue and expiry times (seconds since the epoch).
fn sign_token(secret: &[u8], user: &str, iat: i64, exp: i64) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": user, "iat": iat, "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(secret).expect("an HMAC key"),
    )
    .expect("sign a token")
}

/// Client capabilities of a client that can show a form to its user.
fn eliciting() -> Value {
    json!({"elicitation": {"form": {}}})
}

/// Client capabilities of a client that cannot ask its user anything.
fn no_capabilities() -> Value {
    json!({})
}

// ---------------------------------------------------------------------------------------------
// The server under test and its database
// ---------------------------------------------------------------------------------------------

/// How long the server may take to accept connections (it migrates and seeds first).
const STARTUP_LIMIT: Duration = Duration::from_secs(30);

/// Where the catalogue lives for one test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// The embedded SQLite file in the data folder.
    Sqlite,
    /// A fresh PostgreSQL database (`DATABASE_URL`).
    Postgres,
}

// ---------------------------------------------------------------------------------------------
// The server: the real binary as a child process
// ---------------------------------------------------------------------------------------------

/// The `moviedb-mcp` binary in an environment the test controls. The outer environment is not
/// inherited, so settings such as `DATABASE_URL`, `REDIS_URL`, `OPENAI_API_KEY` or any
/// `MOVIEDB_*` variable of the developer's shell or of CI cannot change what is tested; only the
/// system basics and libpq's `PG*` defaults (a password for `TEST_POSTGRES_URL`, say) pass.
fn binary(secret: &str, database_url: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"));
    command.env_clear();
    for (name, value) in std::env::vars_os() {
        let passes = name.to_str().is_some_and(|name| {
            ["PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH"].contains(&name) || name.starts_with("PG")
        });
        if passes {
            command.env(name, value);
        }
    }
    command.env("MOVIEDB_JWT_SECRET", secret);
    command.env("RUST_LOG", "info");
    if let Some(url) = database_url {
        command.env("DATABASE_URL", url);
    }
    command
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind 127.0.0.1:0 to find a free port")
}

/// A running `moviedb-mcp` serving a fresh catalogue; killed, and its data removed, on drop.
struct MovieServer {
    child: Child,
    data_dir: PathBuf,
    secret: String,
    database_url: Option<String>,
    client: Client,
    output_schemas: tokio::sync::OnceCell<HashMap<String, Value>>,
    /// Dropped after the child is killed (fields drop after `Drop::drop`).
    _database: Option<TestDatabase>,
}

/// Makes sure the server really keeps its catalogue where the backend says: the SQLite file in
/// the data folder, or the test's PostgreSQL database (seeded, so not left empty).
async fn assert_catalogue_in(backend: Backend, data_dir: &Path, database: Option<&TestDatabase>) {
    match (backend, database) {
        (Backend::Sqlite, _) => assert!(
            data_dir.join("moviedb.sqlite3").is_file(),
            "the SQLite server keeps its catalogue in {}",
            data_dir.display()
        ),
        (Backend::Postgres, Some(database)) => {
            assert!(
                database.movie_count().await > 0,
                "the server seeded the PostgreSQL database"
            );
        }
        (Backend::Postgres, None) => unreachable!("a PostgreSQL run has a database"),
    }
}

enum Startup {
    Ready,
    Exited(String),
    TimedOut,
}

impl MovieServer {
    async fn start(backend: Backend) -> Self {
        let database = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(TestDatabase::create().await),
        };
        let database_url = database.as_ref().map(|db| db.url.clone());
        let data_dir = std::env::temp_dir().join(format!(
            "moviedb-mcp-movie-tools-{}-{}",
            std::process::id(),
            random_hex(8)
        ));
        std::fs::create_dir_all(&data_dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", data_dir.display()));
        let secret = random_hex(24);
        let log_path = data_dir.join("server.log");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
            let log = std::fs::File::create(&log_path).expect("create the server log");
            let mut command = binary(&secret, database_url.as_deref());
            command
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--bind")
                .arg(addr.to_string())
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log handle"))
                .stderr(log);
            let child = command
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start moviedb-mcp: {e}"));
            let mut server = Self {
                child,
                data_dir: data_dir.clone(),
                secret: secret.clone(),
                database_url: database_url.clone(),
                client: Client::new(format!("http://{addr}{}", moviedb_mcp::app::MCP_PATH)),
                output_schemas: tokio::sync::OnceCell::new(),
                _database: None,
            };
            match server.wait_until_ready(addr).await {
                Startup::Ready => {
                    assert_catalogue_in(backend, &data_dir, database.as_ref()).await;
                    server._database = database;
                    return server;
                }
                Startup::Exited(log) if attempt < 5 && log.contains("cannot listen") => {
                    // Someone took the port between our probe and the server's bind: try another.
                    server.forget_data_dir();
                    continue;
                }
                Startup::Exited(log) => {
                    panic!("moviedb-mcp ({backend:?}) exited before serving; its log:\n{log}")
                }
                Startup::TimedOut => {
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    panic!(
                        "moviedb-mcp ({backend:?}) did not accept connections on {addr} within {STARTUP_LIMIT:?}; its log:\n{log}"
                    )
                }
            }
        }
    }

    async fn wait_until_ready(&mut self, addr: SocketAddr) -> Startup {
        let deadline = tokio::time::Instant::now() + STARTUP_LIMIT;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let log =
                    std::fs::read_to_string(self.data_dir.join("server.log")).unwrap_or_default();
                return Startup::Exited(log);
            }
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                return Startup::Ready;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Startup::TimedOut
    }

    /// Keeps the data folder when this (failed) instance is dropped; the next attempt reuses it.
    fn forget_data_dir(&mut self) {
        self.data_dir = PathBuf::new();
    }

    /// A client without credentials.
    fn anonymous(&self) -> Session {
        Session {
            client: self.client.clone(),
            bearer: None,
        }
    }

    /// A client signed in as `user` with a token minted from the server's secret.
    fn user(&self, user: &str) -> Session {
        let token =
            moviedb_mcp::auth::mint_token(self.secret.as_bytes(), user, Duration::from_secs(3600))
                .expect("mint a test token");
        self.with_token(&token)
    }

    /// A client that sends `Authorization: Bearer <token>` as given.
    fn with_token(&self, token: &str) -> Session {
        Session {
            client: self.client.clone(),
            bearer: Some(token.to_owned()),
        }
    }

    /// The `outputSchema` each tool declares in `tools/list`, fetched once.
    async fn output_schemas(&self) -> &HashMap<String, Value> {
        self.output_schemas
            .get_or_init(|| async {
                let reply = self.anonymous().request("tools/list").send().await;
                let tools = reply
                    .result()
                    .get("tools")
                    .and_then(Value::as_array)
                    .unwrap_or_else(|| panic!("tools/list without tools: {}", reply.body_text()));
                tools
                    .iter()
                    .filter_map(|tool| {
                        let name = tool.get("name")?.as_str()?.to_owned();
                        Some((name, tool.get("outputSchema")?.clone()))
                    })
                    .collect()
            })
            .await
    }

    /// Panics unless `structured` fits the `outputSchema` that `tool` declares.
    async fn assert_fits_output_schema(&self, tool: &str, structured: &Value) {
        let schema = self
            .output_schemas()
            .await
            .get(tool)
            .unwrap_or_else(|| panic!("tools/list shows no outputSchema for {tool}"));
        let validator = jsonschema::validator_for(schema)
            .unwrap_or_else(|e| panic!("the outputSchema of {tool} does not compile: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(structured)
            .map(|e| format!("  - at {}: {e}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "structuredContent of {tool} does not fit its outputSchema:\n{}\nstructuredContent: {structured}",
            errors.join("\n")
        );
    }
}

impl Drop for MovieServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.data_dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions and results
// ---------------------------------------------------------------------------------------------

/// One client of the server, signed in or not.
#[derive(Clone)]
struct Session {
    client: Client,
    bearer: Option<String>,
}

impl Session {
    /// A request with the standard headers and `_meta`, plus the bearer token if any.
    fn request(&self, method: &str) -> RpcRequest<'_> {
        let request = self.client.request(method);
        match &self.bearer {
            Some(token) => request.header("authorization", format!("Bearer {token}")),
            None => request,
        }
    }

    /// `tools/call` from a client that can show forms.
    async fn call(&self, tool: &str, arguments: Value) -> Reply {
        self.call_with(tool, arguments, eliciting()).await
    }

    /// `tools/call` declaring `capabilities`.
    async fn call_with(&self, tool: &str, arguments: Value, capabilities: Value) -> Reply {
        self.request("tools/call")
            .params(json!({"name": tool, "arguments": arguments}))
            .capabilities(capabilities)
            .send()
            .await
    }

    /// The retry of an `input_required` call: same tool and arguments, the answers and the state.
    async fn retry(
        &self,
        tool: &str,
        arguments: Value,
        input_responses: Value,
        request_state: &str,
    ) -> Reply {
        self.request("tools/call")
            .params(json!({
                "name": tool,
                "arguments": arguments,
                "inputResponses": input_responses,
                "requestState": request_state,
            }))
            .capabilities(eliciting())
            .send()
            .await
    }

    /// The items of this user's watch list (getWatchlist must succeed).
    async fn watchlist(&self) -> Vec<Value> {
        let reply = self.call("getWatchlist", json!({})).await;
        structured(&reply)
            .get("items")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("getWatchlist without items: {}", reply.body_text()))
            .clone()
    }
}

/// The result of a finished call (HTTP 200, `resultType: complete`).
fn complete(reply: &Reply) -> &Map<String, Value> {
    assert_eq!(
        reply.status.as_u16(),
        200,
        "HTTP status (body {})",
        reply.body_text()
    );
    assert_eq!(
        reply.result_type(),
        "complete",
        "expected a finished result, got {}",
        reply.body_text()
    );
    reply.result().as_object().expect("result is an object")
}

fn is_error(result: &Map<String, Value>) -> bool {
    result.get("isError").and_then(Value::as_bool) == Some(true)
}

/// The `structuredContent` of a successful tool result.
fn structured(reply: &Reply) -> &Value {
    let result = complete(reply);
    assert!(
        !is_error(result),
        "expected success, got a tool error: {}",
        reply.body_text()
    );
    result
        .get("structuredContent")
        .unwrap_or_else(|| panic!("result without structuredContent: {}", reply.body_text()))
}

/// The text of a tool error (`isError: true`), answered at once (no `input_required`).
fn tool_error(reply: &Reply) -> String {
    let result = complete(reply);
    assert!(
        is_error(result),
        "expected a tool error (isError: true), got {}",
        reply.body_text()
    );
    let text = reply.text();
    assert!(!text.is_empty(), "a tool error should say what went wrong");
    text
}

/// Asserts a JSON-RPC error with `code`.
fn assert_rpc_error(reply: &Reply, code: i64) {
    assert!(
        reply.response().get("error").is_some(),
        "expected a JSON-RPC error {code}, got {}",
        reply.body_text()
    );
    assert_eq!(
        reply.error_code(),
        code,
        "JSON-RPC error code (body {})",
        reply.body_text()
    );
}

// ---------------------------------------------------------------------------------------------
// The seed data, read from the files the server seeds from
// ---------------------------------------------------------------------------------------------

fn seed_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/moviedb/seed")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the seed file {}: {e}", path.display()))
}

/// The rows of a seed TSV file, without its header.
fn seed_rows(name: &str) -> Vec<Vec<String>> {
    seed_file(name)
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            line.trim_end_matches('\r')
                .split('\t')
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
struct SeedMovie {
    id: i64,
    title: String,
    release_year: i64,
    genre: String,
    rating: f64,
    moods: Vec<String>,
}

fn seed_movies() -> Vec<SeedMovie> {
    seed_rows("movies.tsv")
        .into_iter()
        .map(|f| SeedMovie {
            id: f[0].trim().parse().expect("movie id"),
            title: f[1].clone(),
            release_year: f[2].trim().parse().expect("release year"),
            genre: f[3].clone(),
            rating: f[4].trim().parse().expect("rating"),
            moods: f[5]
                .split(',')
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect(),
        })
        .collect()
}

/// Movies that fit `mood`, best rated first, ties by id.
fn seed_ranking(mood: &str) -> Vec<SeedMovie> {
    let mut movies: Vec<SeedMovie> = seed_movies()
        .into_iter()
        .filter(|m| m.moods.iter().any(|x| x == mood))
        .collect();
    movies.sort_by(|a, b| b.rating.total_cmp(&a.rating).then(a.id.cmp(&b.id)));
    movies
}

fn seed_movie_title(id: i64) -> String {
    seed_movies()
        .into_iter()
        .find(|m| m.id == id)
        .unwrap_or_else(|| panic!("no movie {id} in the seed"))
        .title
}

fn seed_tv_show_title(id: i64) -> String {
    seed_rows("tv_shows.tsv")
        .into_iter()
        .find(|f| f[0].trim().parse::<i64>().ok() == Some(id))
        .unwrap_or_else(|| panic!("no TV show {id} in the seed"))[1]
        .clone()
}

/// The review scores of `movie_id` in the seed.
fn seed_scores(movie_id: i64) -> Vec<i64> {
    seed_rows("reviews.tsv")
        .into_iter()
        .filter(|f| f[0].trim().parse::<i64>().ok() == Some(movie_id))
        .map(|f| f[2].trim().parse().expect("review score"))
        .collect()
}

fn mean(scores: &[i64]) -> f64 {
    scores.iter().sum::<i64>() as f64 / scores.len() as f64
}
