//! The way out: a queue the request threads hand finished spans to, and one export thread that
//! takes them off in batches and sends them over OTLP: HTTP through the workspace's reqwest, or
//! gRPC through tonic.
//!
//! OTLP/HTTP with protobuf, the default, is sent by [`Protobuf`], which writes each batch with
//! [`crate::wire`]; JSON and gRPC go through `opentelemetry-otlp`'s own exporters, given the
//! SDK's form of each span.
//!
//! A span that ends is written into its thread's shard of the queue (an uncontended lock and
//! its bytes): nothing is handed from thread to thread per span, and the export thread, which
//! takes each shard's bytes whole, frees nothing of the request threads'. It hands each shard's
//! buffer back once exported, so a busy thread keeps writing into memory it already touched
//! instead of faulting in fresh pages after every batch. The export thread wakes once a second
//! ([`DELAY`]), when a batch's worth is waiting (one signal, not one per span), or to flush at
//! shutdown, as the SDK's batch processor does. The queue is bounded by a counter shared by
//! every thread of the spans written and not yet taken; a thread adds to it [`STEP`] spans at a
//! time, as one write to a cache line that every core would otherwise pass around per span.
//! Spans written while it is at [`QUEUE`] are dropped and counted (`queue_full`), as are the
//! spans of an export that failed (`export_failed`); the request path never waits for the
//! collector.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::InstrumentationScope;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;

use gateway_core::config::{OtlpProtocol, TelemetryConfig};

use crate::protobuf::Protobuf;
use crate::record::SpanRecord;

/// The instrumentation scope every span of the gateway is in.
pub const SCOPE: &str = "gateway";
/// Spans waiting for export at most (give or take a [`STEP`] per thread); past it new spans are
/// dropped (and counted).
pub const QUEUE: usize = 8192;
/// Spans per export request, at most; a batch's worth waiting wakes the export thread. Larger
/// than the SDK's 512: each request costs the gateway two thread wake-ups and an HTTP exchange
/// whatever its size, and at a few spans per developer request a busy gateway would send
/// hundreds a second. 2048 of the gateway's spans are about 1.5 MB.
const BATCH: usize = 2048;
/// Bytes of spans per export request, at most: well within the 4 MiB a gRPC collector takes
/// by default, whatever the spans carry (a long path, an error's text).
const BATCH_BYTES: usize = 3 << 20;
/// Spans a thread writes before it adds them to the shared count.
const STEP: usize = 32;
/// A batch that does not fill is sent after this long.
const DELAY: Duration = Duration::from_millis(1000);
/// One export request may take this long before it counts as failed.
pub(crate) const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP exporter for `endpoint` in the configured protocol, with the collector's headers
/// read from the environment variable the config names (`k1=v1,k2=v2`, values percent-decoded
/// as OTLP's own variable).
pub fn exporter(
    t: &TelemetryConfig,
    endpoint: &str,
    rt: tokio::runtime::Handle,
) -> Result<Otlp, String> {
    let headers = match std::env::var(&t.headers_env) {
        Ok(text) => parse_headers(&text).map_err(|e| format!("{}: {e}", t.headers_env))?,
        Err(_) => HashMap::new(),
    };
    let built = |e: opentelemetry_otlp::ExporterBuildError| {
        format!("telemetry: cannot build the OTLP exporter: {e}")
    };
    let inner = match t.protocol {
        OtlpProtocol::HttpProtobuf => {
            Otlp::Protobuf(Box::new(Protobuf::new(endpoint, header_map(&headers), rt)?))
        }
        OtlpProtocol::HttpJson => {
            let client = reqwest::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| format!("telemetry: cannot build the HTTP client: {e}"))?;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(Collector { client, rt })
                .with_endpoint(endpoint)
                .with_protocol(Protocol::HttpJson)
                .with_timeout(EXPORT_TIMEOUT)
                .with_headers(headers)
                .build()
                .map_err(built)?;
            Otlp::Http(Box::new(exporter))
        }
        OtlpProtocol::Grpc => {
            let map = header_map(&headers);
            // tonic's channel starts its connection task on the runtime it is built in.
            let _in_runtime = rt.enter();
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .with_metadata(MetadataMap::from_headers(map))
                .build()
                .map_err(built)?;
            Otlp::Grpc {
                inner: Arc::new(exporter),
                rt,
            }
        }
    };
    Ok(inner)
}

