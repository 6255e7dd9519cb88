//! The movie server under test: the real `moviedb-mcp` binary as a child process on a fresh
//! catalogue (embedded SQLite or a fresh PostgreSQL database), sessions signed in or not, the
//! checks on its results, and the seed data it loads, read from the same files.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::net::{free_port, random_hex};
use super::postgres::TestDatabase;
use super::{Client, Reply, RpcRequest};

/// An HS256 token for `user` with the given issue and expiry times (seconds since the epoch).
pub fn sign_token(secret: &[u8], user: &str, iat: i64, exp: i64) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": user, "iat": iat, "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(secret).expect("an HMAC key"),
    )
    .expect("sign a token")
}

/// Client capabilities of a client that can show a form to its user.
pub fn eliciting() -> Value {
    json!({"elicitation": {"form": {}}})
}

/// Client capabilities of a client that cannot ask its user anything.
pub fn no_capabilities() -> Value {
    json!({})
}

// ---------------------------------------------------------------------------------------------
// The server under test and its database
// ---------------------------------------------------------------------------------------------

/// How long the server may take to accept connections (it migrates and seeds first).
pub const STARTUP_LIMIT: Duration = Duration::from_secs(30);

/// Where the catalogue lives for one test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite file in the data folder.
    Sqlite,
    /// A fresh PostgreSQL database (`DATABASE_URL`).
    Postgres,
}

// ---------------------------------------------------------------------------------------------
// The server: the real binary as a child process
// ---------------------------------------------------------------------------------------------

/// The `moviedb-mcp` binary in an environment the test controls. The outer environment is not
/// inherited, so settings such as `DATABASE_URL`, `REDIS_URL`, `OPENAI_API_KEY` or any
/// `MOVIEDB_*` variable of the developer's shell or of CI cannot change what is tested; only the
/// system basics and libpq's `PG*` defaults (a password for `TEST_POSTGRES_URL`, say) pass.
pub fn binary(secret: &str, database_url: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"));
    command.env_clear();
    for (name, value) in std::env::vars_os() {
        let passes = name.to_str().is_some_and(|name| {
            ["PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH"].contains(&name) || name.starts_with("PG")
        });
        if passes {
            command.env(name, value);
        }
    }
    command.env("MOVIEDB_JWT_SECRET", secret);
    command.env("RUST_LOG", "info");
    if let Some(url) = database_url {
        command.env("DATABASE_URL", url);
    }
    command
}

/// Starts `command`'s process with at most `limit` open files, as `ulimit -n` would.
fn limit_open_files(command: &mut Command, limit: u64) {
    use std::os::unix::process::CommandExt as _;
    let rlimit = rustix::process::Rlimit {
        current: Some(limit),
        maximum: Some(limit),
    };
    // SAFETY: setrlimit is async-signal-safe, and nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(move || {
            rustix::process::setrlimit(rustix::process::Resource::Nofile, rlimit)
                .map_err(std::io::Error::from)
        });
    }
}

/// A running `moviedb-mcp` serving a fresh catalogue; killed, and its data removed, on drop.
pub struct MovieServer {
    child: Child,
    pub data_dir: PathBuf,
    pub secret: String,
    pub database_url: Option<String>,
    client: Client,
    output_schemas: tokio::sync::OnceCell<HashMap<String, Value>>,
    /// Dropped after the child is killed (fields drop after `Drop::drop`).
    _database: Option<TestDatabase>,
}

/// Makes sure the server really keeps its catalogue where the backend says: the SQLite file in
/// the data folder, or the test's PostgreSQL database (seeded, so not left empty).
pub async fn assert_catalogue_in(
    backend: Backend,
    data_dir: &Path,
    database: Option<&TestDatabase>,
) {
    match (backend, database) {
        (Backend::Sqlite, _) => assert!(
            data_dir.join("moviedb.sqlite3").is_file(),
            "the SQLite server keeps its catalogue in {}",
            data_dir.display()
        ),
        (Backend::Postgres, Some(database)) => {
            assert!(
                database.movie_count().await > 0,
                "the server seeded the PostgreSQL database"
            );
        }
        (Backend::Postgres, None) => unreachable!("a PostgreSQL run has a database"),
    }
}

pub enum Startup {
    Ready,
    Exited(String),
    TimedOut,
}

/// How to start a server besides its backend.
#[derive(Debug, Default, Clone)]
pub struct Launch {
    /// More command-line arguments.
    pub args: Vec<String>,
    /// The open-file limit (soft and hard) the process starts with.
    pub open_files: Option<u64>,
    /// Passes `--resource-url http://<its address>/mcp`, the URL the server is reached at.
    pub resource_url: bool,
}

