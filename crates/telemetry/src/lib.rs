//! OpenTelemetry traces for both services: the export queue and thread, built once at start
//! from `[telemetry]`, the sampling decision, and the W3C trace context read from and written
//! into HTTP headers.
//!
//! Off (no `otlp_endpoint`), nothing is built: [`get`] is `None` and callers skip every span,
//! so the request path pays one branch. On, a span is a [`SpanRecord`] written into its
//! thread's batch when it ends ([`Telemetry::submit`]); one thread exports the batches over
//! OTLP (HTTP or gRPC), and the request path never waits for the collector. The
//! queue is bounded ([`export`]): spans that find it full, or whose export fails, are dropped
//! and counted in `gateway_telemetry_spans_dropped_total`.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod convert;
pub mod export;
pub mod protobuf;
pub mod record;
pub mod sampler;
mod wire;

use std::borrow::Cow;
use std::sync::OnceLock;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;

use gateway_core::state::SharedState;

pub use opentelemetry::trace::{SpanContext, SpanKind, TraceState};
pub use record::{child, Attr, Attributes, SpanRecord, Timestamp};

use record::new_trace_id;

/// The running export, once telemetry is on.
pub struct Telemetry {
    queue: export::Queue,
    propagator: TraceContextPropagator,
    /// The config in force: the sample ratio is read from it for each trace started here.
    state: SharedState,
    /// `[telemetry] capture_sizes`: spans carry prompt and answer sizes.
    pub capture_sizes: bool,
}

static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();

/// The telemetry when it is on: the one check the request path makes.
#[inline]
pub fn get() -> Option<&'static Telemetry> {
    TELEMETRY.get()
}

/// Starts the export from the config's `[telemetry]` when it names a collector. Exports run
/// their HTTP requests on `rt`. An exporter that cannot be built (bad headers variable) is an
/// error: the operator asked for traces and would otherwise get none without knowing.
pub fn start(state: &SharedState, rt: tokio::runtime::Handle) -> Result<(), String> {
    let cfg = state.config();
    let t = &cfg.telemetry;
    let Some(endpoint) = t.endpoint.as_deref() else {
        return Ok(());
    };
    let mut exporter = export::exporter(t, endpoint, rt)?;
    exporter.set_resource(
        &opentelemetry_sdk::Resource::builder()
            .with_service_name(t.service_name.clone())
            .build(),
    );
    let telemetry = Telemetry {
        queue: export::Queue::start(exporter)?,
        propagator: TraceContextPropagator::new(),
        state: state.clone(),
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
        if !t.queue.stop(std::time::Duration::from_secs(2)) {
            log::warn!(
                "telemetry: spans not exported at shutdown: the collector did not answer in time"
            );
        }
    }
}

impl Telemetry {
    /// The trace context a request carries in `traceparent` / `tracestate`, as the parent of
    /// the span the gateway starts for it; `None` when it carries none, or an invalid one.
    pub fn parent_from(&self, headers: &http::HeaderMap) -> Option<SpanContext> {
        let cx = self
            .propagator
            .extract(&opentelemetry_http::HeaderExtractor(headers));
        let parent = cx.span().span_context().clone();
        parent.is_valid().then_some(parent)
    }

    /// The context of the server span the gateway starts for a request: a child of `parent`
    /// (the caller's span, from [`Telemetry::parent_from`]) in its trace, with its decision
    /// and `tracestate`; without one, the root of a new trace sampled at the live ratio. Its
    /// sampled flag says whether the request's spans are recorded.
    pub fn server_context(&self, parent: Option<&SpanContext>) -> SpanContext {
        let trace_id = parent.map_or_else(new_trace_id, SpanContext::trace_id);
        let ratio = self.state.config.load().telemetry.sample_ratio;
        let sampled = sampler::sampled(ratio, parent, trace_id);
        match parent {
            Some(p) => child(trace_id, sampled, p.trace_state()),
            None => child(trace_id, sampled, &TraceState::NONE),
        }
    }

    /// Writes a finished span into this thread's batch for the export thread; never blocks:
    /// it is dropped and counted when the queue is full.
    pub fn submit(&self, span: &SpanRecord) {
        self.queue.submit(span);
    }

    /// The `traceparent` (and `tracestate`, when there is one) that make `span`, in the trace
    /// whose id is `trace_id`, the parent of the request a provider receives (W3C Trace
    /// Context, version 00).
    pub fn headers_for(&self, trace_id: &TraceIdHex, span: &SpanContext) -> TraceHeaders {
        if !span.is_valid() {
            return TraceHeaders::default();
        }
        // `00-<trace id>-<span id>-<flags>`, written in one piece.
        let mut tp = *b"00-00000000000000000000000000000000-0000000000000000-00";
        tp[3..35].copy_from_slice(&trace_id.0);
        let _ = hex::encode_to_slice(span.span_id().to_bytes(), &mut tp[36..52]);
        if span.is_sampled() {
            tp[54] = b'1';
        }
        TraceHeaders {
            traceparent: Some(tp),
            tracestate: tracestate(span.trace_state()),
        }
    }
}

/// The trace context headers of one request to a provider.
#[derive(Debug, Default)]
pub struct TraceHeaders {
    /// `traceparent`'s value: ASCII only.
    traceparent: Option<[u8; 55]>,
    tracestate: Option<String>,
}

impl TraceHeaders {
    /// The headers, as names and values.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Cow<'_, str>)> {
        let parent = self
            .traceparent
            .as_ref()
            .map(|tp| ("traceparent", Cow::Borrowed(ascii(tp))));
        let state = self
            .tracestate
            .as_deref()
            .map(|s| ("tracestate", Cow::Borrowed(s)));
        parent.into_iter().chain(state)
    }
}

/// `bytes` as text; they are hex digits and dashes that this crate wrote.
fn ascii(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: every caller passes bytes written here from ASCII digits and dashes, which are
    // valid UTF-8; checking them again would cost a pass over each on every request.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

/// A trace id as the 32 lowercase hex digits of `traceparent` and the access line.
#[derive(Debug, Clone, Copy)]
pub struct TraceIdHex([u8; 32]);

impl TraceIdHex {
    pub fn of(span: &SpanContext) -> Self {
        let mut digits = [b'0'; 32];
        let _ = hex::encode_to_slice(span.trace_id().to_bytes(), &mut digits);
        TraceIdHex(digits)
    }

    pub fn as_str(&self) -> &str {
        ascii(&self.0)
    }
}

/// The `tracestate` header of `state`; `None` when it has no entries (most spans: the state is
/// only looked at, not formatted, then).
pub(crate) fn tracestate(state: &TraceState) -> Option<String> {
    if *state == TraceState::NONE {
        return None;
    }
    Some(state.header()).filter(|h| !h.is_empty())
}
