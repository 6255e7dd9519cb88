//! The `moviedb-mcp` binary: serves the movie database over MCP, mints sign-in tokens, and fills
//! the database with a synthetic catalogue for load tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use moviedb_mcp::app;
use moviedb_mcp::auth::keys::KeyRefresh;
use moviedb_mcp::auth::oauth::ResourceServer;
use moviedb_mcp::auth::{Authenticator, JwtAuthenticator, mint_token};
use moviedb_mcp::config::ServeArgs;
use moviedb_mcp::moviedb::summarizer::{LlmArgs, Summarizer};
use moviedb_mcp::moviedb::{Catalogue, catalogue, seed, tools};
use moviedb_mcp::registry::Registry;
use moviedb_mcp::server::{Events, ServerInfo};
use moviedb_mcp::service;
use rand::RngCore;

/// mimalloc rather than the system allocator: a request allocates and frees many small buffers
/// (headers, JSON, continuations), which glibc's allocator serves markedly slower under load
/// (see the README's Performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A Model Context Protocol server for a movie database (MCP 2026-07-28, with Multi Round-Trip
/// Requests). With no subcommand it serves at http://127.0.0.1:3000/mcp.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    database: DatabaseArgs,
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    llm: LlmArgs,
}

#[derive(Debug, clap::Args)]
struct DatabaseArgs {
    /// Folder for the embedded SQLite database and the development sign-in secret.
    #[arg(
        long,
        env = "MOVIEDB_DATA_DIR",
        default_value = ".moviedb",
        global = true
    )]
    data_dir: PathBuf,

    /// Database URL (`postgres://…` or `sqlite://…`); the embedded SQLite file when unset.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// Secret for signing and checking bearer tokens (HS256). When unset a development secret is
    /// generated once and kept in the data folder.
    #[arg(
        long,
        env = "MOVIEDB_JWT_SECRET",
        global = true,
        hide_env_values = true
    )]
    jwt_secret: Option<String>,
}

/// The longest a token minted by `token` may live: a year.
const MAX_TOKEN_HOURS: u64 = 24 * 365;

#[derive(Debug, Subcommand)]
enum Command {
    /// Prints a bearer token for a user, creating the user if needed.
    Token {
        /// The user name the token signs in as: not empty, at most 255 bytes, no control
        /// characters.
        #[arg(long, value_parser = user_name)]
        user: String,
        /// Hours the token stays valid, at most a year (8760).
        #[arg(long, default_value_t = 24 * 30, value_parser = clap::value_parser!(u64).range(1..=MAX_TOKEN_HOURS))]
        hours: u64,
    },
    /// Adds a synthetic catalogue (for load tests) to the database.
    Seed {
        /// Synthetic movies to add, at most ten million.
        #[arg(long, default_value_t = 100_000,
              value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
        movies: u64,
        /// Synthetic reviews to add, spread over all movies, at most a hundred million.
        #[arg(long, default_value_t = 1_000_000,
              value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
        reviews: u64,
    },
}

