//! Streamable HTTP: the `/mcp` endpoint. It validates what HTTP adds (Origin, content type, size,
//! the mirrored routing headers, the protocol version), resolves the caller, and hands the request
//! to the protocol [`Server`], answering with JSON or with an SSE stream. It knows JSON-RPC and
//! HTTP, never what the tools are about.

#[cfg(feature = "legacy")]
mod answer_relay;
#[cfg(feature = "legacy")]
mod claims;
mod front;
mod headers;
mod health;
mod layers;
#[cfg(feature = "legacy")]
mod legacy;
mod listen;
mod modern;
mod origin;
mod respond;
mod run_on_room;
#[cfg(feature = "legacy")]
mod running_calls;
#[cfg(feature = "legacy")]
mod session_streams;
mod sse;
mod streams;
mod traffic;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;

pub use crate::drain::Drain;
pub use headers::encode_header_value;
pub use health::{CHECK_DEADLINE, CheckOutcome, Readiness};
#[cfg(feature = "legacy")]
pub use legacy::LegacyOptions;
pub use listen::{ConnectionLimits, MIN_IDLE_TIMEOUT, RESERVED_DESCRIPTORS, max_connections};
pub use origin::OriginPolicy;
pub use streams::StreamLimits;

use crate::auth::{Authenticator, Principal};
use crate::log_budget::LogBudget;
use crate::server::Server;
use crate::store::Owner;
use respond::WireError;

/// HTTP-level settings of the endpoint.
pub struct TransportOptions {
    /// Which `Origin`s (and hosts named by `Host` or `:authority`) are accepted, against DNS
    /// rebinding.
    pub origin: OriginPolicy,
    /// Resolves each request's principal from its headers.
    pub authenticator: Arc<dyn Authenticator>,
    /// Largest request body accepted; bigger bodies are refused with HTTP 413. Taken as at most
    /// [`MOST_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Longest a client may take to send a request's body once its headers are in (HTTP 408).
    pub body_read_timeout: Duration,
    /// Most body bytes held at once across all requests being read and parsed, claimed as they
    /// arrive; a request whose next bytes do not fit waits up to [`BUSY_WAIT`], then gets HTTP
    /// 503.
    pub max_buffered_body_bytes: usize,
    /// Period of SSE comment lines on streams: long-lived ones, and a request's while it waits
    /// (a 2025-11-25 call waiting for its user's answer, say).
    pub keepalive: Duration,
    /// Ends long-lived streams when the server begins to shut down.
    pub drain: Drain,
    /// Most long-lived streams open at once, in all and per owner.
    pub streams: StreamLimits,
    /// Most requests handled at once, counted from when their body is in (a body slow to come
    /// holds no turn); more wait up to [`BUSY_WAIT`], then get HTTP 503 with `Retry-After`. A
    /// streamed answer stops counting once its stream has started. Also how many 2025-11-25
    /// calls run on after their clients closed their streams, a quarter of those per owner.
    pub max_concurrent_requests: usize,
    /// The 2025-11-25 wire's settings.
    #[cfg(feature = "legacy")]
    pub legacy: legacy::LegacyOptions,
}

/// Most bytes of request headers (names, values and their separators) a `POST /mcp`, or a legacy
/// session's `GET` or `DELETE`, is accepted with. A limit of its own, well below hyper's (about
/// 400 KiB buffered: past it, a head that arrives in small pieces gets hyper's empty 431, one that
/// arrives at once is parsed), so that heads up to hyper's limit get one answer, a JSON-RPC error,
/// however they arrive. HTTP/2 connections take header lists up to twice this size, so that this
/// check, not h2's, answers them.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The longest period between keep-alive comments that is kept to; longer ones are taken as this.
const MOST_KEEPALIVE: Duration = Duration::from_secs(86_400);

/// How long a request waits for a turn when [`TransportOptions::max_concurrent_requests`] are
/// being handled, before it is answered 503.
pub const BUSY_WAIT: Duration = Duration::from_secs(1);

pub(crate) struct Endpoint {
    server: Arc<Server>,
    options: TransportOptions,
    /// One per request being read or handled.
    turns: Arc<tokio::sync::Semaphore>,
    /// The body bytes being read or parsed.
    body_bytes: front::BodyBudget,
    /// The long-lived streams open now.
    streams: Arc<streams::OpenStreams>,
    #[cfg(feature = "legacy")]
    legacy: legacy::LegacyWire,
}

/// The router serving MCP at `path`, with `/healthz` and `/readyz` running `readiness`, inside
/// the HTTP layers (request ids, spans, CORS, panics answered).
pub fn router(
    server: Arc<Server>,
    options: TransportOptions,
    path: &str,
    readiness: Readiness,
) -> Router {
    let health = health::routes(readiness, options.drain.clone());
    let origins = options.origin.clone();
    #[cfg(feature = "legacy")]
    let (endpoint, route) = {
        let mut options = options;
        let wire = legacy::LegacyWire::start(&mut options);
        let endpoint = Endpoint {
            turns: turns(&options),
            body_bytes: body_bytes(&options),
            streams: streams::OpenStreams::new(options.streams),
            server,
            options,
            legacy: wire,
        };
        // HEAD is refused rather than left to the GET handler, which would open the session's
        // stream (ending the one its client reads) only for the body to be dropped.
        let route = post(front::post)
            .get(legacy::get)
            .head(respond::method_not_allowed)
            .delete(legacy::delete);
        (endpoint, route)
    };
    #[cfg(not(feature = "legacy"))]
    let (endpoint, route) = {
        let route = post(front::post)
            .get(respond::method_not_allowed)
            .delete(respond::method_not_allowed);
        let endpoint = Endpoint {
            turns: turns(&options),
            body_bytes: body_bytes(&options),
            streams: streams::OpenStreams::new(options.streams),
            server,
            options,
        };
        (endpoint, route)
    };
    let routes = Router::new()
        .route(path, route)
        .with_state(Arc::new(endpoint))
        .merge(health);
    layers::around(routes, origins)
}