/// The OTLP exporter of the configured protocol.
#[derive(Debug)]
pub enum Otlp {
    /// OTLP/HTTP with protobuf, written and sent by the gateway.
    Protobuf(Box<Protobuf>),
    /// OTLP/HTTP with JSON; its requests are sent by [`Collector`] on the storage runtime.
    Http(Box<opentelemetry_otlp::SpanExporter>),
    /// OTLP/gRPC. tonic's channel needs a Tokio runtime and the batch processor's thread has
    /// none, so each export runs on `rt`.
    Grpc {
        inner: Arc<opentelemetry_otlp::SpanExporter>,
        rt: tokio::runtime::Handle,
    },
}

impl Otlp {
    /// Exports the spans written in `chunks`.
    async fn export(&self, chunks: &[&[u8]]) -> OTelSdkResult {
        match self {
            Otlp::Protobuf(e) => e.export(chunks).await,
            Otlp::Http(e) => e.export(span_data(chunks)?).await,
            Otlp::Grpc { inner, rt } => {
                let inner = inner.clone();
                let batch = span_data(chunks)?;
                rt.spawn(async move { inner.export(batch).await })
                    .await
                    .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?
            }
        }
    }

    fn shutdown(&self, timeout: Duration) -> OTelSdkResult {
        match self {
            Otlp::Protobuf(_) => Ok(()),
            Otlp::Http(e) => e.shutdown_with_timeout(timeout),
            Otlp::Grpc { inner, .. } => inner.shutdown_with_timeout(timeout),
        }
    }

    /// Tells the exporter the process's resource (the service name); before the first export.
    pub fn set_resource(&mut self, resource: &Resource) {
        match self {
            Otlp::Protobuf(e) => e.set_resource(resource),
            Otlp::Http(e) => e.set_resource(resource),
            // Set before the exporter is shared with any export.
            Otlp::Grpc { inner, .. } => {
                if let Some(e) = Arc::get_mut(inner) {
                    e.set_resource(resource);
                }
            }
        }
    }
}

/// The SDK's form of the spans in `chunks`, for `opentelemetry-otlp`'s exporters.
fn span_data(chunks: &[&[u8]]) -> Result<Vec<SpanData>, OTelSdkError> {
    let scope = InstrumentationScope::builder(SCOPE).build();
    let mut body = Vec::new();
    crate::wire::export_request(&mut body, &[], "", SCOPE, chunks);
    crate::convert::span_data(&body, &scope).map_err(OTelSdkError::InternalFailure)
}

/// `k1=v1,k2=v2` into header pairs. A pair without `=` is an error naming its position, never
/// its text (it may hold a credential).
fn parse_headers(text: &str) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for (i, pair) in text.split(',').enumerate() {
        if pair.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("entry {} is not name=value", i + 1));
        };
        let k = k.trim();
        if k.is_empty() || http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            return Err(format!("entry {} has no valid header name", i + 1));
        }
        let v = percent_decode(v.trim());
        if http::HeaderValue::from_str(&v).is_err() {
            return Err(format!("entry {} has an invalid header value", i + 1));
        }
        out.insert(k.to_string(), v);
    }
    Ok(out)
}

/// The headers `parse_headers` checked, as a header map; the values marked sensitive, as they
/// may be credentials.
fn header_map(headers: &HashMap<String, String>) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (k, v) in headers {
        // Both parts were checked by `parse_headers`.
        if let (Ok(k), Ok(mut v)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            http::HeaderValue::from_str(v),
        ) {
            v.set_sensitive(true);
            map.insert(k, v);
        }
    }
    map
}

