//! One JSON line per developer request on stderr (ids only: never a key, a body or a header),
//! and the request's metrics.
//!
//! Lines are appended to an in-memory buffer and written by one background thread every
//! [`FLUSH_EVERY`] (or sooner when the buffer passes [`FLUSH_BYTES`]): a `write(2)` per request
//! under the stderr lock is a system call and a contended lock on every request.
//! [`flush`] writes what is buffered; the graceful stop calls it, so no line is lost there.

use std::cell::RefCell;
use std::io::Write;
use std::sync::{Mutex, Once};
use std::time::Duration;

use prometheus::{Histogram, IntCounter};
use serde::Serialize;

use crate::ctx::RequestCtx;
use gateway_core::metrics;

/// How long a line may wait in the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// A buffer this large is written at once by the request that filled it.
const FLUSH_BYTES: usize = 256 * 1024;

static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static WRITER: Once = Once::new();

/// One access line. Written by [`AccessLine::write_to`]; the derived `Serialize` is the
/// reference its output is tested against.
#[derive(Serialize)]
struct AccessLine<'a> {
    /// When the request finished (RFC 3339, UTC, milliseconds).
    time: Timestamp,
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
    /// Milliseconds, rounded to the microsecond (`0.309`, not `0.30880799999999997`).
    latency_ms: f64,
    deployment: Option<&'a str>,
    /// The W3C trace id when telemetry is on.
    trace_id: Option<&'a str>,
}

/// RFC 3339 with exactly three fractional digits, so lines sort as text and read alike.
const TIME_FORMAT: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
);

/// A UTC instant that serializes as an RFC 3339 string, formatted on the stack (no allocation
/// per access line).
#[derive(Clone, Copy)]
struct Timestamp(time::OffsetDateTime);

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = [0u8; 40];
        let mut cursor = &mut buf[..];
        let written = self
            .0
            .format_into(&mut cursor, TIME_FORMAT)
            .map_err(serde::ser::Error::custom)?;
        let text = std::str::from_utf8(&buf[..written]).map_err(serde::ser::Error::custom)?;
        s.serialize_str(text)
    }
}

/// `d` in milliseconds, rounded to the nearest microsecond. An integer count of microseconds
/// divided by 1000 is the double nearest to the decimal, which serde_json prints in full
/// (`0.309`), where `as_secs_f64() * 1000.0` printed every binary digit of the product.
fn millis_rounded(d: Duration) -> f64 {
    let micros = (d.as_nanos() + 500) / 1000;
    micros as f64 / 1000.0
}

impl gateway_core::json_line::WriteJson for Timestamp {
    /// The whole-second part (`2026-11-28T20:06:46.`) is formatted once per second and thread
    /// and reused by every line of that second; the milliseconds are appended.
    fn write_json(&self, out: &mut Vec<u8>) {
        thread_local! {
            static SECOND: RefCell<(i64, Vec<u8>)> = const { RefCell::new((i64::MIN, Vec::new())) };
        }
        let unix = self.0.unix_timestamp();
        let millis = self.0.millisecond();
        let written = SECOND.with(|cell| {
            let mut cell = cell.borrow_mut();
            let (second, prefix) = &mut *cell;
            if *second != unix {
                let mut buf = [0u8; 40];
                let mut cursor = &mut buf[..];
                // The format has only numeric components: it always fits.
                let Ok(n) = self.0.format_into(&mut cursor, TIME_FORMAT) else {
                    return false;
                };
                // Everything but the milliseconds and the `Z`.
                prefix.clear();
                prefix.extend_from_slice(&buf[..n.saturating_sub(4)]);
                *second = unix;
            }
            out.push(b'"');
            out.extend_from_slice(prefix);
            out.extend_from_slice(&[
                b'0' + (millis / 100) as u8,
                b'0' + (millis / 10 % 10) as u8,
                b'0' + (millis % 10) as u8,
                b'Z',
                b'"',
            ]);
            true
        });
        if !written {
            out.extend_from_slice(b"null");
        }
    }
}

