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
    if let Some(traceparent) = &carrier.traceparent {
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