/// `%20`-style escapes decoded, as OTLP's header variables allow.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends export requests with the workspace's reqwest on the storage runtime (the batch
/// processor's thread has no runtime of its own).
#[derive(Debug)]
struct Collector {
    client: reqwest::Client,
    rt: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Collector {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let request = reqwest::Request::try_from(request)?;
        let sent = self.rt.spawn(async move {
            let response = client.execute(request).await?;
            let mut out = http::Response::builder().status(response.status());
            if let Some(h) = out.headers_mut() {
                *h = response.headers().clone();
            }
            let body = response.bytes().await?;
            Ok::<_, HttpError>(out.body(body)?)
        });
        sent.await?
    }
}

/// What wakes the export thread besides its clock.
enum Signal {
    /// A batch's worth of spans is waiting.
    Batch,
    /// Export everything waiting, stop the exporter and say so.
    Stop(mpsc::SyncSender<()>),
}

/// The spans one thread has written and the export thread has not yet taken.
#[derive(Default)]
struct Written {
    bytes: Vec<u8>,
    spans: usize,
    /// Of `spans`, those not yet added to the queue's shared count (fewer than [`STEP`]).
    uncounted: usize,
    /// An exported buffer handed back, emptied, for the next batch.
    spare: Vec<u8>,
}

/// One thread's written spans. Only its thread and the export thread (once per batch) take
/// the lock, so it is almost never waited for.
type Shard = Arc<Mutex<Written>>;

/// Tells queues apart in a thread's shard (tests start more than one).
static QUEUES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, and the queue it belongs to.
    static SHARD: RefCell<Option<(usize, Shard)>> = const { RefCell::new(None) };
}

/// The request threads' side of the export queue.
pub struct Queue {
    id: usize,
    /// Every thread's shard, for the export thread to take from.
    shards: Arc<Mutex<Vec<Shard>>>,
    signals: mpsc::Sender<Signal>,
    /// Spans written and not yet taken by the export thread.
    pending: Arc<AtomicUsize>,
    /// A `Batch` signal is on its way and not yet taken.
    signalled: Arc<AtomicBool>,
    /// The export thread has stopped: nothing will take more spans.
    stopped: Arc<AtomicBool>,
    full: IntCounter,
}

impl Queue {
    /// Starts the export thread, which owns `exporter`.
    pub fn start(exporter: Otlp) -> Result<Queue, String> {
        let (signals, signal_rx) = mpsc::channel();
        let shards = Arc::new(Mutex::new(Vec::new()));
        let pending = Arc::new(AtomicUsize::new(0));
        let signalled = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            exporter,
            shards: shards.clone(),
            signals: signal_rx,
            pending: pending.clone(),
            signalled: signalled.clone(),
            stopped: stopped.clone(),
            failed: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["export_failed"]),
        };
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || worker.run())
            .map_err(|e| format!("telemetry: cannot start the export thread: {e}"))?;
        Ok(Queue {
            id: QUEUES.fetch_add(1, Ordering::Relaxed),
            shards,
            signals,
            pending,
            signalled,
            stopped,
            full: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["queue_full"]),
        })
    }

    /// Writes a finished span into this thread's batch for the export thread, or drops (and
    /// counts) it when it would take the queue past its bound. Never blocks.
    pub fn submit(&self, span: &SpanRecord) {
        if self.pending.load(Ordering::Relaxed) >= QUEUE {
            self.full.inc();
            return;
        }
        if self.stopped.load(Ordering::Acquire) {
            // The export thread has stopped (shutdown): nothing will take it.
            return;
        }
        // A span ending while its thread is torn down is not written: nothing would take it.
        let counted = SHARD.try_with(|cell| {
            let mut cell = cell.borrow_mut();
            if !matches!(&*cell, Some((id, _)) if *id == self.id) {
                *cell = Some((self.id, self.new_shard()));
            }
            let (_, shard) = cell.as_ref()?;
            let mut w = written(shard);
            span.encode(&mut w.bytes);
            w.spans += 1;
            w.uncounted += 1;
            if w.uncounted < STEP {
                return None;
            }
            w.uncounted = 0;
            Some(self.pending.fetch_add(STEP, Ordering::AcqRel) + STEP)
        });
        if let Ok(Some(waiting)) = counted {
            if waiting >= BATCH
                && !self.signalled.load(Ordering::Relaxed)
                && !self.signalled.swap(true, Ordering::AcqRel)
            {
                let _ = self.signals.send(Signal::Batch);
            }
        }
    }

    /// A shard for a thread that has none in this queue, listed for the export thread.
    fn new_shard(&self) -> Shard {
        let shard = Shard::default();
        self.shards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(shard.clone());
        shard
    }

    /// Exports what is waiting and stops the exporter; waits for at most `timeout`.
    pub fn stop(&self, timeout: Duration) -> bool {
        let (done, finished) = mpsc::sync_channel(1);
        if self.signals.send(Signal::Stop(done)).is_err() {
            return true;
        }
        finished.recv_timeout(timeout).is_ok()
    }
}

