//! The catalogue in SQL: connecting (SQLite file or PostgreSQL), migrating, and every query the
//! tools make. One set of queries serves both databases through sqlx's `Any` driver.
//!
//! Mood rankings and reviews are kept in memory for as long as the catalogue's version stays the
//! same ([`Fresh`]). The watch-list checks and additions of concurrent callers go to the database
//! together, a group per statement ([`watchlist_batches`]): a conversation of `addToWatchlist`
//! takes part in one read (the title's name, and is it listed?) and one write (the user and the
//! item).
//!
//! On SQLite, writes go through one connection and reads through others: SQLite lets one writer
//! in at a time, and writers queueing on its lock would sleep in its busy handler instead of
//! waiting their turn.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{AnyConnection, AnyPool, AssertSqlSafe, Connection as _, Row};

use super::batch::{self, Batch, DatabaseError};
use super::catalogue_batches;
use super::fresh::{Fresh, Version};
use super::model::{
    Id, ItemContent, Mood, MovieSummary, Review, Title, WatchStatus, WatchlistItem,
};
use super::sqlite_file::{self, SetUpLock};
use super::watchlist_batches::{self, ListedCheck, NewItem, OnList};

/// SQLite connections for reads; writes have one of their own.
const SQLITE_READERS: u32 = 4;
/// PostgreSQL connections, shared by reads and writes.
const POSTGRES_CONNECTIONS: u32 = 16;
/// Longest the wait for a connection to the database, at start as for each request.
const CONNECT_LIMIT: Duration = Duration::from_secs(10);
/// Longest a PostgreSQL statement may run before the server ends it.
const POSTGRES_STATEMENT_LIMIT: Duration = Duration::from_secs(30);
/// Longest a PostgreSQL statement may wait for a lock.
const POSTGRES_LOCK_LIMIT: Duration = Duration::from_secs(10);
/// Prepared statements each PostgreSQL connection keeps: above the statements the batches make
/// (one per group size, up to `batch::MOST_PER_CALL`, for each kind), so that none is prepared
/// again and again (sqlx's default keeps 100).
const POSTGRES_PREPARED: usize = 256;
/// Groups of watch-list checks, and of additions, under way at once on PostgreSQL (on SQLite:
/// one per reader, and one for the single writer).
const POSTGRES_BATCHES: usize = 4;

/// Why an item was not added.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// The viewer already has the title on the list.
    #[error("{0} is already in your watch list")]
    AlreadyListed(String),
    /// The title was deleted since it was checked.
    #[error("there is no {}", .0.describe())]
    NoSuchTitle(Title),
    #[error(transparent)]
    Database(#[from] DatabaseError),
}

pub struct Catalogue {
    /// Reads: several SQLite connections, or the PostgreSQL pool.
    reader: AnyPool,
    /// Writes (and, on SQLite, migrations): one SQLite connection, or the same PostgreSQL pool.
    writer: AnyPool,
    versions: Batch<(), Version>,
    recommendations: Batch<Mood, Arc<[MovieSummary]>>,
    recommended: Fresh<Mood, Arc<[MovieSummary]>>,
    reviews: Batch<i64, Arc<[Review]>>,
    reviewed: Fresh<i64, Arc<[Review]>>,
    listed_checks: Batch<ListedCheck, OnList>,
    additions: Batch<NewItem, Option<i64>>,
}

