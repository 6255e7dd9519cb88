//! The command line as a user meets it: every flag `--help` lists is in the README's
//! configuration table with its environment variable (and the table names no flag that does not
//! exist), the `token` subcommand refuses what it cannot sign, and values out of range stop the
//! server before it starts.

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

fn moviedb(args: &[&str]) -> Output {
    // A folder of its own for each run: the tests run at once, and each run removes its folder.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let data_dir =
        std::env::temp_dir().join(format!("moviedb-cli-test-{}-{run}", std::process::id()));
    let mut command = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"));
    // None of the caller's settings (DATABASE_URL, REDIS_URL, MOVIEDB_*…) changes what is tested.
    command.env_clear();
    for name in ["PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH"] {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    let child = command
        .arg("--data-dir")
        .arg(&data_dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run moviedb-mcp");
    let output = within_a_minute(child);
    let _ = std::fs::remove_dir_all(&data_dir);
    output
}

/// The output of `child`, which must exit within a minute: a command that should have been
/// refused at once but serves instead fails the test rather than hanging it.
fn within_a_minute(child: std::process::Child) -> Output {
    let pid = child.id();
    // Read on a thread of its own: both pipes drained while it runs, whatever it writes.
    let (sender, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(child.wait_with_output());
    });
    match outcome.recv_timeout(Duration::from_secs(60)) {
        Ok(output) => output.expect("moviedb-mcp's output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("moviedb-mcp {pid} still ran after a minute");
        }
    }
}

/// The long flags a help text lists, with the environment variable of each when it has one.
fn help_flags(help: &str) -> Vec<(String, Option<String>)> {
    help.lines()
        .map(str::trim_start)
        .filter_map(|line| line.strip_prefix("--"))
        .map(|rest| {
            rest.split(|c: char| c.is_whitespace() || c == '<')
                .next()
                .unwrap_or("")
        })
        .filter(|flag| !["help", "version"].contains(flag))
        .map(|flag| {
            // Its entry: after the flag itself (a value's name, or the line's end for a switch).
            let description = help
                .split(&format!("--{flag}"))
                .skip(1)
                .find(|rest| rest.starts_with([' ', '\n']))
                .unwrap_or_default()
                .split("\n      --")
                .next()
                .unwrap_or_default();
            let env = description
                .split("[env: ")
                .nth(1)
                .map(|rest| rest.split(['=', ']']).next().unwrap_or_default().to_owned());
            (format!("--{flag}"), env)
        })
        .collect()
}

/// The rows of the README's configuration table: `| `--flag` | `ENV` | …`.
fn readme_rows() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("read README.md");
    let table = readme
        .split("## Configuration")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README has a Configuration section");
    table
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_readme_lists_every_flag_of_help_with_its_variable() {
    let help = String::from_utf8(moviedb(&["--help"]).stdout).expect("help is text");
    let flags = help_flags(&help);
    assert!(flags.len() > 10, "--help lists the flags: {help}");
    // Every variable --help names is found with its flag, so none escapes the check below.
    let with_env = flags.iter().filter(|(_, env)| env.is_some()).count();
    assert_eq!(
        with_env,
        help.matches("[env: ").count(),
        "a flag's variable was not read: {flags:?}"
    );
    let rows = readme_rows();
    for (flag, env) in &flags {
        let row = rows
            .iter()
            .find(|row| row.starts_with(&format!("| `{flag}`")))
            .unwrap_or_else(|| panic!("the README's configuration table has no row for {flag}"));
        if let Some(env) = env {
            assert!(
                row.contains(env),
                "the README row of {flag} names {env}: {row}"
            );
        }
    }
    let known: BTreeSet<&str> = flags.iter().map(|(flag, _)| flag.as_str()).collect();
    for row in &rows {
        let flag = row.split('`').nth(1).unwrap_or_default();
        assert!(
            known.contains(flag),
            "the README lists {flag}, which --help does not know"
        );
    }
}

#[test]
fn token_refuses_a_user_name_no_token_could_carry_and_an_endless_lifetime() {
    let long_name = "a".repeat(256);
    for args in [
        &["token", "--user", ""][..],
        &["token", "--user", &long_name],
        &["token", "--user", "tab\tbed"],
        &["token", "--user", "alice", "--hours", "0"],
        &["token", "--user", "alice", "--hours", "8761"],
        &[
            "token",
            "--user",
            "alice",
            "--hours",
            "18446744073709551615",
        ],
    ] {
        let output = moviedb(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} is refused");
        assert!(
            stderr.contains("--user") || stderr.contains("--hours"),
            "{args:?}: the refusal names the argument: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?} prints no token");
    }
    let output = moviedb(&["token", "--user", &"a".repeat(255), "--hours", "8760"]);
    assert!(
        output.status.success(),
        "a year, and a name of 255 bytes, are allowed: {output:?}"
    );
    let token = String::from_utf8_lossy(&output.stdout);
    assert_eq!(token.trim().split('.').count(), 3, "a JWT: {token}");
}

#[test]
fn an_authorization_server_in_the_clear_is_refused() {
    let output = moviedb(&[
        "--auth-issuer",
        "http://auth.example.com",
        "--resource-url",
        "http://127.0.0.1:3000/mcp",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the server does not start");
    assert!(
        stderr.contains("--auth-issuer") && stderr.contains("must be an https URL"),
        "{stderr}"
    );
}

/// Resource-server settings without `--auth-issuer` would leave the development sign-in on (and
/// anonymous callers in) while the operator believes the server signs in with OAuth: refused.
#[test]
fn resource_server_settings_without_an_issuer_are_refused() {
    let settings = [
        "--resource-url=https://movies.example.com/mcp",
        "--auth-leeway-secs=10",
        "--auth-key-refresh-secs=10",
        "--auth-keys-max-age-secs=10",
    ];
    for (run, setting) in settings.into_iter().enumerate() {
        let data_dir = std::env::temp_dir().join(format!(
            "moviedb-cli-no-issuer-{}-{run}",
            std::process::id()
        ));
        let mut child = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"))
            .arg("--data-dir")
            .arg(&data_dir)
            .args([setting, "--bind", "127.0.0.1:0"])
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env_remove("MOVIEDB_AUTH_ISSUER")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run moviedb-mcp");
        // A server that starts would run on: it is given ten seconds to refuse.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while child.try_wait().expect("wait for moviedb-mcp").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = std::fs::remove_dir_all(&data_dir);
                panic!("{setting}: the server started without --auth-issuer");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let output = child.wait_with_output().expect("moviedb-mcp's output");
        let _ = std::fs::remove_dir_all(&data_dir);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{setting}: refused");
        assert!(stderr.contains("--auth-issuer"), "{setting}: {stderr}");
    }
}

#[test]
fn a_resource_url_in_the_clear_or_with_a_query_is_refused() {
    for (resource, why) in [
        ("http://movies.example.com/mcp", "must be an https URL"),
        (
            "https://movies.example.com/mcp?tenant=1",
            "must not carry a query",
        ),
    ] {
        // Checked before the authorization server is asked: this one is never reached.
        let output = moviedb(&[
            "--auth-issuer",
            "https://auth.invalid",
            "--resource-url",
            resource,
        ]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{resource}: the server does not start"
        );
        assert!(
            stderr.contains("--resource-url") && stderr.contains(why),
            "{resource}: {stderr}"
        );
    }
}

#[test]
fn the_development_secret_is_the_owners_alone_and_a_cut_short_one_is_refused() {
    let data_dir = std::env::temp_dir().join(format!(
        "moviedb-cli-secret-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos())
            .unwrap_or_default()
    ));
    let token = || {
        Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"))
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["token", "--user", "alice"])
            .env_remove("DATABASE_URL")
            .env_remove("MOVIEDB_JWT_SECRET")
            .output()
            .expect("run moviedb-mcp")
    };
    let first = token();
    assert!(first.status.success(), "{first:?}");
    let secret = data_dir.join("dev-jwt-secret");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&secret)
            .expect("the secret is written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "readable by its owner alone");
    }
    let written = std::fs::read_to_string(&secret).expect("read the secret");
    let again = token();
    assert!(again.status.success(), "{again:?}");
    assert_eq!(
        std::fs::read_to_string(&secret).ok(),
        Some(written),
        "a later run uses the secret as it is"
    );
    std::fs::write(&secret, "short").expect("cut the secret short");
    let refused = token();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a cut-short secret is refused");
    assert!(stderr.contains("shorter than 16 bytes"), "{stderr}");
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[test]
fn an_unreachable_redis_is_named_with_what_to_set() {
    let data_dir = std::env::temp_dir().join(format!("moviedb-cli-redis-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"))
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--bind", "127.0.0.1:0"])
        .env_remove("DATABASE_URL")
        .env("REDIS_URL", "redis://reader:hunter2@127.0.0.1:1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run moviedb-mcp");
    let _ = std::fs::remove_dir_all(&data_dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "it does not serve without its Redis"
    );
    for expected in ["redis://reader:***@127.0.0.1:1", "REDIS_URL", "--redis-url"] {
        assert!(
            stderr.contains(expected),
            "the error names {expected}: {stderr}"
        );
    }
    assert!(
        !stderr.contains("hunter2"),
        "the password stays out of the error: {stderr}"
    );
}

#[test]
fn a_legacy_wait_of_nothing_or_of_years_stops_the_server_at_start() {
    for seconds in ["0", "86401", "18446744073709551615"] {
        let output = moviedb(&["--legacy-request-timeout-secs", seconds]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{seconds} s is refused");
        assert!(
            stderr.contains("--legacy-request-timeout-secs") && stderr.contains("86400"),
            "{seconds} s: the refusal names the flag and its range: {stderr}"
        );
    }
}

#[test]
fn values_that_would_break_the_server_stop_it_at_start_naming_the_range() {
    let endless = "18446744073709551615";
    for (flag, value, range) in [
        ("--max-body-bytes", "0", "1024..=1073741824"),
        ("--max-body-bytes", endless, "1024..=1073741824"),
        ("--max-concurrent-requests", endless, "1..=1000000"),
        ("--max-connections", "1", "2.."),
        ("--keepalive-secs", "3600", "1..=1800"),
        ("--auth-leeway-secs", "2000000000", "0..=300"),
        ("--auth-key-refresh-secs", "86400", "1..=3600"),
        ("--state-ttl-secs", endless, "1..=604800"),
        ("--legacy-session-idle-secs", endless, "1..=2592000"),
        ("--legacy-session-max-secs", "0", "1..=2592000"),
        ("--task-poll-ms", "0", "1..=60000"),
        ("--task-max-running", endless, "1..=1000000"),
        ("--summary-cache-ttl-secs", endless, "1..=2592000"),
        ("--fallback-cache-ttl-secs", endless, "1..=2592000"),
        ("--continuation-capacity", "0", "1.."),
        ("--share-per-caller", "0", "1.."),
        ("--task-ttl-secs", "0", "1..=2592000"),
        ("--task-lease-ms", "100", "300..=600000"),
        ("--max-streams", "0", "1.."),
        ("--max-streams-per-caller", "0", "1.."),
        ("--header-read-timeout-secs", "0", "1..=3600"),
        ("--body-read-timeout-secs", endless, "1..=3600"),
        ("--idle-timeout-secs", "0", "1..=86400"),
        ("--shutdown-grace-secs", endless, "0..=3600"),
        ("--redis-timeout-ms", "0", "1..=60000"),
        ("--redis-count-secs", "0", "1..=3600"),
        ("--max-buffered-body-bytes", "10", "1024..=68719476736"),
        ("--llm-timeout-secs", "86400", "1..=600"),
    ] {
        // Were the value taken, the server would stop anyway, at its unreachable Redis.
        let output = moviedb(&["--redis-url", "redis://127.0.0.1:1", flag, value]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flag} {value} is refused");
        assert!(
            stderr.contains(flag) && stderr.contains(&format!("is not in {range}")),
            "{flag} {value}: the refusal names the flag and its range: {stderr}"
        );
    }
    let seeding = moviedb(&["seed", "--movies", endless]);
    let stderr = String::from_utf8_lossy(&seeding.stderr);
    assert!(!seeding.status.success());
    assert!(stderr.contains("--movies"), "{stderr}");
}

/// A folder of its own under the temporary folder, its name holding `label`.
fn fresh_folder(label: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!(
        "moviedb-cli-{label}-{}-{nanos}",
        std::process::id()
    ))
}

/// `moviedb-mcp token --user alice` on `data_dir`, with `DATABASE_URL` set to `database_url`
/// when given; started, not awaited.
fn start_token(data_dir: &std::path::Path, database_url: Option<&str>) -> std::process::Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"));
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["token", "--user", "alice"])
        .env_remove("DATABASE_URL")
        .env_remove("MOVIEDB_JWT_SECRET")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(url) = database_url {
        command.env("DATABASE_URL", url);
    }
    command.spawn().expect("run moviedb-mcp")
}

