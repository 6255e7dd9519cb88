//! Checks that the routing headers a client mirrors from the body (`Mcp-Method`, `Mcp-Name`,
//! `Mcp-Param-*`) say the same as the body, decoding the `=?base64?…?=` sentinel form.

use std::borrow::Cow;
use std::fmt::Display;

use axum::http::HeaderMap;
use axum::http::header::{AsHeaderName, HeaderName};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value};

use crate::protocol::error::excerpt;
use crate::protocol::{Method, ProtocolError, TraceCarrier};
use crate::registry::HeaderParam;

/// The headers of the 2026-07-28 wire, parsed once.
pub static MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
static MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
static MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
/// W3C trace context, as HTTP carries it.
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
static BAGGAGE: HeaderName = HeaderName::from_static("baggage");

/// The W3C trace context of the HTTP headers. `tracestate` and `baggage` sent on several lines
/// are one list, joined with commas, as HTTP lists are; a `traceparent` sent more than once
/// names no parent (which of them would be the caller's?), nor does its `tracestate` count.
pub fn trace_headers(headers: &HeaderMap) -> TraceCarrier {
    let joined = |name: &HeaderName| {
        let lines: Vec<&str> = headers
            .get_all(name)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .collect();
        (!lines.is_empty()).then(|| lines.join(","))
    };
    let mut parents = headers.get_all(&TRACEPARENT).iter();
    let traceparent = match (parents.next(), parents.next()) {
        (Some(one), None) => one.to_str().ok().map(str::to_owned),
        _ => None,
    };
    TraceCarrier {
        tracestate: traceparent.as_ref().and_then(|_| joined(&TRACESTATE)),
        traceparent,
        baggage: joined(&BAGGAGE),
    }
}

/// Reads a header as text, trimmed. Header names are case-insensitive (HeaderMap folds them).
/// A header sent on more than one line is refused: a proxy may route on any of them, or on all
/// joined, so none of them is sure to be what the body says.
pub fn header_text<K: AsHeaderName + Display + Copy>(
    headers: &HeaderMap,
    name: K,
) -> Result<Option<&str>, ProtocolError> {
    let mut lines = headers.get_all(name).into_iter();
    let first = lines.next();
    if lines.next().is_some() {
        return Err(ProtocolError::header_mismatch(format!(
            "{name} header is sent more than once"
        )));
    }
    match first {
        None => Ok(None),
        Some(value) => value.to_str().map(|text| Some(text.trim())).map_err(|_| {
            ProtocolError::header_mismatch(format!(
                "{name} header contains characters that are not visible ASCII"
            ))
        }),
    }
}

/// Decodes a header value that may use the Base64 sentinel form.
pub fn decode_sentinel<'a>(name: &str, raw: &'a str) -> Result<Cow<'a, str>, ProtocolError> {
    let Some(encoded) = raw
        .strip_prefix("=?base64?")
        .and_then(|rest| rest.strip_suffix("?="))
    else {
        return Ok(Cow::Borrowed(raw));
    };
    let bytes = STANDARD.decode(encoded).map_err(|_| {
        ProtocolError::header_mismatch(format!(
            "{name} header has invalid Base64 in its =?base64?…?= value"
        ))
    })?;
    String::from_utf8(bytes).map(Cow::Owned).map_err(|_| {
        ProtocolError::header_mismatch(format!("{name} header decodes to invalid UTF-8"))
    })
}

/// How a client writes `value` into `Mcp-Name` or an `Mcp-Param-*` header: as is when it is
/// plain visible ASCII (inner spaces allowed), else in the `=?base64?…?=` sentinel form, which
/// also carries a value that would read as a sentinel itself.
pub fn encode_header_value(value: &str) -> Cow<'_, str> {
    let visible = value.bytes().all(|byte| matches!(byte, b' '..=b'~'));
    let padded = value.starts_with(' ') || value.ends_with(' ');
    let like_a_sentinel = value.starts_with("=?base64?") && value.ends_with("?=");
    if visible && !padded && !like_a_sentinel {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(format!("=?base64?{}?=", STANDARD.encode(value)))
    }
}

/// `Mcp-Method` must be present and equal the body's method.
pub fn check_method(headers: &HeaderMap, method: &str) -> Result<(), ProtocolError> {
    match header_text(headers, &MCP_METHOD)? {
        None => Err(ProtocolError::header_mismatch("Missing Mcp-Method header")),
        Some(value) if value == method => Ok(()),
        Some(value) => Err(ProtocolError::header_mismatch(format!(
            "Header mismatch: Mcp-Method header value '{}' does not match body value '{method}'",
            excerpt(value)
        ))),
    }
}