impl AccessLine<'_> {
    /// Appends the line as `serde_json::to_writer(out, self)` would, byte for byte, with the
    /// keys written as fixed text (`gateway_core::json_line`).
    fn write_to(&self, out: &mut Vec<u8>) {
        gateway_core::json_object!(out, {
            "time": self.time,
            "kind": self.kind,
            "request_id": self.request_id,
            "route": self.route,
            "model": self.model,
            "key_id": self.key_id,
            "user_id": self.user_id,
            "status": self.status,
            "error_code": self.error_code,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "latency_ms": self.latency_ms,
            "deployment": self.deployment,
            "trace_id": self.trace_id,
        });
    }
}

/// Called once per request from the proxy's `logging` phase. The access line does not go
/// through `log`, so it does not depend on `RUST_LOG`.
pub fn developer_request(ctx: &RequestCtx, enabled: bool) {
    let elapsed = ctx.started.elapsed();
    record_metrics(ctx, elapsed);
    if !enabled {
        return;
    }
    let line = AccessLine {
        time: Timestamp(time::OffsetDateTime::now_utc()),
        kind: "access",
        request_id: &ctx.request_id,
        route: ctx.endpoint.map(|e| e.name()),
        model: ctx.model.as_deref(),
        key_id: ctx.identity.as_ref().map(|i| i.key.id.as_str()),
        user_id: ctx.identity.as_ref().map(|i| i.user.id.as_str()),
        status: ctx.status,
        error_code: ctx.error_code,
        input_tokens: ctx.input_tokens,
        output_tokens: ctx.output_tokens,
        latency_ms: millis_rounded(elapsed),
        deployment: ctx.deployment.as_deref(),
        trace_id: ctx.trace.as_ref().map(|t| t.trace_id.as_str()),
    };
    append(&line);
}

fn append(line: &AccessLine<'_>) {
    WRITER.call_once(start_writer);
    let full = {
        let mut buf = BUFFER.lock().unwrap_or_else(|p| p.into_inner());
        line.write_to(&mut buf);
        buf.push(b'\n');
        (buf.len() >= FLUSH_BYTES).then(|| taken(&mut buf))
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
        taken(&mut buf)
    };
    write_stderr(&bytes);
}

/// The buffered lines, leaving an empty buffer of the same capacity: the next lines are
/// written into room allocated once, not grown by doubling from nothing after every flush.
fn taken(buf: &mut Vec<u8>) -> Vec<u8> {
    let room = Vec::with_capacity(buf.capacity());
    std::mem::replace(buf, room)
}

fn write_stderr(bytes: &[u8]) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(bytes);
}

/// The metric series one kind of request counts into, resolved once per worker thread.
/// `with_label_values` hashes every label and takes the vector's lock on each call (five calls a
/// request); a worker sees few kinds of request, so it keeps the handles it resolved.
struct Series {
    route: &'static str,
    model: Box<str>,
    status: u16,
    code: Option<&'static str>,
    requests: IntCounter,
    latency: Histogram,
    /// Resolved on first use: a kind that never settles tokens exports no token series.
    input: Option<IntCounter>,
    output: Option<IntCounter>,
}

/// Most kinds of request a worker keeps handles for; past it, the oldest is dropped (its
/// series stay registered, only the shortcut goes).
const SERIES_PER_THREAD: usize = 64;

thread_local! {
    static SERIES: RefCell<Vec<Series>> = const { RefCell::new(Vec::new()) };
    static FIRST_BYTE: RefCell<Vec<(Box<str>, Histogram)>> = const { RefCell::new(Vec::new()) };
}

/// The kept entry `matches` picks, or one `make` resolves, kept in its place (the oldest goes
/// once [`SERIES_PER_THREAD`] are kept).
fn kept<T>(list: &mut Vec<T>, matches: impl Fn(&T) -> bool, make: impl FnOnce() -> T) -> &mut T {
    let i = match list.iter().position(matches) {
        Some(i) => i,
        None => {
            if list.len() >= SERIES_PER_THREAD {
                list.remove(0);
            }
            list.push(make());
            list.len() - 1
        }
    };
    &mut list[i]
}

