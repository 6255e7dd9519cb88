//! The load generator's client: one keep-alive HTTP/1.1 connection per loop (hyper, Nagle's
//! algorithm off) and the workloads. An MRTR workload's round trip is a `tools/call` answered
//! `input_required`, then the retry with `inputResponses` and the `requestState`, answered
//! `complete`; a single-call workload's is one `tools/call` answered `complete`. Every response is
//! checked: the HTTP status, the `resultType`, the question asked and the final answer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

/// The conformance example's MRTR tool: it asks the user's name, then greets them.
pub const ELICITATION_TOOL: &str = "test_input_required_result_elicitation";
/// Its answer once the retry says the name is "bench".
pub const ELICITATION_REPLY: &str = "Hello, bench!";
const WATCHLIST_TOOL: &str = "addToWatchlist";
const RECOMMEND_TOOL: &str = "recommendMoviesForMood";
const SUMMARIZE_TOOL: &str = "summarizeMovieReviews";
/// Movies of the seeded catalogue (ids 1 to 355).
pub const SEEDED_MOVIES: u64 = 355;
const MOODS: [&str; 6] = [
    "COMFORT",
    "ADVENTURE",
    "ROMANCE",
    "HORROR",
    "THOUGHTFUL",
    "COMEDY",
];
const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}"#;

/// One keep-alive connection to a server.
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

impl Connection {
    pub async fn open(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // Drives the connection; it ends when the sender is dropped or the server hangs up.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self {
            sender,
            host: HeaderValue::from_str(&addr.to_string())?,
        })
    }

    /// Whether the server has closed the connection (seen once it has been read).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// POSTs one `tools/call` to `/mcp` and returns the body of its 200 answer.
    async fn call(
        &mut self,
        tool: &'static str,
        authorization: Option<&HeaderValue>,
        body: String,
    ) -> anyhow::Result<Bytes> {
        self.sender.ready().await?;
        let mut request = Request::post("/mcp")
            .header(HOST, &self.host)
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool);
        if let Some(authorization) = authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        let response = self
            .sender
            .send_request(request.body(Full::new(Bytes::from(body)))?)
            .await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::ensure!(
            status == StatusCode::OK,
            "HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(body)
    }
}

/// What each round trip does.
#[derive(Clone)]
pub enum Workload {
    /// The conformance example's `test_input_required_result_elicitation` (the floor answers it too).
    Elicitation,
    /// `addToWatchlist` of a seeded movie, answered WATCHED, for a new user each time.
    Watchlist(Arc<Users>),
    /// Single calls of `recommendMoviesForMood`, the moods in turn.
    Recommend(Arc<AtomicU64>),
    /// Single calls of `summarizeMovieReviews`, these movies (each with a summary) in turn.
    Summarize(Arc<Turns>),
    /// Recommendations and summaries in turn (the floor's single calls).
    Calls(Arc<Turns>),
}

/// Movies to summarize, and a counter that takes them in turn.
pub struct Turns {
    movies: Vec<u64>,
    next: AtomicU64,
}

impl Turns {
    pub fn new(movies: Vec<u64>) -> anyhow::Result<Arc<Self>> {
        anyhow::ensure!(!movies.is_empty(), "no movie to summarize");
        Ok(Arc::new(Self {
            movies,
            next: AtomicU64::new(0),
        }))
    }

    /// The turn's number and its movie.
    fn next(&self) -> (u64, u64) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        (n, self.movies[n as usize % self.movies.len()])
    }
}

/// Signs in a new user for every watch-list round trip, so the unique index never refuses one.
pub struct Users {
    secret: Vec<u8>,
    /// Tells this run's users from another run's in a database that outlives runs.
    run: String,
    next: AtomicU64,
}

impl Users {
    pub fn new(secret: &str, run: &str) -> Self {
        Self {
            secret: secret.as_bytes().to_vec(),
            run: run.to_owned(),
            next: AtomicU64::new(0),
        }
    }

    /// A fresh user's `Authorization` value, and the movie they add.
    fn next(&self) -> anyhow::Result<(HeaderValue, u64)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let token = moviedb_mcp::auth::mint_token(
            &self.secret,
            &format!("bench-{}-{n}", self.run),
            Duration::from_secs(3600),
        )?;
        Ok((
            HeaderValue::from_str(&format!("Bearer {token}"))?,
            1 + n % SEEDED_MOVIES,
        ))
    }
}

impl Workload {
    /// One full MRTR round trip (or one single call), every answer checked.
    pub async fn round_trip(&self, connection: &mut Connection) -> anyhow::Result<()> {
        match self {
            Self::Recommend(next) => {
                return recommend(connection, next.fetch_add(1, Ordering::Relaxed)).await;
            }
            Self::Summarize(turns) => return summarize(connection, turns.next().1).await,
            Self::Calls(turns) => {
                let (n, movie) = turns.next();
                return if n % 2 == 0 {
                    recommend(connection, n / 2).await
                } else {
                    summarize(connection, movie).await
                };
            }
            Self::Elicitation | Self::Watchlist(_) => {}
        }
        let asked = self.ask(connection).await?;
        let retry = call_body(
            asked.tool,
            &asked.arguments,
            Some((asked.responses, &asked.state)),
        );
        let last = connection
            .call(asked.tool, asked.authorization.as_ref(), retry)
            .await?;
        self.check_final(&answer(&last)?)
    }

    /// Only the first request of a round trip, whose continuation is then left parked.
    pub async fn first_round(&self, connection: &mut Connection) -> anyhow::Result<()> {
        self.ask(connection).await.map(drop)
    }

