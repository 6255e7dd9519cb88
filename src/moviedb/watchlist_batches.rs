//! The watch-list checks and additions of many callers, each group as one statement (see
//! [`super::batch`]): "what are these titles called, and which are already listed?" as one
//! query, and "add these items, creating their users" as one write. The unique index still
//! decides races, within a group as between groups: of two additions of one title for one user,
//! one saves and the other is told the title is already listed.

use std::fmt::Write as _;
use std::sync::Arc;

use sqlx::any::AnyArguments;
use sqlx::query::Query;
use sqlx::{Any, AnyPool, AssertSqlSafe, Row};

use super::batch::{Batch, READ_TIME_LIMIT, Run};
use super::model::{Title, WatchStatus};

/// What is `title` called, and is it on `user`'s list?
#[derive(Clone)]
pub struct ListedCheck {
    pub user: String,
    pub title: Title,
}

/// What a [`ListedCheck`] found: the title's name as the catalogue has it now (`None` when
/// there is no such title), and whether the user already listed it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OnList {
    pub name: Option<String>,
    pub listed: bool,
}

/// An item to add to `user`'s list, and the user to create if needed.
#[derive(Clone)]
pub struct NewItem {
    pub user: String,
    pub title: Title,
    pub status: WatchStatus,
    pub added_at: i64,
}

