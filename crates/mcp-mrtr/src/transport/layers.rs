//! The cross-cutting HTTP layers around every route, from tower-http: an `x-request-id` on every
//! request, echoed on its response and named in its log span; a span per request (method, path,
//! `Mcp-Method`, `Mcp-Name`; status and latency when it ends); CORS for browser clients on the
//! allowed origins, with preflights from any other origin refused with 403; and a handler that
//! panics answered with a JSON-RPC -32603 instead of a dropped connection.
//!
//! Every request goes through them, so they keep off its path what it does not need: the span's
//! fields are read only when the span is logged or exported, and CORS runs only for requests
//! that come with an `Origin` (browsers), not for other clients.

use std::any::Any;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use futures::future::Either;
use rand::RngCore;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, Cors, CorsLayer, ExposeHeaders};
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use super::origin::OriginPolicy;
use crate::protocol::ProtocolError;
use crate::protocol::error::excerpt;
use crate::protocol::jsonrpc::error_bytes;

/// The response headers a browser page may read: the session, the revision, the challenge of a
/// refused sign-in, the request id and when to come back.
const EXPOSED: [&str; 5] = [
    "mcp-session-id",
    "mcp-protocol-version",
    "www-authenticate",
    "x-request-id",
    "retry-after",
];

/// How long a browser may reuse a preflight's answer.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(3600);

/// `router` inside the layers (see the module docs), CORS following `origins`.
pub(super) fn around(router: Router, origins: OriginPolicy) -> Router {
    let allowed = origins.clone();
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| {
            origin
                .to_str()
                .is_ok_and(|origin| allowed.allows_origin(origin))
        }))
        .allow_methods(AllowMethods::list([
            Method::GET,
            Method::POST,
            Method::DELETE,
        ]))
        // Whatever the page asks to send: `Authorization`, `Content-Type`, the MCP headers and
        // any `Mcp-Param-*` a tool declares.
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers(ExposeHeaders::list(EXPOSED.map(HeaderName::from_static)))
        .max_age(PREFLIGHT_MAX_AGE);
    let layers = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(NumberedRequestId::new()))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(span_for)
                .on_response(DefaultOnResponse::new().level(Level::DEBUG))
                // Failures are logged where they happen, with what went wrong.
                .on_failure(()),
        )
        .layer(CatchPanicLayer::custom(answer_panic))
        .layer(BrowserLayer {
            origins,
            cors: Arc::new(cors),
        });
    router.layer(layers)
}

/// A fresh id for a request that brought none: this process's random 64-bit prefix, then the
/// count of requests it has numbered passed through a keyed permutation of 64-bit numbers, in
/// hex. Unique without drawing random bytes on every request, and the count cannot be read off
/// it.
#[derive(Clone)]
struct NumberedRequestId {
    prefix: Arc<str>,
    key: u64,
    next: Arc<AtomicU64>,
}

impl NumberedRequestId {
    fn new() -> Self {
        let mut random = rand::thread_rng();
        Self {
            prefix: Arc::from(format!("{:016x}", random.next_u64())),
            key: random.next_u64(),
            next: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl MakeRequestId for NumberedRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let scrambled = scramble(number ^ self.key);
        HeaderValue::try_from(format!("{}{scrambled:016x}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
}

/// A bijection of 64-bit numbers that spreads consecutive inputs over the whole range (the
/// finalizer of SplitMix64: each step, a xor-shift or a multiplication by an odd number, is
/// invertible).
fn scramble(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The span of one request: its id, method and path, and the MCP routing headers.
fn span_for<B>(request: &axum::http::Request<B>) -> tracing::Span {
    use tracing::field::{Empty, display};
    let span = tracing::info_span!(
        "request",
        id = Empty,
        method = %request.method(),
        path = request.uri().path(),
        mcp_method = Empty,
        mcp_name = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    for (field, name) in [
        ("id", "x-request-id"),
        ("mcp_method", "mcp-method"),
        ("mcp_name", "mcp-name"),
    ] {
        if let Some(value) = request.headers().get(name).and_then(|v| v.to_str().ok()) {
            span.record(field, display(excerpt(value)));
        }
    }
    span
}

/// What browsers get: CORS for a request that comes with an `Origin`, and 403 for a preflight
/// from an origin that may not call the endpoint, as every other request from it gets (CORS
/// alone would only leave out the `Access-Control-*` headers). Other clients send no `Origin`
/// and skip CORS altogether. Written as a plain service: it sits in front of every request.
#[derive(Clone)]
struct BrowserLayer {
    origins: OriginPolicy,
    /// Shared: the service is cloned for every request, and most requests do not need it.
    cors: Arc<CorsLayer>,
}

impl<S> Layer<S> for BrowserLayer {
    type Service = Browser<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Browser {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
struct Browser<S> {
    inner: S,
    layer: BrowserLayer,
}

type Refused<E> = Ready<Result<Response<Body>, E>>;

impl<S, B> Service<Request<B>> for Browser<S>
where
    S: Service<Request<B>, Response = Response<Body>> + Clone,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future =
        Either<Refused<S::Error>, Either<S::Future, <Cors<S> as Service<Request<B>>>::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(origin) = request.headers().get(header::ORIGIN) else {
            return Either::Right(Either::Left(self.inner.call(request)));
        };
        let allowed = origin
            .to_str()
            .is_ok_and(|origin| self.layer.origins.allows_origin(origin));
        if request.method() == Method::OPTIONS && !allowed {
            tracing::warn!("refused a preflight from a foreign origin");
            let refusal = Response::builder()
                .status(StatusCode::FORBIDDEN)
                .body(Body::empty())
                .unwrap_or_default();
            return Either::Left(ready(Ok(refusal)));
        }
        // The service made ready by `poll_ready` serves the request; a clone takes its place.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        Either::Right(Either::Right(self.layer.cors.layer(ready).call(request)))
    }
}

/// What a request whose handler panicked is answered with; the panic is logged.
fn answer_panic(panic: Box<dyn Any + Send + 'static>) -> Response<Body> {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    tracing::error!("a request handler panicked: {what}");
    let error =
        ProtocolError::internal("Internal error: the server failed while handling the request");
    Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(error_bytes(None, &error)))
        .unwrap_or_default()
}
