//! Sign-in as the MCP authorization spec makes it, against a real authorization server: the npm
//! package `oidc-provider` (run by Node from `examples/oauth/`, installed there by `.ci/run` or
//! `npm install --prefix examples/oauth`) issues client-credentials access tokens as JWTs for the
//! `moviedb-mcp` under test, which runs as an OAuth 2.1 resource server. The official TypeScript
//! SDK client signs in on its own, from the 401 to a finished MRTR conversation; then every kind of
//! bad token is refused with the right status and challenge.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use support::movies::{Backend, Launch, MovieServer, Session, eliciting, structured};
use support::net::{free_port, random_hex};
use support::openai::{Answer, FakeProvider};

const READ: &str = "movies:read";
/// How long the authorization server, a token or the SDK client may take.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long one start of the authorization server may take before it is tried again: it is
/// listening within a second here, but a CI run once saw one stay silent for a minute.
const START_PATIENCE: Duration = Duration::from_secs(20);
/// Tries at starting the authorization server.
const START_TRIES: usize = 3;
const WRITE: &str = "watchlist:write";

fn oauth_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/oauth");
    assert!(
        dir.join("node_modules/oidc-provider").is_dir()
            && dir
                .join("node_modules/@modelcontextprotocol/client")
                .is_dir(),
        "the sign-in tests need their Node packages: npm install --prefix examples/oauth (.ci/run does)"
    );
    dir
}

/// `oidc-provider` on a port of its own, signing with the keys in `keys` (created when missing);
/// killed on drop.
struct AuthorizationServer {
    child: Child,
    port: u16,
    issuer: String,
}

impl AuthorizationServer {
    /// On a free port. That port may be taken by another test's process before Node binds it,
    /// so a server that does not start is tried again on another.
    fn start(keys: &Path) -> Self {
        Self::start_trying(keys, free_port)
    }

    /// On `port`, so that a restart keeps the issuer.
    fn start_on(port: u16, keys: &Path) -> Self {
        Self::start_trying(keys, || port)
    }

    /// Up to `START_TRIES` starts, each on the port `port` gives.
    fn start_trying(keys: &Path, port: impl Fn() -> u16) -> Self {
        let mut why = String::new();
        for _ in 0..START_TRIES {
            match Self::try_start_on(port(), keys) {
                Ok(server) => return server,
                Err(failure) => why = failure,
            }
        }
        panic!("oidc-provider did not start in {START_TRIES} tries: {why}");
    }