/// The export thread: takes the written spans from every thread's shard and exports them in
/// batches.
struct Worker {
    exporter: Otlp,
    shards: Arc<Mutex<Vec<Shard>>>,
    signals: mpsc::Receiver<Signal>,
    pending: Arc<AtomicUsize>,
    signalled: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
    failed: IntCounter,
}

impl Worker {
    fn run(mut self) {
        loop {
            match self.signals.recv_timeout(DELAY) {
                Ok(Signal::Batch) => {
                    self.signalled.store(false, Ordering::Release);
                    self.drain();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.drain(),
                Ok(Signal::Stop(done)) => {
                    self.stopped.store(true, Ordering::Release);
                    self.drain();
                    if let Err(e) = self.exporter.shutdown(DELAY) {
                        log::debug!("telemetry: exporter not stopped cleanly: {e}");
                    }
                    let _ = done.send(());
                    return;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.stopped.store(true, Ordering::Release);
                    self.drain();
                    return;
                }
            }
        }
    }

    /// Exports every span waiting, in requests of at most [`BATCH`] spans, and hands each
    /// shard its buffer back.
    fn drain(&mut self) {
        let mut taken = Vec::new();
        let mut from = Vec::new();
        let mut counted = 0;
        {
            let mut all = self.shards.lock().unwrap_or_else(PoisonError::into_inner);
            // A thread that has ended leaves its shard to this list alone: emptied below, it
            // is dropped from the list.
            let live: Vec<bool> = all.iter().map(|s| Arc::strong_count(s) > 1).collect();
            for (shard, &live) in all.iter().zip(&live) {
                let mut w = written(shard);
                if w.spans == 0 {
                    // A thread gone quiet does not keep a burst's room.
                    if w.bytes.capacity().max(w.spare.capacity()) > QUIET_ROOM {
                        w.bytes = Vec::new();
                        w.spare = Vec::new();
                    }
                    continue;
                }
                // A spare too small for what the thread wrote this time is not grown (that
                // would copy its old bytes) but replaced, by one with room for half as much
                // again: made to the byte, it would grow (and copy) whenever the next interval
                // brings a little more.
                let next = match std::mem::take(&mut w.spare) {
                    spare if spare.capacity() >= w.bytes.len() => spare,
                    _ => Vec::with_capacity(w.bytes.len() + w.bytes.len() / 2),
                };
                let bytes = std::mem::replace(&mut w.bytes, next);
                let spans = std::mem::take(&mut w.spans);
                counted += spans - std::mem::take(&mut w.uncounted);
                taken.push(Written {
                    bytes,
                    spans,
                    ..Written::default()
                });
                from.push(live.then(|| shard.clone()));
            }
            let mut live = live.into_iter();
            all.retain(|_| live.next().unwrap_or(false));
        }
        self.pending.fetch_sub(counted, Ordering::AcqRel);
        for (request, spans) in requests(&taken, BATCH, BATCH_BYTES) {
            self.export(&request, spans);
        }
        for (shard, mut w) in from.into_iter().zip(taken) {
            // A burst's buffer is let go once the traffic that filled it has passed: only one
            // about the size of what the thread now writes between exports is handed back.
            let fits = w.bytes.capacity() <= (4 * w.bytes.len()).max(QUIET_ROOM);
            if let (Some(shard), true) = (shard, fits) {
                w.bytes.clear();
                written(&shard).spare = w.bytes;
            }
        }
    }

    fn export(&mut self, chunks: &[&[u8]], n: usize) {
        let result = futures::executor::block_on(self.exporter.export(chunks));
        if let Err(e) = result {
            self.failed.inc_by(n as u64);
            log::debug!("telemetry: {n} spans not exported: {e}");
        }
    }
}

/// The export requests for the spans `taken` from the shards, in order: each at most `batch`
/// spans and `max_bytes` of them (a span larger than that goes alone), a shard's run of spans
/// cut at span boundaries where it does not fit whole.
fn requests(taken: &[Written], batch: usize, max_bytes: usize) -> Vec<(Vec<&[u8]>, usize)> {
    let mut out = Vec::new();
    let mut request: Vec<&[u8]> = Vec::new();
    let (mut in_request, mut request_bytes) = (0, 0);
    for w in taken {
        let (mut rest, mut left) = (w.bytes.as_slice(), w.spans);
        while left > 0 {
            let room = batch - in_request;
            let byte_room = max_bytes.saturating_sub(request_bytes);
            let (cut, n) = if left <= room && rest.len() <= byte_room {
                (rest.len(), left)
            } else {
                // Only the spans that end within the room are counted.
                crate::wire::after_spans(&rest[..byte_room.min(rest.len())], room)
            };
            let (cut, n) = match (n, in_request) {
                // Not one more span fits: the request is sent and the rest starts the next.
                (0, 1..) => {
                    out.push((std::mem::take(&mut request), in_request));
                    (in_request, request_bytes) = (0, 0);
                    continue;
                }
                // A span larger than a whole request goes alone.
                (0, 0) => crate::wire::after_spans(rest, 1),
                _ => (cut, n),
            };
            request.push(&rest[..cut]);
            in_request += n;
            request_bytes += cut;
            rest = &rest[cut..];
            // Bytes that are not a run of spans (never written so) end the shard's part.
            left = if n == 0 { 0 } else { left - n };
            if in_request >= batch || request_bytes >= max_bytes {
                out.push((std::mem::take(&mut request), in_request));
                (in_request, request_bytes) = (0, 0);
            }
        }
    }
    if in_request > 0 {
        out.push((request, in_request));
    }
    out
}

/// A shard's spans, also when a thread panicked holding its lock: what it wrote before is whole
/// (a span is written in one call that does not fail part-way), and the counts stay true.
fn written(shard: &Shard) -> std::sync::MutexGuard<'_, Written> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A shard with no spans waiting keeps at most this much room.
const QUIET_ROOM: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_and_errors_never_echo_values() {
        let h = parse_headers("authorization=Bearer%20abc, x-tenant = t1 ,").unwrap();
        assert_eq!(h["authorization"], "Bearer abc");
        assert_eq!(h["x-tenant"], "t1");
        let e = parse_headers("a=1,secretvalue").unwrap_err();
        assert!(e.contains("entry 2") && !e.contains("secretvalue"), "{e}");
        assert!(parse_headers("bad name=1").is_err());
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4a%zz"), "J%zz");
    }

