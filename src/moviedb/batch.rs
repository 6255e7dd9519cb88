//! Many callers' requests answered by one database call. Each call to the database costs far more
//! than the work it carries (sqlx hands every SQLite statement to a thread of its own and back;
//! PostgreSQL is a network round trip and, for a write, a commit), so requests that arrive while
//! a call is under way wait for the next one and go together. A batch of writes isolates
//! refusals: when the database refuses a row of a call (a constraint, a trigger), that call's
//! requests are tried again one by one, so that one bad request does not fail the others it
//! travelled with.
//!
//! A read that takes longer than [`READ_TIME_LIMIT`] fails the requests it carries (a stalled
//! connection would otherwise hold them, and every request queued behind). Writes have no such
//! limit here: a write given up on this side may still commit on the database's, and its callers
//! would be told it failed. The database bounds them instead (PostgreSQL's statement and lock
//! time limits, SQLite's busy timeout; see `catalogue`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use sqlx::error::ErrorKind;
use sqlx::postgres::PgDatabaseError;
use sqlx::sqlite::SqliteError;
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::Instrument as _;

/// Most requests one call carries (each adds a row of parameters to its statement).
pub const MOST_PER_CALL: usize = 32;

/// Longest a read may take before its requests fail: past the pool's wait for a connection
/// (10 s) and PostgreSQL's own statement limit (30 s) together, so that the database's answer,
/// when it gives one, is the one reported. A connection whose read was cut short this way is
/// checked before it serves again, and on a connection that stopped answering that check waits
/// for the operating system to give the connection up.
pub const READ_TIME_LIMIT: Duration = Duration::from_secs(45);

/// A read made outside a batch, held to [`READ_TIME_LIMIT`] as the batches' reads are.
pub async fn read_in_time<T>(
    name: &'static str,
    read: impl Future<Output = sqlx::Result<T>>,
) -> sqlx::Result<T> {
    read_within(name, READ_TIME_LIMIT, read).await
}

/// `read`, or an error once it has taken `limit`.
async fn read_within<T>(
    name: &'static str,
    limit: Duration,
    read: impl Future<Output = sqlx::Result<T>>,
) -> sqlx::Result<T> {
    tokio::time::timeout(limit, read).await.unwrap_or_else(|_| {
        tracing::warn!(
            read = name,
            ?limit,
            "a database read took too long; it fails"
        );
        Err(sqlx::Error::Protocol(format!(
            "the database did not answer the {name} query within {limit:?}"
        )))
    })
}

/// A database failure shared by every request of the call that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct DatabaseError(Arc<sqlx::Error>);

impl DatabaseError {
    /// Whether the database refused a row for naming one that does not exist.
    pub fn is_foreign_key_violation(&self) -> bool {
        matches!(&*self.0, sqlx::Error::Database(error)
            if error.kind() == ErrorKind::ForeignKeyViolation)
    }
}

impl From<sqlx::Error> for DatabaseError {
    fn from(error: sqlx::Error) -> Self {
        Self(Arc::new(error))
    }
}

/// What a batch's calls do, which decides how they are cut short and retried.
#[derive(Clone, Copy)]
enum Kind {
    Reads { time_limit: Duration },
    Writes,
}

struct Job<Request, Answer> {
    request: Request,
    reply: oneshot::Sender<Result<Answer, DatabaseError>>,
}

/// Sends requests to `calls` runners, each of which takes every request waiting (up to
/// [`MOST_PER_CALL`]) and answers them with one call of `run`.
pub struct Batch<Request, Answer> {
    queue: mpsc::Sender<Job<Request, Answer>>,
    name: &'static str,
}

/// What answers a batch: one answer per request, in order. In a batch of writes, a call that
/// fails must leave nothing written, as its requests are tried again one by one.
pub type Run<Request, Answer> =
    Arc<dyn Fn(Arc<[Request]>) -> BoxFuture<'static, sqlx::Result<Vec<Answer>>> + Send + Sync>;

impl<Request: Clone + Send + Sync + 'static, Answer: Send + 'static> Batch<Request, Answer> {
    /// Starts `calls` runners of reads on the current runtime; they stop when the batch is
    /// dropped. `name` labels the batch's statements in the metrics. A failed call, or one past
    /// `time_limit`, fails every request it carried; a request whose caller went away before
    /// its turn is not read.
    pub fn start_reads(
        name: &'static str,
        calls: usize,
        time_limit: Duration,
        run: Run<Request, Answer>,
    ) -> Self {
        Self::spawn(name, calls, run, Kind::Reads { time_limit })
    }