impl Launch {
    /// A launch with these command-line arguments.
    pub fn with_args<const N: usize>(args: [&str; N]) -> Self {
        Self {
            args: args.map(str::to_owned).to_vec(),
            ..Self::default()
        }
    }
}

impl MovieServer {
    /// A connection pool to the server's own database, as another writer would open it.
    pub async fn database(&self) -> sqlx::AnyPool {
        let url = match &self.database_url {
            Some(url) => url.clone(),
            None => format!(
                "sqlite://{}",
                self.data_dir.join("moviedb.sqlite3").display()
            ),
        };
        sqlx::any::install_default_drivers();
        sqlx::AnyPool::connect(&url)
            .await
            .expect("open the server's database")
    }

    /// An open `subscriptions/listen` stream for tool-list changes, its acknowledgement read.
    pub async fn listen_for_tool_changes(&self) -> super::EventStream {
        let mut listen = super::checked_client(self.url().to_owned())
            .request("subscriptions/listen")
            .params(json!({"notifications": {"toolsListChanged": true}}))
            .open_stream()
            .await;
        listen.expect_message(Duration::from_secs(15)).await;
        listen
    }

    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, Launch::default()).await
    }

    /// Starts a server on `backend` as `launch` says.
    pub async fn start_with(backend: Backend, launch: Launch) -> Self {
        let database = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(TestDatabase::create().await),
        };
        let database_url = database.as_ref().map(|db| db.url.clone());
        let data_dir = std::env::temp_dir().join(format!(
            "moviedb-mcp-movie-tools-{}-{}",
            std::process::id(),
            random_hex(8)
        ));
        std::fs::create_dir_all(&data_dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", data_dir.display()));
        let secret = random_hex(24);
        let log_path = data_dir.join("server.log");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
            let log = std::fs::File::create(&log_path).expect("create the server log");
            let mut command = binary(&secret, database_url.as_deref());
            if let Some(limit) = launch.open_files {
                limit_open_files(&mut command, limit);
            }
            command
                .arg("--data-dir")
                .arg(&data_dir)
                .arg("--bind")
                .arg(addr.to_string())
                .args(&launch.args)
                .args(
                    launch
                        .resource_url
                        .then(|| ["--resource-url".to_owned(), format!("http://{addr}/mcp")])
                        .into_iter()
                        .flatten(),
                )
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log handle"))
                .stderr(log);
            let child = command
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start moviedb-mcp: {e}"));
            let mut server = Self {
                child,
                data_dir: data_dir.clone(),
                secret: secret.clone(),
                database_url: database_url.clone(),
                client: super::checked_client(format!(
                    "http://{addr}{}",
                    moviedb_mcp::app::MCP_PATH
                )),
                output_schemas: tokio::sync::OnceCell::new(),
                _database: None,
            };
            match server.wait_until_ready(addr).await {
                Startup::Ready => {
                    assert_catalogue_in(backend, &data_dir, database.as_ref()).await;
                    server._database = database;
                    return server;
                }
                Startup::Exited(log) if attempt < 5 && log.contains("cannot listen") => {
                    // Someone took the port between our probe and the server's bind: try another.
                    server.forget_data_dir();
                    continue;
                }
                Startup::Exited(log) => {
                    panic!("moviedb-mcp ({backend:?}) exited before serving; its log:\n{log}")
                }
                Startup::TimedOut => {
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    panic!(
                        "moviedb-mcp ({backend:?}) did not accept connections on {addr} within {STARTUP_LIMIT:?}; its log:\n{log}"
                    )
                }
            }
        }
    }

    pub async fn wait_until_ready(&mut self, addr: SocketAddr) -> Startup {
        let deadline = tokio::time::Instant::now() + STARTUP_LIMIT;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                let log =
                    std::fs::read_to_string(self.data_dir.join("server.log")).unwrap_or_default();
                return Startup::Exited(log);
            }
            let connect = tokio::net::TcpStream::connect(addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                return Startup::Ready;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Startup::TimedOut
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as an orchestrator stopping the server would.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// The server's exit status once it has exited, or `None` if it still runs after `limit`.
    pub async fn exit_status(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("server.log")).unwrap_or_default()
    }

    /// Keeps the data folder when this (failed) instance is dropped; the next attempt reuses it.
    pub fn forget_data_dir(&mut self) {
        self.data_dir = PathBuf::new();
    }

    /// The MCP endpoint.
    pub fn url(&self) -> &str {
        self.client.url()
    }

    /// A client without credentials.
    pub fn anonymous(&self) -> Session {
        Session {
            client: self.client.clone(),
        }
    }

    /// A client signed in as `user` with a token minted from the server's secret.
    pub fn user(&self, user: &str) -> Session {
        let token =
            moviedb_mcp::auth::mint_token(self.secret.as_bytes(), user, Duration::from_secs(3600))
                .expect("mint a test token");
        self.with_token(&token)
    }

    /// A client that sends `Authorization: Bearer <token>` as given.
    pub fn with_token(&self, token: &str) -> Session {
        Session {
            client: self.client.with_bearer(token),
        }
    }

    /// The `outputSchema` each tool declares in `tools/list`, fetched once.
    pub async fn output_schemas(&self) -> &HashMap<String, Value> {
        self.output_schemas
            .get_or_init(|| async {
                let reply = self.anonymous().request("tools/list").send().await;
                let tools = reply
                    .result()
                    .get("tools")
                    .and_then(Value::as_array)
                    .unwrap_or_else(|| panic!("tools/list without tools: {}", reply.body_text()));
                tools
                    .iter()
                    .filter_map(|tool| {
                        let name = tool.get("name")?.as_str()?.to_owned();
                        Some((name, tool.get("outputSchema")?.clone()))
                    })
                    .collect()
            })
            .await
    }
}

