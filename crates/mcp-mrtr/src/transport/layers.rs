//! The cross-cutting HTTP layers around every route: an `x-request-id` on every request, echoed
//! on its response and named in its log span; a span per request (method, path, `Mcp-Method`,
//! `Mcp-Name`), open until its answer is sent or its stream ends, with lines at `debug` (target
//! `mcp_mrtr::http`) giving the status and latency of each answer and the length of each stream;
//! CORS for browser clients on the allowed origins, with preflights from any other origin
//! refused with 403; and a handler that panics answered with a JSON-RPC -32603 instead of a
//! dropped connection.
//!
//! Every request goes through them, so they keep off its path what it does not need. The request
//! id, the span and the panic guard are one service whose future wraps the handler's, boxing
//! neither it nor an answer of known length (tower-http's four layers for the same work made a
//! round trip 6-10 % slower); the span's fields are read only when it is logged or exported, the
//! clock only when the lines are; CORS (tower-http) runs only for requests that come with an
//! `Origin` (browsers).

use std::any::Any;
use std::future::{Future, Ready, ready};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use bytes::Bytes;
use futures::future::Either;
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use rand::RngCore;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, Cors, CorsLayer, ExposeHeaders};
use tracing::{Level, Span};

use super::origin::OriginPolicy;
use crate::log_budget::LogBudget;
use crate::protocol::ProtocolError;
use crate::protocol::error::excerpt;
use crate::protocol::jsonrpc::error_bytes;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The target of the lines logged when a request is answered and when its stream ends.
const LOG_TARGET: &str = "mcp_mrtr::http";

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
        .layer(FramingLayer {
            ids: NumberedRequestId::new(),
        })
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
    prefix: u64,
    key: u64,
    next: Arc<AtomicU64>,
}

impl NumberedRequestId {
    fn new() -> Self {
        let mut random = rand::thread_rng();
        Self {
            prefix: random.next_u64(),
            key: random.next_u64(),
            next: Arc::new(AtomicU64::new(0)),
        }
    }

    fn next(&self) -> HeaderValue {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        let mut digits = [0u8; 32];
        let (prefix, count) = digits.split_at_mut(16);
        // Eight bytes always fill sixteen digits exactly: neither write can fail.
        let written = hex::encode_to_slice(self.prefix.to_be_bytes(), prefix)
            .and_then(|()| hex::encode_to_slice(scramble(number ^ self.key).to_be_bytes(), count));
        match written.map(|()| HeaderValue::from_bytes(&digits)) {
            Ok(Ok(id)) => id,
            _ => HeaderValue::from_static("unnumbered"),
        }
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
fn span_for<B>(request: &Request<B>) -> Span {
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

/// Gives every request an id (its own `x-request-id`, or a numbered one), runs it in its span,
/// echoes the id on the response, and answers a handler's panic instead of dropping the
/// connection.
#[derive(Clone)]
struct FramingLayer {
    ids: NumberedRequestId,
}

impl<S> Layer<S> for FramingLayer {
    type Service = Framing<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Framing {
            inner,
            ids: self.ids.clone(),
        }
    }
}

#[derive(Clone)]
struct Framing<S> {
    inner: S,
    ids: NumberedRequestId,
}

impl<S, B> Service<Request<B>> for Framing<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Framed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let id = match request.headers().get(X_REQUEST_ID) {
            Some(id) => id.clone(),
            None => {
                let id = self.ids.next();
                request.headers_mut().insert(X_REQUEST_ID, id.clone());
                id
            }
        };
        let span = span_for(&request);
        // The clock is read only for the lines that give durations, when they are logged.
        let started = tracing::enabled!(target: LOG_TARGET, Level::DEBUG).then(Instant::now);
        let called = {
            let _entered = span.enter();
            catch_unwind(AssertUnwindSafe(|| self.inner.call(request)))
        };
        let stage = match called {
            Ok(handler) => Stage::Running { handler },
            Err(panic) => Stage::Answered {
                response: span.in_scope(|| answer_panic(panic)),
            },
        };
        Framed {
            stage,
            id: Some(id),
            span,
            started,
        }
    }
}

pin_project! {
    /// Where a request stands: its handler's future running, or the answer to a handler that
    /// panicked before it returned one, or answered (the handler's state freed at once).
    #[project = StageProjection]
    #[project_replace = StageTaken]
    enum Stage<F> {
        Running { #[pin] handler: F },
        Answered { response: Response<Body> },
        Spent,
    }
}

pin_project! {
    /// The handler's future, in its request's span, with the id to echo.
    struct Framed<F> {
        #[pin]
        stage: Stage<F>,
        id: Option<HeaderValue>,
        span: Span,
        started: Option<Instant>,
    }
}

impl<F, E> Future for Framed<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        let polled = match this.stage.as_mut().project() {
            StageProjection::Running { handler } => {
                catch_unwind(AssertUnwindSafe(|| handler.poll(cx)))
            }
            _ => match this.stage.as_mut().project_replace(Stage::Spent) {
                StageTaken::Answered { response } => Ok(Poll::Ready(Ok(response))),
                _ => panic!("a request's future polled after it finished"),
            },
        };
        if !matches!(polled, Ok(Poll::Pending)) {
            // Ready (or panicked): never polled again, and its state freed now.
            this.stage.set(Stage::Spent);
        }
        let mut response = match polled {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(answer)) => answer?,
            Err(panic) => answer_panic(panic),
        };
        if let Some(id) = this.id.take() {
            response.headers_mut().entry(X_REQUEST_ID).or_insert(id);
        }
        if let Some(started) = this.started {
            tracing::debug!(
                target: LOG_TARGET,
                status = response.status().as_u16(),
                latency_ms = started.elapsed().as_millis() as u64,
                "finished processing request"
            );
        }
        let body = response.body();
        let streamed = !body.is_end_stream() && body.size_hint().exact().is_none();
        if streamed && (!this.span.is_disabled() || this.started.is_some()) {
            response = response.map(|body| {
                Body::new(InSpan {
                    body,
                    span: this.span.clone(),
                    started: *this.started,
                })
            });
        }
        Poll::Ready(Ok(response))
    }
}

pin_project! {
    /// A streamed answer's body (SSE), read in its request's span, which stays open until the
    /// stream ends or is dropped. Answers of a known length are not wrapped.
    struct InSpan {
        #[pin]
        body: Body,
        span: Span,
        started: Option<Instant>,
    }
}

impl HttpBody for InSpan {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        let _entered = this.span.enter();
        let polled = this.body.poll_frame(cx);
        if matches!(polled, Poll::Ready(None))
            && let Some(started) = this.started.take()
        {
            tracing::debug!(
                target: LOG_TARGET,
                stream_ms = started.elapsed().as_millis() as u64,
                "end of stream"
            );
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
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
            if let Some(held_back) = REFUSED_PREFLIGHTS.take() {
                tracing::warn!(held_back, "refused a preflight from a foreign origin");
            }
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

/// Lines about refused preflights, which any page can send.
static REFUSED_PREFLIGHTS: LogBudget = LogBudget::new("refused_preflight");