    /// Starts it and waits for its "listening"; otherwise stops it and says what it wrote and
    /// what state its process was in.
    fn try_start_on(port: u16, keys: &Path) -> Result<Self, String> {
        let errors_path =
            std::env::temp_dir().join(format!("moviedb-oidc-provider-{}.log", random_hex(6)));
        let errors = std::fs::File::create(&errors_path).expect("create its error log");
        let child = Command::new("node")
            .arg(oauth_dir().join("authorization_server.mjs"))
            .arg(port.to_string())
            .arg(keys)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(errors)
            .spawn()
            .expect("start oidc-provider under node");
        // Stopped on drop, whatever happens next.
        let mut server = Self {
            child,
            port,
            issuer: format!("http://127.0.0.1:{port}"),
        };
        let stdout = server.child.stdout.take().expect("its stdout");
        let (said, heard) = std::sync::mpsc::channel();
        // Read on: a closed pipe would fail the server's next write.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = said.send(line);
            }
        });
        let first = heard.recv_timeout(START_PATIENCE);
        let written = std::fs::read_to_string(&errors_path).unwrap_or_default();
        let _ = std::fs::remove_file(&errors_path);
        if first
            .as_deref()
            .is_ok_and(|line| line.trim() == "listening")
        {
            Ok(server)
        } else {
            let process = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
                .ok()
                .and_then(|status| {
                    status
                        .lines()
                        .find(|line| line.starts_with("State:"))
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "process gone".to_owned());
            Err(format!(
                "on port {port}, first line {first:?}, {process}, error output: {written}"
            ))
        }
    }

    /// An access token for `client` (`tests-rs256`, `tests-es256`, `tests-eddsa`, `tests-short`)
    /// meant for `resource`, with `scope`.
    async fn token(&self, client: &str, resource: &str, scope: &str) -> String {
        let body = [
            ("grant_type", "client_credentials"),
            ("resource", resource),
            ("scope", scope),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={}", form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
        let answer: Value = reqwest::Client::new()
            .post(format!("{}/token", self.issuer))
            .timeout(PATIENCE)
            .basic_auth(client, Some(format!("{client}-secret")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .expect("the token endpoint answers")
            .json()
            .await
            .expect("a JSON answer");
        answer["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access token: {answer}"))
            .to_owned()
    }
}

impl Drop for AuthorizationServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn form_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            b' ' => "+".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A keys file of its own for one test.
fn keys_file() -> PathBuf {
    std::env::temp_dir().join(format!("moviedb-oauth-keys-{}.json", random_hex(6)))
}

/// `moviedb-mcp` as a resource server of `issuer`, its resource URL its own address.
async fn resource_server(issuer: &str) -> MovieServer {
    resource_server_with(issuer, &[]).await
}

/// The same with more arguments; a leeway of 1 s unless they give one (as a separate
/// `--auth-leeway-secs` argument: clap refuses the flag twice).
async fn resource_server_with(issuer: &str, more: &[&str]) -> MovieServer {
    let mut args = vec!["--auth-issuer", issuer];
    if !more.contains(&"--auth-leeway-secs") {
        args.extend(["--auth-leeway-secs", "1"]);
    }
    args.extend(more);
    let args = args.into_iter().map(str::to_owned).collect();
    MovieServer::start_with(
        Backend::Sqlite,
        Launch {
            args,
            resource_url: true,
            ..Launch::default()
        },
    )
    .await
}

fn metadata_url(server: &MovieServer) -> String {
    server
        .url()
        .replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
}

/// Checks a refusal: its HTTP status and that its challenge names `parts`.
fn assert_challenge(reply: &support::Reply, status: u16, parts: &[&str]) {
    assert_eq!(reply.status.as_u16(), status, "{}", reply.body_text());
    let challenge = reply.header("www-authenticate").unwrap_or_default();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    for part in parts {
        assert!(challenge.contains(part), "{part} in {challenge}");
    }
}

#[tokio::test]
async fn the_sdk_client_finds_the_authorization_server_signs_in_and_converses() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let server = resource_server(&authority.issuer).await;
    let metadata = metadata_url(&server);

    // What a client sees first: 401 and where to go.
    let anonymous = server.anonymous().request("tools/list").send().await;
    assert_challenge(
        &anonymous,
        401,
        &[
            &format!("resource_metadata=\"{metadata}\""),
            "scope=\"movies:read\"",
        ],
    );
    // Credentials of another scheme are no bearer token: the same challenge, no error code.
    let basic = server
        .anonymous()
        .request("tools/list")
        .header("Authorization", "Basic YW5uOnNlY3JldA==")
        .send()
        .await;
    assert_challenge(&basic, 401, &[&format!("resource_metadata=\"{metadata}\"")]);
    let challenge = basic.header("www-authenticate").unwrap_or_default();
    assert!(!challenge.contains("error="), "{challenge}");
    for url in [metadata.clone(), metadata.replace("/mcp", "")] {
        let document: Value = reqwest::get(&url)
            .await
            .expect("the metadata answers")
            .json()
            .await
            .expect("JSON");
        assert_eq!(
            document["resource"],
            json!(server.url()),
            "{url}: {document}"
        );
        assert_eq!(document["authorization_servers"], json!([authority.issuer]));
        assert_eq!(document["scopes_supported"], json!([READ, WRITE]));
        assert_eq!(document["bearer_methods_supported"], json!(["header"]));
    }

    // The official SDK does the rest by itself, from that 401.
    let run = tokio::process::Command::new("node")
        .arg(oauth_dir().join("sdk_client.mjs"))
        .args([
            server.url(),
            &authority.issuer,
            "tests-es256",
            "tests-es256-secret",
            "6",
        ])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the SDK client finished in time")
        .expect("run the SDK client");
    assert!(
        output.status.success(),
        "the SDK client failed: {}{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    let saved: Value = serde_json::from_slice(&output.stdout).expect("the saved item");
    assert_eq!(saved["status"], "WATCHED", "{saved}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("already watched"),
        "the server asked its question: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn tokens_signed_with_rs256_es256_and_eddsa_sign_in_their_subject() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let server = resource_server(&authority.issuer).await;
    let both = format!("{READ} {WRITE}");
    for (client, movie) in [("tests-rs256", 5), ("tests-es256", 6), ("tests-eddsa", 7)] {
        let token = authority.token(client, server.url(), &both).await;
        let session = server.with_token(&token);
        let added = session
            .call(
                "addToWatchlist",
                json!({"subject": {"movieId": movie.to_string()}, "status": "WATCHED"}),
            )
            .await;
        assert_eq!(structured(&added)["status"], "WATCHED", "{client}");
        // The list belongs to the token's subject: each client sees its own title only.
        let listed = session.watchlist().await;
        assert_eq!(listed.len(), 1, "{client}: {listed:?}");
        assert_eq!(listed[0]["content"]["id"], json!(movie.to_string()));
    }
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn an_issuer_written_with_or_without_a_final_slash_is_the_authorization_servers_own() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    // The operator writes the issuer with a final `/`; the authorization server names itself
    // without one, and its tokens say so.
    let server = resource_server(&format!("{}/", authority.issuer)).await;
    let document = metadata_of(&server).await;
    assert_eq!(
        document["authorization_servers"],
        json!([authority.issuer]),
        "the metadata names the issuer as the authorization server does: {document}"
    );
    let token = authority
        .token("tests-es256", server.url(), &format!("{READ} {WRITE}"))
        .await;
    let listed = server
        .with_token(&token)
        .call("getWatchlist", json!({}))
        .await;
    assert_eq!(listed.status.as_u16(), 200, "{}", listed.body_text());
    let _ = std::fs::remove_file(keys);

    // The other way round: the authorization server names itself with a final `/` (as Auth0
    // does), the operator writes it without one. Its own spelling is the one published.
    let slashed = stand_in_issuer_naming_itself(no_keys(), "/").await;
    let server = resource_server(&slashed).await;
    let document = metadata_of(&server).await;
    assert_eq!(
        document["authorization_servers"],
        json!([format!("{slashed}/")]),
        "{document}"
    );
    // Two slashes are another issuer.
    let doubled = stand_in_issuer_naming_itself(no_keys(), "//").await;
    let said = refused_start(&doubled).await;
    assert!(said.contains("its issuer is not"), "{said}");
}

#[tokio::test]
async fn a_token_for_the_resource_url_written_with_a_final_slash_is_for_this_server() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let server = resource_server(&authority.issuer).await;
    let both = format!("{READ} {WRITE}");
    let slashed = authority
        .token("tests-es256", &format!("{}/", server.url()), &both)
        .await;
    let listed = list_tools(&server, &slashed).await;
    assert_eq!(listed.status.as_u16(), 200, "{}", listed.body_text());
    // Another path is another resource.
    let deeper = authority
        .token("tests-es256", &format!("{}/x", server.url()), &both)
        .await;
    assert_challenge(&list_tools(&server, &deeper).await, 401, &["audience"]);
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn a_token_just_past_its_expiry_is_accepted_within_the_leeway() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let server = resource_server_with(&authority.issuer, &["--auth-leeway-secs", "30"]).await;
    let short = authority
        .token("tests-short", server.url(), &format!("{READ} {WRITE}"))
        .await;
    // The token lives a second; 2.5 s later it is past its `exp` by at least a second of the
    // decoder's whole-second clock, and well within the server's 30 s of leeway.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let claims = short.split('.').nth(1).expect("claims");
    let claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).expect("base64url claims"))
            .expect("JSON claims");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs();
    let exp = claims["exp"].as_u64().expect("an exp");
    assert!(exp < now, "the token has expired: exp {exp}, now {now}");
    let listed = list_tools(&server, &short).await;
    assert_eq!(listed.status.as_u16(), 200, "{}", listed.body_text());
    let _ = std::fs::remove_file(keys);
}