impl Catalogue {
    /// Connects to `url` (`sqlite://…` or `postgres://…`), brings the schema up to date and runs
    /// `prepare` (the seeding) on the catalogue. Processes doing so on the same SQLite file take
    /// turns ([`SetUpLock`]); on PostgreSQL the migrator takes a lock of its own, and seeding
    /// waits for another's rows.
    pub async fn connect<T>(
        url: &str,
        prepare: impl AsyncFnOnce(&Self) -> anyhow::Result<T>,
    ) -> anyhow::Result<(Self, T)> {
        install_default_drivers();
        let postgres = url.starts_with("postgres:") || url.starts_with("postgresql:");
        let sqlite = url.starts_with("sqlite:");
        anyhow::ensure!(
            postgres || sqlite,
            "DATABASE_URL must start with sqlite: or postgres:"
        );
        let (pool_url, set_up_lock) = if postgres {
            (with_statement_cache(url), None)
        } else {
            let file = sqlite_file::file_of(url)?;
            // A read-only process migrates and seeds nothing: it need not take its turn.
            let lock = if sqlite_file::read_only(url) {
                None
            } else {
                Some(SetUpLock::take(&file).await?)
            };
            (sqlite_file::creating(url), lock)
        };
        let pool_url = pool_url.as_str();
        let open = |connections: u32| async move {
            pool_options(sqlite, connections)
                .connect(pool_url)
                .await
                .with_context(|| format!("cannot open the database at {}", redact(url)))
        };
        let (reader, writer) = if sqlite {
            let writer = open(1).await?;
            // WAL lets readers read while the writer writes; it is kept in the file.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&writer)
                .await?;
            sqlx::migrate!("migrations/sqlite")
                .run(&writer)
                .await
                .context("migrating the SQLite database")?;
            (open(SQLITE_READERS).await?, writer)
        } else {
            // Migrations run on a connection of their own, free of the time limits the pool's
            // connections set (a migration may rightly take longer than any request should).
            let connecting = tokio::time::timeout(CONNECT_LIMIT, AnyConnection::connect(url));
            let mut migrating = connecting
                .await
                .map_err(|_| anyhow::anyhow!("no answer within {CONNECT_LIMIT:?}"))
                .and_then(|connected| connected.map_err(anyhow::Error::from))
                .with_context(|| format!("cannot open the database at {}", redact(url)))?;
            sqlx::migrate!("migrations/postgres")
                .run(&mut migrating)
                .await
                .context("migrating the PostgreSQL database")?;
            // Migrated: a failure to say goodbye is no reason not to serve.
            let _ = migrating.close().await;
            let pool = open(POSTGRES_CONNECTIONS).await?;
            (pool.clone(), pool)
        };
        let (reads, writes) = if postgres {
            (POSTGRES_BATCHES, POSTGRES_BATCHES)
        } else {
            (SQLITE_READERS as usize, 1)
        };
        let catalogue = Self {
            versions: catalogue_batches::versions(reader.clone()),
            recommendations: catalogue_batches::recommendations(reader.clone(), reads),
            recommended: Fresh::new(),
            reviews: catalogue_batches::reviews(reader.clone(), reads),
            reviewed: Fresh::new(),
            listed_checks: watchlist_batches::listed_checks(reader.clone(), reads),
            additions: watchlist_batches::additions(writer.clone(), postgres, writes),
            reader,
            writer,
        };
        let prepared = prepare(&catalogue).await?;
        drop(set_up_lock);
        Ok((catalogue, prepared))
    }

