//! W3C trace context across requests and rounds. A request's `_meta.traceparent` (or, failing
//! that, its `traceparent` header) becomes the parent of its span, so a client's trace continues
//! into the server; and each MRTR round leaves its trace context with the continuation it parks,
//! so the next round, on whichever replica, continues the same trace.
//!
//! The spans are plain `tracing` spans; they reach an OpenTelemetry exporter only when the
//! application installs a `tracing-opentelemetry` layer. Without one, nothing here costs more
//! than parsing the header.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// Makes `span` a child of the trace context `traceparent` names, if it is a valid one. Call it
/// before the span is first entered.
pub(crate) fn adopt(span: &tracing::Span, traceparent: &str) {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let parent = TraceContextPropagator::new().extract(&carrier);
    if parent.span().span_context().is_valid() {
        // Refused only for a span that is already closed or not recorded: nothing to adopt then.
        let _ = span.set_parent(parent);
    }
}

/// The `traceparent` of `span`, when it is exported (an OpenTelemetry layer records it).
pub(crate) fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}
