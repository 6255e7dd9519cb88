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
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use support::movies::*;
use support::{Reply, accept};

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
    a_change_to_the_catalogue_shows_in_the_next_answer,
    a_catalogue_whose_version_went_back_is_read_afresh,
    exclude_watched_leaves_out_only_what_this_user_watched,
    movies_with_too_few_reviews_get_counts_only,
    reviews_are_summarized_with_their_band_themes_and_average,
    summarizing_with_a_progress_token_streams_progress_before_the_result,
    the_watch_list_needs_a_signed_in_user,
    add_needs_exactly_one_of_movie_and_tv_show,
    adding_an_unknown_title_names_it_without_asking,
    a_renamed_or_deleted_title_shows_in_the_next_answer,
    add_with_a_status_saves_at_once,
    a_write_that_fails_half_way_saves_nothing_and_can_be_retried,
    an_item_the_database_refuses_fails_alone_not_with_the_items_saved_beside_it,
    add_without_a_status_asks_first_and_saves_watched,
    every_other_answer_saves_want_to_watch,
    an_answer_that_does_not_fit_the_form_is_refused_and_the_question_stands,
    a_client_that_cannot_ask_gets_want_to_watch_at_once,
    a_title_already_listed_is_refused_without_a_question,
    a_request_state_is_used_at_most_once,
    fifty_conversations_adding_one_title_save_it_once,
    users_have_separate_watch_lists_and_states,
    the_watch_list_is_newest_first,
    invalid_and_expired_tokens_are_refused_with_401,
    the_token_subcommand_signs_a_user_in,
    the_seed_subcommand_adds_a_synthetic_catalogue,
    ids_are_strings_and_integers_are_still_accepted,
);

/// PostgreSQL only: its lock time limit is a setting of the server's connections.
mod postgres_only {
    #[tokio::test]
    async fn an_addition_waiting_on_a_row_locked_elsewhere_fails_in_time_and_can_be_retried() {
        super::an_addition_waiting_on_a_row_locked_elsewhere_fails_in_time_and_can_be_retried()
            .await;
    }
}

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

async fn a_change_to_the_catalogue_shows_in_the_next_answer(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let user = server.anonymous();
    let before = recommend(&user, json!({"mood": "COMEDY"})).await;
    let last = ids(&before)
        .last()
        .copied()
        .expect("some comedies are recommended");

    // Another writer (an operator, another process) makes the last comedy the best rated, and
    // writes a review: the next answers show both, without waiting for anything to expire.
    let database = server.database().await;
    let after = rate_ten_then_recommend_comedies(&database, &user, last).await;
    assert_eq!(
        ids(&after).first(),
        Some(&last),
        "the newly top-rated comedy leads: {after:?}"
    );
    let reviews_before = summarize(&user, last).await["reviewCount"]
        .as_i64()
        .unwrap_or_default();
    sqlx::query(
        "INSERT INTO reviews (movie_id, score, comment, author) VALUES ($1, 10, 'A new favourite.', 'late_fan')",
    )
    .bind(last)
    .execute(&database)
    .await
    .expect("add a review");
    assert_eq!(
        summarize(&user, last).await["reviewCount"],
        json!(reviews_before + 1),
        "the new review is counted at once"
    );
    database.close().await;
}

async fn a_catalogue_whose_version_went_back_is_read_afresh(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let user = server.anonymous();
    let before = recommend(&user, json!({"mood": "COMEDY"})).await;
    let last = *ids(&before).last().expect("some comedies are recommended");
    let database = server.database().await;
    // The database is put back to an earlier version (as a restore from a backup would), the
    // server reads it, then a change brings the counter back to where it was.
    sqlx::query("UPDATE catalogue_version SET version = version - 1")
        .execute(&database)
        .await
        .expect("set the version back");
    recommend(&user, json!({"mood": "COMEDY"})).await;
    let after = rate_ten_then_recommend_comedies(&database, &user, last).await;
    assert_eq!(
        ids(&after).first(),
        Some(&last),
        "what was read before the version went back is not served: {after:?}"
    );
    database.close().await;
}

