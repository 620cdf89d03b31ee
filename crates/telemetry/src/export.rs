//! The way out: a queue the request threads hand finished spans to, and one export thread that
//! takes them off in batches and sends them over OTLP: HTTP through the workspace's reqwest, or
//! gRPC through tonic.
//!
//! OTLP/HTTP with protobuf, the default, is sent by [`Protobuf`], which writes each batch with
//! [`crate::wire`]; JSON and gRPC go through `opentelemetry-otlp`'s own exporters, given the
//! SDK's form of each span.
//!
//! Handing a request's spans over is a counter and one channel send: the export thread does
//! not wait on the span channel, so no hand-off wakes it. It wakes once a second ([`DELAY`]),
//! when a batch's worth is waiting (one signal, not one per hand-off), or to flush at shutdown,
//! as the SDK's batch processor does. The queue is bounded by that counter: spans that would
//! take it past [`QUEUE`] are dropped and counted (`queue_full`), as are the spans of an export
//! that failed (`export_failed`); the request path never waits for the collector.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
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
/// Spans waiting for export at most; past it new spans are dropped (and counted).
pub const QUEUE: usize = 4096;
/// Spans per export request.
const BATCH: usize = 512;
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
    async fn export(&self, batch: &[SpanRecord]) -> OTelSdkResult {
        match self {
            Otlp::Protobuf(e) => e.export(batch).await,
            Otlp::Http(e) => e.export(span_data(batch)).await,
            Otlp::Grpc { inner, rt } => {
                let inner = inner.clone();
                let batch = span_data(batch);
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

/// The SDK's form of `batch`, for `opentelemetry-otlp`'s exporters.
fn span_data(batch: &[SpanRecord]) -> Vec<SpanData> {
    let scope = InstrumentationScope::builder(SCOPE).build();
    batch.iter().map(|s| s.to_span_data(&scope)).collect()
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

/// The request threads' side of the export queue.
pub struct Queue {
    /// A request's spans travel together: one hand-off per request, not per span.
    spans: mpsc::Sender<Vec<SpanRecord>>,
    signals: mpsc::Sender<Signal>,
    /// Spans handed over and not yet taken by the export thread.
    pending: Arc<AtomicUsize>,
    /// A `Batch` signal is on its way and not yet taken.
    signalled: Arc<AtomicBool>,
    full: IntCounter,
}

impl Queue {
    /// Starts the export thread, which owns `exporter`.
    pub fn start(exporter: Otlp) -> Result<Queue, String> {
        let (spans, span_rx) = mpsc::channel();
        let (signals, signal_rx) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let signalled = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            exporter,
            spans: span_rx,
            signals: signal_rx,
            pending: pending.clone(),
            signalled: signalled.clone(),
            batch: Vec::with_capacity(BATCH),
            failed: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["export_failed"]),
        };
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || worker.run())
            .map_err(|e| format!("telemetry: cannot start the export thread: {e}"))?;
        Ok(Queue {
            spans,
            signals,
            pending,
            signalled,
            full: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["queue_full"]),
        })
    }

    /// Hands finished spans to the export thread, or drops (and counts) them when they would
    /// take the queue past its bound. Never blocks.
    pub fn submit(&self, spans: Vec<SpanRecord>) {
        let n = spans.len();
        if n == 0 {
            return;
        }
        let waiting = self.pending.fetch_add(n, Ordering::AcqRel) + n;
        if waiting > QUEUE {
            self.pending.fetch_sub(n, Ordering::AcqRel);
            self.full.inc_by(n as u64);
            return;
        }
        if self.spans.send(spans).is_err() {
            // The export thread has stopped (shutdown): nothing will take them.
            self.pending.fetch_sub(n, Ordering::AcqRel);
            return;
        }
        if waiting >= BATCH
            && !self.signalled.load(Ordering::Relaxed)
            && !self.signalled.swap(true, Ordering::AcqRel)
        {
            let _ = self.signals.send(Signal::Batch);
        }
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

/// The export thread: takes the waiting spans off the queue in batches and exports each.
struct Worker {
    exporter: Otlp,
    spans: mpsc::Receiver<Vec<SpanRecord>>,
    signals: mpsc::Receiver<Signal>,
    pending: Arc<AtomicUsize>,
    signalled: Arc<AtomicBool>,
    /// The batch being filled; kept between exports for its room.
    batch: Vec<SpanRecord>,
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
                    self.drain();
                    if let Err(e) = self.exporter.shutdown(DELAY) {
                        log::debug!("telemetry: exporter not stopped cleanly: {e}");
                    }
                    let _ = done.send(());
                    return;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.drain();
                    return;
                }
            }
        }
    }

    /// Exports every span waiting, in batches of at most [`BATCH`].
    fn drain(&mut self) {
        while let Ok(spans) = self.spans.try_recv() {
            self.pending.fetch_sub(spans.len(), Ordering::AcqRel);
            for span in spans {
                self.batch.push(span);
                if self.batch.len() == BATCH {
                    self.export();
                }
            }
        }
        if !self.batch.is_empty() {
            self.export();
        }
    }

    fn export(&mut self) {
        let n = self.batch.len();
        let result = futures::executor::block_on(self.exporter.export(&self.batch));
        self.batch.clear();
        if let Err(e) = result {
            self.failed.inc_by(n as u64);
            log::debug!("telemetry: {n} spans not exported: {e}");
        }
    }
}

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

    /// A collector that takes the connection and never answers holds the export thread in its
    /// first export (for the export's ten-second deadline): the spans handed over meanwhile
    /// beyond the queue's bound are dropped at once and counted, and handing over never waits.
    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        use crate::record::{child, new_trace_id, SpanRecord};
        use opentelemetry::trace::{SpanKind, TraceState};

        let rt = tokio::runtime::Runtime::new().unwrap();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/traces", silent.local_addr().unwrap());
        let exporter = Protobuf::new(&url, http::HeaderMap::new(), rt.handle().clone()).unwrap();
        let queue = Queue::start(Otlp::Protobuf(Box::new(exporter))).unwrap();
        let full = gateway_core::metrics::SPANS_DROPPED.with_label_values(&["queue_full"]);
        let before = full.get();
        let span = SpanRecord::start(
            child(new_trace_id(), true, &TraceState::NONE),
            None,
            "POST",
            SpanKind::Server,
            std::time::SystemTime::now(),
            0,
        );
        let handed = 3 * QUEUE;
        for _ in 0..handed {
            queue.submit(vec![span.clone()]);
        }
        let dropped = (full.get() - before) as usize;
        // Taken by the export thread before it blocked: at most one batch.
        assert!(
            dropped >= handed - QUEUE - BATCH && dropped <= handed - QUEUE,
            "{dropped} of {handed} dropped"
        );
        assert!(queue.pending.load(Ordering::Acquire) <= QUEUE);
        drop(silent);
    }
}
