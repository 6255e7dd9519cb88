//! Stand-ins for what the movie server talks to. An LLM provider for the summary scenario:
//! `POST /v1/chat/completions` answered at once with a fixed two-line summary in the OpenAI
//! chat-completions shape (the movie server caches what it answers, so once each movie was
//! summarized the provider is not called again). And an OTLP/HTTP trace sink for the row that
//! exports traces: `POST /v1/traces` answered with an empty success.

use std::net::SocketAddr;

use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

/// Serves the provider on `bind` until the process is stopped.
pub async fn serve(bind: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let app = Router::new().route("/v1/chat/completions", post(complete));
    axum::serve(listener, app).await?;
    Ok(())
}

/// Serves the trace sink on `bind` until the process is stopped.
pub async fn serve_otlp_sink(bind: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(bind).await?;
    // An empty ExportTraceServiceResponse is zero bytes of protobuf.
    let app = Router::new().route(
        "/v1/traces",
        post(|| async { ([("content-type", "application/x-protobuf")], "") }),
    );
    axum::serve(listener, app).await?;
    Ok(())
}

async fn complete() -> Response {
    let text = "SUMMARY: Reviewers praise the performances and the score, though several find the \
                middle act slow.\nTHEMES: performances; score; pacing; cinematography";
    axum::Json(json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    }))
    .into_response()
}