    /// The first request, checked: it must ask its question and carry a `requestState`.
    async fn ask(&self, connection: &mut Connection) -> anyhow::Result<Asked> {
        let (tool, arguments, authorization, key, responses) = match self {
            Self::Elicitation => (
                ELICITATION_TOOL,
                "{}".to_owned(),
                None,
                "user_name",
                r#"{"user_name":{"action":"accept","content":{"name":"bench"}}}"#,
            ),
            Self::Recommend(_) | Self::Summarize(_) | Self::Calls(_) => {
                anyhow::bail!("a single-call workload asks nothing")
            }
            Self::Watchlist(users) => {
                let (authorization, movie) = users.next()?;
                (
                    WATCHLIST_TOOL,
                    format!(r#"{{"subject":{{"movieId":{movie}}}}}"#),
                    Some(authorization),
                    "status",
                    r#"{"status":{"action":"accept","content":{"status":"WATCHED"}}}"#,
                )
            }
        };
        let body = call_body(tool, &arguments, None);
        let first = answer(&connection.call(tool, authorization.as_ref(), body).await?)?;
        anyhow::ensure!(
            first.result_type == "input_required" && first.input_requests.contains_key(key),
            "expected input_required asking {key:?}, got {}",
            first.result_type
        );
        Ok(Asked {
            tool,
            arguments,
            authorization,
            responses,
            state: first
                .request_state
                .context("input_required without requestState")?,
        })
    }

    fn check_final(&self, last: &Answer) -> anyhow::Result<()> {
        let complete = last.result_type == "complete" && !last.is_error;
        match self {
            Self::Elicitation => {
                let text = last.content.first().and_then(|block| block.text.as_deref());
                anyhow::ensure!(
                    complete && text == Some(ELICITATION_REPLY),
                    "unexpected final answer: {} {text:?}",
                    last.result_type
                );
            }
            Self::Watchlist(_) => {
                let saved = last.structured_content.as_ref();
                let status = saved.and_then(|s| s.get("status")).and_then(Value::as_str);
                let title = saved
                    .and_then(|s| s.pointer("/content/title"))
                    .and_then(Value::as_str);
                anyhow::ensure!(
                    complete && status == Some("WATCHED") && title.is_some_and(|t| !t.is_empty()),
                    "unexpected final answer: {} {saved:?}",
                    last.result_type
                );
            }
            Self::Recommend(_) | Self::Summarize(_) | Self::Calls(_) => {
                anyhow::bail!("a single-call workload has no retry")
            }
        }
        Ok(())
    }
}

/// One `recommendMoviesForMood` call (the `turn`th mood), checked for a list of movies.
async fn recommend(connection: &mut Connection, turn: u64) -> anyhow::Result<()> {
    let mood = MOODS[(turn % MOODS.len() as u64) as usize];
    let arguments = format!(r#"{{"input":{{"mood":"{mood}"}}}}"#);
    let body = call_body(RECOMMEND_TOOL, &arguments, None);
    let last = answer(&connection.call(RECOMMEND_TOOL, None, body).await?)?;
    let movies = last
        .structured_content
        .as_ref()
        .and_then(|s| s.get("movies"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    anyhow::ensure!(
        last.result_type == "complete" && !last.is_error && movies > 0,
        "unexpected recommendations: {} with {movies} movies",
        last.result_type
    );
    Ok(())
}

/// One `summarizeMovieReviews` call, checked for a written summary.
pub async fn summarize(connection: &mut Connection, movie: u64) -> anyhow::Result<()> {
    match summary_of(connection, movie).await? {
        Some(_) => Ok(()),
        None => anyhow::bail!("movie {movie} got no summary"),
    }
}

/// The summary sentence of `movie`, if it has enough reviews for one.
pub async fn summary_of(connection: &mut Connection, movie: u64) -> anyhow::Result<Option<String>> {
    let arguments = format!(r#"{{"movieId":"{movie}"}}"#);
    let body = call_body(SUMMARIZE_TOOL, &arguments, None);
    let last = answer(&connection.call(SUMMARIZE_TOOL, None, body).await?)?;
    anyhow::ensure!(
        last.result_type == "complete" && !last.is_error,
        "unexpected summary answer: {}",
        last.result_type
    );
    Ok(last
        .structured_content
        .as_ref()
        .and_then(|s| s.get("summary"))
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
        .map(str::to_owned))
}

/// A first round that asked: what the retry needs.
struct Asked {
    tool: &'static str,
    arguments: String,
    authorization: Option<HeaderValue>,
    /// The `inputResponses` of the retry.
    responses: &'static str,
    state: String,
}

/// A `tools/call` body; a retry adds its `inputResponses` and `requestState`.
fn call_body(tool: &str, arguments: &str, retry: Option<(&str, &str)>) -> String {
    let retry = match retry {
        None => String::new(),
        Some((responses, state)) => format!(
            r#","inputResponses":{responses},"requestState":{}"#,
            Value::from(state)
        ),
    };
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}{retry},"_meta":{META}}}}}"#
    )
}

#[derive(Deserialize)]
struct Envelope {
    result: Option<Answer>,
    error: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    result_type: String,
    #[serde(default)]
    input_requests: HashMap<String, IgnoredAny>,
    request_state: Option<String>,
    #[serde(default)]
    content: Vec<Block>,
    structured_content: Option<Value>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Deserialize)]
struct Block {
    text: Option<String>,
}

fn answer(body: &[u8]) -> anyhow::Result<Answer> {
    let envelope: Envelope = serde_json::from_slice(body).context("the answer is not JSON-RPC")?;
    match (envelope.result, envelope.error) {
        (Some(result), None) => Ok(result),
        (_, Some(error)) => anyhow::bail!("JSON-RPC error: {error}"),
        (None, None) => anyhow::bail!("neither result nor error"),
    }
}