impl Drop for MovieServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.data_dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sessions and results
// ---------------------------------------------------------------------------------------------

/// One client of the server, signed in (every request it sends carries its bearer token, the
/// schema checks' own `tools/list` included) or not.
#[derive(Clone)]
pub struct Session {
    client: Client,
}

impl Session {
    /// A user of the endpoint at `url` signed in with `token`.
    pub fn signed_in(url: String, token: String) -> Self {
        Self {
            client: super::checked_client(url).with_bearer(&token),
        }
    }

    /// A request with the standard headers and `_meta`, and the bearer token if any.
    pub fn request(&self, method: &str) -> RpcRequest<'_> {
        self.client.request(method)
    }

    /// `tools/call` from a client that can show forms.
    pub async fn call(&self, tool: &str, arguments: Value) -> Reply {
        self.call_with(tool, arguments, eliciting()).await
    }

    /// `tools/call` declaring `capabilities`.
    pub async fn call_with(&self, tool: &str, arguments: Value, capabilities: Value) -> Reply {
        self.request("tools/call")
            .params(json!({"name": tool, "arguments": arguments}))
            .capabilities(capabilities)
            .send()
            .await
    }

    /// The retry of an `input_required` call: same tool and arguments, the answers and the state.
    pub async fn retry(
        &self,
        tool: &str,
        arguments: Value,
        input_responses: Value,
        request_state: &str,
    ) -> Reply {
        self.request("tools/call")
            .params(json!({
                "name": tool,
                "arguments": arguments,
                "inputResponses": input_responses,
                "requestState": request_state,
            }))
            .capabilities(eliciting())
            .send()
            .await
    }

    /// The items of this user's watch list (getWatchlist must succeed).
    pub async fn watchlist(&self) -> Vec<Value> {
        let reply = self.call("getWatchlist", json!({})).await;
        structured(&reply)
            .get("items")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("getWatchlist without items: {}", reply.body_text()))
            .clone()
    }
}

/// The number in an id the server sent: ids travel as strings of digits (GraphQL `ID`s).
pub fn id_of(value: &Value) -> i64 {
    value
        .as_str()
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| panic!("an id is a string of digits, got {value}"))
}

/// The result of a finished call (HTTP 200, `resultType: complete`).
pub fn complete(reply: &Reply) -> &Map<String, Value> {
    assert_eq!(
        reply.status.as_u16(),
        200,
        "HTTP status (body {})",
        reply.body_text()
    );
    assert_eq!(
        reply.result_type(),
        "complete",
        "expected a finished result, got {}",
        reply.body_text()
    );
    reply.result().as_object().expect("result is an object")
}

pub fn is_error(result: &Map<String, Value>) -> bool {
    result.get("isError").and_then(Value::as_bool) == Some(true)
}

/// The `structuredContent` of a successful tool result.
pub fn structured(reply: &Reply) -> &Value {
    let result = complete(reply);
    assert!(
        !is_error(result),
        "expected success, got a tool error: {}",
        reply.body_text()
    );
    result
        .get("structuredContent")
        .unwrap_or_else(|| panic!("result without structuredContent: {}", reply.body_text()))
}