/// The protected-resource metadata `server` publishes for its endpoint.
async fn metadata_of(server: &MovieServer) -> Value {
    reqwest::get(metadata_url(server))
        .await
        .expect("the metadata answers")
        .json()
        .await
        .expect("JSON")
}

/// A key set with no keys.
fn no_keys() -> axum::routing::MethodRouter {
    axum::routing::get(|| async { axum::Json(json!({"keys": []})) })
}

/// `tools/list` sent with `token`.
async fn list_tools(server: &MovieServer, token: &str) -> support::Reply {
    server.with_token(token).request("tools/list").send().await
}

/// A stand-in authorization server on loopback: metadata naming itself as issuer and a
/// `jwks_uri` on itself, answered by `jwks`. Serves until the test ends.
async fn stand_in_issuer(jwks: axum::routing::MethodRouter) -> String {
    stand_in_issuer_naming_itself(jwks, "").await
}

/// [`stand_in_issuer`], its metadata naming the issuer it returns followed by `suffix`.
async fn stand_in_issuer_naming_itself(jwks: axum::routing::MethodRouter, suffix: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let issuer = format!("http://{}", listener.local_addr().expect("its address"));
    let metadata =
        json!({"issuer": format!("{issuer}{suffix}"), "jwks_uri": format!("{issuer}/jwks")});
    let app = axum::Router::new()
        .route(
            "/.well-known/oauth-authorization-server",
            axum::routing::get(move || async move { axum::Json(metadata) }),
        )
        .route("/jwks", jwks)
        .route(
            "/keys",
            axum::routing::get(|| async { axum::Json(json!({"keys": []})) }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    issuer
}

/// What `moviedb-mcp`, signing in with `issuer`, says as it refuses to start.
async fn refused_start(issuer: &str) -> String {
    let data_dir = std::env::temp_dir().join(format!("moviedb-sign-in-{}", random_hex(8)));
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"))
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--auth-issuer", issuer])
        .args(["--resource-url", "http://127.0.0.1:9/mcp"])
        .args(["--bind", "127.0.0.1:0"])
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("moviedb-mcp stops")
        .expect("moviedb-mcp runs");
    let _ = std::fs::remove_dir_all(&data_dir);
    assert!(
        !output.status.success(),
        "{issuer}: the server must not start"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn the_resource_metadata_is_readable_from_any_origin() {
    let issuer = stand_in_issuer(no_keys()).await;
    let server = resource_server(&issuer).await;
    let http = reqwest::Client::new();
    let page = "https://app.example";
    // What a browser-based client asks before it sends the MCP header along.
    let preflight = http
        .request(reqwest::Method::OPTIONS, metadata_url(&server))
        .header("origin", page)
        .header("access-control-request-method", "GET")
        .header("access-control-request-headers", "mcp-protocol-version")
        .send()
        .await
        .expect("the preflight answers");
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let header = |response: &reqwest::Response, name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(
        header(&preflight, "access-control-allow-origin").as_deref(),
        Some("*")
    );
    assert!(
        header(&preflight, "access-control-allow-headers")
            .is_some_and(|allowed| allowed == "*" || allowed.contains("mcp-protocol-version")),
        "{:?}",
        preflight.headers()
    );
    let read = http
        .get(metadata_url(&server))
        .header("origin", page)
        .header("mcp-protocol-version", "2026-07-28")
        .send()
        .await
        .expect("the metadata answers");
    assert_eq!(read.status().as_u16(), 200);
    assert_eq!(
        header(&read, "access-control-allow-origin").as_deref(),
        Some("*")
    );
    let document: Value = read.json().await.expect("JSON");
    assert_eq!(document["authorization_servers"], json!([issuer]));
}

#[tokio::test]
async fn keys_come_only_from_the_authorization_server_and_only_so_large() {
    // A redirect within the authorization server is followed.
    let moved = stand_in_issuer(axum::routing::get(|| async {
        axum::response::Redirect::temporary("/keys")
    }))
    .await;
    let server = resource_server(&moved).await;
    let document = metadata_of(&server).await;
    assert_eq!(document["authorization_servers"], json!([moved]));

    // One to another origin is not: the keys would be whoever's it points at.
    let redirecting = stand_in_issuer(axum::routing::get(|| async {
        axum::response::Redirect::temporary("http://127.0.0.1:9/jwks")
    }))
    .await;
    let said = refused_start(&redirecting).await;
    assert!(said.contains("another origin"), "{said}");

    let huge = json!({"keys": [], "padding": "x".repeat(300 * 1024)});
    let bloated =
        stand_in_issuer(axum::routing::get(move || async move { axum::Json(huge) })).await;
    let said = refused_start(&bloated).await;
    assert!(said.contains("larger than"), "{said}");

    // Sent in chunks without a length, it is cut off while being read.
    let streamed = stand_in_issuer(axum::routing::get(|| async {
        let document = json!({"keys": [], "padding": "x".repeat(300 * 1024)}).to_string();
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> = document
            .into_bytes()
            .chunks(16 * 1024)
            .map(|chunk| Ok(chunk.to_vec()))
            .collect();
        axum::body::Body::from_stream(futures::stream::iter(chunks))
    }))
    .await;
    let said = refused_start(&streamed).await;
    assert!(said.contains("larger than"), "{said}");
}

#[tokio::test]
async fn every_kind_of_bad_token_is_refused_with_401_and_a_challenge() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    // The same keys under another issuer, and other keys under a third.
    let impostor = AuthorizationServer::start(&keys);
    let stranger = AuthorizationServer::start(&keys_file());
    let server = resource_server(&authority.issuer).await;
    let resource = server.url().to_owned();
    let both = format!("{READ} {WRITE}");

    let good = authority.token("tests-rs256", &resource, &both).await;
    // One character changed in the middle of the signature: its last character may carry only
    // padding bits, which a decoder can ignore or refuse.
    let (signed, signature) = good.rsplit_once('.').expect("a signature");
    let mut altered: Vec<u8> = signature.bytes().collect();
    let middle = altered.len() / 2;
    altered[middle] = if altered[middle] == b'A' { b'B' } else { b'A' };
    let bad_signature = format!("{signed}.{}", String::from_utf8_lossy(&altered));
    let claims = good.split('.').nth(1).expect("claims").to_owned();
    let alg_none = format!(
        "{}.{claims}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#)
    );
    let expired = authority.token("tests-short", &resource, &both).await;
    // A client whose id, its tokens' subject, is 256 bytes long.
    let long_subject = format!("{:x<256}", "tests-long-subject-");

    let cases = [
        (
            "another audience",
            authority
                .token("tests-es256", "http://127.0.0.1:9/other/mcp", &both)
                .await,
            "audience",
        ),
        (
            "another issuer",
            impostor.token("tests-es256", &resource, &both).await,
            "issued by",
        ),
        (
            "an unknown key",
            stranger.token("tests-es256", &resource, &both).await,
            "does not publish",
        ),
        ("a bad signature", bad_signature, "signature"),
        ("alg none", alg_none, "signed JWT"),
        ("not a token at all", "not-a-jwt".to_owned(), "signed JWT"),
        (
            "a subject of 256 bytes",
            authority.token(&long_subject, &resource, &both).await,
            "longer than 255 bytes",
        ),
    ];
    // Past the token's second of life and the server's second of leeway.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    let all = cases
        .into_iter()
        .chain([("an expired token", expired, "expired")]);
    for (what, token, reason) in all {
        let reply = list_tools(&server, &token).await;
        assert_challenge(
            &reply,
            401,
            &[
                "error=\"invalid_token\"",
                &format!("resource_metadata=\"{}\"", metadata_url(&server)),
                reason,
            ],
        );
        assert!(reply.body_text().contains("Unauthorized"), "{what}");
    }
    let fine = server
        .with_token(&good)
        .call("getWatchlist", json!({}))
        .await;
    assert_eq!(fine.status.as_u16(), 200, "{}", fine.body_text());
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn a_token_without_the_write_scope_reads_but_cannot_add() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let server = resource_server(&authority.issuer).await;
    let reader = server.with_token(&authority.token("tests-es256", server.url(), READ).await);

    let recommended = reader
        .call(
            "recommendMoviesForMood",
            json!({"input": {"mood": "COMFORT"}}),
        )
        .await;
    assert!(structured(&recommended)["movies"].is_array());
    let refused = reader
        .call("addToWatchlist", json!({"subject": {"movieId": "6"}}))
        .await;
    assert_challenge(
        &refused,
        403,
        &[
            "error=\"insufficient_scope\"",
            "scope=\"watchlist:write\"",
            "resource_metadata=",
        ],
    );
    assert!(reader.watchlist().await.is_empty(), "nothing was written");
    let _ = std::fs::remove_file(keys);
}

/// `method` (`tasks/get`, `tasks/cancel`) on task `id` from a client that takes tasks.
async fn task_request(session: &Session, method: &str, id: &Value) -> support::Reply {
    session
        .request(method)
        .params(json!({"taskId": id}))
        .capabilities(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
        .send()
        .await
}

#[tokio::test]
async fn a_task_is_reached_only_with_the_scope_its_tool_needs() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let provider =
        FakeProvider::start(Answer::Held("SUMMARY: Moving.\nTHEMES: heart".into())).await;
    let base_url = provider.base_url();
    let llm = [
        "--llm-base-url",
        base_url.as_str(),
        "--llm-model",
        "review-writer-test",
        "--llm-api-key",
        "sk-test-0123456789abcdef",
    ];
    let server = resource_server_with(&authority.issuer, &llm).await;
    // Two tokens of the same client, so the same principal: one reads, one only writes.
    let reader = server.with_token(&authority.token("tests-es256", server.url(), READ).await);
    let writer = server.with_token(&authority.token("tests-es256", server.url(), WRITE).await);
    let taking_tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});

    let created = reader
        .call_with(
            "summarizeMovieReviews",
            json!({"movieId": "6"}),
            taking_tasks,
        )
        .await;
    assert_eq!(created.result_type(), "task", "{}", created.body_text());
    let id = created.result()["taskId"].clone();

    // summarizeMovieReviews needs movies:read: without it, its task is out of reach, to read,
    // cancel or follow.
    for method in ["tasks/get", "tasks/cancel"] {
        let refused = task_request(&writer, method, &id).await;
        assert_challenge(
            &refused,
            403,
            &["error=\"insufficient_scope\"", "scope=\"movies:read\""],
        );
    }
    let listen = writer
        .request("subscriptions/listen")
        .params(json!({"notifications": {"taskIds": [id]}}))
        .capabilities(json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}))
        .send()
        .await;
    assert_challenge(
        &listen,
        403,
        &["error=\"insufficient_scope\"", "scope=\"movies:read\""],
    );
    // A request the server would refuse for want of the Tasks extension is refused for that,
    // whatever the task.
    let without_tasks = writer
        .request("tasks/get")
        .params(json!({"taskId": id}))
        .send()
        .await;
    without_tasks.assert_error(400, -32021);
    let working = task_request(&reader, "tasks/get", &id).await;
    assert_eq!(
        working.result()["status"],
        "working",
        "the refused cancel changed nothing: {}",
        working.body_text()
    );
    provider.release();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let seen = task_request(&reader, "tasks/get", &id).await;
        if seen.result()["status"] == "completed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task did not complete: {}",
            seen.body_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn a_request_state_opens_only_for_the_subject_it_was_sealed_for() {
    let keys = keys_file();
    let authority = AuthorizationServer::start(&keys);
    let server = resource_server(&authority.issuer).await;
    let both = format!("{READ} {WRITE}");
    let first: Session =
        server.with_token(&authority.token("tests-es256", server.url(), &both).await);
    let second = server.with_token(&authority.token("tests-eddsa", server.url(), &both).await);

    let arguments = json!({"subject": {"movieId": "6"}});
    let asked = first
        .call_with("addToWatchlist", arguments.clone(), eliciting())
        .await;
    assert_eq!(
        asked.result_type(),
        "input_required",
        "{}",
        asked.body_text()
    );
    let answer = json!({"status": {"action": "accept", "content": {"status": "WATCHED"}}});
    let stolen = second
        .retry(
            "addToWatchlist",
            arguments.clone(),
            answer.clone(),
            &asked.request_state(),
        )
        .await;
    assert_eq!(stolen.error_code(), -32602, "{}", stolen.body_text());
    assert!(stolen.error_message().contains("another principal"));
    let mine = first
        .retry("addToWatchlist", arguments, answer, &asked.request_state())
        .await;
    assert_eq!(structured(&mine)["status"], "WATCHED");
    let _ = std::fs::remove_file(keys);
}