impl Endpoint {
    /// The refusal, if any, that a request's head alone earns, checked before anything else in
    /// the spec's order: its `Origin` and the host it names (403: an invalid Origin is answered
    /// 403 whatever else is wrong), then its size (431). Used by `POST /mcp` and a legacy
    /// session's `GET` and `DELETE`.
    fn head_refusal(&self, uri: &Uri, headers: &HeaderMap) -> Option<WireError> {
        if let Err(reason) = self.options.origin.check(uri, headers) {
            if let Some(held_back) = REFUSED_ORIGINS.take() {
                tracing::warn!(held_back, "refused request: {reason}");
            }
            return Some(WireError::refused(StatusCode::FORBIDDEN, reason));
        }
        WireError::head_too_large(headers)
    }

    /// Room for one more of `owner`'s long-lived streams (`subscriptions/listen`, a legacy
    /// session's `GET`); taking it may end the owner's oldest stream.
    fn stream_room(&self, owner: &Owner) -> Result<streams::StreamSlot, streams::ServerFull> {
        self.streams.open(owner)
    }

    /// The period of keep-alive comments on this endpoint's streams.
    fn keepalive(&self) -> Duration {
        self.options
            .keepalive
            .clamp(Duration::from_millis(1), MOST_KEEPALIVE)
    }

    /// How a long-lived stream is kept in the room `slot` holds for it: `opening` is its first
    /// message, `farewell` its last when the server ends it, as it does when the credentials it
    /// was opened with stop being accepted (`valid_until`).
    fn long_lived(
        &self,
        slot: streams::StreamSlot,
        valid_until: Option<SystemTime>,
        opening: Option<Vec<u8>>,
        farewell: Option<Vec<u8>>,
    ) -> sse::LongLived {
        let ends_at = valid_until.map(|at| {
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::Instant::now() + left.min(MOST_STREAM_LIFE)
        });
        sse::LongLived {
            keepalive: self.keepalive(),
            drain: self.options.drain.clone(),
            slot,
            opening: opening.map(|message| sse::frame(&message)),
            farewell: farewell.map(|message| sse::frame(&message)),
            ends_at,
        }
    }
}

/// The furthest a stream's end is set by its credentials' expiry (a year): far enough for any
/// token, and within what a timer takes.
const MOST_STREAM_LIFE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The largest body limit a transport takes (4 GiB less a byte): a body's claim on the budget of
/// body bytes held at once is counted in `u32` permits.
pub const MOST_BODY_BYTES: usize = u32::MAX as usize;

/// Lines about refused Origins and hosts, which any client can send.
static REFUSED_ORIGINS: LogBudget = LogBudget::new("refused_origin_or_host");

fn turns(options: &TransportOptions) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(
        options
            .max_concurrent_requests
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
    ))
}

fn body_bytes(options: &TransportOptions) -> front::BodyBudget {
    let most = tokio::sync::Semaphore::MAX_PERMITS;
    let bytes = options.max_buffered_body_bytes.clamp(
        options.max_body_bytes.clamp(1, MOST_BODY_BYTES.min(most)),
        most,
    );
    front::BodyBudget::new(bytes)
}

/// Whose share of the stores a caller's entries count against: a signed-in principal, or an
/// anonymous caller's address (its /64 for IPv6, which one client usually holds whole).
pub(crate) fn owner_of(principal: &Principal, peer: Option<IpAddr>) -> Owner {
    match (principal, peer) {
        (Principal::Anonymous, Some(IpAddr::V4(address))) => Owner::new(&v4_name(address)),
        (Principal::Anonymous, Some(IpAddr::V6(address))) => {
            let network = u128::from(address) & !((1u128 << 64) - 1);
            Owner::new(&format!("address:{}/64", std::net::Ipv6Addr::from(network)))
        }
        _ => Owner::new(&principal.id()),
    }
}

/// `address:a.b.c.d`, written digit by digit: `Display` for an address goes through the
/// formatter's padding machinery, a measurable part of an anonymous caller's request.
fn v4_name(address: std::net::Ipv4Addr) -> String {
    let mut name = String::with_capacity("address:255.255.255.255".len());
    name.push_str("address:");
    for (i, octet) in address.octets().into_iter().enumerate() {
        if i > 0 {
            name.push('.');
        }
        if octet >= 100 {
            name.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            name.push(char::from(b'0' + octet / 10 % 10));
        }
        name.push(char::from(b'0' + octet % 10));
    }
    name
}

/// Serves `router` on `listener` within `limits` until `drain` begins: connections capped, slow
/// and idle ones closed, Nagle's algorithm off (small request/response pairs would otherwise wait
/// for delayed ACKs). Then stops accepting and lets the requests being served finish, within the
/// grace period.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    drain: Drain,
) {
    listen::serve(listener, router, limits, drain).await;
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::v4_name;

    #[test]
    fn an_ipv4_owner_is_named_as_the_address_is_written() {
        for address in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(10, 99, 100, 9),
            Ipv4Addr::new(192, 168, 1, 250),
        ] {
            assert_eq!(v4_name(address), format!("address:{address}"));
        }
    }
}
