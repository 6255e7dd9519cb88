//! W3C trace context across requests and rounds. A request's `_meta.traceparent` and
//! `_meta.tracestate` (or, failing those, its HTTP headers) make the parent of its span, so a
//! client's trace continues into the server with the vendors' trace state; `_meta.baggage`
//! entries become `baggage.<key>` attributes of the span. Each MRTR round leaves its trace
//! context and baggage with the continuation it parks, so the next round, on whichever replica,
//! continues the same trace with the same baggage.
//!
//! The spans are plain `tracing` spans; they reach an OpenTelemetry exporter only when the
//! application installs a `tracing-opentelemetry` layer. Without one, nothing here costs more
//! than parsing the header.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::protocol::TraceCarrier;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";
const BAGGAGE: &str = "baggage";

/// Makes `span` a child of the trace context `carrier` names, if it names a valid one, and
/// records its baggage on the span. Call it before the span is first entered.
pub(crate) fn adopt(span: &tracing::Span, carrier: &TraceCarrier) {
    if let Some(traceparent) = carrier.traceparent.as_ref().filter(|t| well_formed(t)) {
        let mut entries = HashMap::from([(TRACEPARENT.to_owned(), traceparent.clone())]);
        if let Some(tracestate) = &carrier.tracestate {
            entries.insert(TRACESTATE.to_owned(), tracestate.clone());
        }
        let parent = TraceContextPropagator::new().extract(&entries);
        if parent.span().span_context().is_valid() {
            // Refused only for a span that is already closed or not recorded: nothing to adopt.
            let _ = span.set_parent(parent);
        }
    }
    if let Some(baggage) = &carrier.baggage {
        record_baggage(span, baggage);
    }
}

/// Whether `traceparent` has W3C's form: `<version>-<trace id>-<parent id>-<flags>`, 2, 32, 16
/// and 2 lowercase hex digits, the version not `ff`; a version after `00` may carry more, after a
/// `-`. The propagator's own parser takes short ids (padded with zeros: every client sending
/// `00-1-2-01` would share one trace), signs and uppercase versions.
fn well_formed(traceparent: &str) -> bool {
    let lower_hex = |part: &[u8]| {
        part.iter()
            .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
    };
    let bytes = traceparent.as_bytes();
    if bytes.len() < 55 {
        return false;
    }
    let (fields, rest) = bytes.split_at(55);
    let version = &fields[..2];
    let shaped = lower_hex(version)
        && version != b"ff"
        && fields[2] == b'-'
        && lower_hex(&fields[3..35])
        && fields[35] == b'-'
        && lower_hex(&fields[36..52])
        && fields[52] == b'-'
        && lower_hex(&fields[53..]);
    let ends_right = if version == b"00" {
        rest.is_empty()
    } else {
        rest.first().is_none_or(|byte| *byte == b'-')
    };
    shaped && ends_right
}

/// Records the W3C `baggage` entries on `span` as `baggage.<key>` attributes.
pub(crate) fn record_baggage(span: &tracing::Span, baggage: &str) {
    // Only for a span that is exported: attributes are for the exporter alone.
    if !span.context().span().span_context().is_valid() {
        return;
    }
    let entries = HashMap::from([(BAGGAGE.to_owned(), baggage.to_owned())]);
    // The propagator keeps to W3C's limits (entries, bytes) and drops malformed members.
    let context = BaggagePropagator::new().extract_with_context(&Context::new(), &entries);
    for (key, (value, _)) in context.baggage() {
        span.set_attribute(format!("baggage.{key}"), value.to_string());
    }
}

/// The trace context of `span` and the conversation's `baggage`, to pass on to the next round;
/// empty unless the span is exported (an OpenTelemetry layer records it). The baggage passed on
/// is what the propagator read of it: within W3C's limits, malformed members dropped.
pub(crate) fn carrier_of(span: &tracing::Span, baggage: Option<&str>) -> TraceCarrier {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return TraceCarrier::default();
    }
    let mut entries = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut entries);
    let baggage = baggage.and_then(|baggage| {
        let read = HashMap::from([(BAGGAGE.to_owned(), baggage.to_owned())]);
        let mut written = HashMap::new();
        let propagator = BaggagePropagator::new();
        propagator.inject_context(&propagator.extract(&read), &mut written);
        written
            .remove(BAGGAGE)
            .filter(|baggage| !baggage.is_empty())
    });
    TraceCarrier {
        traceparent: entries.remove(TRACEPARENT),
        tracestate: entries.remove(TRACESTATE),
        baggage,
    }
}

#[cfg(test)]
mod tests {
    use super::well_formed;

    #[test]
    fn only_traceparents_of_the_w3c_form_are_taken() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(well_formed(good));
        // A later version may carry more after a dash.
        assert!(well_formed(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more"
        ));
        assert!(well_formed(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        ));
        for bad in [
            "00-1-2-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "AB-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "",
        ] {
            assert!(!well_formed(bad), "{bad:?} is refused");
        }
    }
}