#[tokio::test]
async fn without_an_issuer_the_log_says_sign_in_is_for_development() {
    let server = MovieServer::start(Backend::Sqlite).await;
    assert!(
        server.log().contains("sign-in is in development mode"),
        "{}",
        server.log()
    );
    let anonymous = server
        .anonymous()
        .call(
            "recommendMoviesForMood",
            json!({"input": {"mood": "COMFORT"}}),
        )
        .await;
    assert_eq!(
        anonymous.status.as_u16(),
        200,
        "anonymous callers are let in"
    );
    assert_eq!(
        anonymous.result_type(),
        "complete",
        "and served: {}",
        anonymous.body_text()
    );
}

#[tokio::test]
async fn the_log_says_when_metrics_are_open_beside_a_signed_in_endpoint() {
    const WARNING: &str = "/metrics is served on the MCP listener, to callers without a token";
    let issuer = stand_in_issuer(no_keys()).await;
    let beside = resource_server(&issuer).await;
    assert!(beside.log().contains(WARNING), "{}", beside.log());
    let metrics = reqwest::get(beside.url().replace("/mcp", "/metrics"))
        .await
        .expect("the metrics answer");
    assert_eq!(
        metrics.status().as_u16(),
        200,
        "they are open, as the log says"
    );
    let apart = format!("127.0.0.1:{}", free_port());
    let apart = resource_server_with(&issuer, &["--metrics-bind", &apart]).await;
    assert!(!apart.log().contains(WARNING), "{}", apart.log());
    let development = MovieServer::start(Backend::Sqlite).await;
    assert!(
        !development.log().contains(WARNING),
        "development sign-in is not for the open: {}",
        development.log()
    );
}

