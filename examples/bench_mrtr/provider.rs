//! A stand-in LLM provider for the summary scenario: `POST /v1/chat/completions` answered at once
//! with a fixed two-line summary in the OpenAI chat-completions shape. The movie server caches
//! what it answers, so once each movie was summarized the provider is not called again.

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