fn record_metrics(ctx: &RequestCtx, elapsed: Duration) {
    let route = ctx.endpoint.map(|e| e.name()).unwrap_or("other");
    // Only configured model names become labels (unknown names would grow the series).
    let model = if ctx.deployment.is_some() || ctx.status == 200 {
        ctx.model.as_deref().unwrap_or("")
    } else {
        ""
    };
    SERIES.with_borrow_mut(|series| {
        let (status, code) = (ctx.status, ctx.error_code);
        let s = kept(
            series,
            |s| s.status == status && s.code == code && s.route == route && &*s.model == model,
            || Series {
                route,
                model: model.into(),
                status,
                code,
                requests: metrics::REQUESTS.with_label_values(&[
                    route,
                    model,
                    itoa::Buffer::new().format(status),
                    code.unwrap_or(""),
                ]),
                latency: metrics::LATENCY.with_label_values(&[route]),
                input: None,
                output: None,
            },
        );
        s.requests.inc();
        s.latency.observe(elapsed.as_secs_f64());
        if ctx.input_tokens > 0 {
            s.input
                .get_or_insert_with(|| metrics::TOKENS.with_label_values(&["input", model]))
                .inc_by(ctx.input_tokens);
        }
        if ctx.output_tokens > 0 {
            s.output
                .get_or_insert_with(|| metrics::TOKENS.with_label_values(&["output", model]))
                .inc_by(ctx.output_tokens);
        }
    });
    if let (Some(d), Some(ms)) = (&ctx.deployment, ctx.ttfb_ms) {
        FIRST_BYTE.with_borrow_mut(|known| {
            let (_, first_byte) = kept(
                known,
                |(name, _)| **name == **d,
                || (d.as_str().into(), metrics::TTFB.with_label_values(&[d])),
            );
            first_byte.observe(ms as f64 / 1000.0);
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::route::Endpoint;
    use gateway_core::quota::RateView;

    fn ctx(model: &str, status: u16, code: Option<&'static str>, tokens: u64) -> RequestCtx {
        RequestCtx {
            key_memo: Box::default(),
            request_id: "req_test".into(),
            started: Instant::now(),
            endpoint: Some(Endpoint::Embeddings),
            model: Some(model.into()),
            identity: None,
            status,
            error_code: code,
            input_tokens: tokens,
            output_tokens: tokens * 2,
            deployment: Some("metrics-test-deployment".into()),
            rate: RateView::default(),
            ttfb_ms: Some(3),
            trace: None,
        }
    }

    /// The hand-assembled line is what the derived serializer writes, escapes, `null`s and
    /// odd floats included.
    #[test]
    fn access_line_is_the_serialized_struct() {
        let lines = [
            AccessLine {
                time: Timestamp(time::OffsetDateTime::UNIX_EPOCH),
                kind: "access",
                request_id: "req_abc",
                route: Some("chat_completions"),
                model: Some("gpt-4o"),
                key_id: Some("key_1"),
                user_id: Some("usr_1"),
                status: 200,
                error_code: None,
                input_tokens: 25,
                output_tokens: u64::MAX,
                latency_ms: 0.523_456_7,
                deployment: Some("openai-east"),
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            },
            AccessLine {
                time: Timestamp(time::OffsetDateTime::UNIX_EPOCH),
                kind: "access",
                request_id: "req_\"quoted\"\n",
                route: None,
                model: Some("m\u{1}\\ü😀"),
                key_id: None,
                user_id: None,
                status: 0,
                error_code: Some("rate_limit_exceeded"),
                input_tokens: 0,
                output_tokens: 0,
                latency_ms: 1e-9,
                deployment: None,
                trace_id: None,
            },
            AccessLine {
                time: Timestamp(time::OffsetDateTime::UNIX_EPOCH),
                kind: "access",
                request_id: "",
                route: Some("messages"),
                model: None,
                key_id: Some(""),
                user_id: Some("u"),
                status: 599,
                error_code: None,
                input_tokens: 1,
                output_tokens: 2,
                latency_ms: 123_456.0,
                deployment: Some("</script>"),
                trace_id: None,
            },
        ];
        for line in &lines {
            let mut written = Vec::new();
            line.write_to(&mut written);
            let reference = serde_json::to_vec(line).expect("serializes");
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&reference)
            );
        }
    }

    /// The time field is RFC 3339 with milliseconds; latencies print as short decimals.
    /// The cached whole second and the appended milliseconds are the full format's text, also
    /// for several instants of one second and across seconds.
    #[test]
    fn timestamps_written_in_parts_are_the_formatted_ones() {
        use gateway_core::json_line::WriteJson;
        let base = time::OffsetDateTime::from_unix_timestamp(1_764_360_406).expect("instant");
        for ms in [0i64, 7, 45, 999, 1_000, 1_001, 61_234, 86_400_999] {
            let at = base + time::Duration::milliseconds(ms);
            let mut ours = Vec::new();
            Timestamp(at).write_json(&mut ours);
            let theirs = serde_json::to_string(&Timestamp(at)).expect("serializes");
            assert_eq!(String::from_utf8(ours).expect("utf-8"), theirs, "{ms}");
        }
    }

    #[test]
    fn time_and_latency_render_for_people() {
        let at = time::macros::datetime!(2026-11-25 18:17:06.123_456_789 UTC);
        let text = serde_json::to_string(&Timestamp(at)).expect("serializes");
        assert_eq!(text, "\"2026-11-25T18:17:06.123Z\"");
        let parsed = time::OffsetDateTime::parse(
            text.trim_matches('"'),
            &time::format_description::well_known::Rfc3339,
        )
        .expect("RFC 3339");
        assert_eq!(parsed.unix_timestamp(), at.unix_timestamp());
        let ms = |nanos: u64| serde_json::to_string(&millis_rounded(Duration::from_nanos(nanos)));
        assert_eq!(ms(308_808).expect("ms"), "0.309");
        assert_eq!(ms(1_234_567_890).expect("ms"), "1234.568");
        assert_eq!(ms(0).expect("ms"), "0.0");
    }

    fn requests(model: &str, status: &str, code: &str) -> u64 {
        metrics::REQUESTS
            .with_label_values(&["embeddings", model, status, code])
            .get()
    }

    fn tokens(direction: &str, model: &str) -> u64 {
        metrics::TOKENS.with_label_values(&[direction, model]).get()
    }

    /// The handles a worker keeps count into the same series `with_label_values` names, one
    /// per kind of request, and token series only once tokens are settled.
    #[test]
    fn kept_handles_count_into_the_named_series() {
        let model = "metrics-test-model";
        for _ in 0..3 {
            record_metrics(&ctx(model, 200, None, 5), Duration::from_millis(2));
        }
        record_metrics(
            &ctx(model, 502, Some("routing_unavailable"), 0),
            Duration::from_millis(2),
        );
        assert_eq!(requests(model, "200", ""), 3);
        assert_eq!(requests(model, "502", "routing_unavailable"), 1);
        assert_eq!(tokens("input", model), 15);
        assert_eq!(tokens("output", model), 30);
        // A model whose requests never settled tokens exports no token series.
        let quiet = "metrics-test-quiet-model";
        record_metrics(&ctx(quiet, 200, None, 0), Duration::from_millis(1));
        assert_eq!(requests(quiet, "200", ""), 1);
        let exported = metrics::REGISTRY.gather();
        let token_series = exported
            .iter()
            .filter(|f| f.name() == "gateway_tokens_total")
            .flat_map(|f| f.get_metric())
            .filter(|m| m.get_label().iter().any(|l| l.value() == quiet))
            .count();
        assert_eq!(token_series, 0);
        let first_byte = metrics::TTFB
            .with_label_values(&["metrics-test-deployment"])
            .get_sample_count();
        assert_eq!(first_byte, 5);
        // Past the per-thread bound the oldest handles go; counting goes on.
        for n in 0..(SERIES_PER_THREAD + 5) {
            let m = format!("metrics-test-many-{n}");
            record_metrics(&ctx(&m, 200, None, 0), Duration::from_millis(1));
        }
        record_metrics(&ctx(model, 200, None, 5), Duration::from_millis(2));
        assert_eq!(requests(model, "200", ""), 4);
        assert_eq!(requests("metrics-test-many-0", "200", ""), 1);
    }
}