#[tokio::test]
async fn a_key_the_authorization_server_withdrew_stops_signing_in_once_the_keys_are_old() {
    let (first_keys, rotated_keys) = (keys_file(), keys_file());
    let authority = AuthorizationServer::start(&first_keys);
    let port = authority.port;
    let server = resource_server_with(
        &authority.issuer,
        &[
            "--auth-keys-max-age-secs",
            "2",
            "--auth-key-refresh-secs",
            "1",
        ],
    )
    .await;
    let both = format!("{READ} {WRITE}");
    let before = authority.token("tests-es256", server.url(), &both).await;
    let fine = list_tools(&server, &before).await;
    assert_eq!(fine.status.as_u16(), 200, "{}", fine.body_text());

    // The authorization server withdraws its keys (it restarts with others, under the same
    // issuer). No token names a key the server does not know, yet once its keys are older than
    // their most age it fetches them again, and the withdrawn key no longer signs anyone in.
    drop(authority);
    let authority = AuthorizationServer::start_on(port, &rotated_keys);
    // Fetched again in the background within the keys' most age of 2 s (or a second later, when
    // the authorization server was not back in time for the first try).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let refused = loop {
        let reply = list_tools(&server, &before).await;
        if reply.status.as_u16() != 200 || tokio::time::Instant::now() > deadline {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_challenge(&refused, 401, &["error=\"invalid_token\""]);
    assert!(
        server.log().contains("past their most age"),
        "{}",
        server.log()
    );
    let after = authority.token("tests-es256", server.url(), &both).await;
    let accepted = list_tools(&server, &after).await;
    assert_eq!(accepted.status.as_u16(), 200, "{}", accepted.body_text());
    for keys in [first_keys, rotated_keys] {
        let _ = std::fs::remove_file(keys);
    }
}

#[tokio::test]
async fn old_keys_are_fetched_again_without_keeping_requests_waiting() {
    let (key, key_set) = rs256_key_set();
    // Once `trouble` is set the key set hangs, as an authorization server in trouble would;
    // `hanging` counts the fetches it holds.
    let (trouble, hanging) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (in_trouble, held) = (trouble.clone(), hanging.clone());
    let issuer = stand_in_issuer(axum::routing::get(move || async move {
        if in_trouble.load(Ordering::SeqCst) {
            held.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        axum::Json(key_set)
    }))
    .await;
    let server = renewing_every_second(&issuer).await;
    let token = rs256_token(&issuer, server.url(), "fran", Some("k1"), &key);
    let first = list_tools(&server, &token).await;
    assert_eq!(first.status.as_u16(), 200, "{}", first.body_text());

    trouble.store(true, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while hanging.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the keys, a second old, are fetched again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The fetch under way hangs until its 5 s timeout: a request waiting for it would not be
    // answered within 3 s.
    let answered = tokio::time::timeout(Duration::from_secs(3), list_tools(&server, &token)).await;
    let reply = answered.expect("answered while the keys are being fetched");
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
}

#[tokio::test]
async fn an_authorization_server_away_is_told_once_in_the_log_and_its_return_too() {
    const OUTAGE: &str = "cannot fetch the authorization server's keys";
    let (key, key_set) = rs256_key_set();
    // While `away` is set the key set answers 503; `refused` counts those answers.
    let (away, refused) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (is_away, refusals) = (away.clone(), refused.clone());
    let issuer = stand_in_issuer(axum::routing::get(move || async move {
        if is_away.load(Ordering::SeqCst) {
            refusals.fetch_add(1, Ordering::SeqCst);
            return Err(axum::http::StatusCode::SERVICE_UNAVAILABLE);
        }
        Ok(axum::Json(key_set))
    }))
    .await;
    let server = renewing_every_second(&issuer).await;
    let token = rs256_token(&issuer, server.url(), "gil", Some("k1"), &key);

    away.store(true, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while refused.load(Ordering::SeqCst) < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the old keys are tried again every second"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = server.log();
    assert_eq!(
        log.matches(OUTAGE).count(),
        1,
        "three failed fetches, one warning: {log}"
    );
    let reply = list_tools(&server, &token).await;
    assert_eq!(
        reply.status.as_u16(),
        200,
        "the keys held sign in meanwhile: {}",
        reply.body_text()
    );

    away.store(false, Ordering::SeqCst);
    let back =
        "fetched the authorization server's keys again (the keys were past their most age), after";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !server.log().contains(back) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log says when the keys are fetched again: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.log().matches(OUTAGE).count(), 1, "{}", server.log());
}

/// An RSA key, and a key set publishing it as `k1` for RS256.
fn rs256_key_set() -> (jsonwebtoken::EncodingKey, Value) {
    let (key, modulus) = rsa_key();
    let key_set = json!({"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": "k1",
                                   "n": modulus, "e": "AQAB"}]});
    (key, key_set)
}

/// A resource server of `issuer` that trusts its keys for a second, and fetches them at most
/// every second.
async fn renewing_every_second(issuer: &str) -> MovieServer {
    resource_server_with(
        issuer,
        &[
            "--auth-keys-max-age-secs",
            "1",
            "--auth-key-refresh-secs",
            "1",
        ],
    )
    .await
}

/// A token of `issuer` for `audience` and `subject` with the read scope, valid for five minutes,
/// signed RS256 with `key` and naming `kid`.
fn rs256_token(
    issuer: &str,
    audience: &str,
    subject: &str,
    kid: Option<&str>,
    key: &jsonwebtoken::EncodingKey,
) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = json!({"iss": issuer, "aud": audience, "sub": subject, "iat": now,
                        "exp": now + 300, "scope": READ});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, &claims, key).expect("a signed token")
}

