//! Prometheus metrics, served on `server.admin_listen` only (never on a public listener).

use std::sync::LazyLock;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub static REGISTRY: LazyLock<Registry> = LazyLock::new(Registry::new);

// Metric definitions are constants: a failure here is a programming error caught by the unit
// test below and at start (`init` runs before any listener opens), never on a request.
#[allow(clippy::expect_used)]
fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter definition");
    if let Err(e) = REGISTRY.register(Box::new(c.clone())) {
        log::error!("metric {name}: {e}");
    }
    c
}

#[allow(clippy::expect_used)]
fn histogram(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid histogram definition");
    let _ = REGISTRY.register(Box::new(h.clone()));
    h
}

const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

pub static REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_requests_total",
        "Developer API requests by route, model, status and error code.",
        &["route", "model", "status", "code"],
    )
});

pub static LATENCY: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram(
        "gateway_request_duration_seconds",
        "Developer API request duration, to the last byte.",
        &["route"],
        LATENCY_BUCKETS.to_vec(),
    )
});

pub static TTFB: LazyLock<HistogramVec> = LazyLock::new(|| {
    histogram(
        "gateway_upstream_first_byte_seconds",
        "Time to the provider's first response byte, per deployment.",
        &["deployment"],
        LATENCY_BUCKETS.to_vec(),
    )
});

pub static TOKENS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_tokens_total",
        "Tokens settled, by direction (input/output) and model.",
        &["direction", "model"],
    )
});

#[allow(clippy::expect_used)]
pub static RESERVATIONS: LazyLock<IntGauge> = LazyLock::new(|| {
    let g = IntGauge::new(
        "gateway_reservations_in_flight",
        "Quota reservations held by requests in flight on this instance, until their settlement is paid and recorded.",
    )
    .expect("valid gauge definition");
    let _ = REGISTRY.register(Box::new(g.clone()));
    g
});

pub static WEBHOOK_ITEMS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_webhook_items_total",
        "Payment webhook items by result status.",
        &["status"],
    )
});

pub static SIGNIN: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_signin_attempts_total",
        "Sign-in attempts by step and outcome.",
        &["step", "outcome"],
    )
});

pub static RELOADS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_config_reloads_total",
        "Config reloads by result.",
        &["result"],
    )
});

pub static DEPLOYMENT_EJECTIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_deployment_ejections_total",
        "Deployments taken out of the rotation, by the failure that did it (or retry_after).",
        &["deployment", "reason"],
    )
});

#[allow(clippy::expect_used)]
pub static DEPLOYMENT_HEALTHY: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    let g = IntGaugeVec::new(
        Opts::new(
            "gateway_deployment_healthy",
            "1 while a deployment is in good standing; 0 from its ejection to its next success.",
        ),
        &["deployment"],
    )
    .expect("valid gauge definition");
    let _ = REGISTRY.register(Box::new(g.clone()));
    g
});

pub static UPSTREAM_ATTEMPTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_upstream_attempts_total",
        "Requests sent to a deployment, by how the answer began (ok, request_error or the failure).",
        &["deployment", "outcome"],
    )
});

pub static SPANS_DROPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    counter(
        "gateway_telemetry_spans_dropped_total",
        "Spans not delivered to the OTLP collector, by reason (queue_full, export_failed).",
        &["reason"],
    )
});

pub fn config_reload(result: &str) {
    RELOADS.with_label_values(&[result]).inc();
}

pub fn signin(step: &str, outcome: &str) {
    SIGNIN.with_label_values(&[step, outcome]).inc();
}

pub fn webhook_item(status: &str) {
    WEBHOOK_ITEMS.with_label_values(&[status]).inc();
}

/// Makes sure every family exists (so a scrape shows zeros before traffic).
pub fn init() {
    LazyLock::force(&REQUESTS);
    LazyLock::force(&LATENCY);
    LazyLock::force(&TTFB);
    LazyLock::force(&TOKENS);
    LazyLock::force(&RESERVATIONS);
    LazyLock::force(&WEBHOOK_ITEMS);
    LazyLock::force(&SIGNIN);
    LazyLock::force(&RELOADS);
    LazyLock::force(&DEPLOYMENT_EJECTIONS);
    LazyLock::force(&DEPLOYMENT_HEALTHY);
    LazyLock::force(&UPSTREAM_ATTEMPTS);
    LazyLock::force(&SPANS_DROPPED);
}

/// The Prometheus text exposition of everything registered.
pub fn render() -> String {
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&REGISTRY.gather(), &mut buf) {
        log::error!("metrics encoding: {e}");
    }
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_family_renders() {
        super::init();
        super::config_reload("ok");
        // Families with labels appear once a series exists.
        super::REQUESTS
            .with_label_values(&["chat_completions", "m", "200", ""])
            .inc();
        super::LATENCY
            .with_label_values(&["chat_completions"])
            .observe(0.01);
        super::DEPLOYMENT_HEALTHY.with_label_values(&["p/m"]).set(1);
        super::DEPLOYMENT_EJECTIONS
            .with_label_values(&["p/m", "timeout"])
            .inc();
        super::UPSTREAM_ATTEMPTS
            .with_label_values(&["p/m", "ok"])
            .inc();
        let text = super::render();
        for name in [
            "gateway_requests_total",
            "gateway_request_duration_seconds",
            "gateway_reservations_in_flight",
            "gateway_config_reloads_total",
            "gateway_deployment_healthy",
            "gateway_deployment_ejections_total",
            "gateway_upstream_attempts_total",
        ] {
            assert!(text.contains(name), "{name} missing in {text}");
        }
    }
}