    /// A root server span of a new trace, started now.
    fn server_span() -> crate::record::SpanRecord {
        use crate::record::{child, new_trace_id, SpanRecord};
        use opentelemetry::trace::{SpanKind, TraceState};
        SpanRecord::start(
            child(new_trace_id(), true, &TraceState::NONE),
            None,
            "POST",
            SpanKind::Server,
            crate::record::Timestamp::now(),
        )
    }

    /// Each thread's share of spans, `n` server spans apiece.
    fn taken(counts: &[usize]) -> Vec<Written> {
        counts
            .iter()
            .map(|&n| {
                let mut w = Written::default();
                for _ in 0..n {
                    server_span().encode(&mut w.bytes);
                    w.spans += 1;
                }
                w
            })
            .collect()
    }

    /// Every request holds whole spans, and together they hold every span taken, in order.
    fn assert_whole_and_in_order(requests: &[(Vec<&[u8]>, usize)], taken: &[Written]) {
        for (chunks, n) in requests {
            let whole: usize = chunks
                .iter()
                .map(|c| crate::wire::after_spans(c, usize::MAX).1)
                .sum();
            assert_eq!(whole, *n, "every chunk holds whole spans");
        }
        let sent: Vec<u8> = requests.iter().flat_map(|(c, _)| c.concat()).collect();
        let all: Vec<u8> = taken.iter().flat_map(|w| w.bytes.clone()).collect();
        assert_eq!(sent, all, "nothing lost, nothing reordered");
    }