/// A user name the server would accept as a token's subject.
fn user_name(name: &str) -> Result<String, String> {
    match moviedb_mcp::auth::user_name_refusal(name) {
        Some(refusal) => Err(format!("the user name {refusal}")),
        None => Ok(name.to_owned()),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = moviedb_mcp::telemetry::init_logging();
    let cli = Cli::parse();
    let catalogue = open_catalogue(&cli.database).await?;
    match cli.command {
        None => serve(&cli, catalogue).await,
        Some(Command::Token { user, hours }) => {
            catalogue.ensure_user(&user).await?;
            let secret = jwt_secret(&cli.database)?;
            println!(
                "{}",
                mint_token(&secret, &user, Duration::from_secs(hours * 3600))?
            );
            Ok(())
        }
        Some(Command::Seed { movies, reviews }) => {
            tracing::info!(movies, reviews, "adding a synthetic catalogue");
            seed::seed_synthetic(&catalogue, movies, reviews).await?;
            tracing::info!("done");
            Ok(())
        }
    }
}

async fn serve(cli: &Cli, catalogue: Catalogue) -> anyhow::Result<()> {
    app::check_redis(&cli.serve).await?;
    let metrics = app::install_metrics()?;
    let mut registry = Registry::new();
    let summarizer = Summarizer::configure(&cli.llm, cli.serve.redis()).await?;
    let catalogue = Arc::new(catalogue);
    let database = catalogue.clone();
    let mut settings = cli.serve.settings();
    settings.readiness = settings.readiness.with("database", move || {
        let database = database.clone();
        async move { database.ping().await.map_err(|e| e.to_string()) }
    });
    tools::register(&mut registry, catalogue, Arc::new(summarizer));
    let info = ServerInfo {
        name: "moviedb-mcp".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        instructions: Some(
            "A movie database. Recommend movies for a mood, summarize a movie's reviews, and keep the signed-in \
             user's watch list (addToWatchlist, getWatchlist)."
                .into(),
        ),
    };
    let (authenticator, sign_in): (Arc<dyn Authenticator>, _) = match &cli.serve.auth_issuer {
        Some(issuer) => {
            let resource = cli.serve.resource_url.as_deref().context(
                "--auth-issuer needs --resource-url: this server's canonical URL, the audience its \
                 tokens must name",
            )?;
            let leeway = Duration::from_secs(cli.serve.auth_leeway_secs);
            let keys = KeyRefresh {
                least_between: Duration::from_secs(cli.serve.auth_key_refresh_secs),
                most_age: Duration::from_secs(cli.serve.auth_keys_max_age_secs),
            };
            let server = Arc::new(ResourceServer::discover(issuer, resource, leeway, keys).await?);
            let routes = server.routes();
            (server, Some(routes))
        }
        None => {
            tracing::warn!(
                "sign-in is in development mode: HS256 tokens from `moviedb-mcp token` and a shared \
                 secret; set --auth-issuer and --resource-url to accept an authorization server's \
                 tokens"
            );
            let secret = jwt_secret(&cli.database)?;
            (Arc::new(JwtAuthenticator::new(&secret)?), None)
        }
    };
    let router = service::router(&settings, registry, info, Events::new(), authenticator).await?;
    let with_authorization_server = sign_in.is_some();
    let router = match sign_in {
        Some(routes) => router.merge(routes),
        None => router,
    };
    let router = match cli.serve.metrics_bind {
        Some(bind) => {
            app::serve_metrics_apart(bind, metrics).await?;
            router
        }
        None => {
            if with_authorization_server {
                tracing::warn!(
                    "/metrics is served on the MCP listener, to callers without a token: \
                     --metrics-bind moves it to an address of its own"
                );
            }
            router.merge(app::metrics_routes(metrics))
        }
    };
    service::serve(cli.serve.bind, &settings, router, app::drain_signal()).await
}

async fn open_catalogue(args: &DatabaseArgs) -> anyhow::Result<Catalogue> {
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => Catalogue::embedded_url(&args.data_dir)?,
    };
    let (catalogue, seeded) = Catalogue::connect(&url, seed::seed_if_empty).await?;
    tracing::info!(database = %catalogue::redact(&url), "database ready");
    if seeded {
        tracing::info!("seeded the catalogue");
    }
    Ok(catalogue)
}

/// The configured secret, or the development secret kept in the data folder.
fn jwt_secret(args: &DatabaseArgs) -> anyhow::Result<Vec<u8>> {
    if let Some(secret) = &args.jwt_secret {
        anyhow::ensure!(
            secret.len() >= 16,
            "MOVIEDB_JWT_SECRET must be at least 16 bytes"
        );
        return Ok(secret.as_bytes().to_vec());
    }
    let path = args.data_dir.join("dev-jwt-secret");
    if !path.exists() {
        let mut bytes = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut bytes);
        let generated = hex::encode(bytes);
        if write_new_private(&path, &generated)? {
            tracing::warn!(
                "MOVIEDB_JWT_SECRET is not set: generated a development secret in {}",
                path.display()
            );
            return Ok(generated.into_bytes());
        }
    }
    // There already (an earlier run's, or another process's that started at the same time).
    let existing = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let existing = existing.trim();
    anyhow::ensure!(
        existing.len() >= 16,
        "the development secret in {} is shorter than 16 bytes (a file cut short?): \
         delete it to have a new one generated, or set MOVIEDB_JWT_SECRET",
        path.display()
    );
    tracing::warn!(
        "MOVIEDB_JWT_SECRET is not set: using the development secret in {}",
        path.display()
    );
    Ok(existing.as_bytes().to_vec())
}

/// Writes `contents` to a new file at `path`, readable by its owner alone from the start and
/// whole or not at all (written aside, then linked in place); `false` when a file is already
/// there.
fn write_new_private(path: &Path, contents: &str) -> anyhow::Result<bool> {
    use std::io::Write as _;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut nonce = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut nonce);
    let aside = path.with_extension(format!("new-{}", hex::encode(nonce)));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let written = options.open(&aside).and_then(|mut file| {
        file.write_all(contents.as_bytes())?;
        file.sync_all()
    });
    let linked = written.and_then(|()| std::fs::hard_link(&aside, path));
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        // A file system without hard links: created in place, mode 0600 all the same (a file
        // cut short by a crash is then refused at the next start).
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::Unsupported | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            let created = options.open(path).and_then(|mut file| {
                file.write_all(contents.as_bytes())?;
                file.sync_all()
            });
            match created {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
            }
        }
        Err(e) => Err(e).with_context(|| format!("cannot write {}", path.display())),
    }
}
