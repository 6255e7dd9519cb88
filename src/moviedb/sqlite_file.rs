//! The file behind a SQLite database URL, and the lock beside it that processes setting up the
//! same file take turns on.
//!
//! sqlx's SQLite migrator takes no lock, and SQLite answers "database is locked" at once, without
//! waiting, to some steps of a set-up (switching to WAL, a read turning into a write): processes
//! starting together on a fresh file would otherwise race to create the same tables, and the
//! losers would fail to start.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sqlx::sqlite::SqliteConnectOptions;

/// Longest a process waits for another to finish setting up the same file.
const SET_UP_LIMIT: Duration = Duration::from_secs(120);
/// How often a waiting process looks again.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// `url` with `mode=rwc` added when it names no mode, so that a file named for the first time is
/// created, as the embedded database's is.
pub fn creating(url: &str) -> String {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    if query.split('&').any(|pair| pair.starts_with("mode=")) {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}mode=rwc")
}

/// The file `url` keeps its data in. An in-memory database is refused: the catalogue's
/// connections (a writer and several readers) would each see a database of their own, empty.
pub fn file_of(url: &str) -> anyhow::Result<PathBuf> {
    let rest = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let (database, query) = rest.split_once('?').unwrap_or((rest, ""));
    // An empty name is a temporary database of SQLite's own, one per connection too.
    let in_memory = database.is_empty()
        || database.ends_with(":memory:")
        || query.split('&').any(|p| p == "mode=memory");
    anyhow::ensure!(
        !in_memory,
        "an in-memory SQLite database cannot serve: the server's connections would each see one \
         of their own, empty; name a file (sqlite://path/to/moviedb.sqlite3), or leave \
         DATABASE_URL unset for the one under --data-dir"
    );
    let options = SqliteConnectOptions::from_str(url)
        .with_context(|| format!("DATABASE_URL is not a SQLite URL sqlx reads: {url}"))?;
    Ok(options.get_filename().to_path_buf())
}

/// A SQLite URL naming `file`, created when missing, whatever characters its path holds.
pub fn url_of(file: &Path) -> anyhow::Result<String> {
    let file = std::path::absolute(file)
        .with_context(|| format!("cannot tell where {} is", file.display()))?;
    let mut url = String::from("sqlite://");
    for byte in file.as_os_str().as_encoded_bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => {
                url.push(char::from(*byte));
            }
            _ => url.push_str(&format!("%{byte:02X}")),
        }
    }
    url.push_str("?mode=rwc");
    Ok(url)
}

/// Whether `url` opens its database read-only (`mode=ro`): such a process sets nothing up.
pub fn read_only(url: &str) -> bool {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    query.split('&').any(|pair| pair == "mode=ro")
}

/// An exclusive lock on `<database file>.setup-lock`, held while this process migrates and seeds
/// the database; released when dropped, or when the process ends however it ends. Where no lock
/// can be had (a folder this process may not write, a file system without locks) it goes on
/// without, as it did before there was one, and says so.
pub struct SetUpLock {
    _file: Option<File>,
}

impl SetUpLock {
    /// Waits (up to [`SET_UP_LIMIT`]) until no other process sets up `database`, then holds the
    /// lock.
    pub async fn take(database: &Path) -> anyhow::Result<Self> {
        let mut path = database.as_os_str().to_owned();
        path.push(".setup-lock");
        let path = PathBuf::from(path);
        let opened = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path);
        let file = match opened {
            Ok(file) => file,
            Err(e) => return Ok(Self::without(&path, &e)),
        };
        let started = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self { _file: Some(file) }),
                Err(TryLockError::WouldBlock) if started.elapsed() < SET_UP_LIMIT => {
                    tokio::time::sleep(LOOK_EVERY).await;
                }
                Err(TryLockError::WouldBlock) => anyhow::bail!(
                    "another process has been setting up {} for {SET_UP_LIMIT:?} (it holds {})",
                    database.display(),
                    path.display()
                ),
                Err(TryLockError::Error(e)) => return Ok(Self::without(&path, &e)),
            }
        }
    }

    fn without(path: &Path, why: &std::io::Error) -> Self {
        tracing::warn!(
            "cannot lock {} ({why}): setting the database up without taking turns with other \
             processes starting on it",
            path.display()
        );
        Self { _file: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_mode_creates_its_file_and_one_with_a_mode_keeps_it() {
        assert_eq!(creating("sqlite://a.db"), "sqlite://a.db?mode=rwc");
        assert_eq!(
            creating("sqlite://a.db?cache=shared"),
            "sqlite://a.db?cache=shared&mode=rwc"
        );
        assert_eq!(creating("sqlite://a.db?mode=ro"), "sqlite://a.db?mode=ro");
    }

    #[test]
    fn in_memory_databases_are_refused_and_files_found() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
        ] {
            let refusal = file_of(url).expect_err(url).to_string();
            assert!(refusal.contains("in-memory"), "{url}: {refusal}");
        }
        assert_eq!(
            file_of("sqlite://data/a%20b.db?mode=rwc").expect("a file"),
            Path::new("data/a b.db")
        );
        assert_eq!(file_of("sqlite:a.db").expect("a file"), Path::new("a.db"));
    }

    #[test]
    fn an_empty_name_is_refused_as_in_memory_and_read_only_is_seen() {
        for url in ["sqlite://", "sqlite:", "sqlite://?mode=rwc"] {
            assert!(file_of(url).is_err(), "{url} is refused");
        }
        assert!(read_only("sqlite://a.db?cache=shared&mode=ro"));
        assert!(!read_only("sqlite://a.db?mode=rwc"));
    }

    #[cfg(unix)]
    #[test]
    fn a_path_with_spaces_and_url_characters_comes_back_whole() {
        let file = Path::new("/tmp/my data #1/?x%/moviedb.sqlite3");
        let url = url_of(file).expect("a URL");
        assert!(
            url.starts_with("sqlite:///tmp/my%20data%20%231/%3Fx%25/"),
            "{url}"
        );
        let parsed: sqlx::any::AnyConnectOptions = url.parse().expect("sqlx reads it");
        assert_eq!(file_of(parsed.database_url.as_str()).expect("a file"), file);
    }
}
