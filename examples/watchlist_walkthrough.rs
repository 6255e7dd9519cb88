//! Watch MRTR happen: drives `addToWatchlist` over the wire with plain HTTP and prints each round.
//!
//! Start the server (`cargo run`), get a token (`cargo run -- token --user alice`), then:
//!
//! ```text
//! cargo run --example watchlist_walkthrough -- --token <TOKEN> [--movie-id 6] [--answer WATCHED]
//! ```
//!
//! Round 1 asks for the title without a status; the server answers `input_required` with an
//! elicitation. The walkthrough plays the user, answers, and retries with a new id, the answers and
//! the echoed `requestState`. Then it reads the watch list back.

use serde_json::{Value, json};

struct Args {
    url: String,
    token: String,
    movie_id: i64,
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

struct Client {
    http: reqwest::Client,
    args: Args,
    next_id: u64,
}

impl Client {
    async fn call(
        &mut self,
        tool: &str,
        mut params: Value,
    ) -> Result<Value, Box<dyn std::error::Error>> {
        self.next_id += 1;
        params["name"] = json!(tool);
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": { "name": "watchlist-walkthrough", "version": "1.0.0" },
            "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} }
        });
        let request = json!({ "jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": params });
        println!(
            "\n>>> POST {} (id {})\n{}",
            self.args.url,
            self.next_id,
            serde_json::to_string_pretty(&request)?
        );
        let response = self
            .http
            .post(&self.args.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", "2026-07-28")
            .header("Mcp-Method", "tools/call")
            .header("Mcp-Name", tool)
            .bearer_auth(&self.args.token)
            .body(request.to_string())
            .send()
            .await?;
        let status = response.status();
        let body: Value = response.json().await?;
        println!(
            "<<< HTTP {status}\n{}",
            serde_json::to_string_pretty(&body)?
        );
        Ok(body)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args().map_err(|e| format!("{e}\nusage: watchlist_walkthrough --token TOKEN [--url URL] [--movie-id N] [--answer WATCHED|WANT_TO_WATCH|decline]"))?;
    let movie_id = args.movie_id;
    let answer = args.answer.clone();
    let mut client = Client {
        http: reqwest::Client::new(),
        args,
        next_id: 0,
    };

    println!("== Round 1: add movie {movie_id} without saying whether it was watched");
    let arguments = json!({ "subject": { "movieId": movie_id.to_string() } });
    let first = client
        .call("addToWatchlist", json!({ "arguments": arguments }))
        .await?;
    let result = &first["result"];
    if result["resultType"] != "input_required" {
        println!("\nThe server answered at once (no question was needed).");
        return Ok(());
    }
    for (key, request) in result["inputRequests"].as_object().into_iter().flatten() {
        println!(
            "\nThe server asks ({key}, {}): {}",
            request["method"], request["params"]["message"]
        );
    }

    let response = if answer == "decline" {
        json!({ "action": "decline" })
    } else {
        json!({ "action": "accept", "content": { "status": answer } })
    };
    println!(
        "\n== Round 2: the user answers {response}; retry with a new id, the answer and the requestState"
    );
    let retry = json!({
        "arguments": arguments,
        "inputResponses": { "status": response },
        "requestState": result["requestState"],
    });
    client.call("addToWatchlist", retry).await?;

    println!("\n== Read the watch list back");
    client
        .call("getWatchlist", json!({ "arguments": {} }))
        .await?;
    Ok(())
}
