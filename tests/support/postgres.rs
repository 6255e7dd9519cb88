//! A fresh PostgreSQL database per test, created on the machine's server (`TEST_POSTGRES_URL`, an
//! admin connection URL, default `postgres://postgres@127.0.0.1:5432/postgres`) and dropped when
//! the test ends. A test that needs PostgreSQL fails when it is not reachable; it does not skip.

use std::time::Duration;

use rand::RngCore;
use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

/// The admin connection used when `TEST_POSTGRES_URL` is not set.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A database created for one test and dropped (best effort) when this value is dropped.
pub struct TestDatabase {
    admin_url: String,
    name: String,
    /// The URL servers connect to (`DATABASE_URL`).
    pub url: String,
}

fn admin_url() -> String {
    std::env::var("TEST_POSTGRES_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned())
}

/// `url` with its database (the path) replaced by `database`, keeping any query string.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{root}/{database}?{query}"),
        None => format!("{root}/{database}"),
    }
}

async fn connect(url: &str) -> Result<PgConnection, String> {
    match tokio::time::timeout(Duration::from_secs(15), PgConnection::connect(url)).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 15 s".to_owned()),
    }
}

fn random_suffix() -> String {
    let mut raw = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut raw);
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

impl TestDatabase {
    /// Creates `moviedb_test_<random>`; panics when PostgreSQL is not reachable.
    pub async fn create() -> Self {
        let admin_url = admin_url();
        let shown = moviedb_mcp::moviedb::catalogue::redact(&admin_url);
        let mut admin = connect(&admin_url).await.unwrap_or_else(|e| {
            panic!(
                "PostgreSQL is not reachable at {shown} ({e}). Start it, or point TEST_POSTGRES_URL \
                 at an admin connection URL (default {DEFAULT_POSTGRES_URL})."
            )
        });
        let name = format!("moviedb_test_{}", random_suffix());
        // The name is generated above from [a-z0-9_] only.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap_or_else(|e| panic!("cannot create the test database {name} on {shown}: {e}"));
        let _ = admin.close().await;
        Self {
            url: with_database(&admin_url, &name),
            admin_url,
            name,
        }
    }

    /// How many movies the catalogue holds (0 before a server seeded it).
    pub async fn movie_count(&self) -> i64 {
        self.rows_in("movies").await
    }

    /// How many rows `table` holds (one of the server's tables, named by the test).
    pub async fn rows_in(&self, table: &'static str) -> i64 {
        let mut connection = connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot open the test database: {e}"));
        let rows = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("cannot count the rows of {table} in PostgreSQL: {e}"));
        let _ = connection.close().await;
        rows
    }

    /// How many watch-list rows `user` has, read straight from the database.
    pub async fn watchlist_rows(&self, user: &str) -> i64 {
        let mut connection = connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("cannot open the test database: {e}"));
        let rows = sqlx::query_scalar(
            "SELECT COUNT(*) FROM watchlist_items w JOIN users u ON u.id = w.user_id WHERE u.name = $1",
        )
        .bind(user)
        .fetch_one(&mut connection)
        .await
        .unwrap_or_else(|e| panic!("cannot count the watch-list rows of {user}: {e}"));
        let _ = connection.close().await;
        rows
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs inside the test's runtime, which cannot be blocked on; use a thread of its own.
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(mut admin) = connect(&admin_url).await {
                    let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(drop))
                        .execute(&mut admin)
                        .await;
                    let _ = admin.close().await;
                }
            });
        });
        let _ = cleanup.join();
    }
}
