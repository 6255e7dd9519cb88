//! Watch MRTR happen: drives `addToWatchlist` over the wire with the library's scripted client
//! (`mcp_mrtr::client`) and prints each round's request and answer.
//!
//! Start the server (`cargo run`), get a token (`cargo run -- token --user alice`), then:
//!
//! ```text
//! cargo run --example watchlist_walkthrough -- --token <TOKEN> [--movie-id N] [--answer WATCHED]
//! ```
//!
//! Without `--movie-id` it picks a recommended movie that is not on the user's list yet, so the
//! question is asked on every run. Round 1 adds it without a status; the server answers
//! `input_required` with an elicitation. The walkthrough plays the user, answers, and the client
//! calls again with a new id, the answer and the echoed `requestState`. Then it reads the watch
//! list back.

use std::process::ExitCode;

use mcp_mrtr::client::{Client, Reply};
use reqwest::StatusCode;
use serde_json::{Value, json};

const HELP: &str = "\
Adds a movie to the signed-in user's watch list with addToWatchlist, over MRTR, and prints every
round: the call without a status, the server's question (input_required), the retry with the
answer and the echoed requestState, and the watch list read back.

usage: watchlist_walkthrough --token TOKEN [--url URL] [--movie-id N] [--answer ANSWER]

  --token TOKEN   a bearer token from `moviedb-mcp token --user NAME` (or MOVIEDB_TOKEN)
  --url URL       the MCP endpoint (default http://127.0.0.1:3000/mcp)
  --movie-id N    the movie to add; by default a recommended movie not on the list yet
  --answer A      the user's answer: WATCHED (default), WANT_TO_WATCH, or decline
  --help          this text";

struct Args {
    url: String,
    token: String,
    movie_id: Option<u64>,
    answer: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "http://127.0.0.1:3000/mcp".into(),
        token: std::env::var("MOVIEDB_TOKEN").unwrap_or_default(),
        movie_id: None,
        answer: "WATCHED".into(),
    };
    let mut raw = std::env::args().skip(1);
    while let Some(flag) = raw.next() {
        if flag == "--help" || flag == "-h" {
            println!("{HELP}");
            std::process::exit(0);
        }
        let value = raw.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => args.url = value,
            "--token" => args.token = value,
            "--movie-id" => {
                let id = value.parse().map_err(|_| "--movie-id takes a number")?;
                args.movie_id = Some(id);
            }
            "--answer" => args.answer = value,
            other => return Err(format!("unknown option {other}")),
        }
    }
    if args.token.is_empty() {
        return Err(
            "give --token (from `cargo run -- token --user alice`) or set MOVIEDB_TOKEN".into(),
        );
    }
    Ok(args)
}

/// The ids of the movies on the user's watch list; a refusal said in words a user can act on.
async fn listed_movies(client: &Client) -> Result<Vec<Value>, String> {
    let reply = client.call_tool("getWatchlist", json!({})).await;
    if reply.status == StatusCode::UNAUTHORIZED {
        return Err(
            "the server refused the token (HTTP 401): mint one for this server with \
                    `cargo run -- token --user alice`"
                .into(),
        );
    }
    let result = reply
        .messages
        .iter()
        .find_map(|message| message.get("result"))
        .ok_or_else(|| {
            format!(
                "getWatchlist failed (HTTP {}): {}",
                reply.status,
                reply.body_text()
            )
        })?;
    let items = result["structuredContent"]["items"]
        .as_array()
        .ok_or_else(|| format!("getWatchlist answered without items: {result}"))?;
    Ok(items
        .iter()
        .filter(|item| item["content"]["type"] == "movie")
        .map(|item| item["content"]["id"].clone())
        .collect())
}

/// A recommended movie that is not on the user's watch list (`listed`) yet.
async fn not_yet_listed(client: &Client, listed: &[Value]) -> Result<String, String> {
    for mood in [
        "COMFORT",
        "ADVENTURE",
        "THOUGHTFUL",
        "COMEDY",
        "ROMANCE",
        "HORROR",
    ] {
        let reply = client
            .call_tool("recommendMoviesForMood", json!({"input": {"mood": mood}}))
            .await;
        let movies = reply.result()["structuredContent"]["movies"].clone();
        for movie in movies.as_array().into_iter().flatten() {
            if !listed.contains(&movie["id"]) {
                return Ok(movie["id"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    Err("every recommended movie is already on the list; give --movie-id".into())
}

/// Prints one round: what was sent, and what came back.
fn show(url: &str, reply: &Reply) {
    let pretty = |bytes: &[u8]| match serde_json::from_slice::<Value>(bytes) {
        Ok(json) => serde_json::to_string_pretty(&json).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    };
    println!("\n>>> POST {url}\n{}", pretty(&reply.sent));
    println!("<<< HTTP {}\n{}", reply.status, pretty(&reply.body));
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}\n\n{HELP}");
            return ExitCode::from(2);
        }
    };
    match walk_through(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("watchlist_walkthrough: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn walk_through(args: &Args) -> Result<(), String> {
    let client = Client::new(args.url.clone()).with_bearer(&args.token);
    // Signed in? Asked first, so that a refused token is said in words, whatever comes next.
    let listed = listed_movies(&client).await?;
    let movie_id = match args.movie_id {
        Some(id) => id.to_string(),
        None => not_yet_listed(&client, &listed).await?,
    };

    println!("== addToWatchlist for movie {movie_id} without saying whether it was watched");
    let user_answer = match args.answer.as_str() {
        "decline" => json!({ "action": "decline" }),
        status => json!({ "action": "accept", "content": { "status": status } }),
    };
    let arguments = json!({ "subject": { "movieId": movie_id } });
    let conversation = client
        .converse("addToWatchlist", arguments, |_, _| user_answer.clone())
        .await;
    for (number, reply) in conversation.rounds.iter().enumerate() {
        println!("\n== Round {}", number + 1);
        show(&args.url, reply);
        if reply.result_type() == "input_required" {
            for (key, request) in reply.input_requests() {
                let question = &request["params"]["message"];
                println!("\nThe server asks ({key}): {question}\nThe user answers: {user_answer}");
            }
        }
    }
    if conversation.rounds.len() == 1 {
        println!("\nThe server answered at once (no question was needed).");
    }

    println!("\n== Read the watch list back");
    show(
        &args.url,
        &client.call_tool("getWatchlist", json!({})).await,
    );
    Ok(())
}
