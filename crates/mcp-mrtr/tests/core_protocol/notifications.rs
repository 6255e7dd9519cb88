//! Client notifications: accepted and ignored on this wire.

use serde_json::json;

use crate::support::TestServer;

#[tokio::test]
async fn posted_notifications_get_202_with_an_empty_body() {
    let server = TestServer::start().await;
    let reply = server
        .client()
        .request("notifications/cancelled")
        .params(json!({"requestId": 1, "reason": "test"}))
        .notification()
        .send()
        .await;
    assert_eq!(reply.status.as_u16(), 202);
    assert!(
        reply.body.is_empty(),
        "empty body, got {:?}",
        reply.body_text()
    );
}
