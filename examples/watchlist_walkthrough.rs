//! Watch MRTR happen: drives `addToWatchlist` over the wire with the library's scripted client
//! (`mcp_mrtr::client`) and prints each round's request and answer.
//!
//! Start the server (`cargo run`), get a token (`cargo run -- token --user alice`), then:
//!
//! ```text
//! cargo run --example watchlist_walkthrough -- --token <TOKEN> [--movie-id 6] [--answer WATCHED]
//! ```
//!
//! Round 1 asks for the title without a status; the server answers `input_required` with an
//! elicitation. The walkthrough plays the user, answers, and the client calls again with a new
//! id, the answer and the echoed `requestState`. Then it reads the watch list back.

use mcp_mrtr::client::{Client, Reply};
use serde_json::{Value, json};

const USAGE: &str = "usage: watchlist_walkthrough --token TOKEN [--url URL] [--movie-id N] \
                     [--answer WATCHED|WANT_TO_WATCH|decline]";

struct Args {
    url: String,
    token: String,
    movie_id: u64,
    answer: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: "http://127.0.0.1:3000/mcp".into(),
        token: std::env::var("MOVIEDB_TOKEN").unwrap_or_default(),
        movie_id: 6,
        answer: "WATCHED".into(),
    };
    let mut raw = std::env::args().skip(1);
    while let Some(flag) = raw.next() {
        let value = raw.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => args.url = value,
            "--token" => args.token = value,
            "--movie-id" => {
                args.movie_id = value.parse().map_err(|_| "--movie-id takes a number")?
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
async fn main() -> Result<(), String> {
    let args = parse_args().map_err(|e| format!("{e}\n{USAGE}"))?;
    let client = Client::new(args.url.clone()).with_bearer(&args.token);

    println!(
        "== addToWatchlist for movie {} without saying whether it was watched",
        args.movie_id
    );
    let user_answer = match args.answer.as_str() {
        "decline" => json!({ "action": "decline" }),
        status => json!({ "action": "accept", "content": { "status": status } }),
    };
    let arguments = json!({ "subject": { "movieId": args.movie_id.to_string() } });
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