/// The text of a tool error (`isError: true`), answered at once (no `input_required`).
pub fn tool_error(reply: &Reply) -> String {
    let result = complete(reply);
    assert!(
        is_error(result),
        "expected a tool error (isError: true), got {}",
        reply.body_text()
    );
    let text = reply.text();
    assert!(!text.is_empty(), "a tool error should say what went wrong");
    text
}

/// Asserts a JSON-RPC error with `code`.
pub fn assert_rpc_error(reply: &Reply, code: i64) {
    assert!(
        reply.response().get("error").is_some(),
        "expected a JSON-RPC error {code}, got {}",
        reply.body_text()
    );
    assert_eq!(
        reply.error_code(),
        code,
        "JSON-RPC error code (body {})",
        reply.body_text()
    );
}

// ---------------------------------------------------------------------------------------------
// The seed data, read from the files the server seeds from
// ---------------------------------------------------------------------------------------------

pub fn seed_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/moviedb/seed")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the seed file {}: {e}", path.display()))
}

/// The rows of a seed TSV file, without its header.
pub fn seed_rows(name: &str) -> Vec<Vec<String>> {
    seed_file(name)
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            line.trim_end_matches('\r')
                .split('\t')
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
pub struct SeedMovie {
    pub id: i64,
    pub title: String,
    pub release_year: i64,
    pub genre: String,
    pub rating: f64,
    pub moods: Vec<String>,
}

pub fn seed_movies() -> Vec<SeedMovie> {
    seed_rows("movies.tsv")
        .into_iter()
        .map(|f| SeedMovie {
            id: f[0].trim().parse().expect("movie id"),
            title: f[1].clone(),
            release_year: f[2].trim().parse().expect("release year"),
            genre: f[3].clone(),
            rating: f[4].trim().parse().expect("rating"),
            moods: f[5]
                .split(',')
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect(),
        })
        .collect()
}

/// Movies that fit `mood`, best rated first, ties by id.
pub fn seed_ranking(mood: &str) -> Vec<SeedMovie> {
    let mut movies: Vec<SeedMovie> = seed_movies()
        .into_iter()
        .filter(|m| m.moods.iter().any(|x| x == mood))
        .collect();
    movies.sort_by(|a, b| b.rating.total_cmp(&a.rating).then(a.id.cmp(&b.id)));
    movies
}

pub fn seed_movie_title(id: i64) -> String {
    seed_movies()
        .into_iter()
        .find(|m| m.id == id)
        .unwrap_or_else(|| panic!("no movie {id} in the seed"))
        .title
}

pub fn seed_tv_show_title(id: i64) -> String {
    seed_rows("tv_shows.tsv")
        .into_iter()
        .find(|f| f[0].trim().parse::<i64>().ok() == Some(id))
        .unwrap_or_else(|| panic!("no TV show {id} in the seed"))[1]
        .clone()
}

/// The review scores of `movie_id` in the seed.
pub fn seed_scores(movie_id: i64) -> Vec<i64> {
    seed_rows("reviews.tsv")
        .into_iter()
        .filter(|f| f[0].trim().parse::<i64>().ok() == Some(movie_id))
        .map(|f| f[2].trim().parse().expect("review score"))
        .collect()
}

pub fn mean(scores: &[i64]) -> f64 {
    scores.iter().sum::<i64>() as f64 / scores.len() as f64
}

/// A server summarizing with `provider`, and a streamed `summarizeMovieReviews` call it is
/// making: the provider has been asked, and holds its answer until released.
pub async fn summarizing_with(
    provider: &super::openai::FakeProvider,
) -> (MovieServer, super::EventStream) {
    let launch = Launch::with_args([
        "--llm-base-url",
        &provider.base_url(),
        "--llm-model",
        "review-writer-test",
        "--llm-api-key",
        "sk-test-0123456789",
    ]);
    let server = MovieServer::start_with(Backend::Sqlite, launch).await;
    let client = super::checked_client(server.url().to_owned());
    let mut summary = client
        .request("tools/call")
        .params(json!({"name": "summarizeMovieReviews", "arguments": {"movieId": "6"}}))
        .progress_token(json!("drain"))
        .open_stream()
        .await;
    // Progress 0.4: the provider has been asked, and waits to be released.
    loop {
        let message = summary.expect_message(Duration::from_secs(15)).await;
        if message["params"]["progress"].as_f64() == Some(0.4) {
            break;
        }
    }
    (server, summary)
}