    /// The SQLite URL of the embedded database under `data_dir`, creating the folder.
    pub fn embedded_url(data_dir: &Path) -> anyhow::Result<String> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        sqlite_file::url_of(&data_dir.join("moviedb.sqlite3"))
    }

    /// Checks that the database answers.
    pub async fn ping(&self) -> sqlx::Result<()> {
        let ping = sqlx::query("SELECT 1").execute(&self.reader);
        batch::read_in_time("ping", ping).await.map(|_| ())
    }

    /// The connections that write (and seed).
    pub fn pool(&self) -> &AnyPool {
        &self.writer
    }

    /// Movies that fit `mood`, best rated first, ties broken by id; without the titles
    /// `watched_by` marked WATCHED when given.
    pub async fn recommend(
        &self,
        mood: Mood,
        watched_by: Option<&str>,
    ) -> Result<Arc<[MovieSummary]>, DatabaseError> {
        let Some(user) = watched_by else {
            let version = self.versions.ask(()).await?;
            if let Some(movies) = self.recommended.get(version, &mood) {
                return Ok(movies);
            }
            let movies = self.recommendations.ask(mood).await?;
            self.recommended.put(version, mood, movies.clone());
            return Ok(movies);
        };
        // LIMIT is model::RECOMMENDATION_LIMIT.
        let unwatched = sqlx::query(
            "SELECT m.id, m.title, m.release_year, m.genre, m.rating FROM movies m \
             JOIN movie_moods mm ON mm.movie_id = m.id WHERE mm.mood = $1 \
             AND NOT EXISTS (SELECT 1 FROM watchlist_items w JOIN users u ON u.id = w.user_id \
             WHERE w.movie_id = m.id AND w.status = 'WATCHED' AND u.name = $2) \
             ORDER BY m.rating DESC, m.id ASC LIMIT 20",
        )
        .bind(mood.as_str())
        .bind(user)
        .fetch_all(&self.reader);
        let rows = batch::read_in_time("unwatched_recommendations", unwatched).await?;
        let movies = rows
            .iter()
            .map(catalogue_batches::movie_summary)
            .collect::<sqlx::Result<Vec<_>>>()?;
        Ok(movies.into())
    }

    /// The reviews of a movie, oldest first.
    pub async fn reviews(&self, movie_id: i64) -> Result<Arc<[Review]>, DatabaseError> {
        let version = self.versions.ask(()).await?;
        if let Some(reviews) = self.reviewed.get(version, &movie_id) {
            return Ok(reviews);
        }
        let reviews = self.reviews.ask(movie_id).await?;
        // No reviews (or no such movie) is not kept: asking for ids nobody reviewed would
        // otherwise push out the movies people summarize.
        if !reviews.is_empty() {
            self.reviewed.put(version, movie_id, reviews.clone());
        }
        Ok(reviews)
    }

    /// The id of the user called `name`, created on first use.
    pub async fn ensure_user(&self, name: &str) -> sqlx::Result<i64> {
        // One statement whether or not the row exists: the no-op update makes RETURNING answer.
        sqlx::query_scalar(
            "INSERT INTO users (name, created_at) VALUES ($1, $2) \
             ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING id",
        )
        .bind(name)
        .bind(now_millis())
        .fetch_one(&self.writer)
        .await
    }

    /// The name of `title` as the catalogue has it now (`None` when there is no such title), and
    /// whether `user` already has it on their list.
    pub async fn on_list(&self, user: &str, title: Title) -> Result<OnList, DatabaseError> {
        let check = ListedCheck {
            user: user.to_owned(),
            title,
        };
        self.listed_checks.ask(check).await
    }

    /// Puts `title` on `user`'s list, creating the user on first use. The unique index decides
    /// races: a second add of the same title fails with [`AddError::AlreadyListed`] and writes
    /// nothing; a title deleted since it was checked fails with [`AddError::NoSuchTitle`].
    pub async fn add_to_watchlist(
        &self,
        user: &str,
        title: Title,
        name: &str,
        status: WatchStatus,
    ) -> Result<WatchlistItem, AddError> {
        let item = NewItem {
            user: user.to_owned(),
            title,
            status,
            added_at: now_millis(),
        };
        let added_at = item.added_at;
        let added = self.additions.ask(item).await.map_err(|error| {
            if error.is_foreign_key_violation() {
                AddError::NoSuchTitle(title)
            } else {
                AddError::Database(error)
            }
        })?;
        match added {
            Some(id) => Ok(WatchlistItem {
                id: Id(id),
                status,
                added_at: rfc3339(added_at),
                content: content(title, name.to_owned()),
            }),
            None => Err(AddError::AlreadyListed(format!("\"{name}\""))),
        }
    }

    /// `user`'s list, newest first.
    pub async fn watchlist(&self, user: &str) -> sqlx::Result<Vec<WatchlistItem>> {
        let list = sqlx::query(
            "SELECT w.id, w.status, w.added_at, w.movie_id, w.tv_show_id, COALESCE(m.title, s.title) AS title \
             FROM watchlist_items w JOIN users u ON u.id = w.user_id \
             LEFT JOIN movies m ON m.id = w.movie_id LEFT JOIN tv_shows s ON s.id = w.tv_show_id \
             WHERE u.name = $1 ORDER BY w.added_at DESC, w.id DESC",
        )
        .bind(user)
        .fetch_all(&self.reader);
        let rows = batch::read_in_time("watchlist", list).await?;
        rows.iter()
            .map(|row| {
                let movie: Option<i64> = row.try_get("movie_id")?;
                let show: Option<i64> = row.try_get("tv_show_id")?;
                let title = match (movie, show) {
                    (Some(id), _) => Title::Movie(id),
                    (None, Some(id)) => Title::TvShow(id),
                    (None, None) => {
                        return Err(sqlx::Error::Protocol(
                            "watch-list item without a title".into(),
                        ));
                    }
                };
                let status: String = row.try_get("status")?;
                Ok(WatchlistItem {
                    id: Id(row.try_get("id")?),
                    status: WatchStatus::parse(&status)
                        .ok_or_else(|| sqlx::Error::Protocol(format!("unknown status {status}")))?,
                    added_at: rfc3339(row.try_get("added_at")?),
                    content: content(title, row.try_get("title")?),
                })
            })
            .collect()
    }
}

