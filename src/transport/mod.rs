//! Streamable HTTP: the `/mcp` endpoint. It validates what HTTP adds (Origin, content type, size,
//! the mirrored routing headers, the protocol version), resolves the caller, and hands the request
//! to the protocol [`Server`], answering with JSON or with an SSE stream. It knows JSON-RPC and
//! HTTP, never movies.

mod headers;
mod http;
#[cfg(feature = "legacy")]
mod legacy;
mod origin;
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
    pub origin: OriginPolicy,
    pub authenticator: Arc<dyn Authenticator>,
    pub max_body_bytes: usize,
    /// Period of SSE comment lines on long-lived streams.
    pub keepalive: Duration,
    #[cfg(feature = "legacy")]
    pub legacy: legacy::LegacyOptions,
    /// With replicas: carries legacy clients' answers to the replica whose call waits for them.
    #[cfg(feature = "legacy")]
    pub answer_relay: Option<crate::store::RedisEventRelay>,
}

pub(crate) struct Endpoint {
    server: Arc<Server>,
    options: TransportOptions,
    /// Calls waiting for a legacy client's answer to a server-initiated request.
    #[cfg(feature = "legacy")]
    pending: Arc<crate::mrtr::PendingAnswers>,
    /// Answers for calls waiting on other replicas, on their way to the relay.
    #[cfg(feature = "legacy")]
    answers_elsewhere: Option<tokio::sync::mpsc::Sender<Vec<u8>>>,
}

/// The router serving MCP at `path`.
pub fn router(server: Arc<Server>, options: TransportOptions, path: &str) -> Router {
    #[cfg(feature = "legacy")]
    let mut options = options;
    #[cfg(feature = "legacy")]
    let pending: Arc<crate::mrtr::PendingAnswers> = Arc::default();
    #[cfg(feature = "legacy")]
    let answers_elsewhere = options
        .answer_relay
        .take()
        .map(|relay| legacy::relay_answers(relay, pending.clone()));
    let endpoint = Arc::new(Endpoint {
        server,
        options,
        #[cfg(feature = "legacy")]
        pending,
        #[cfg(feature = "legacy")]
        answers_elsewhere,
    });
    #[cfg(feature = "legacy")]
    let route = post(http::post).get(legacy::get).delete(legacy::delete);
    #[cfg(not(feature = "legacy"))]
    let route = post(http::post)
        .get(http::method_not_allowed)
        .delete(http::method_not_allowed);
    Router::new().route(path, route).with_state(endpoint)
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
