//! One JSON line per developer request on stderr. Ids only: never a key, a body or a header.

use crate::proxy::RequestCtx;

pub fn developer_request(ctx: &RequestCtx) {
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
    log::info!(target: "access", "{line}");
}
