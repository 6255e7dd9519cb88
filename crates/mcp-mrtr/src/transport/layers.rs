//! The cross-cutting HTTP layers around every route, from tower-http: an `x-request-id` on every
//! request, echoed on its response and named in its log span; a span per request (method, path,
//! `Mcp-Method`, `Mcp-Name`; status and latency when it ends); CORS for browser clients on the
//! allowed origins, with preflights from any other origin refused with 403; and a handler that
//! panics answered with a JSON-RPC -32603 instead of a dropped connection.

use std::any::Any;
use std::future::{Ready, ready};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use futures::future::Either;
use rand::RngCore;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer, ExposeHeaders};
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
        .layer(SetRequestIdLayer::x_request_id(RandomRequestId))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(span_for)
                .on_response(DefaultOnResponse::new().level(Level::DEBUG))
                // Failures are logged where they happen, with what went wrong.
                .on_failure(()),
        )
        .layer(CatchPanicLayer::custom(answer_panic))
        .layer(PreflightGuardLayer(origins))
        .layer(cors);
    router.layer(layers)
}

/// A fresh 128-bit id for a request that brought none.
#[derive(Clone, Copy)]
struct RandomRequestId;

impl MakeRequestId for RandomRequestId {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut bytes = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut bytes);
        let mut id = [0u8; 32];
        for (pair, byte) in id.chunks_exact_mut(2).zip(bytes) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0x0f)];
        }
        HeaderValue::from_bytes(&id).ok().map(RequestId::new)
    }
}

/// The span of one request: its id, method and path, and the MCP routing headers.
fn span_for<B>(request: &axum::http::Request<B>) -> tracing::Span {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(|value| excerpt(value).into_owned())
            .unwrap_or_default()
    };
    tracing::info_span!(
        "request",
        id = %header("x-request-id"),
        method = %request.method(),
        path = request.uri().path(),
        mcp_method = %header("mcp-method"),
        mcp_name = %header("mcp-name"),
    )
}

/// Refuses, with 403, a preflight from an origin that may not call the endpoint, as every other
/// request from it is: CORS alone would only leave out the `Access-Control-*` headers. Written as
/// a plain service: it sits in front of every request.
#[derive(Clone)]
struct PreflightGuardLayer(OriginPolicy);

impl<S> Layer<S> for PreflightGuardLayer {
    type Service = PreflightGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PreflightGuard {
            inner,
            origins: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct PreflightGuard<S> {
    inner: S,
    origins: OriginPolicy,
}

impl<S, B> Service<Request<B>> for PreflightGuard<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response<Body>, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let foreign = request.method() == Method::OPTIONS
            && request.headers().get(header::ORIGIN).is_some_and(|origin| {
                !origin
                    .to_str()
                    .is_ok_and(|origin| self.origins.allows_origin(origin))
            });
        if !foreign {
            return Either::Right(self.inner.call(request));
        }
        tracing::warn!("refused a preflight from a foreign origin");
        let refusal = Response::builder()
            .status(StatusCode::FORBIDDEN)
            .body(Body::empty())
            .unwrap_or_default();
        Either::Left(ready(Ok(refusal)))
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