#[test]
fn processes_starting_together_on_a_fresh_database_all_start_and_seed_it_once() {
    for round in 0..6 {
        // A space and URL characters in the folder's name: the database URL is built from it.
        let data_dir = fresh_folder(&format!("race {round} #?%"));
        let racing: Vec<_> = (0..3).map(|_| start_token(&data_dir, None)).collect();
        let outputs: Vec<Output> = racing
            .into_iter()
            .map(|child| child.wait_with_output().expect("wait for moviedb-mcp"))
            .collect();
        let _ = std::fs::remove_dir_all(&data_dir);
        for output in &outputs {
            assert!(
                output.status.success(),
                "round {round}: every process starts: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let token = String::from_utf8_lossy(&output.stdout);
            assert_eq!(token.trim().split('.').count(), 3, "a JWT: {token}");
        }
        let seeders = outputs
            .iter()
            .filter(|output| {
                String::from_utf8_lossy(&output.stderr).contains("seeded the catalogue")
            })
            .count();
        assert_eq!(
            seeders, 1,
            "round {round}: one process seeds, the others find it seeded"
        );
    }
}

#[test]
fn a_sqlite_url_naming_a_new_file_creates_it_and_an_in_memory_one_is_refused() {
    let data_dir = fresh_folder("sqlite-url");
    std::fs::create_dir_all(&data_dir).expect("create the folder");
    let file = data_dir.join("movies.db");
    let url = format!("sqlite://{}", file.display());
    let created = start_token(&data_dir, Some(&url))
        .wait_with_output()
        .expect("wait for moviedb-mcp");
    let exists = file.exists();
    let refused = start_token(&data_dir, Some("sqlite::memory:"))
        .wait_with_output()
        .expect("wait for moviedb-mcp");
    let _ = std::fs::remove_dir_all(&data_dir);
    assert!(created.status.success(), "{created:?}");
    assert!(exists, "{} is created", file.display());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "an in-memory database is refused"
    );
    assert!(
        stderr.contains("in-memory") && stderr.contains("--data-dir"),
        "the refusal says why and what to do: {stderr}"
    );
}

#[test]
fn redis_cluster_takes_1_yes_on_true_and_their_opposites_and_refuses_the_rest() {
    let start = |value: &str| {
        let data_dir = fresh_folder("cluster");
        let output = Command::new(env!("CARGO_BIN_EXE_moviedb-mcp"))
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--bind", "127.0.0.1:0"])
            .env_remove("DATABASE_URL")
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .env("REDIS_CLUSTER", value)
            .env("RUST_BACKTRACE", "0")
            .output()
            .expect("run moviedb-mcp");
        let _ = std::fs::remove_dir_all(&data_dir);
        output
    };
    for value in ["1", "yes", "on", "true", "0", "no"] {
        let output = start(value);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Taken: the server goes on to its (unreachable) Redis and stops there.
        assert!(
            stderr.contains("REDIS_URL") && !stderr.contains("invalid value"),
            "REDIS_CLUSTER={value} is taken: {stderr}"
        );
    }
    let output = start("maybe");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("invalid value") && stderr.contains("--redis-cluster"),
        "REDIS_CLUSTER=maybe is refused naming the flag: {stderr}"
    );
}
