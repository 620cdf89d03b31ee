//! One JSON line per developer request on stderr (ids only: never a key, a body or a header),
//! and the request's metrics.

use std::io::Write;

use crate::metrics;
use crate::proxy::RequestCtx;

/// Called once per request from the proxy's `logging` phase. The access line is written
/// straight to stderr (not through `log`), so it does not depend on `RUST_LOG`.
pub fn developer_request(ctx: &RequestCtx, enabled: bool) {
    record_metrics(ctx);
    if !enabled {
        return;
    }
    let line = serde_json::json!({
        "kind": "access",
        "request_id": ctx.request_id,
        "route": ctx.endpoint.map(|e| e.name()),
        "model": ctx.model,
        "key_id": ctx.key_id,
        "user_id": ctx.user_id,
        "status": ctx.status,
        "error_code": ctx.error_code,
        "input_tokens": ctx.input_tokens,
        "output_tokens": ctx.output_tokens,
        "latency_ms": ctx.started.elapsed().as_secs_f64() * 1000.0,
        "deployment": ctx.deployment,
    });
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

fn record_metrics(ctx: &RequestCtx) {
    let route = ctx.endpoint.map(|e| e.name()).unwrap_or("other");
    // Only configured model names become labels (unknown names would grow the series).
    let model = if ctx.deployment.is_some() || ctx.status == 200 {
        ctx.model.as_deref().unwrap_or("")
    } else {
        ""
    };
    let status = ctx.status.to_string();
    metrics::REQUESTS
        .with_label_values(&[route, model, &status, ctx.error_code.unwrap_or("")])
        .inc();
    metrics::LATENCY
        .with_label_values(&[route])
        .observe(ctx.started.elapsed().as_secs_f64());
    if let (Some(d), Some(ms)) = (&ctx.deployment, ctx.ttfb_ms) {
        metrics::TTFB
            .with_label_values(&[d.as_str()])
            .observe(ms as f64 / 1000.0);
    }
    if ctx.input_tokens > 0 {
        metrics::TOKENS
            .with_label_values(&["input", model])
            .inc_by(ctx.input_tokens);
    }
    if ctx.output_tokens > 0 {
        metrics::TOKENS
            .with_label_values(&["output", model])
            .inc_by(ctx.output_tokens);
    }
}
