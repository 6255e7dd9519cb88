//! Many callers' requests answered by one database call. Each call to the database costs far more
//! than the work it carries (sqlx hands every SQLite statement to a thread of its own and back;
//! PostgreSQL is a network round trip and, for a write, a commit), so requests that arrive while
//! a call is under way wait for the next one and go together.

use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::Instrument as _;

/// Most requests one call carries (each adds a row of parameters to its statement).
pub const MOST_PER_CALL: usize = 32;

/// A database failure shared by every request of the call that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error(transparent)]
pub struct DatabaseError(Arc<sqlx::Error>);

impl From<sqlx::Error> for DatabaseError {
    fn from(error: sqlx::Error) -> Self {
        Self(Arc::new(error))
    }
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

/// What answers a batch: one answer per request, in order.
pub type Run<Request, Answer> =
    Arc<dyn Fn(Vec<Request>) -> BoxFuture<'static, sqlx::Result<Vec<Answer>>> + Send + Sync>;

impl<Request: Send + 'static, Answer: Send + 'static> Batch<Request, Answer> {
    /// Starts `calls` runners on the current runtime; they stop when the batch is dropped.
    /// `name` labels the batch's statements in the metrics.
    pub fn start(name: &'static str, calls: usize, run: Run<Request, Answer>) -> Self {
        let (queue, waiting) = mpsc::channel(MOST_PER_CALL * calls.max(1) * 8);
        let waiting = Arc::new(Mutex::new(waiting));
        for _ in 0..calls.max(1) {
            tokio::spawn(runner(name, waiting.clone(), run.clone()));
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

async fn runner<Request, Answer>(
    name: &'static str,
    waiting: Arc<Mutex<mpsc::Receiver<Job<Request, Answer>>>>,
    run: Run<Request, Answer>,
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
        let (requests, replies): (Vec<_>, Vec<_>) =
            jobs.into_iter().map(|job| (job.request, job.reply)).unzip();
        metrics::histogram!("moviedb_sql_batch_size", "batch" => name)
            .record(requests.len() as f64);
        let started = std::time::Instant::now();
        answer_all(run(requests), replies).await;
        metrics::histogram!("moviedb_sql_batch_seconds", "batch" => name)
            .record(started.elapsed().as_secs_f64());
    }
}

/// Hands each request its answer; when the call fails, every request gets the failure. A caller
/// that went away meanwhile is skipped.
async fn answer_all<Answer>(
    call: impl Future<Output = sqlx::Result<Vec<Answer>>>,
    replies: Vec<oneshot::Sender<Result<Answer, DatabaseError>>>,
) {
    match call.await {
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
