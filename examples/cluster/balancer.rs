//! The round-robin HTTP balancer in front of the replicas. Each request (not each connection) goes
//! to the next replica, with its method, path, headers (`Host` as received) and body; the response
//! streams back as the replica sends it (SSE included) with `X-Moviedb-Replica: <n>` added. A
//! request moves on to the next replica only when a replica refuses the connection (it died), never
//! once the request was sent, so nothing runs twice.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::serve::ListenerExt;

use crate::replicas::Replica;

/// Names the replica that served a response (1-based).
const REPLICA_HEADER: &str = "x-moviedb-replica";
/// Largest request body the balancer buffers (it keeps the body to resend it to another replica).
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;
/// Headers about one hop, which a proxy must not forward.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Where one replica listens.
#[derive(Debug, Clone)]
pub struct Upstream {
    number: usize,
    addr: SocketAddr,
}

impl Upstream {
    pub fn of(replica: &Replica) -> Self {
        Self {
            number: replica.number,
            addr: replica.addr,
        }
    }
}

struct Balancer {
    upstreams: Vec<Upstream>,
    next: AtomicUsize,
    http: reqwest::Client,
}

impl Balancer {
    /// Every upstream once, starting with the next one in turn.
    fn in_turn(&self) -> impl Iterator<Item = &Upstream> {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.upstreams.len();
        (0..count).map(move |offset| &self.upstreams[(first + offset) % count])
    }
}

/// Serves until `shutdown` resolves; open streams are cut then, not waited for. Nagle's algorithm
/// is off on both sides, as on the replicas: small answers must not wait for delayed ACKs.
pub async fn serve(
    listener: tokio::net::TcpListener,
    upstreams: Vec<Upstream>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .build()?;
    let balancer = Arc::new(Balancer {
        upstreams,
        next: AtomicUsize::new(0),
        http,
    });
    let router = Router::new().fallback(forward).with_state(balancer);
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::select! {
        served = axum::serve(listener, router).into_future() => Ok(served?),
        () = shutdown => Ok(()),
    }
}

async fn forward(State(balancer): State<Arc<Balancer>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = to_bytes(body, MAX_REQUEST_BYTES).await else {
        return refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is too large for the balancer",
        );
    };
    let path = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    let mut headers = end_to_end(&parts.headers);
    headers.remove(header::CONTENT_LENGTH);
    for upstream in balancer.in_turn() {
        let sent = balancer
            .http
            .request(
                parts.method.clone(),
                format!("http://{}{path}", upstream.addr),
            )
            .headers(headers.clone())
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) => return relay(response, upstream.number),
            Err(e) if e.is_connect() => tracing::warn!(
                "replica {} refused the connection ({e}); trying the next one",
                upstream.number
            ),
            Err(e) => {
                tracing::warn!("replica {} failed: {e}", upstream.number);
                return refusal(
                    StatusCode::BAD_GATEWAY,
                    &format!("replica {} failed: {e}", upstream.number),
                );
            }
        }
    }
    refusal(
        StatusCode::BAD_GATEWAY,
        "no replica accepted the connection",
    )
}

/// The replica's response, streamed as it comes, marked with the replica's number.
fn relay(response: reqwest::Response, number: usize) -> Response {
    let mut relayed = Response::new(Body::empty());
    *relayed.status_mut() = response.status();
    *relayed.headers_mut() = end_to_end(response.headers());
    relayed
        .headers_mut()
        .insert(REPLICA_HEADER, HeaderValue::from(number));
    *relayed.body_mut() = Body::from_stream(response.bytes_stream());
    relayed
}

fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut kept = headers.clone();
    for name in &HOP_BY_HOP {
        kept.remove(name);
    }
    kept
}

fn refusal(status: StatusCode, reason: &str) -> Response {
    let mut response = Response::new(Body::from(format!("{reason}\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
