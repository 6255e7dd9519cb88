//! The seeded catalogue (real titles and years; ratings, reviews and comments written for this
//! project), loaded on first start, and a synthetic catalogue generator for load tests.

use anyhow::{Context as _, bail};
use rand::Rng;
use sqlx::{Any, Transaction};

use super::catalogue::Catalogue;
use super::model::Mood;

const MOVIES: &str = include_str!("seed/movies.tsv");
const TV_SHOWS: &str = include_str!("seed/tv_shows.tsv");
const REVIEWS: &str = include_str!("seed/reviews.tsv");

/// Rows per multi-row INSERT.
const BATCH: usize = 200;

#[derive(Debug, Clone)]
enum Cell {
    Int(i64),
    Real(f64),
    Text(String),
}

/// Loads the seeded catalogue into an empty database; a database with movies is left alone.
/// Returns whether it seeded.
pub async fn seed_if_empty(catalogue: &Catalogue) -> anyhow::Result<bool> {
    if movie_count(catalogue).await? > 0 {
        return Ok(false);
    }
    match load_seed(catalogue).await {
        Ok(()) => Ok(true),
        // Replicas starting together on an empty database race to seed it; the loser's inserts
        // collide with the winner's rows and roll back whole, which is fine once the data is there.
        Err(e) if movie_count(catalogue).await? > 0 => {
            tracing::info!("another server seeded the catalogue first ({e:#})");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

async fn movie_count(catalogue: &Catalogue) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM movies")
        .fetch_one(catalogue.pool())
        .await?)
}

/// A transaction for seeding. On PostgreSQL it lifts the time limits the server's connections
/// set: a seed may rightly take longer than any request, and a replica seeding beside another
/// (replicas starting together on an empty database) waits for the other's rows instead of
/// giving up and failing to start.
async fn seeding(catalogue: &Catalogue) -> sqlx::Result<Transaction<'static, Any>> {
    let mut tx = catalogue.pool().begin().await?;
    if tx.backend_name() == "PostgreSQL" {
        for setting in [
            "SET LOCAL statement_timeout = 0",
            "SET LOCAL lock_timeout = 0",
        ] {
            sqlx::query(setting).execute(&mut *tx).await?;
        }
    }
    Ok(tx)
}

/// Inserts the seed files in one transaction.
async fn load_seed(catalogue: &Catalogue) -> anyhow::Result<()> {
    let mut tx = seeding(catalogue).await?;
    let (movie_rows, mood_rows) = parse_movies(MOVIES)?;
    insert(
        &mut tx,
        "movies",
        &["id", "title", "release_year", "genre", "rating"],
        movie_rows,
    )
    .await?;
    insert(&mut tx, "movie_moods", &["movie_id", "mood"], mood_rows).await?;
    insert(
        &mut tx,
        "tv_shows",
        &["id", "title", "first_air_year", "genre", "rating"],
        parse_shows(TV_SHOWS)?,
    )
    .await?;
    insert(
        &mut tx,
        "reviews",
        &["movie_id", "author", "score", "comment"],
        parse_reviews(REVIEWS)?,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Adds `movies` synthetic movies (ids after the highest one) and `reviews` reviews spread over
/// them, for load tests.
pub async fn seed_synthetic(
    catalogue: &Catalogue,
    movies: u64,
    reviews: u64,
) -> anyhow::Result<()> {
    let first: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM movies")
        .fetch_one(catalogue.pool())
        .await?;
    let movies = i64::try_from(movies).context("too many movies to add")?;
    let mut rng = rand::thread_rng();
    let mut tx = seeding(catalogue).await?;
    let mut movie_rows = Vec::with_capacity(BATCH);
    let mut mood_rows = Vec::with_capacity(BATCH * 2);
    for n in 1..=movies {
        let id = first
            .checked_add(n)
            .context("movie ids past the largest the database takes")?;
        let rating = f64::from(rng.gen_range(10..=100u8)) / 10.0;
        movie_rows.push(vec![
            Cell::Int(id),
            Cell::Text(format!("Synthetic Feature {id}")),
            Cell::Int(rng.gen_range(1930..=2025)),
            Cell::Text("Drama".into()),
            Cell::Real(rating),
        ]);
        let first_mood = rng.gen_range(0..Mood::ALL.len());
        mood_rows.push(vec![
            Cell::Int(id),
            Cell::Text(Mood::ALL[first_mood].as_str().into()),
        ]);
        mood_rows.push(vec![
            Cell::Int(id),
            Cell::Text(
                Mood::ALL[(first_mood + 1) % Mood::ALL.len()]
                    .as_str()
                    .into(),
            ),
        ]);
        if movie_rows.len() >= BATCH {
            insert(
                &mut tx,
                "movies",
                &["id", "title", "release_year", "genre", "rating"],
                std::mem::take(&mut movie_rows),
            )
            .await?;
            insert(
                &mut tx,
                "movie_moods",
                &["movie_id", "mood"],
                std::mem::take(&mut mood_rows),
            )
            .await?;
        }
    }
    insert(
        &mut tx,
        "movies",
        &["id", "title", "release_year", "genre", "rating"],
        movie_rows,
    )
    .await?;
    insert(&mut tx, "movie_moods", &["movie_id", "mood"], mood_rows).await?;
    let last = first.saturating_add(movies);
    if last > 0 {
        let mut review_rows = Vec::with_capacity(BATCH);
        for _ in 0..reviews {
            let score: i64 = rng.gen_range(1..=10);
            review_rows.push(vec![
                Cell::Int(rng.gen_range(1..=last)),
                Cell::Text(format!("loadtester{}", rng.gen_range(1..=5000))),
                Cell::Int(score),
                Cell::Text(format!("Synthetic review with a score of {score}: the pacing and the performances were noted.")),
            ]);
            if review_rows.len() >= BATCH {
                insert(
                    &mut tx,
                    "reviews",
                    &["movie_id", "author", "score", "comment"],
                    std::mem::take(&mut review_rows),
                )
                .await?;
            }
        }
        insert(
            &mut tx,
            "reviews",
            &["movie_id", "author", "score", "comment"],
            review_rows,
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn insert(
    tx: &mut Transaction<'static, Any>,
    table: &str,
    columns: &[&str],
    rows: Vec<Vec<Cell>>,
) -> anyhow::Result<()> {
    for chunk in rows.chunks(BATCH) {
        let mut sql = format!("INSERT INTO {table} ({}) VALUES ", columns.join(", "));
        let mut n = 0;
        for (i, _) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            let placeholders: Vec<String> = columns
                .iter()
                .map(|_| {
                    n += 1;
                    format!("${n}")
                })
                .collect();
            sql.push('(');
            sql.push_str(&placeholders.join(", "));
            sql.push(')');
        }
        // Table and column names are this module's constants; values are bound.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for cell in chunk.iter().flatten() {
            query = match cell {
                Cell::Int(v) => query.bind(*v),
                Cell::Real(v) => query.bind(*v),
                Cell::Text(v) => query.bind(v.clone()),
            };
        }
        query
            .execute(&mut **tx)
            .await
            .with_context(|| format!("seeding {table}"))?;
    }
    Ok(())
}

/// Splits a TSV file into records, checking the header.
fn records<'a>(file: &'a str, header: &str) -> anyhow::Result<Vec<Vec<&'a str>>> {
    let mut lines = file.lines();
    if lines.next().map(str::trim_end) != Some(header) {
        bail!("seed file does not start with the header {header:?}");
    }
    let width = header.split('\t').count();
    lines
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(n, line)| {
            let fields: Vec<&str> = line.trim_end_matches('\r').split('\t').collect();
            if fields.len() != width {
                bail!(
                    "seed line {} has {} fields, expected {width}",
                    n + 2,
                    fields.len()
                );
            }
            Ok(fields)
        })
        .collect()
}

