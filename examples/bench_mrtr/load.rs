//! Driving one server: C loops, each on its own keep-alive connection, doing round trips until a
//! deadline or until a shared count is reached, and the tally of what was measured: latencies,
//! errors, wall time and the server's CPU time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::client::{Connection, Workload};
use crate::servers::{Server, TICKS_PER_SECOND};

/// When the loops stop.
#[derive(Clone)]
pub enum Until {
    Deadline(Instant),
    /// Once all loops together have started this many round trips.
    Count(Arc<AtomicU64>, u64),
}

impl Until {
    pub fn count(total: u64) -> Self {
        Self::Count(Arc::default(), total)
    }

    /// Whether a loop may start one more round trip.
    fn next(&self) -> bool {
        match self {
            Self::Deadline(deadline) => Instant::now() < *deadline,
            Self::Count(started, total) => started.fetch_add(1, Ordering::Relaxed) < *total,
        }
    }
}

/// What each iteration does.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Call, `input_required`, retry, `complete`.
    Full,
    /// The call only: its continuation is left parked, as a client that never answers leaves it.
    FirstOnly,
}

/// One server under load, with a connection per loop.
pub struct Target {
    pub name: &'static str,
    pub server: Server,
    workload: Workload,
    connections: Vec<Option<Connection>>,
    pub tally: Tally,
}

impl Target {
    /// Opens `concurrency` connections to `server`.
    pub async fn connect(
        name: &'static str,
        server: Server,
        workload: Workload,
        concurrency: usize,
    ) -> anyhow::Result<Self> {
        let mut connections = Vec::with_capacity(concurrency);
        for _ in 0..concurrency {
            connections.push(Some(Connection::open(server.addr).await?));
        }
        Ok(Self {
            name,
            server,
            workload,
            connections,
            tally: Tally::default(),
        })
    }

    /// Runs every loop until `until`; with `measure`, adds what happened to the tally.
    pub async fn run(&mut self, until: &Until, round: Round, measure: bool) -> anyhow::Result<()> {
        let cpu_before = self.server.cpu_ticks()?;
        let started = Instant::now();
        let loops = self.connections.iter_mut().map(|slot| {
            let connection = slot.take();
            let workload = self.workload.clone();
            let until = until.clone();
            let addr = self.server.addr;
            tokio::spawn(async move {
                let mut outcome = LoopOutcome {
                    connection,
                    latencies_us: Vec::new(),
                    errors: 0,
                    first_error: None,
                };
                while until.next() {
                    // A server closes connections left idle while the others had their turns
                    // (longer than its idle timeout with long --seconds): open a new one.
                    if outcome
                        .connection
                        .as_ref()
                        .is_some_and(Connection::is_closed)
                    {
                        outcome.connection = None;
                    }
                    let connection = match outcome.connection.as_mut() {
                        Some(connection) => connection,
                        None => match Connection::open(addr).await {
                            Ok(connection) => outcome.connection.insert(connection),
                            Err(e) => {
                                outcome.failed(e);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        },
                    };
                    let began = Instant::now();
                    let done = match round {
                        Round::Full => workload.round_trip(connection).await,
                        Round::FirstOnly => workload.first_round(connection).await,
                    };
                    match done {
                        Ok(()) => {
                            let micros = began.elapsed().as_micros();
                            outcome
                                .latencies_us
                                .push(u32::try_from(micros).unwrap_or(u32::MAX));
                        }
                        Err(e) => {
                            outcome.failed(e);
                            // Start afresh: the connection may be in any state after a failure.
                            outcome.connection = None;
                        }
                    }
                }
                outcome
            })
        });
        let finished = futures::future::join_all(loops).await;
        let elapsed = started.elapsed();
        let cpu_after = self.server.cpu_ticks()?;
        let mut first_error = None;
        for (slot, outcome) in self.connections.iter_mut().zip(finished) {
            let outcome = outcome?;
            *slot = outcome.connection;
            if measure {
                self.tally.latencies_us.extend(outcome.latencies_us);
                self.tally.errors += outcome.errors;
            }
            first_error = first_error.or(outcome.first_error);
        }
        if let Some(error) = first_error {
            eprintln!("{}: round trip failed: {error}", self.name);
        }
        if measure {
            self.tally.elapsed += elapsed;
            self.tally.cpu_ticks += cpu_after.saturating_sub(cpu_before);
        }
        Ok(())
    }
}

struct LoopOutcome {
    connection: Option<Connection>,
    latencies_us: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

impl LoopOutcome {
    fn failed(&mut self, error: anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{error:#}"));
        }
    }
}

/// Everything measured on one server.
#[derive(Default)]
pub struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    elapsed: Duration,
    cpu_ticks: u64,
}

/// A tally boiled down to the figures of the table.
pub struct Figures {
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    /// Server CPU time per successful round trip.
    pub cpu_us: f64,
}

impl Tally {
    pub fn figures(&self) -> Figures {
        let mut sorted = self.latencies_us.clone();
        sorted.sort_unstable();
        let percentile = |p: usize| {
            sorted
                .get((sorted.len() * p / 100).min(sorted.len().saturating_sub(1)))
                .map_or(0.0, |&us| f64::from(us) / 1000.0)
        };
        let done = sorted.len() as f64;
        Figures {
            per_second: done / self.elapsed.as_secs_f64().max(f64::EPSILON),
            p50_ms: percentile(50),
            p99_ms: percentile(99),
            errors: self.errors,
            cpu_us: self.cpu_ticks as f64 / TICKS_PER_SECOND * 1e6 / done.max(1.0),
        }
    }
}
