//! The catalogue reads of many callers, each group as one query (see [`super::batch`]): the
//! catalogue's version, the best movies for a set of moods, and the reviews of a set of movies. A
//! request waits for a query that starts after it arrived, so it sees every change committed
//! before it was made.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::any::AnyRow;
use sqlx::{AnyPool, AssertSqlSafe, Row};

use super::batch::{Batch, Run};
use super::model::{Id, Mood, MovieSummary, RECOMMENDATION_LIMIT, Review};

/// Answers "what is the catalogue's version now?" with one query at a time.
pub fn versions(pool: AnyPool) -> Batch<(), i64> {
    let run: Run<(), i64> = Arc::new(move |asks: Arc<[()]>| {
        let pool = pool.clone();
        Box::pin(async move {
            let version: i64 = sqlx::query_scalar("SELECT version FROM catalogue_version")
                .fetch_one(&pool)
                .await?;
            Ok(vec![version; asks.len()])
        })
    });
    Batch::start("catalogue_version", 1, run)
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
    Batch::start("recommendations", calls, run)
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
    Batch::start("reviews", calls, run)
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
