//! Parent-based sampling at the configured ratio, read live: a reload that changes
//! `[telemetry] sample_ratio` applies to the next trace started here, without rebuilding the
//! tracer. A request whose client sent a sampled (or unsampled) `traceparent` follows it.

use opentelemetry::trace::{Link, SpanKind, TraceId};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingResult, ShouldSample};

use gateway_core::state::SharedState;

/// The root sampler: the trace-id ratio of the config in force.
#[derive(Clone)]
pub struct LiveRatio {
    state: SharedState,
}

impl std::fmt::Debug for LiveRatio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveRatio").finish_non_exhaustive()
    }
}

impl LiveRatio {
    /// Follows a parent's decision; for a trace started here, samples at the live ratio.
    pub fn parent_based(state: SharedState) -> Sampler {
        Sampler::ParentBased(Box::new(LiveRatio { state }))
    }
}

impl ShouldSample for LiveRatio {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let ratio = self.state.config.load().telemetry.sample_ratio;
        Sampler::TraceIdRatioBased(ratio).should_sample(
            parent_context,
            trace_id,
            name,
            span_kind,
            attributes,
            links,
        )
    }
}