/// `Mcp-Name` must be present on `tools/call`, `prompts/get` and `resources/read`, and equal
/// `params.name` or `params.uri` once decoded.
pub fn check_name(
    headers: &HeaderMap,
    method: Method,
    params: &Map<String, Value>,
) -> Result<(), ProtocolError> {
    let Some(field) = method.name_field() else {
        return Ok(());
    };
    let Some(raw) = header_text(headers, &MCP_NAME)? else {
        return Err(ProtocolError::header_mismatch("Missing Mcp-Name header"));
    };
    let header = decode_sentinel("Mcp-Name", raw)?;
    let body = params
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default();
    if header == body {
        Ok(())
    } else {
        Err(ProtocolError::header_mismatch(format!(
            "Header mismatch: Mcp-Name header value '{}' does not match body value '{}'",
            excerpt(&header),
            excerpt(body)
        )))
    }
}

/// Every `x-mcp-header` parameter present in the arguments must arrive as a matching
/// `Mcp-Param-{name}` header, and such a header may not name a value the arguments lack (a
/// proxy routing on it would route a call that runs without it).
pub fn check_params(
    headers: &HeaderMap,
    declared: &[HeaderParam],
    arguments: Option<&Value>,
) -> Result<(), ProtocolError> {
    for param in declared {
        let header_name = format!("mcp-param-{}", param.header.to_ascii_lowercase());
        let display = format!("Mcp-Param-{}", param.header);
        let body = arguments.and_then(|args| {
            param
                .path
                .iter()
                .try_fold(args, |value, key| value.get(key))
        });
        let raw = header_text(headers, &header_name)?;
        let (raw, body) = match (raw, body.filter(|v| !v.is_null())) {
            (None, None) => continue,
            (None, Some(_)) => {
                return Err(ProtocolError::header_mismatch(format!(
                    "Missing {display} header for a parameter present in the body"
                )));
            }
            (Some(raw), None) => {
                decode_sentinel(&display, raw)?;
                return Err(ProtocolError::header_mismatch(format!(
                    "Header mismatch: {display} header names a value the body does not have"
                )));
            }
            (Some(raw), Some(body)) => (raw, body),
        };
        let header = decode_sentinel(&display, raw)?;
        let matches = match body {
            Value::String(text) => header == text.as_str(),
            Value::Bool(flag) => header == flag.to_string(),
            Value::Number(number) => same_number(&header, number),
            _ => false,
        };
        if !matches {
            return Err(ProtocolError::header_mismatch(format!(
                "Header mismatch: {display} header does not match the body value"
            )));
        }
    }
    Ok(())
}

/// Whether `header` is `number` in value. Integers are compared exactly (as f64 they could not
/// tell 2^53 from 2^53 + 1), and one beyond what f64 holds exactly matches only its own digits
/// (not `9007199254740992.0` for 9007199254740993); other numbers are compared as f64, so `42.0`
/// is 42.
fn same_number(header: &str, number: &serde_json::Number) -> bool {
    /// The largest integer f64 holds exactly with all below it (2^53 - 1).
    const EXACT_IN_F64: i128 = (1 << 53) - 1;
    let integer = number
        .as_i64()
        .map(i128::from)
        .or_else(|| number.as_u64().map(i128::from));
    match integer {
        Some(body) if body.abs() > EXACT_IN_F64 => header == number.to_string(),
        Some(body) => match header.parse::<i128>() {
            Ok(header) => body == header,
            Err(_) => header.parse::<f64>().ok() == number.as_f64(),
        },
        None => header.parse::<f64>().ok() == number.as_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_values_are_decoded_and_plain_values_kept() {
        assert_eq!(
            decode_sentinel("h", "=?base64?SGVsbG8=?=").unwrap(),
            "Hello"
        );
        assert_eq!(decode_sentinel("h", "SGVsbG8=").unwrap(), "SGVsbG8=");
        assert_eq!(
            decode_sentinel("h", "=?base64?SGVsbG8=").unwrap(),
            "=?base64?SGVsbG8="
        );
        assert!(decode_sentinel("h", "=?base64?SGVsbG8?=").is_err());
        assert!(decode_sentinel("h", "=?base64?SGVs!!!bG8=?=").is_err());
    }

    #[test]
    fn values_are_encoded_as_the_transport_examples_show() {
        let examples = [
            ("us-west1", "us-west1"),
            ("two words", "two words"),
            ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
            (" padded ", "=?base64?IHBhZGRlZCA=?="),
            ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
            ("tab\there", "=?base64?dGFiCWhlcmU=?="),
            ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
        ];
        for (value, header) in examples {
            assert_eq!(encode_header_value(value), header, "{value:?}");
            assert_eq!(decode_sentinel("h", header).unwrap(), value);
        }
    }
}