    /// Starts `calls` runners of writes. A call the database failed by refusing a row is tried
    /// again request by request, in order, so that only the requests it refuses fail. Every
    /// request is written, even when its caller went away.
    pub fn start_writes(name: &'static str, calls: usize, run: Run<Request, Answer>) -> Self {
        Self::spawn(name, calls, run, Kind::Writes)
    }

    fn spawn(name: &'static str, calls: usize, run: Run<Request, Answer>, kind: Kind) -> Self {
        let (queue, waiting) = mpsc::channel(MOST_PER_CALL * calls.max(1) * 8);
        let waiting = Arc::new(Mutex::new(waiting));
        for _ in 0..calls.max(1) {
            tokio::spawn(runner(name, waiting.clone(), run.clone(), kind));
        }
        Self { queue, name }
    }

    /// The answer to `request`, from the next call that takes it. Its span covers the wait for
    /// a turn and the statement.
    pub async fn ask(&self, request: Request) -> Result<Answer, DatabaseError> {
        let span = tracing::info_span!(
            "moviedb.sql",
            otel.name = self.name,
            db.system = "sql",
            batch = self.name
        );
        async {
            let (reply, answer) = oneshot::channel();
            let stopped = || DatabaseError::from(sqlx::Error::PoolClosed);
            self.queue
                .send(Job { request, reply })
                .await
                .map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        }
        .instrument(span)
        .await
    }
}

async fn runner<Request: Clone, Answer>(
    name: &'static str,
    waiting: Arc<Mutex<mpsc::Receiver<Job<Request, Answer>>>>,
    run: Run<Request, Answer>,
    kind: Kind,
) {
    loop {
        let jobs = {
            let mut waiting = waiting.lock().await;
            let Some(first) = waiting.recv().await else {
                return;
            };
            let mut jobs = vec![first];
            while jobs.len() < MOST_PER_CALL {
                match waiting.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            jobs
        };
        let jobs = match kind {
            Kind::Reads { .. } => jobs
                .into_iter()
                .filter(|job| !job.reply.is_closed())
                .collect(),
            Kind::Writes => jobs,
        };
        if jobs.is_empty() {
            continue;
        }
        let (requests, replies): (Vec<_>, Vec<_>) =
            jobs.into_iter().map(|job| (job.request, job.reply)).unzip();
        let requests: Arc<[Request]> = requests.into();
        metrics::histogram!("moviedb_sql_batch_size", "batch" => name)
            .record(requests.len() as f64);
        let started = std::time::Instant::now();
        let answers = match kind {
            Kind::Reads { time_limit } => {
                read_within(name, time_limit, call(name, &run, requests.clone())).await
            }
            Kind::Writes => call(name, &run, requests.clone()).await,
        };
        match answers {
            Err(error)
                if matches!(kind, Kind::Writes) && requests.len() > 1 && refuses_a_row(&error) =>
            {
                tracing::warn!(batch = name, %error, requests = requests.len(),
                    "the database refused a row of a grouped statement; trying its requests one by one");
                metrics::counter!("moviedb_sql_batch_splits_total", "batch" => name).increment(1);
                run_alone(name, &run, &requests, replies).await;
            }
            answers => answer_all(answers, replies),
        }
        metrics::histogram!("moviedb_sql_batch_seconds", "batch" => name)
            .record(started.elapsed().as_secs_f64());
    }
}

/// Runs each of `requests` alone, in order (as they arrived, so the first of two requests for
/// the same row still wins). Once one fails for another reason than a refused row, the rest
/// get that failure without being tried: the database is out of reach for them too.
async fn run_alone<Request: Clone, Answer>(
    name: &'static str,
    run: &Run<Request, Answer>,
    requests: &[Request],
    replies: Vec<oneshot::Sender<Result<Answer, DatabaseError>>>,
) {
    let mut out_of_reach: Option<DatabaseError> = None;
    for (request, reply) in requests.iter().zip(replies) {
        if let Some(error) = &out_of_reach {
            let _ = reply.send(Err(error.clone()));
            continue;
        }
        match call(name, run, Arc::from([request.clone()])).await {
            Err(error) if !refuses_a_row(&error) => {
                let error = DatabaseError::from(error);
                out_of_reach = Some(error.clone());
                let _ = reply.send(Err(error));
            }
            answers => answer_all(answers, vec![reply]),
        }
    }
}

/// One call of `run` for `requests`. A call that panics fails its requests instead of ending the
/// runner, which would leave the batch one runner short (the SQLite writer has only one) and
/// every later request without an answer.
async fn call<Request, Answer>(
    name: &'static str,
    run: &Run<Request, Answer>,
    requests: Arc<[Request]>,
) -> sqlx::Result<Vec<Answer>> {
    let calling = AssertUnwindSafe(async { run(requests).await });
    calling.catch_unwind().await.unwrap_or_else(|_| {
        tracing::error!(batch = name, "a database call panicked; its requests fail");
        Err(sqlx::Error::Protocol(format!(
            "the {name} database call panicked"
        )))
    })
}

/// Whether `error` is the database refusing a row: a constraint or a trigger's refusal, a value
/// it cannot take. Anything else (I/O, a lock not granted, a server shutting down, rows that
/// cannot be read) would meet each request alone too.
fn refuses_a_row(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(error) = error else {
        return false;
    };
    if error.kind() != ErrorKind::Other {
        // Unique, foreign-key, not-null and check violations.
        return true;
    }
    if let Some(postgres) = error.try_downcast_ref::<PgDatabaseError>() {
        // SQLSTATE classes 22 (data exception) and 23 (integrity), and `RAISE EXCEPTION`.
        let code = postgres.code();
        return code.starts_with("22") || code.starts_with("23") || code == "P0001";
    }
    // SQLite's extended result codes: their low byte is CONSTRAINT (19, a trigger's `RAISE`
    // included) or MISMATCH (20, a value its column cannot take).
    error.try_downcast_ref::<SqliteError>().is_some()
        && error
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 19 | 20))
}