    /// Spans taken from several threads go out in order, at most a batch to a request, a
    /// thread's run of spans cut between two spans where it does not fit whole.
    #[test]
    fn taken_spans_make_requests_of_at_most_a_batch() {
        let taken = taken(&[3, 7, 1, 4]);
        let requests = requests(&taken, 5, usize::MAX);
        let counts: Vec<usize> = requests.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [5, 5, 5]);
        assert_whole_and_in_order(&requests, &taken);
        assert_eq!(super::requests(&taken[..1], 5, usize::MAX).len(), 1);
        assert!(super::requests(&[], 5, usize::MAX).is_empty());
    }

    /// A request holds at most its bytes' worth of spans, however many the batch allows; a
    /// span larger than that goes alone.
    #[test]
    fn requests_stay_within_their_bytes() {
        let taken = taken(&[3, 7, 1, 4]);
        let span = taken[0].bytes.len() / 3;
        let requests = requests(&taken, 100, 2 * span + span / 2);
        let counts: Vec<usize> = requests.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [2, 2, 2, 2, 2, 2, 2, 1]);
        assert_whole_and_in_order(&requests, &taken);
        let alone = super::requests(&taken, 100, span / 2);
        assert_eq!(alone.len(), 15);
        assert!(alone.iter().all(|(_, n)| *n == 1));
        assert_whole_and_in_order(&alone, &taken);
    }

    /// A collector that takes the connection and never answers holds the export thread in its
    /// first export (for the export's ten-second deadline): the spans written meanwhile beyond
    /// the queue's bound are dropped at once and counted, and writing them never waits.
    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", silent.local_addr().unwrap());
        let exporter = Protobuf::new(&url, http::HeaderMap::new(), rt.handle().clone()).unwrap();
        let queue = Queue::start(Otlp::Protobuf(Box::new(exporter))).unwrap();
        let full = gateway_core::metrics::SPANS_DROPPED.with_label_values(&["queue_full"]);
        let before = full.get();
        let span = server_span();
        let handed = 3 * QUEUE;
        for _ in 0..handed {
            queue.submit(&span);
        }
        let dropped = (full.get() - before) as usize;
        // Taken by the export thread before it blocked: what the thread's shard held when it
        // was signalled, never more than the queue's bound.
        assert!(
            dropped >= handed - 2 * QUEUE && dropped <= handed - QUEUE,
            "{dropped} of {handed} dropped"
        );
        assert!(queue.pending.load(Ordering::Acquire) <= QUEUE);
        drop(silent);
    }
}
