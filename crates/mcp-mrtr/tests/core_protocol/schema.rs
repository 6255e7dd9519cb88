//! The schema check every reply goes through catches what it should.

use serde_json::{Value, json};

use crate::support;

#[test]
fn the_schema_check_rejects_messages_the_spec_forbids() {
    use support::schema::check;

    // Sanity: well-formed messages pass.
    assert!(
        check(
            "CallToolResult",
            &json!({"resultType": "complete", "content": []})
        )
        .is_ok()
    );
    assert!(
        check(
            "JSONRPCErrorResponse",
            &json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}})
        )
        .is_ok()
    );

    // A 2026 result without resultType.
    assert!(check("CallToolResult", &json!({"content": []})).is_err());
    // A list result without its caching hints.
    assert!(
        check(
            "ListToolsResult",
            &json!({"resultType": "complete", "tools": []})
        )
        .is_err()
    );
    // An error response with a null or fractional id.
    for id in [Value::Null, json!(1.5)] {
        assert!(
            check(
                "JSONRPCErrorResponse",
                &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": "bad"}})
            )
            .is_err(),
            "id {id}"
        );
    }
    // -32021 whose requiredCapabilities is an array instead of a ClientCapabilities object.
    assert!(
        check(
            "MissingRequiredClientCapabilityError",
            &json!({"jsonrpc": "2.0", "id": 1, "error": {
                "code": -32021, "message": "m", "data": {"requiredCapabilities": ["sampling"]}
            }})
        )
        .is_err()
    );
    // An input_required result whose requestState is not a string.
    assert!(
        check(
            "InputRequiredResult",
            &json!({"resultType": "input_required", "requestState": 7})
        )
        .is_err()
    );
    // A progress notification without its token.
    assert!(
        check(
            "ProgressNotification",
            &json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}})
        )
        .is_err()
    );
}

#[test]
#[should_panic(expected = "must not")]
fn the_schema_check_refuses_server_requests_on_a_response_stream() {
    support::schema::validate_server_message(
        "tools/call",
        &json!({"jsonrpc": "2.0", "id": 9, "method": "elicitation/create", "params": {}}),
    );
}