/// Hands each request its answer; when the call failed, every request gets the failure. A
/// caller that went away meanwhile is skipped.
fn answer_all<Answer>(
    answers: sqlx::Result<Vec<Answer>>,
    replies: Vec<oneshot::Sender<Result<Answer, DatabaseError>>>,
) {
    match answers {
        Ok(answers) if answers.len() == replies.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(answers) => {
            let error = DatabaseError::from(sqlx::Error::Protocol(format!(
                "{} answers to {} requests",
                answers.len(),
                replies.len()
            )));
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
        Err(error) => {
            let error = DatabaseError::from(error);
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use sqlx::sqlite::SqlitePoolOptions;
    use tokio::sync::Semaphore;

    use super::*;

    #[tokio::test]
    async fn a_call_that_panics_fails_its_requests_and_the_batch_goes_on() {
        // One runner, as the SQLite writer has: were it to end, nothing would answer again.
        let run: Run<u32, u32> = Arc::new(|numbers: Arc<[u32]>| {
            Box::pin(async move {
                assert!(!numbers.contains(&7), "seven is not taken");
                Ok(numbers.iter().map(|n| n * 2).collect())
            })
        });
        let batch = Batch::start_writes("panicking", 1, run);
        seven_fails_then_four_is_doubled(&batch, "panicked").await;
    }

    /// Asking for 7 fails with `saying` in the error; the runner then still answers 4 with 8.
    async fn seven_fails_then_four_is_doubled(batch: &Batch<u32, u32>, saying: &str) {
        let failed = batch.ask(7).await;
        assert!(
            failed
                .as_ref()
                .is_err_and(|error| error.to_string().contains(saying)),
            "{failed:?}"
        );
        assert_eq!(batch.ask(4).await.ok(), Some(8), "the runner still answers");
    }

    #[tokio::test]
    async fn a_read_past_its_time_limit_fails_its_requests_and_the_batch_goes_on() {
        // Reading 7 never ends, as a query on a stalled connection would not.
        let run: Run<u32, u32> = Arc::new(|numbers: Arc<[u32]>| {
            Box::pin(async move {
                if numbers.contains(&7) {
                    std::future::pending::<()>().await;
                }
                Ok(numbers.iter().map(|n| n * 2).collect())
            })
        });
        let batch = Batch::start_reads("stalling", 1, Duration::from_millis(50), run);
        seven_fails_then_four_is_doubled(&batch, "did not answer").await;
    }

    #[tokio::test]
    async fn a_read_that_never_answers_fails_at_its_limit() {
        let stalled = std::future::pending::<sqlx::Result<u32>>();
        let error = read_within("stalled", Duration::from_millis(50), stalled)
            .await
            .expect_err("a read that never answers fails");
        assert!(
            error
                .to_string()
                .contains("did not answer the stalled query"),
            "{error}"
        );
        let answered = read_within("quick", Duration::from_secs(5), async { Ok(7) }).await;
        assert_eq!(answered.ok(), Some(7));
    }

    #[tokio::test]
    async fn a_read_whose_caller_went_away_is_not_made() {
        let (calls, gate): (Calls, _) = (Calls::default(), Arc::new(Semaphore::new(0)));
        let run: Run<u32, u32> = {
            let (calls, gate) = (calls.clone(), gate.clone());
            Arc::new(move |numbers: Arc<[u32]>| {
                let (calls, gate) = (calls.clone(), gate.clone());
                Box::pin(async move {
                    note_the_call(&calls, &gate, numbers.len()).await;
                    Ok(numbers.iter().map(|n| n * 2).collect())
                })
            })
        };
        let batch = Arc::new(Batch::start_reads("abandoned", 1, READ_TIME_LIMIT, run));
        let held = tokio::spawn({
            let batch = batch.clone();
            async move { batch.ask(1).await }
        });
        while calls.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // Two callers queue behind the held call; one hangs up before its turn.
        let abandoned = tokio::spawn({
            let batch = batch.clone();
            async move { batch.ask(2).await }
        });
        let kept = tokio::spawn({
            let batch = batch.clone();
            async move { batch.ask(3).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        abandoned.abort();
        let _ = abandoned.await;
        gate.add_permits(1);
        assert_eq!(held.await.unwrap().ok(), Some(2));
        assert_eq!(kept.await.unwrap().ok(), Some(6));
        assert_eq!(
            *calls.lock().unwrap(),
            vec![1, 1],
            "the second call carried only the caller still waiting"
        );
    }

    /// What the test batches saw: the size of each call, in order.
    type Calls = Arc<StdMutex<Vec<usize>>>;

    /// Notes a call of `size` requests; the first call then waits for `gate`, so that the
    /// requests sent meanwhile go together in the next one.
    async fn note_the_call(calls: &Calls, gate: &Semaphore, size: usize) {
        let first = {
            let mut calls = calls.lock().unwrap();
            calls.push(size);
            calls.len() == 1
        };
        if first {
            let _ = gate.acquire().await;
        }
    }

    /// A batch that writes numbers into a real SQLite table refusing 13 (a check constraint)
    /// and answers their doubles; `failure`, when given, fails every call instead. Its first
    /// call waits for `gate`, so that the requests sent meanwhile go together in the next one.
    async fn doubling(
        calls: Calls,
        gate: Arc<Semaphore>,
        failure: Option<fn() -> sqlx::Error>,
    ) -> Batch<u32, u32> {
        // One connection: each connection to `sqlite::memory:` has a database of its own.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        sqlx::query("CREATE TABLE numbers (n INTEGER CHECK (n <> 13))")
            .execute(&pool)
            .await
            .unwrap();
        let run: Run<u32, u32> = Arc::new(move |numbers: Arc<[u32]>| {
            let (calls, gate, pool) = (calls.clone(), gate.clone(), pool.clone());
            Box::pin(async move {
                note_the_call(&calls, &gate, numbers.len()).await;
                if let Some(failure) = failure {
                    return Err(failure());
                }
                // One statement for the call: it writes every row or none.
                let mut insert = sqlx::QueryBuilder::new("INSERT INTO numbers (n) ");
                insert.push_values(numbers.iter(), |mut row, n| {
                    row.push_bind(i64::from(*n));
                });
                insert.build().execute(&pool).await?;
                Ok(numbers.iter().map(|n| n * 2).collect())
            })
        });
        Batch::start_writes("doubling", 1, run)
    }

    /// Asks for 100 alone, then for `grouped` together once the first call holds the runner.
    async fn ask_grouped(
        batch: Batch<u32, u32>,
        calls: &Calls,
        gate: &Semaphore,
        grouped: std::ops::RangeInclusive<u32>,
    ) -> Vec<(u32, Result<u32, DatabaseError>)> {
        let batch = Arc::new(batch);
        let first = tokio::spawn({
            let batch = batch.clone();
            async move { (100, batch.ask(100).await) }
        });
        while calls.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let count = grouped.clone().count();
        let grouped: Vec<_> = grouped
            .map(|n| {
                let batch = batch.clone();
                tokio::spawn(async move { (n, batch.ask(n).await) })
            })
            .collect();
        while batch.queue.max_capacity() - batch.queue.capacity() < count {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        let mut answers = vec![first.await.unwrap()];
        for answer in grouped {
            answers.push(answer.await.unwrap());
        }
        answers
    }

    #[tokio::test]
    async fn a_row_the_database_refuses_fails_alone_not_with_its_group() {
        let calls = Calls::default();
        let gate = Arc::new(Semaphore::new(0));
        let batch = doubling(calls.clone(), gate.clone(), None).await;
        for answer in ask_grouped(batch, &calls, &gate, 10..=16).await {
            match answer {
                (13, answer) => assert!(answer.is_err(), "13 is refused"),
                (n, Ok(answer)) => assert_eq!(answer, n * 2),
                (n, Err(error)) => panic!("{n} failed with its group: {error}"),
            }
        }
        let calls = calls.lock().unwrap().clone();
        assert_eq!(
            calls,
            [1, 7, 1, 1, 1, 1, 1, 1, 1],
            "the group of 7, then each alone"
        );
    }

    #[tokio::test]
    async fn a_database_out_of_reach_fails_the_group_once() {
        let calls = Calls::default();
        let gate = Arc::new(Semaphore::new(0));
        let timed_out = || sqlx::Error::PoolTimedOut;
        let batch = doubling(calls.clone(), gate.clone(), Some(timed_out)).await;
        for (n, answer) in ask_grouped(batch, &calls, &gate, 10..=16).await {
            assert!(answer.is_err(), "{n} fails");
        }
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls, [1, 7], "no request is tried again alone");
    }

    /// Whether `sql` fails on `pool` with an error [`refuses_a_row`] counts as a refused row.
    async fn refused(pool: &sqlx::AnyPool, sql: &'static str) -> bool {
        let error = sqlx::query(sql).execute(pool).await.expect_err(sql);
        refuses_a_row(&error)
    }

    /// Each database's refusals of a row, as they come through the `Any` pools the server uses,
    /// are told from its other failures.
    #[tokio::test]
    async fn refused_rows_are_told_from_other_failures_on_both_databases() {
        sqlx::any::install_default_drivers();
        let sqlite = sqlx::any::AnyPoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let schema = "CREATE TABLE items (id INTEGER PRIMARY KEY, n INTEGER NOT NULL UNIQUE \
                      CHECK (n > 0)); INSERT INTO items (n) VALUES (1); \
                      CREATE TRIGGER no_sevens BEFORE INSERT ON items WHEN NEW.n = 7 \
                      BEGIN SELECT RAISE(ABORT, 'no sevens'); END;";
        sqlx::raw_sql(schema).execute(&sqlite).await.unwrap();
        for sql in [
            "INSERT INTO items (n) VALUES (1)",
            "INSERT INTO items (n) VALUES (NULL)",
            "INSERT INTO items (n) VALUES (-1)",
            "INSERT INTO items (n) VALUES (7)",
            "INSERT INTO items (id, n) VALUES ('not a number', 2)",
        ] {
            assert!(refused(&sqlite, sql).await, "SQLite refuses a row: {sql}");
        }
        for sql in ["SELECT * FROM nowhere", "INSERT INTO items (n) VALUES ("] {
            assert!(!refused(&sqlite, sql).await, "not a refused row: {sql}");
        }

        let url = std::env::var("TEST_POSTGRES_URL")
            .ok()
            .filter(|url| !url.trim().is_empty())
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let postgres = sqlx::any::AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("PostgreSQL (TEST_POSTGRES_URL) answers");
        for sql in [
            "SELECT 1 / 0",
            "SELECT 'not a number'::integer",
            "DO $$ BEGIN RAISE EXCEPTION 'refused by a trigger'; END $$",
        ] {
            assert!(
                refused(&postgres, sql).await,
                "PostgreSQL refuses a row: {sql}"
            );
        }
        for sql in [
            "SELECT * FROM nowhere",
            "SELEC 1",
            "DO $$ BEGIN RAISE EXCEPTION 'held' USING ERRCODE = 'lock_not_available'; END $$",
        ] {
            assert!(!refused(&postgres, sql).await, "not a refused row: {sql}");
        }
    }
}
