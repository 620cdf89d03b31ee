//! OpenTelemetry traces for both services: the tracer, built once at start from `[telemetry]`,
//! and the W3C trace context read from and written into HTTP headers.
//!
//! Off (no `otlp_endpoint`), nothing is built: [`get`] is `None` and callers skip every span,
//! so the request path pays one branch. On, spans are handed to the SDK's batch processor,
//! which exports them from its own thread over OTLP (HTTP or gRPC); the request path never
//! waits for the collector. The queue in front of it is bounded ([`export`]): a span that finds it full, or
//! whose export fails, is dropped and counted in `gateway_telemetry_spans_dropped_total`.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod export;
pub mod protobuf;
pub mod sampler;
mod wire;

use std::sync::OnceLock;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, TraceContextExt, TraceState, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use gateway_core::state::SharedState;

pub use opentelemetry::trace::{Span, SpanKind, Status, Tracer};
pub use opentelemetry::KeyValue;
pub use opentelemetry_sdk::trace::Span as SdkSpan;

/// The running tracer, once telemetry is on.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    /// `[telemetry] capture_sizes`: spans carry prompt and answer sizes.
    pub capture_sizes: bool,
}

static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();

/// The tracer when telemetry is on: the one check the request path makes.
#[inline]
pub fn get() -> Option<&'static Telemetry> {
    TELEMETRY.get()
}

/// Builds the tracer from the config's `[telemetry]` when it names a collector. Exports run
/// their HTTP requests on `rt`. An exporter that cannot be built (bad headers variable) is an
/// error: the operator asked for traces and would otherwise get none without knowing.
pub fn start(state: &SharedState, rt: tokio::runtime::Handle) -> Result<(), String> {
    let cfg = state.config();
    let t = &cfg.telemetry;
    let Some(endpoint) = t.endpoint.as_deref() else {
        return Ok(());
    };
    let exporter = export::exporter(t, endpoint, rt)?;
    let provider = SdkTracerProvider::builder()
        .with_span_processor(export::bounded(exporter))
        .with_sampler(sampler::LiveRatio::parent_based(state.clone()))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(t.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("gateway");
    let telemetry = Telemetry {
        provider,
        tracer,
        propagator: TraceContextPropagator::new(),
        capture_sizes: t.capture_sizes,
    };
    if TELEMETRY.set(telemetry).is_err() {
        return Err("telemetry started twice".into());
    }
    log::info!(
        "telemetry: exporting spans to {endpoint} (sample ratio {})",
        t.sample_ratio
    );
    Ok(())
}

/// Exports what is queued and stops the exporter, once (later calls do nothing); called at a
/// clean stop. Blocks for at most about two seconds: an unreachable collector is not waited for.
pub fn shutdown() {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if DONE.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    if let Some(t) = get() {
        if let Err(e) = t
            .provider
            .shutdown_with_timeout(std::time::Duration::from_secs(2))
        {
            log::warn!("telemetry: spans not exported at shutdown: {e}");
        }
    }
}

impl Telemetry {
    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// The trace context a request carries in `traceparent` / `tracestate`, as the parent of
    /// the span the gateway starts for it (an empty context when it carries none, or an
    /// invalid one).
    pub fn parent_from(&self, headers: &http::HeaderMap) -> Context {
        self.propagator
            .extract(&opentelemetry_http::HeaderExtractor(headers))
    }

    /// The `traceparent` (and `tracestate`, when there is one) that make `span` the parent of
    /// the request a provider receives (W3C Trace Context, version 00).
    pub fn headers_for(&self, span: &SpanContext) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(2);
        if !span.is_valid() {
            return out;
        }
        let mut tp = String::with_capacity(55);
        tp.push_str("00-");
        push_hex(&mut tp, &span.trace_id().to_bytes());
        tp.push('-');
        push_hex(&mut tp, &span.span_id().to_bytes());
        tp.push('-');
        push_hex(&mut tp, &[span.trace_flags().to_u8() & 1]);
        out.push(("traceparent", tp));
        if let Some(state) = tracestate(span.trace_state()) {
            out.push(("tracestate", state));
        }
        out
    }
}

/// A trace id as the 32 lowercase hex digits of `traceparent` and the access line.
pub fn trace_id_hex(span: &SpanContext) -> String {
    let mut s = String::with_capacity(32);
    push_hex(&mut s, &span.trace_id().to_bytes());
    s
}

/// The `tracestate` header of `state`; `None` when it has no entries (most spans: the state is
/// only looked at, not formatted, then).
pub(crate) fn tracestate(state: &TraceState) -> Option<String> {
    if *state == TraceState::NONE {
        return None;
    }
    Some(state.header()).filter(|h| !h.is_empty())
}

/// `bytes` (at most 16: an id or the flags) as lowercase hex, written in one piece.
fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut digits = [0u8; 32];
    let n = 2 * bytes.len().min(16);
    if hex::encode_to_slice(&bytes[..n / 2], &mut digits[..n]).is_ok() {
        out.push_str(std::str::from_utf8(&digits[..n]).unwrap_or_default());
    }
}

/// The context whose parent is `span`, for starting its children.
pub fn child_context(span: &SpanContext) -> Context {
    Context::new().with_remote_span_context(span.clone())
}