fn int(field: &str) -> anyhow::Result<i64> {
    field
        .trim()
        .parse()
        .with_context(|| format!("{field:?} is not a whole number"))
}

fn real(field: &str) -> anyhow::Result<f64> {
    field
        .trim()
        .parse()
        .with_context(|| format!("{field:?} is not a number"))
}

type Rows = Vec<Vec<Cell>>;

fn parse_movies(file: &str) -> anyhow::Result<(Rows, Rows)> {
    let mut movies = Vec::new();
    let mut moods = Vec::new();
    for fields in records(file, "id\ttitle\trelease_year\tgenre\trating\tmoods")? {
        let id = int(fields[0])?;
        movies.push(vec![
            Cell::Int(id),
            Cell::Text(fields[1].to_owned()),
            Cell::Int(int(fields[2])?),
            Cell::Text(fields[3].to_owned()),
            Cell::Real(real(fields[4])?),
        ]);
        for mood in fields[5]
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            let mood = Mood::parse(mood)
                .with_context(|| format!("movie {id} has unknown mood {mood:?}"))?;
            moods.push(vec![Cell::Int(id), Cell::Text(mood.as_str().to_owned())]);
        }
    }
    Ok((movies, moods))
}

fn parse_shows(file: &str) -> anyhow::Result<Rows> {
    records(file, "id\ttitle\tfirst_air_year\tgenre\trating")?
        .into_iter()
        .map(|f| {
            Ok(vec![
                Cell::Int(int(f[0])?),
                Cell::Text(f[1].to_owned()),
                Cell::Int(int(f[2])?),
                Cell::Text(f[3].to_owned()),
                Cell::Real(real(f[4])?),
            ])
        })
        .collect()
}

fn parse_reviews(file: &str) -> anyhow::Result<Rows> {
    records(file, "movie_id\tauthor\tscore\tcomment")?
        .into_iter()
        .map(|f| {
            Ok(vec![
                Cell::Int(int(f[0])?),
                Cell::Text(f[1].to_owned()),
                Cell::Int(int(f[2])?),
                Cell::Text(f[3].to_owned()),
            ])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_files_parse_and_cover_every_mood() {
        let (movies, moods) = parse_movies(MOVIES).unwrap();
        assert!(movies.len() >= 300, "{} movies", movies.len());
        for mood in Mood::ALL {
            let count = moods
                .iter()
                .filter(|row| matches!(&row[1], Cell::Text(m) if m == mood.as_str()))
                .count();
            assert!(count >= 40, "{} movies for {}", count, mood.as_str());
        }
        assert!(parse_shows(TV_SHOWS).unwrap().len() >= 50);
        assert!(parse_reviews(REVIEWS).unwrap().len() >= 300);
    }
}
