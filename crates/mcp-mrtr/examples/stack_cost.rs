//! What this crate's HTTP stack costs per MRTR round trip in process, without sockets: the same
//! two requests as `bench_mrtr`'s memory row (`tools/call` answered `input_required`, then the
//! retry answered `complete`) sent through the router with `tower::ServiceExt::oneshot` on one
//! thread, against a bare axum router answering fixed bytes. Prints microseconds and heap
//! allocations per round trip for both, and the time ratio. Both figures include building the
//! requests and reading the answers (the same work on both sides), and one thread has none of a
//! real server's cross-thread wake-ups.
//!
//! ```sh
//! cargo run --release -p mcp-mrtr --example stack_cost -- 200000
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use http_body_util::BodyExt as _;
use mcp_mrtr::auth::AnonymousOnly;
use mcp_mrtr::protocol::content::CallToolResult;
use mcp_mrtr::registry::{Registry, Tool};
use mcp_mrtr::server::{Events, ServerInfo};
use mcp_mrtr::service::{self, Settings};
use serde_json::json;
use tower::ServiceExt as _;

#[global_allocator]
static ALLOCATOR: Counting = Counting(mimalloc::MiMalloc);

/// mimalloc, counting allocations (reallocations included) while `COUNTING` is on, so the
/// example can print how many a round trip makes. Timed runs leave it off: then each allocation
/// costs one more load of a flag, not a count.
struct Counting(mimalloc::MiMalloc);

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn count_one() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on unchanged to mimalloc, which upholds `GlobalAlloc`'s contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's guarantees are passed on.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's guarantees are passed on.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's guarantees are passed on.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: the caller's guarantees are passed on.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

const META: &str = r#"{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}"#;
const TOOL: &str = "test_input_required_result_elicitation";

fn call(state: Option<&str>) -> Request<Body> {
    let body = match state {
        None => format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{TOOL}","arguments":{{}},"_meta":{META}}}}}"#
        ),
        Some(state) => format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"{TOOL}","arguments":{{}},"_meta":{META},"inputResponses":{{"user_name":{{"action":"accept","content":{{"name":"bench"}}}}}},"requestState":"{state}"}}}}"#
        ),
    };
    let mut request = Request::post("/mcp")
        .header("host", "127.0.0.1:3000")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", TOOL)
        .header("content-length", body.len())
        .body(Body::from(body))
        .expect("a valid request");
    let peer: SocketAddr = ([127, 0, 0, 1], 40000).into();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

async fn send(router: &axum::Router, request: Request<Body>) -> bytes::Bytes {
    let response = router.clone().oneshot(request).await.expect("infallible");
    assert!(response.status().is_success(), "{}", response.status());
    response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes()
}

fn state_of(body: &[u8]) -> String {
    let reply: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    reply["result"]["requestState"]
        .as_str()
        .expect("a requestState")
        .to_owned()
}

/// Microseconds per round trip.
async fn round_trips(router: &axum::Router, n: u64) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        let first = send(router, call(None)).await;
        let state = state_of(&first);
        let last = send(router, call(Some(&state))).await;
        assert!(last.windows(13).any(|w| w == b"Hello, bench!"));
    }
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Heap allocations (reallocations included) per round trip, counted apart from the timed runs.
async fn allocations(router: &axum::Router, n: u64) -> f64 {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
    round_trips(router, n).await;
    COUNTING.store(false, Ordering::Relaxed);
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

fn bare_router() -> axum::Router {
    let state = "A".repeat(150);
    let input_required = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","inputRequests":{{"user_name":{{"method":"elicitation/create","params":{{"mode":"form","message":"What is your name?","requestedSchema":{{"properties":{{"name":{{"description":"Your name","type":"string"}}}},"required":["name"],"type":"object"}}}}}}}},"requestState":"{state}"}}}}"#
    );
    let complete = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"text":"Hello, bench!","type":"text"}],"resultType":"complete"}}"#;
    let replies = Arc::new((
        bytes::Bytes::from(input_required),
        bytes::Bytes::from_static(complete.as_bytes()),
    ));
    axum::Router::new().route(
        "/mcp",
        axum::routing::post(move |body: bytes::Bytes| {
            let replies = replies.clone();
            async move {
                let retry = body.windows(14).any(|w| w == b"\"requestState\"");
                let reply = if retry {
                    replies.1.clone()
                } else {
                    replies.0.clone()
                };
                ([("content-type", "application/json")], reply)
            }
        }),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000)
        // Five measured slices need at least one round trip each.
        .max(10);
    let mut registry = Registry::new();
    registry.add_tool(Tool::without_arguments(TOOL, "asks the user's name", |ctx| async move {
        let form = json!({"type": "object", "properties": {"name": {"type": "string", "description": "Your name"}}, "required": ["name"]});
        let answer = ctx.elicit("user_name", "What is your name?", form).await?;
        let name = answer.text("name").unwrap_or_else(|| "stranger".into());
        Ok(CallToolResult::text(format!("Hello, {name}!")))
    }));
    let info = ServerInfo {
        name: "stack-cost".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        instructions: None,
    };
    let settings = Settings {
        loopback: true,
        ..Settings::default()
    };
    let stack = service::router(
        &settings,
        registry,
        info,
        Events::new(),
        Arc::new(AnonymousOnly),
    )
    .await?;
    let bare = bare_router();
    round_trips(&stack, n / 10).await;
    round_trips(&bare, n / 10).await;
    let (mut ours, mut floor) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        floor.push(round_trips(&bare, n / 5).await);
        ours.push(round_trips(&stack, n / 5).await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ours_us, floor_us) = (median(&mut ours), median(&mut floor));
    let (ours_allocs, floor_allocs) = (
        allocations(&stack, n / 10).await,
        allocations(&bare, n / 10).await,
    );
    println!(
        "in process, per round trip: bare axum {floor_us:.2} us, mcp-mrtr {ours_us:.2} us ({:.2}x); \
         allocations: bare axum {floor_allocs:.0}, mcp-mrtr {ours_allocs:.0}",
        ours_us / floor_us
    );
    Ok(())
}
