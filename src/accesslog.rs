//! One JSON line per developer request on stderr (ids only: never a key, a body or a header),
//! and the request's metrics.
//!
//! Lines are appended to an in-memory buffer and written by one background thread every
//! [`FLUSH_EVERY`] (or sooner when the buffer passes [`FLUSH_BYTES`]): a `write(2)` per request
//! under the stderr lock cost ~13% of the gateway's CPU at a few thousand requests a second.
//! [`flush`] writes what is buffered; the graceful stop calls it, so no line is lost there.

use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

use serde::Serialize;

use crate::metrics;
use crate::proxy::RequestCtx;

/// How long a line may wait in the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// A buffer this large is written at once by the request that filled it.
const FLUSH_BYTES: usize = 256 * 1024;

static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static WRITER: Once = Once::new();

#[derive(Serialize)]
struct AccessLine<'a> {
    kind: &'static str,
    request_id: &'a str,
    route: Option<&'static str>,
    model: Option<&'a str>,
    key_id: Option<&'a str>,
    user_id: Option<&'a str>,
    status: u16,
    error_code: Option<&'static str>,
    input_tokens: u64,
    output_tokens: u64,
    latency_ms: f64,
    deployment: Option<&'a str>,
}

/// Called once per request from the proxy's `logging` phase. The access line does not go
/// through `log`, so it does not depend on `RUST_LOG`.
pub fn developer_request(ctx: &RequestCtx, enabled: bool) {
    record_metrics(ctx);
    if !enabled {
        return;
    }
    let line = AccessLine {
        kind: "access",
        request_id: &ctx.request_id,
        route: ctx.endpoint.map(|e| e.name()),
        model: ctx.model.as_deref(),
        key_id: ctx.key_id.as_deref(),
        user_id: ctx.user_id.as_deref(),
        status: ctx.status,
        error_code: ctx.error_code,
        input_tokens: ctx.input_tokens,
        output_tokens: ctx.output_tokens,
        latency_ms: ctx.started.elapsed().as_secs_f64() * 1000.0,
        deployment: ctx.deployment.as_deref(),
    };
    append(&line);
}

fn append(line: &AccessLine<'_>) {
    WRITER.call_once(start_writer);
    let full = {
        let mut buf = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
        if serde_json::to_writer(&mut *buf, line).is_err() {
            return;
        }
        buf.push(b'\n');
        (buf.len() >= FLUSH_BYTES).then(|| std::mem::take(&mut *buf))
    };
    if let Some(bytes) = full {
        write_stderr(&bytes);
    }
}

fn start_writer() {
    let started = std::thread::Builder::new()
        .name("access-log".into())
        .spawn(|| loop {
            std::thread::sleep(FLUSH_EVERY);
            flush();
        });
    if let Err(e) = started {
        log::error!("cannot start the access-log writer: {e}; lines are written at shutdown");
    }
}

/// Writes every buffered line now.
pub fn flush() {
    let bytes = {
        let mut buf = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
        if buf.is_empty() {
            return;
        }
        std::mem::take(&mut *buf)
    };
    write_stderr(&bytes);
}

fn write_stderr(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes);
}

fn record_metrics(ctx: &RequestCtx) {
    let route = ctx.endpoint.map(|e| e.name()).unwrap_or("other");
    // Only configured model names become labels (unknown names would grow the series).
    let model = if ctx.deployment.is_some() || ctx.status == 200 {
        ctx.model.as_deref().unwrap_or("")
    } else {
        ""
    };
    let mut status_buf = itoa::Buffer::new();
    let status = status_buf.format(ctx.status);
    metrics::REQUESTS
        .with_label_values(&[route, model, status, ctx.error_code.unwrap_or("")])
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