/// Pool settings: on SQLite every connection waits up to 5 s for a lock, checks foreign keys, and
/// syncs the WAL at checkpoints rather than at every commit (`synchronous = NORMAL`: a power cut
/// may lose the last commits, never corrupt the file). A SQLite connection is a file handle
/// with nothing to go stale, so it is not pinged before each use. On PostgreSQL the server ends
/// a statement past [`POSTGRES_STATEMENT_LIMIT`] and a wait for a lock past
/// [`POSTGRES_LOCK_LIMIT`] (a row locked by another session, say), rolling it back: a stuck
/// statement fails the requests it carries instead of holding them, and everyone queued behind.
fn pool_options(sqlite: bool, connections: u32) -> AnyPoolOptions {
    AnyPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(CONNECT_LIMIT)
        .test_before_acquire(!sqlite)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                let settings = if sqlite {
                    vec![
                        "PRAGMA busy_timeout = 5000".to_owned(),
                        "PRAGMA foreign_keys = ON".to_owned(),
                        "PRAGMA synchronous = NORMAL".to_owned(),
                    ]
                } else {
                    vec![
                        format!(
                            "SET statement_timeout = {}",
                            POSTGRES_STATEMENT_LIMIT.as_millis()
                        ),
                        format!("SET lock_timeout = {}", POSTGRES_LOCK_LIMIT.as_millis()),
                    ]
                };
                for setting in settings {
                    sqlx::query(AssertSqlSafe(setting))
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
}

/// `url` asking PostgreSQL connections to keep [`POSTGRES_PREPARED`] prepared statements, unless
/// it says how many itself.
fn with_statement_cache(url: &str) -> String {
    if url.contains("statement-cache-capacity=") {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}statement-cache-capacity={POSTGRES_PREPARED}")
}

fn content(title: Title, name: String) -> ItemContent {
    match title {
        Title::Movie(id) => ItemContent {
            title: name,
            kind: "movie".into(),
            id: Id(id),
        },
        Title::TvShow(id) => ItemContent {
            title: name,
            kind: "tvShow".into(),
            id: Id(id),
        },
    }
}

pub(crate) fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn rfc3339(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// A URL without its password, for logs: the user information's, and a `password` or
/// `sslpassword` in the query (which PostgreSQL URLs may carry instead).
pub fn redact(url: &str) -> String {
    // The query's first, so that an `@` in its password is not taken for the user information's.
    let url = without_query_passwords(url);
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{}://{user}:***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url,
    }
}

/// `text` with its `%XX` escapes decoded, as a URL's reader takes a query's keys.
fn unescaped(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = |offset: usize| {
            bytes
                .get(at + offset)
                .and_then(|digit| char::from(*digit).to_digit(16))
        };
        match (bytes[at], hex(1), hex(2)) {
            (b'%', Some(high), Some(low)) => {
                // Two hex digits make at most 255.
                decoded.push(u8::try_from(high * 16 + low).unwrap_or(u8::MAX));
                at += 3;
            }
            (byte, _, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// `url` with the value of every `password=` or `sslpassword=` that follows a `?` or `&` masked:
/// wherever the query begins, even after a `?` left unescaped in the user information's password.
fn without_query_passwords(url: &str) -> String {
    let mut shown = String::with_capacity(url.len());
    for (index, piece) in url.split_inclusive(['?', '&']).enumerate() {
        let (pair, delimiter) = match piece.strip_suffix(['?', '&']) {
            Some(pair) => (pair, &piece[pair.len()..]),
            None => (piece, ""),
        };
        let secret = pair.split_once('=').map(|(key, _)| key).filter(|key| {
            let key = unescaped(key);
            ["password", "sslpassword"]
                .iter()
                .any(|secret| key.eq_ignore_ascii_case(secret))
        });
        match secret {
            // The first piece comes before any delimiter: no query parameter.
            Some(key) if index > 0 => {
                shown.push_str(key);
                shown.push_str("=***");
            }
            _ => shown.push_str(pair),
        }
        shown.push_str(delimiter);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_kept_out_of_logged_urls_wherever_the_url_carries_them() {
        for (url, shown) in [
            (
                "postgres://app:hunter2@db/movies",
                "postgres://app:***@db/movies",
            ),
            (
                "postgres://db/movies?user=app&password=hunter2&sslmode=require",
                "postgres://db/movies?user=app&password=***&sslmode=require",
            ),
            (
                "postgres://app@db/movies?PASSWORD=p@ss&sslpassword=hunter2",
                "postgres://app:***@db/movies?PASSWORD=***&sslpassword=***",
            ),
            ("sqlite://movies.db?mode=rwc", "sqlite://movies.db?mode=rwc"),
            // Unescaped, which no parser takes: logged as the connection fails, hidden all the same.
            (
                "postgres://app:pa?ss@db/movies",
                "postgres://app:***@db/movies",
            ),
            // A key written with escapes is the same key to the database's URL reader.
            (
                "postgres://db/movies?pass%77ord=hunter2",
                "postgres://db/movies?pass%77ord=***",
            ),
        ] {
            assert_eq!(redact(url), shown);
        }
    }

    #[test]
    fn postgres_urls_ask_for_a_statement_cache_unless_they_set_one() {
        assert_eq!(
            with_statement_cache("postgres://u@db/movies"),
            "postgres://u@db/movies?statement-cache-capacity=256"
        );
        assert_eq!(
            with_statement_cache("postgres://u@db/movies?sslmode=require"),
            "postgres://u@db/movies?sslmode=require&statement-cache-capacity=256"
        );
        let own = "postgres://u@db/movies?statement-cache-capacity=50";
        assert_eq!(with_statement_cache(own), own);
    }
}