/// An RSA key made by `openssl` for the test: the signing key, and its modulus in base64url, as a
/// key set publishes it.
fn rsa_key() -> (jsonwebtoken::EncodingKey, String) {
    let path = std::env::temp_dir().join(format!("moviedb-rsa-{}", random_hex(6)));
    let openssl = |args: &[&str]| {
        let ran = Command::new("openssl")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("openssl is installed");
        assert!(ran.status.success(), "openssl {args:?}: {ran:?}");
        ran.stdout
    };
    let (pem, der) = (path.with_extension("pem"), path.with_extension("der"));
    let (pem, der) = (pem.to_string_lossy(), der.to_string_lossy());
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &pem,
    ]);
    // PKCS #1, as jsonwebtoken reads an RSA key in DER.
    openssl(&[
        "rsa",
        "-in",
        &pem,
        "-traditional",
        "-outform",
        "DER",
        "-out",
        &der,
    ]);
    let modulus = String::from_utf8(openssl(&["rsa", "-in", &pem, "-noout", "-modulus"]))
        .expect("openssl writes text");
    let key = jsonwebtoken::EncodingKey::from_rsa_der(&std::fs::read(&*der).expect("the key"));
    for file in [&*pem, &*der] {
        let _ = std::fs::remove_file(file);
    }
    let hex = modulus.trim().trim_start_matches("Modulus=");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hexadecimal"))
        .collect();
    (key, URL_SAFE_NO_PAD.encode(bytes))
}

