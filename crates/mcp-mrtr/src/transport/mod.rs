//! Streamable HTTP: the `/mcp` endpoint. It validates what HTTP adds (Origin, content type, size,
//! the mirrored routing headers, the protocol version), resolves the caller, and hands the request
//! to the protocol [`Server`], answering with JSON or with an SSE stream. It knows JSON-RPC and
//! HTTP, never what the tools are about.

mod front;
mod headers;
#[cfg(feature = "legacy")]
mod legacy;
mod modern;
mod origin;
mod respond;
mod sse;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;

#[cfg(feature = "legacy")]
pub use legacy::LegacyOptions;
pub use origin::OriginPolicy;

use crate::auth::Authenticator;
use crate::server::Server;

/// HTTP-level settings of the endpoint.
pub struct TransportOptions {
    /// Which `Origin` (and `Host`) headers are accepted, against DNS rebinding.
    pub origin: OriginPolicy,
    /// Resolves each request's principal from its headers.
    pub authenticator: Arc<dyn Authenticator>,
    /// Largest request body accepted; bigger bodies are refused with HTTP 413.
    pub max_body_bytes: usize,
    /// Period of SSE comment lines on long-lived streams.
    pub keepalive: Duration,
    /// Most requests read and handled at once; more wait up to [`BUSY_WAIT`], then get HTTP 503
    /// with `Retry-After`. A streamed answer stops counting once its stream has started.
    pub max_concurrent_requests: usize,
    /// The 2025-11-25 wire's settings.
    #[cfg(feature = "legacy")]
    pub legacy: legacy::LegacyOptions,
}

/// How long a request waits for a turn when [`TransportOptions::max_concurrent_requests`] are
/// being handled, before it is answered 503.
pub const BUSY_WAIT: Duration = Duration::from_secs(1);

pub(crate) struct Endpoint {
    server: Arc<Server>,
    options: TransportOptions,
    /// One per request being read or handled.
    turns: Arc<tokio::sync::Semaphore>,
    #[cfg(feature = "legacy")]
    legacy: legacy::LegacyWire,
}

/// The router serving MCP at `path`.
pub fn router(server: Arc<Server>, options: TransportOptions, path: &str) -> Router {
    #[cfg(feature = "legacy")]
    let (endpoint, route) = {
        let mut options = options;
        let wire = legacy::LegacyWire::start(&mut options);
        let endpoint = Endpoint {
            turns: turns(&options),
            server,
            options,
            legacy: wire,
        };
        let route = post(front::post).get(legacy::get).delete(legacy::delete);
        (endpoint, route)
    };
    #[cfg(not(feature = "legacy"))]
    let (endpoint, route) = {
        let route = post(front::post)
            .get(respond::method_not_allowed)
            .delete(respond::method_not_allowed);
        let endpoint = Endpoint {
            turns: turns(&options),
            server,
            options,
        };
        (endpoint, route)
    };
    Router::new()
        .route(path, route)
        .with_state(Arc::new(endpoint))
}

fn turns(options: &TransportOptions) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(
        options.max_concurrent_requests.max(1),
    ))
}

/// Serves `router` on `listener` until `shutdown` resolves, with Nagle's algorithm off on every
/// accepted socket (small request/response pairs would otherwise wait for delayed ACKs).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router.into_make_service())
        .with_graceful_shutdown(shutdown)
        .await
}