/// Rates `movie` 10 in the database, as an operator would, then asks for comedies.
async fn rate_ten_then_recommend_comedies(
    database: &sqlx::AnyPool,
    user: &Session,
    movie: i64,
) -> Vec<Value> {
    sqlx::query("UPDATE movies SET rating = 10 WHERE id = $1")
        .bind(movie)
        .execute(database)
        .await
        .expect("rate the movie");
    recommend(user, json!({"mood": "COMEDY"})).await
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

    add(&alice, json!({"movieId": watched.to_string()}), "WATCHED").await;
    add(
        &alice,
        json!({"movieId": want.to_string()}),
        "WANT_TO_WATCH",
    )
    .await;

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
        ids(&recommend(&alice, json!({"mood": "HORROR", "excludeWatched": null})).await),
        everything,
        "excludeWatched: null is false, as when it is left out"
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
        let summary = summarize(&user, movie_id).await;
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
        let summary = summarize(&user, movie_id).await;
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
        let summary = summarize(&user, movie_id).await;
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
    let with_five_reviews = (1..=400)
        .find(|id| seed_scores(*id).len() == 5)
        .expect("the seed has a movie with five reviews");
    let loading = [(0.0, "Loading reviews")];
    let summarizing = [
        (0.0, "Loading reviews"),
        (0.4, "Summarizing"),
        (1.0, "Done"),
    ];
    // Only a movie with three or more reviews is summarized, so only it reports the later steps.
    for (movie_id, reviews, expected) in [
        (1, 0, &loading[..]),
        (3, 2, &loading[..]),
        (with_five_reviews, 5, &summarizing[..]),
    ] {
        assert_eq!(
            seed_scores(movie_id).len(),
            reviews,
            "seed of movie {movie_id}"
        );
        let token = json!(format!("summary-of-{movie_id}"));
        let reply = server
            .anonymous()
            .request("tools/call")
            .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": movie_id.to_string()}}))
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
                assert_eq!(n["params"]["total"], 1.0, "progress out of 1: {n}");
                (
                    n["params"]["progress"]
                        .as_f64()
                        .expect("progress is a number"),
                    n["params"]["message"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            progress, expected,
            "progress of movie {movie_id} ({reviews} reviews)"
        );
        let summary = structured(&reply);
        assert_eq!(summary["reviewCount"], json!(reviews), "{summary}");
    }
}

// ---------------------------------------------------------------------------------------------
// addToWatchlist and getWatchlist
// ---------------------------------------------------------------------------------------------

async fn the_watch_list_needs_a_signed_in_user(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let anonymous = server.anonymous();
    for arguments in [
        json!({"subject": {"movieId": "6"}, "status": "WATCHED"}),
        // No status, from a client that could be asked: still refused at once.
        json!({"subject": {"movieId": "6"}}),
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
        json!({"subject": {"movieId": "6", "tvShowId": "3"}}),
        json!({"subject": {"movieId": "6", "tvShowId": "3"}, "status": "WATCHED"}),
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
        (json!({"movieId": "999999"}), "999999"),
        (json!({"tvShowId": "999998"}), "999998"),
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

async fn a_renamed_or_deleted_title_shows_in_the_next_answer(backend: Backend) {
    const RENAMED: i64 = 6;
    const DELETED: i64 = 7;
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let database = server.database().await;
    // Round one of a conversation about a movie an operator then deletes.
    let arguments = json!({"subject": {"movieId": DELETED.to_string()}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);

    sqlx::query("UPDATE movies SET title = 'The Godfather (Restored)' WHERE id = $1")
        .bind(RENAMED)
        .execute(&database)
        .await
        .expect("rename the movie");
    sqlx::query("DELETE FROM movies WHERE id = $1")
        .bind(DELETED)
        .execute(&database)
        .await
        .expect("delete the movie");

    let renamed = add(&alice, json!({"movieId": RENAMED.to_string()}), "WATCHED").await;
    assert_eq!(
        renamed["content"]["title"], "The Godfather (Restored)",
        "the answer names the title as it is now: {renamed}"
    );
    let answer = json!({"status": accept(json!({"status": "WATCHED"}))});
    let gone = alice
        .retry("addToWatchlist", arguments.clone(), answer, &state)
        .await;
    let text = tool_error(&gone);
    assert!(
        text.contains(&format!("There is no movie {DELETED}")),
        "the answer says the movie is gone: {text:?}"
    );
    let again = alice.call("addToWatchlist", arguments).await;
    let text = tool_error(&again);
    assert!(
        text.contains(&format!("There is no movie {DELETED}")),
        "a new conversation is told at once: {text:?}"
    );
    let list = alice.watchlist().await;
    assert_eq!(list.len(), 1, "only the renamed movie was added: {list:?}");
    assert_eq!(list[0]["content"]["title"], "The Godfather (Restored)");
    database.close().await;
}

async fn add_with_a_status_saves_at_once(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");

    let movie = add(&alice, json!({"movieId": "6"}), "WATCHED").await;
    assert_eq!(movie["content"]["title"], seed_movie_title(6), "{movie}");
    assert_eq!(seed_movie_title(6), "The Godfather");
    let show = add(&alice, json!({"tvShowId": "3"}), "WANT_TO_WATCH").await;
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

/// Makes the database itself refuse watch-list items `when` (a trigger condition on the new row),
/// as a constraint or a trigger added by an operator would. Returns the statement that lifts the
/// refusal.
async fn refuse_items(backend: Backend, database: &sqlx::AnyPool, when: &str) -> &'static str {
    let (statements, lift) = match backend {
        Backend::Sqlite => (
            vec![format!(
                "CREATE TRIGGER refuse_items BEFORE INSERT ON watchlist_items WHEN {when} \
                 BEGIN SELECT RAISE(ABORT, 'refused for the test'); END"
            )],
            "DROP TRIGGER refuse_items",
        ),
        Backend::Postgres => (
            vec![
                "CREATE FUNCTION refuse_items() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'refused for the test'; END $$"
                    .to_owned(),
                format!(
                    "CREATE TRIGGER refuse_items BEFORE INSERT ON watchlist_items \
                     FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION refuse_items()"
                ),
            ],
            "DROP TRIGGER refuse_items ON watchlist_items",
        ),
    };
    for statement in statements {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(database)
            .await
            .expect("install the refusal");
    }
    lift
}

async fn a_write_that_fails_half_way_saves_nothing_and_can_be_retried(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let zoe = server.user("zoe");
    let database = server.database().await;
    let count_users = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM users")
            .fetch_one(&database)
            .await
            .expect("count the users")
    };
    // Every item is refused, after the new user's row is written in the same transaction.
    let lift = refuse_items(backend, &database, "true").await;
    let users_before = count_users().await;
    let arguments = json!({"subject": {"movieId": "6"}, "status": "WATCHED"});

    let failed = zoe.call("addToWatchlist", arguments.clone()).await;
    assert_rpc_error(&failed, -32603);
    assert_eq!(
        count_users().await,
        users_before,
        "the user row written for the failed item is rolled back with it"
    );

    sqlx::query(lift)
        .execute(&database)
        .await
        .expect("lift the refusal");
    let saved = saved_item(&zoe.call("addToWatchlist", arguments).await).clone();
    assert_eq!(saved["status"], "WATCHED", "{saved}");
    assert_eq!(zoe.watchlist().await.len(), 1, "saved once, by the retry");
    assert_eq!(count_users().await, users_before + 1, "zoe is a user now");
    database.close().await;
}

async fn an_item_the_database_refuses_fails_alone_not_with_the_items_saved_beside_it(
    backend: Backend,
) {
    const REFUSED: i64 = 6;
    let server = MovieServer::start(backend).await;
    let database = server.database().await;
    refuse_items(backend, &database, &format!("NEW.movie_id = {REFUSED}")).await;
    let add = |movie: i64| {
        let fan = server.user(&format!("fan-{movie}"));
        async move {
            let arguments = json!({"subject": {"movieId": movie.to_string()}, "status": "WATCHED"});
            (movie, fan.call("addToWatchlist", arguments).await)
        }
    };

    // The test holds the database's write lock, so additions wait for it in the server. The
    // first ones take the server's writers (SQLite has one; on PostgreSQL they are sent one at a
    // time until one finds no writer free), the rest queue up behind them, the refused movie
    // among them, and go to the database as one group once the lock is let go.
    let mut lock = database.begin().await.expect("a transaction");
    let hold = match backend {
        Backend::Sqlite => "DELETE FROM watchlist_items WHERE id = -1",
        Backend::Postgres => "LOCK TABLE watchlist_items IN SHARE ROW EXCLUSIVE MODE",
    };
    sqlx::query(hold)
        .execute(&mut *lock)
        .await
        .expect("take the write lock");
    let mut first = vec![tokio::spawn(add(1))];
    let mut next = 2;
    match backend {
        Backend::Sqlite => tokio::time::sleep(Duration::from_millis(500)).await,
        Backend::Postgres => {
            while writer_took_it(&database, first.len()).await {
                assert!(next < REFUSED, "more writers than the test expects");
                first.push(tokio::spawn(add(next)));
                next += 1;
            }
        }
    }
    let grouped = tokio::spawn(futures::future::join_all((next..=14).map(add)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    lock.rollback().await.expect("let the lock go");

    let mut answers = futures::future::join_all(first)
        .await
        .into_iter()
        .map(|answer| answer.expect("a first addition"))
        .collect::<Vec<_>>();
    answers.extend(grouped.await.expect("grouped additions"));
    for (movie, reply) in &answers {
        if *movie == REFUSED {
            assert_rpc_error(reply, -32603);
        } else {
            let saved = saved_item(reply);
            assert_eq!(
                saved["content"]["title"],
                seed_movie_title(*movie),
                "{saved}"
            );
        }
    }
    let saved: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM watchlist_items")
        .fetch_one(&database)
        .await
        .expect("count the items");
    assert_eq!(saved, 13, "every movie but the refused one is saved");
    assert!(
        server.log().contains("trying its requests one by one"),
        "the refused movie travelled in a group, and the log says so"
    );
    let metrics = server.url().replace("/mcp", "/metrics");
    let metrics = reqwest::get(&metrics)
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    let splits = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("moviedb_sql_batch_splits_total{batch=\"watchlist_additions\"} ")
        })
        .unwrap_or("absent");
    assert_eq!(splits, "1", "the metrics count the split group");
    database.close().await;
}

/// Whether PostgreSQL shows `waiting` sessions waiting for a lock within two seconds: the
/// latest of `waiting` additions took a writer of its own rather than queueing in the server.
async fn writer_took_it(database: &sqlx::AnyPool, waiting: usize) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        let sessions: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(database)
        .await
        .expect("read pg_stat_activity");
        if usize::try_from(sessions).is_ok_and(|sessions| sessions >= waiting) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn an_addition_waiting_on_a_row_locked_elsewhere_fails_in_time_and_can_be_retried() {
    let server = MovieServer::start(Backend::Postgres).await;
    let dave = server.user("dave");
    add(&dave, json!({"movieId": "6"}), "WATCHED").await;
    // Another session (an operator's open transaction) holds dave's user row.
    let database = server.database().await;
    let mut holding = database.begin().await.expect("begin");
    sqlx::query("SELECT id FROM users WHERE name = 'dave' FOR UPDATE")
        .fetch_all(&mut *holding)
        .await
        .expect("lock dave's row");

    let arguments = json!({"subject": {"movieId": "7"}, "status": "WANT_TO_WATCH"});
    // Past the lock limit (10 s), with room for a loaded machine; without a limit it would wait
    // for good.
    let waited = tokio::time::timeout(
        Duration::from_secs(40),
        dave.call("addToWatchlist", arguments.clone()),
    )
    .await
    .expect("the addition fails in time instead of waiting on the lock");
    assert_rpc_error(&waited, -32603);
    holding.rollback().await.expect("release the row");

    let saved = saved_item(&dave.call("addToWatchlist", arguments).await).clone();
    assert_eq!(saved["status"], "WANT_TO_WATCH", "{saved}");
    assert_eq!(dave.watchlist().await.len(), 2, "the retry saved it once");
    database.close().await;
}

async fn add_without_a_status_asks_first_and_saves_watched(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let arguments = json!({"subject": {"movieId": "6"}});

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
    ];
    let count = cases.len();
    for (case, movie_id, answer) in cases {
        let arguments = json!({"subject": {"movieId": movie_id.to_string()}});
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

async fn an_answer_that_does_not_fit_the_form_is_refused_and_the_question_stands(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let arguments = json!({"subject": {"movieId": "6"}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
    for content in [json!({"status": "MAYBE"}), json!({"status": 1})] {
        let refused = alice
            .retry(
                "addToWatchlist",
                arguments.clone(),
                json!({"status": accept(content.clone())}),
                &state,
            )
            .await;
        assert_rpc_error(&refused, -32602);
        let message = refused.error()["message"].as_str().unwrap_or_default();
        assert!(
            message
                .contains("inputResponses.status does not fit the requested form: status must be"),
            "{content}: {message}"
        );
        assert!(
            alice.watchlist().await.is_empty(),
            "{content}: nothing saved"
        );
    }
    // The question stands: the same state, answered as the form asks, saves the title.
    let done = alice
        .retry(
            "addToWatchlist",
            arguments,
            json!({"status": accept(json!({"status": "WATCHED"}))}),
            &state,
        )
        .await;
    assert_eq!(saved_item(&done)["status"], "WATCHED");
    assert_eq!(alice.watchlist().await.len(), 1);
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
                json!({"subject": {"movieId": movie_id.to_string()}}),
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
    add(&alice, json!({"movieId": "6"}), "WATCHED").await;
    add(&alice, json!({"tvShowId": "3"}), "WANT_TO_WATCH").await;

    for arguments in [
        // No status, from a client that can be asked: refused at once, not asked.
        json!({"subject": {"movieId": "6"}}),
        json!({"subject": {"movieId": "6"}, "status": "WANT_TO_WATCH"}),
        json!({"subject": {"tvShowId": "3"}}),
        json!({"subject": {"tvShowId": "3"}, "status": "WATCHED"}),
    ] {
        let text = tool_error(&alice.call("addToWatchlist", arguments.clone()).await);
        assert!(text.contains(ALREADY_LISTED), "{arguments}: {text:?}");
    }

    // Listed while the question was open: the answer does not add it a second time.
    let arguments = json!({"subject": {"movieId": "7"}});
    let state = status_question(&alice.call("addToWatchlist", arguments.clone()).await);
    add(&alice, json!({"movieId": "7"}), "WATCHED").await;
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
    let arguments = json!({"subject": {"movieId": "6"}});
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
    let arguments = json!({"subject": {"movieId": "7"}});
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

async fn fifty_conversations_adding_one_title_save_it_once(backend: Backend) {
    const CONVERSATIONS: usize = 50;
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let arguments = json!({"subject": {"movieId": "8"}});

    // Fifty first rounds at once: the title is not listed yet, so each one asks.
    let first_rounds = futures::future::join_all(
        (0..CONVERSATIONS).map(|_| alice.call("addToWatchlist", arguments.clone())),
    )
    .await;
    let states: Vec<String> = first_rounds.iter().map(status_question).collect();

    // Fifty answers at once: one saves the title, every other one is told it is already there.
    let answer = json!({"status": accept(json!({"status": "WATCHED"}))});
    let answers = futures::future::join_all(
        states
            .iter()
            .map(|state| alice.retry("addToWatchlist", arguments.clone(), answer.clone(), state)),
    )
    .await;
    let (refused, saved): (Vec<_>, Vec<_>) =
        answers.iter().partition(|reply| is_error(complete(reply)));
    assert_eq!(
        (saved.len(), refused.len()),
        (1, CONVERSATIONS - 1),
        "one save and {} refusals",
        CONVERSATIONS - 1
    );
    assert_eq!(saved_item(saved[0])["status"], "WATCHED");
    for reply in refused {
        let text = tool_error(reply);
        assert!(text.contains(ALREADY_LISTED), "{text:?}");
    }

    let list = alice.watchlist().await;
    assert_eq!(list.len(), 1, "one row: {list:?}");
    assert_eq!(list[0]["content"]["title"], seed_movie_title(8), "{list:?}");
}

async fn users_have_separate_watch_lists_and_states(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");
    let bob = server.user("bob");

    add(&alice, json!({"movieId": "6"}), "WATCHED").await;
    add(&bob, json!({"movieId": "6"}), "WANT_TO_WATCH").await;
    add(&bob, json!({"movieId": "7"}), "WATCHED").await;

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
    let arguments = json!({"subject": {"movieId": "4"}});
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
    add(&alice, json!({"movieId": "1"}), "WANT_TO_WATCH").await;
    add(&alice, json!({"movieId": "2"}), "WATCHED").await;
    add(&alice, json!({"tvShowId": "3"}), "WANT_TO_WATCH").await;
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
    // Its structuredContent fits the declared outputSchema (every call's is checked).
    structured(&alice.call("getWatchlist", json!({})).await);
}

// ---------------------------------------------------------------------------------------------
// Ids: strings on the wire (GraphQL `ID`), integers still accepted
// ---------------------------------------------------------------------------------------------

async fn ids_are_strings_and_integers_are_still_accepted(backend: Backend) {
    let server = MovieServer::start(backend).await;
    let alice = server.user("alice");

    // Each id argument takes a string of digits or an integer, and answers with string ids.
    let by_string = summarize(&alice, 6).await;
    let by_integer = structured(
        &alice
            .call("summarizeMovieReviews", json!({"movieId": 6}))
            .await,
    )
    .clone();
    assert_eq!(
        by_integer, by_string,
        "an integer id is read as the same id"
    );
    assert_eq!(by_string["movieId"], "6", "{by_string}");
    for (subject, listed_id) in [
        (json!({"movieId": "6"}), "6"),
        (json!({"movieId": 7}), "7"),
        (json!({"tvShowId": "3"}), "3"),
        (json!({"tvShowId": 4}), "4"),
    ] {
        let saved = add(&alice, subject.clone(), "WATCHED").await;
        assert!(saved["id"].is_string(), "{subject}: {saved}");
        let listed = alice.watchlist().await;
        let newest = &listed[0];
        assert_eq!(
            newest["id"], saved["id"],
            "{subject}: the newest item is the one saved"
        );
        assert_eq!(newest["content"]["id"], listed_id, "{subject}: {newest}");
    }

    // Anything else is a tool error that names the argument and what it expects.
    let bad_ids = [
        json!("abc"),
        json!(""),
        json!("-1"),
        json!(" 6"),
        json!("99999999999999999999"),
        json!(5.5),
        json!(-1),
        json!(true),
        json!(9_223_372_036_854_775_808_u64),
        json!({"id": 6}),
        json!("9".repeat(200_000)),
    ];
    for bad in bad_ids {
        for (tool, arguments, path) in [
            ("summarizeMovieReviews", json!({"movieId": bad}), "movieId"),
            (
                "addToWatchlist",
                json!({"subject": {"movieId": bad}, "status": "WATCHED"}),
                "subject.movieId",
            ),
            (
                "addToWatchlist",
                json!({"subject": {"tvShowId": bad}, "status": "WATCHED"}),
                "subject.tvShowId",
            ),
        ] {
            let error = tool_error(&alice.call(tool, arguments.clone()).await);
            assert!(
                error.starts_with(&format!("Invalid arguments: {path}: ")),
                "{tool} {arguments}: the error names {path}: {error}"
            );
            // A huge value is quoted only in part, so the explanation after it may be cut.
            if bad.to_string().len() < 100 {
                assert!(
                    error.contains("expected an id: a string of digits"),
                    "{tool} {arguments}: the error says what an id is: {error}"
                );
            }
            assert!(
                error.len() <= 1100,
                "the error quotes the value only in part: {} bytes",
                error.len()
            );
        }
    }
    assert_eq!(
        alice.watchlist().await.len(),
        4,
        "no refused call wrote anything"
    );
}

// ---------------------------------------------------------------------------------------------
// Sign-in
// ---------------------------------------------------------------------------------------------

async fn invalid_and_expired_tokens_are_refused_with_401(backend: Backend) {
    let server = MovieServer::start(backend).await;
    // A client whose very first call is refused (its look at the tool list is refused too) is
    // shown the refusal.
    let stranger = mcp_mrtr::client::Client::new(server.url().to_owned()).with_bearer("not-a-jwt");
    let refused = stranger.call_tool("getWatchlist", json!({})).await;
    assert_eq!(refused.status.as_u16(), 401, "{}", refused.body_text());
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
    let long_subject = sign_token(server.secret.as_bytes(), &"c".repeat(256), now, now + 3600);
    let nul_subject = sign_token(server.secret.as_bytes(), "carol\u{0}", now, now + 3600);
    // A header naming an algorithm in letters no HTTP header may carry.
    let foreign_letters = format!(
        "{}.{}.c2ln",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256É","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(format!(
            r#"{{"sub":"carol","iat":{now},"exp":{}}}"#,
            now + 60
        ))
    );
    for (what, token) in [
        ("not a JWT", "not-a-jwt".to_owned()),
        ("signed with another secret", foreign),
        ("expired an hour ago", expired),
        ("whose subject is 256 bytes long", long_subject),
        ("whose subject holds a NUL", nul_subject),
        ("whose header is not ASCII", foreign_letters),
    ] {
        let session = server.with_token(&token);
        for (tool, arguments) in [
            (
                "addToWatchlist",
                json!({"subject": {"movieId": "6"}, "status": "WATCHED"}),
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
        // A notification or a stray response is refused the same way, not accepted unread.
        for (kind, body) in [
            (
                "notification",
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                       "params": {"requestId": "r-1"}}),
            ),
            (
                "response",
                json!({"jsonrpc": "2.0", "id": "q-1", "result": {}}),
            ),
        ] {
            let reply = session
                .request("notifications/cancelled")
                .raw_body(body.to_string())
                .send()
                .await;
            assert_eq!(
                (
                    reply.status.as_u16(),
                    reply.header("www-authenticate").is_some()
                ),
                (401, true),
                "a {kind} with a token {what}: body {}",
                reply.body_text()
            );
            let answer: Value = serde_json::from_str(&reply.body_text())
                .unwrap_or_else(|e| panic!("a {kind}: the 401 is a JSON-RPC error ({e})"));
            assert!(answer["error"].is_object(), "a {kind}: {answer}");
            assert_eq!(
                answer["id"],
                Value::Null,
                "a {kind} with a token {what}: refused before its body was read, the refusal \
                 names no id: {answer}"
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
    add(&carol, json!({"movieId": "6"}), "WATCHED").await;
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

    let pool = server.database().await;
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
        json!({"movieId": last.to_string()}),
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
    movies.iter().map(|m| id_of(&m["id"])).collect()
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
        let id = id_of(&movie["id"]);
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
                id_of(&a["id"]) < id_of(&b["id"]),
                "equal ratings are ordered by id: {a} then {b}"
            );
        }
    }
}

/// The summary of `movie_id` (must succeed and fit the declared output schema).
async fn summarize(session: &Session, movie_id: i64) -> Value {
    let reply = session
        .call(
            "summarizeMovieReviews",
            json!({"movieId": movie_id.to_string()}),
        )
        .await;
    let summary = structured(&reply).clone();
    assert_eq!(id_of(&summary["movieId"]), movie_id, "{summary}");
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
    id_of(&saved["id"]);
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
