//! Parent-based sampling at the configured ratio, read live: a reload that changes
//! `[telemetry] sample_ratio` applies to the next trace started here. A request whose client
//! sent a sampled (or unsampled) `traceparent` follows it, as the SDK's `ParentBased` sampler
//! does; a trace started here is kept by the SDK's own trace-id ratio rule, so a collector's
//! tail sampling that assumes it sees the same decision.

use opentelemetry::trace::{SpanContext, SpanKind, TraceId};
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, ShouldSample};

/// Whether the trace of a request is recorded: `parent`'s decision when the request carries
/// a valid parent, else `ratio` applied to `trace_id`.
pub fn sampled(ratio: f64, parent: Option<&SpanContext>, trace_id: TraceId) -> bool {
    if let Some(parent) = parent.filter(|p| p.is_valid()) {
        return parent.is_sampled();
    }
    // The ratio rule's own ends, without building its answer.
    if ratio >= 1.0 {
        return true;
    }
    let result = Sampler::TraceIdRatioBased(ratio).should_sample(
        None,
        trace_id,
        "",
        &SpanKind::Server,
        &[],
        &[],
    );
    result.decision == SamplingDecision::RecordAndSample
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceState};

    fn parent(flags: TraceFlags) -> SpanContext {
        SpanContext::new(
            TraceId::from(7),
            SpanId::from(9),
            flags,
            true,
            TraceState::NONE,
        )
    }

    #[test]
    fn a_parent_decides_and_the_ratio_decides_a_root() {
        let id = TraceId::from(u128::MAX / 3);
        assert!(sampled(0.0, Some(&parent(TraceFlags::SAMPLED)), id));
        assert!(!sampled(1.0, Some(&parent(TraceFlags::default())), id));
        assert!(sampled(1.0, None, id));
        assert!(!sampled(0.0, None, id));
        // An invalid parent is no parent.
        assert!(sampled(1.0, Some(&SpanContext::empty_context()), id));
        // About half of random ids at 0.5.
        let kept = (0..2000u128)
            .filter(|i| {
                sampled(
                    0.5,
                    None,
                    TraceId::from(i.wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)),
                )
            })
            .count();
        assert!((800..1200).contains(&kept), "{kept}");
    }
}