#[tokio::test]
async fn a_token_naming_its_key_is_checked_against_a_key_published_without_an_id() {
    let (key, modulus) = rsa_key();
    let key_set = json!({"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "n": modulus,
                                   "e": "AQAB"}]});
    let issuer = stand_in_issuer(axum::routing::get(
        move || async move { axum::Json(key_set) },
    ))
    .await;
    let server = resource_server(&issuer).await;
    let signed = |kid: Option<&str>| rs256_token(&issuer, server.url(), "dana", kid, &key);
    for kid in [Some("rotation-7"), None] {
        let reply = list_tools(&server, &signed(kid)).await;
        assert_eq!(
            reply.status.as_u16(),
            200,
            "a token with key id {kid:?}: {}",
            reply.body_text()
        );
    }
    // A key the server does not publish is refused all the same.
    let (other_key, _) = rsa_key();
    let forged = rs256_token(
        &issuer,
        server.url(),
        "dana",
        Some("rotation-7"),
        &other_key,
    );
    assert_challenge(
        &list_tools(&server, &forged).await,
        401,
        &["error=\"invalid_token\""],
    );
}

/// An authorization server that names none of its keys gives no key id to notice a rotation
/// by: a signature no key held verifies makes the server fetch the keys again (no sooner than
/// `--auth-key-refresh-secs` after the last fetch), not wait for them to be an hour old.
#[tokio::test]
async fn a_rotation_of_keys_without_ids_is_noticed_by_the_first_token_signed_with_the_new() {
    let ((old, old_modulus), (new, new_modulus)) = (rsa_key(), rsa_key());
    let ((newer, newer_modulus), (forger, _)) = (rsa_key(), rsa_key());
    let publishing = |modulus: &str| json!({"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "n": modulus, "e": "AQAB"}]});
    let published = Arc::new(std::sync::Mutex::new(publishing(&old_modulus)));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (serving, counted) = (published.clone(), fetches.clone());
    let issuer = stand_in_issuer(axum::routing::get(move || async move {
        counted.fetch_add(1, Ordering::SeqCst);
        let keys = serving.lock().expect("the key set").clone();
        axum::Json(keys)
    }))
    .await;
    let server = resource_server_with(&issuer, &["--auth-key-refresh-secs", "1"]).await;
    let signed = |kid: Option<&str>, key: &jsonwebtoken::EncodingKey| {
        rs256_token(&issuer, server.url(), "fay", kid, key)
    };
    let status = |token: String| {
        let server = &server;
        async move { list_tools(server, &token).await.status.as_u16() }
    };
    assert_eq!(status(signed(None, &old)).await, 200);

    // Rotated twice: first noticed by a token naming no key, then by one naming a key (in a
    // set that names none, its id tells nothing either).
    let mut refetched = std::time::Instant::now();
    let mut before = 0;
    for (modulus, key, kids) in [
        (&new_modulus, &new, [None, Some("any-id")]),
        (&newer_modulus, &newer, [Some("any-id"), None]),
    ] {
        *published.lock().expect("the key set") = publishing(modulus);
        // Past the least time between fetches.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        before = fetches.load(Ordering::SeqCst);
        refetched = std::time::Instant::now();
        for kid in kids {
            assert_eq!(
                status(signed(kid, key)).await,
                200,
                "a token with key id {kid:?} signed with the new key"
            );
        }
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            before + 1,
            "fetched again once, for the first token"
        );
    }
    assert_eq!(status(signed(None, &old)).await, 401, "the old key is gone");
    // Forged signatures fetch the keys at most once a refresh interval (1 s).
    for _ in 0..20 {
        assert_eq!(status(signed(None, &forger)).await, 401);
    }
    // Seconds begun since just before the fetch for the last rotation, each allowing one more.
    let intervals = refetched.elapsed().as_secs_f64().ceil();
    let more = fetches.load(Ordering::SeqCst) - (before + 1);
    assert!(
        more as f64 <= intervals,
        "{more} more fetches in {intervals} seconds begun"
    );
}

#[tokio::test]
async fn an_unknown_key_id_among_named_keys_fetches_the_keys_then_tries_the_unnamed() {
    let ((named, named_modulus), (unnamed, unnamed_modulus)) = (rsa_key(), rsa_key());
    let key_set = json!({"keys": [
        {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": "k1", "n": named_modulus, "e": "AQAB"},
        {"kty": "RSA", "use": "sig", "alg": "RS256", "n": unnamed_modulus, "e": "AQAB"},
    ]});
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = fetches.clone();
    let issuer = stand_in_issuer(axum::routing::get(move || async move {
        counted.fetch_add(1, Ordering::SeqCst);
        axum::Json(key_set)
    }))
    .await;
    let server = resource_server_with(&issuer, &["--auth-key-refresh-secs", "1"]).await;
    // Once per start (a start may be tried again when its port was taken meanwhile).
    let at_start = fetches.load(Ordering::SeqCst);
    // Past the least time between fetches.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let signed = |kid: Option<&str>, key: &jsonwebtoken::EncodingKey| {
        rs256_token(&issuer, server.url(), "erin", kid, key)
    };
    // A key id the set does not hold may be a rotation: the keys are fetched again first, then
    // the token, still not found by its id, is checked with the key published without one.
    let reply = list_tools(&server, &signed(Some("rotation-8"), &unnamed)).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.body_text());
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        at_start + 1,
        "fetched again for the unknown id"
    );
    for (what, token) in [
        ("its own key id", signed(Some("k1"), &named)),
        ("no key id", signed(None, &unnamed)),
    ] {
        let reply = list_tools(&server, &token).await;
        assert_eq!(reply.status.as_u16(), 200, "{what}: {}", reply.body_text());
    }
    // A token naming a published key is checked with that key alone.
    assert_challenge(
        &list_tools(&server, &signed(Some("k1"), &unnamed)).await,
        401,
        &["signature"],
    );
    assert_eq!(
        fetches.load(Ordering::SeqCst),
        at_start + 1,
        "known key ids fetch nothing"
    );
}

