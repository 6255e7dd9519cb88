//! The catalogue reads of many callers, each group as one query (see [`super::batch`]): the
//! catalogue's version, the best movies for a set of moods, and the reviews of a set of movies. A
//! request waits for a query that starts after it arrived, so it sees every change committed
//! before it was made.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use sqlx::any::AnyRow;
use sqlx::{AnyPool, AssertSqlSafe, Row};

use super::batch::{Batch, READ_TIME_LIMIT, Run};
use super::fresh::Version;
use super::model::{Id, Mood, MovieSummary, RECOMMENDATION_LIMIT, Review};

/// Answers "what is the catalogue's version now?" with one query at a time. Queries run one
/// after another, each seeing what the one before saw, so a counter lower than the last one read
/// means the database itself went back: that starts a new epoch.
pub fn versions(pool: AnyPool) -> Batch<(), Version> {
    let last_seen: Arc<Mutex<Option<Version>>> = Arc::default();
    let run: Run<(), Version> = Arc::new(move |asks: Arc<[()]>| {
        let (pool, last_seen) = (pool.clone(), last_seen.clone());
        Box::pin(async move {
            let counter: i64 = sqlx::query_scalar("SELECT version FROM catalogue_version")
                .fetch_one(&pool)
                .await?;
            let mut last_seen = last_seen.lock().unwrap_or_else(PoisonError::into_inner);
            let epoch = match *last_seen {
                Some(last) if counter < last.counter => {
                    tracing::warn!(
                        was = last.counter,
                        now = counter,
                        "the catalogue's version went back (a restored or swapped database): \
                         catalogue reads kept in memory are dropped"
                    );
                    last.epoch + 1
                }
                Some(last) => last.epoch,
                None => 0,
            };
            let version = Version { epoch, counter };
            *last_seen = Some(version);
            Ok(vec![version; asks.len()])
        })
    });
    Batch::start_reads("catalogue_version", 1, READ_TIME_LIMIT, run)
}

/// Answers "the best movies for this mood" on `calls` connections of `pool` at a time.
pub fn recommendations(pool: AnyPool, calls: usize) -> Batch<Mood, Arc<[MovieSummary]>> {
    let run: Run<Mood, Arc<[MovieSummary]>> = Arc::new(move |moods: Arc<[Mood]>| {
        let pool = pool.clone();
        Box::pin(async move {
            let mut wanted: Vec<Mood> = moods.to_vec();
            wanted.sort_by_key(|mood| mood.as_str());
            wanted.dedup();
            let sql = format!(
                "SELECT mood, id, title, release_year, genre, rating FROM (\
                   SELECT mm.mood, m.id, m.title, m.release_year, m.genre, m.rating, \
                   ROW_NUMBER() OVER (PARTITION BY mm.mood ORDER BY m.rating DESC, m.id ASC) AS place \
                   FROM movies m JOIN movie_moods mm ON mm.movie_id = m.id \
                   WHERE mm.mood IN ({})) ranked \
                 WHERE place <= {RECOMMENDATION_LIMIT} ORDER BY mood, place",
                parameters(wanted.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for mood in &wanted {
                query = query.bind(mood.as_str());
            }
            let mut by_mood: HashMap<String, Vec<MovieSummary>> = HashMap::new();
            for row in query.fetch_all(&pool).await? {
                let movie = movie_summary(&row)?;
                by_mood.entry(row.try_get("mood")?).or_default().push(movie);
            }
            let lists: HashMap<String, Arc<[MovieSummary]>> = by_mood
                .into_iter()
                .map(|(mood, movies)| (mood, movies.into()))
                .collect();
            Ok(moods
                .iter()
                .map(|mood| lists.get(mood.as_str()).cloned().unwrap_or_default())
                .collect())
        })
    });
    Batch::start_reads("recommendations", calls, READ_TIME_LIMIT, run)
}

/// Answers "the reviews of this movie, oldest first" on `calls` connections of `pool` at a time.
pub fn reviews(pool: AnyPool, calls: usize) -> Batch<i64, Arc<[Review]>> {
    let run: Run<i64, Arc<[Review]>> = Arc::new(move |movies: Arc<[i64]>| {
        let pool = pool.clone();
        Box::pin(async move {
            let mut wanted = movies.to_vec();
            wanted.sort_unstable();
            wanted.dedup();
            let sql = format!(
                "SELECT movie_id, score, comment, author FROM reviews \
                 WHERE movie_id IN ({}) ORDER BY movie_id, id",
                parameters(wanted.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for movie in &wanted {
                query = query.bind(*movie);
            }
            let mut by_movie: HashMap<i64, Vec<Review>> = HashMap::new();
            for row in query.fetch_all(&pool).await? {
                let review = Review {
                    score: row.try_get("score")?,
                    comment: row.try_get("comment")?,
                    author: row.try_get("author")?,
                };
                by_movie
                    .entry(row.try_get("movie_id")?)
                    .or_default()
                    .push(review);
            }
            let lists: HashMap<i64, Arc<[Review]>> = by_movie
                .into_iter()
                .map(|(movie, reviews)| (movie, reviews.into()))
                .collect();
            Ok(movies
                .iter()
                .map(|movie| lists.get(movie).cloned().unwrap_or_default())
                .collect())
        })
    });
    Batch::start_reads("reviews", calls, READ_TIME_LIMIT, run)
}

/// A movie as a recommendation lists it, from a row with its columns.
pub fn movie_summary(row: &AnyRow) -> sqlx::Result<MovieSummary> {
    Ok(MovieSummary {
        id: Id(row.try_get("id")?),
        title: row.try_get("title")?,
        release_year: row.try_get("release_year")?,
        genre: row.try_get("genre")?,
        rating: row.try_get("rating")?,
    })
}

/// `$1, $2, …, $count`.
fn parameters(count: usize) -> String {
    (1..=count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}