/// Answers [`ListedCheck`]s on `calls` connections of `pool` at a time. The title is read with
/// the check, so that a renamed or deleted title shows in the very next answer.
pub fn listed_checks(pool: AnyPool, calls: usize) -> Batch<ListedCheck, OnList> {
    let run: Run<ListedCheck, OnList> = Arc::new(move |checks: Arc<[ListedCheck]>| {
        let pool = pool.clone();
        Box::pin(async move {
            let sql = format!(
                "WITH v(n, name, movie_id, tv_show_id) AS (VALUES {}) \
                 SELECT v.n, COALESCE(m.title, s.title) AS title, \
                 CAST(CASE WHEN EXISTS (SELECT 1 FROM watchlist_items w \
                   JOIN users u ON u.id = w.user_id WHERE u.name = v.name \
                   AND (w.movie_id = v.movie_id OR w.tv_show_id = v.tv_show_id)) \
                   THEN 1 ELSE 0 END AS BIGINT) AS listed \
                 FROM v LEFT JOIN movies m ON m.id = v.movie_id \
                 LEFT JOIN tv_shows s ON s.id = v.tv_show_id",
                value_rows(checks.len(), 4)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (n, check) in checks.iter().enumerate() {
                let (movie_id, tv_show_id) = ids(check.title);
                query = query
                    .bind(n as i64)
                    .bind(check.user.as_str())
                    .bind(movie_id)
                    .bind(tv_show_id);
            }
            let mut found: Vec<Option<OnList>> = vec![None; checks.len()];
            for row in query.fetch_all(&pool).await? {
                let n: i64 = row.try_get(0)?;
                let on_list = OnList {
                    name: row.try_get(1)?,
                    listed: row.try_get::<i64, _>(2)? != 0,
                };
                if let Some(slot) = usize::try_from(n).ok().and_then(|n| found.get_mut(n)) {
                    *slot = Some(on_list);
                }
            }
            found
                .into_iter()
                .map(|on_list| {
                    on_list.ok_or_else(|| sqlx::Error::Protocol("a check without its row".into()))
                })
                .collect()
        })
    });
    Batch::start_reads("watchlist_checks", calls, READ_TIME_LIMIT, run)
}

/// Adds [`NewItem`]s on `calls` connections of `pool` at a time; each answer is the new item's
/// id, or `None` when the title was already listed.
pub fn additions(pool: AnyPool, postgres: bool, calls: usize) -> Batch<NewItem, Option<i64>> {
    let run: Run<NewItem, Option<i64>> = Arc::new(move |items: Arc<[NewItem]>| {
        let pool = pool.clone();
        Box::pin(async move {
            let rows = value_rows(items.len(), 6);
            let values = format!(
                "WITH v(n, name, movie_id, tv_show_id, status, added_at) AS (VALUES {rows})"
            );
            // PostgreSQL creates the users and adds the items in one statement (data-modifying
            // CTEs). SQLite has none, but runs the three statements of one query string in a
            // single call: the users, the items, then the ids of the users to tell whose is whose.
            // Rows are written in key order, so that two groups under way at once on PostgreSQL
            // take their row locks in the same order and cannot deadlock; requests for the same
            // item stay in arrival order, the first one winning.
            let sql = if postgres {
                format!(
                    "{values}, \
                     member AS (INSERT INTO users (name, created_at) \
                       SELECT name, MIN(added_at) FROM v GROUP BY name ORDER BY name \
                       ON CONFLICT (name) DO UPDATE SET name = excluded.name RETURNING id, name), \
                     added AS (INSERT INTO watchlist_items (user_id, movie_id, tv_show_id, status, added_at) \
                       SELECT m.id, v.movie_id, v.tv_show_id, v.status, v.added_at \
                       FROM v JOIN member m ON m.name = v.name \
                       ORDER BY v.name, v.movie_id, v.tv_show_id, v.n \
                       ON CONFLICT DO NOTHING RETURNING id, user_id, movie_id, tv_show_id, status) \
                     SELECT a.id, m.name, a.movie_id, a.tv_show_id, a.status \
                     FROM added a JOIN member m ON m.id = a.user_id"
                )
            } else {
                format!(
                    "{values} INSERT INTO users (name, created_at) \
                       SELECT name, MIN(added_at) FROM v WHERE true GROUP BY name ORDER BY name \
                       ON CONFLICT (name) DO NOTHING; \
                     {values} INSERT INTO watchlist_items (user_id, movie_id, tv_show_id, status, added_at) \
                       SELECT u.id, v.movie_id, v.tv_show_id, v.status, v.added_at \
                       FROM v JOIN users u ON u.name = v.name WHERE true \
                       ORDER BY v.name, v.movie_id, v.tv_show_id, v.n \
                       ON CONFLICT DO NOTHING RETURNING id, user_id, movie_id, tv_show_id, status; \
                     {values} SELECT u.id, u.name FROM users u WHERE u.name IN (SELECT name FROM v)"
                )
            };
            let mut query: Query<'_, Any, AnyArguments> = sqlx::query(AssertSqlSafe(sql));
            for (n, item) in items.iter().enumerate() {
                let (movie_id, tv_show_id) = ids(item.title);
                query = query
                    .bind(n as i64)
                    .bind(item.user.as_str())
                    .bind(movie_id)
                    .bind(tv_show_id)
                    .bind(item.status.as_str())
                    .bind(item.added_at);
            }
            // Every row of every statement: the `Any` driver's `fetch_optional` and `fetch_one`
            // stop at the first statement's end.
            let inserted = if postgres {
                // One statement: it commits whole or not at all.
                let rows = query.fetch_all(&pool).await?;
                rows.iter()
                    .map(|row| inserted(row, row.try_get(1)?))
                    .collect::<sqlx::Result<Vec<_>>>()?
            } else {
                // Three statements: they commit together, and only once their rows are read, so
                // that a failure anywhere leaves nothing saved and a retry adds the items again.
                let mut transaction = pool.begin().await?;
                let rows = query.fetch_all(&mut *transaction).await?;
                let inserted = sqlite_inserted(&rows)?;
                transaction.commit().await?;
                inserted
            };
            Ok(claim(&items, inserted))
        })
    });
    Batch::start_writes("watchlist_additions", calls, run)
}

/// SQLite's rows: the inserted items (five columns), then the users' ids and names (two), from
/// which each item's user is named.
fn sqlite_inserted(rows: &[sqlx::any::AnyRow]) -> sqlx::Result<Vec<Inserted>> {
    let (added, users): (Vec<_>, Vec<_>) = rows.iter().partition(|row| row.len() == 5);
    let names = users
        .iter()
        .map(|row| Ok((row.try_get::<i64, _>(0)?, row.try_get::<String, _>(1)?)))
        .collect::<sqlx::Result<Vec<_>>>()?;
    added
        .into_iter()
        .map(|row| {
            let user_id: i64 = row.try_get(1)?;
            let name = names
                .iter()
                .find(|(id, _)| *id == user_id)
                .map(|(_, name)| name.clone())
                .ok_or_else(|| sqlx::Error::Protocol(format!("no name for user {user_id}")))?;
            inserted(row, name)
        })
        .collect()
}

/// A row the insert returned: the item's id, its user's name, its title and status.
struct Inserted {
    id: i64,
    user: String,
    title: Title,
    status: String,
}

fn inserted(row: &sqlx::any::AnyRow, user: String) -> sqlx::Result<Inserted> {
    let movie_id: Option<i64> = row.try_get(2)?;
    let tv_show_id: Option<i64> = row.try_get(3)?;
    let title = match (movie_id, tv_show_id) {
        (Some(id), _) => Title::Movie(id),
        (None, Some(id)) => Title::TvShow(id),
        (None, None) => return Err(sqlx::Error::Protocol("an item without a title".into())),
    };
    Ok(Inserted {
        id: row.try_get(0)?,
        user,
        title,
        status: row.try_get(4)?,
    })
}

/// Gives each inserted row to the first request it answers; requests left without one found
/// their title already listed.
fn claim(items: &[NewItem], mut inserted: Vec<Inserted>) -> Vec<Option<i64>> {
    items
        .iter()
        .map(|item| {
            let position = inserted.iter().position(|row| {
                row.user == item.user
                    && row.title == item.title
                    && row.status == item.status.as_str()
            })?;
            Some(inserted.swap_remove(position).id)
        })
        .collect()
}

/// `($1, $2, …), ($k+1, …), …`: `rows` rows of `columns` numbered parameters.
fn value_rows(rows: usize, columns: usize) -> String {
    let mut text = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        text.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..columns {
            let separator = if column == 0 { "" } else { ", " };
            let _ = write!(text, "{separator}${}", row * columns + column + 1);
        }
        text.push(')');
    }
    text
}

fn ids(title: Title) -> (Option<i64>, Option<i64>) {
    match title {
        Title::Movie(id) => (Some(id), None),
        Title::TvShow(id) => (None, Some(id)),
    }
}