#[tokio::test]
async fn rotated_keys_are_fetched_again_but_made_up_key_ids_fetch_at_most_once_an_interval() {
    const FETCHED: &str = "fetched the authorization server's keys again";
    let (first_keys, rotated_keys) = (keys_file(), keys_file());
    let authority = AuthorizationServer::start(&first_keys);
    let port = authority.port;
    let server = resource_server_with(&authority.issuer, &["--auth-key-refresh-secs", "2"]).await;
    let resource = server.url().to_owned();
    let both = format!("{READ} {WRITE}");
    let before = authority.token("tests-es256", &resource, &both).await;
    // Started now: its start-up must not eat into the interval the flood below is timed in.
    let stranger = AuthorizationServer::start(&keys_file());
    let made_up = stranger.token("tests-es256", &resource, &both).await;
    let fine = list_tools(&server, &before).await;
    assert_eq!(fine.status.as_u16(), 200, "{}", fine.body_text());

    // The authorization server restarts with new keys, under the same issuer.
    drop(authority);
    let authority = AuthorizationServer::start_on(port, &rotated_keys);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let after = authority.token("tests-es256", &resource, &both).await;
    let accepted = list_tools(&server, &after).await;
    assert_eq!(
        accepted.status.as_u16(),
        200,
        "the new key is fetched: {}",
        accepted.body_text()
    );
    assert_eq!(server.log().matches(FETCHED).count(), 1, "{}", server.log());

    // Tokens of keys nobody publishes, in a flood: refused, with no fetch within the interval.
    let refused_with_made_up_key = || async {
        let refused = list_tools(&server, &made_up).await;
        assert_eq!(refused.status.as_u16(), 401, "{}", refused.body_text());
    };
    for _ in 0..20 {
        refused_with_made_up_key().await;
    }
    assert_eq!(
        server.log().matches(FETCHED).count(),
        1,
        "no fetch for a flood within the interval: {}",
        server.log()
    );
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    refused_with_made_up_key().await;
    assert_eq!(
        server.log().matches(FETCHED).count(),
        2,
        "one fetch once the interval is over: {}",
        server.log()
    );
    for keys in [first_keys, rotated_keys] {
        let _ = std::fs::remove_file(keys);
    }
}
