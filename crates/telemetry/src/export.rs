//! The way out: OTLP over HTTP through the workspace's reqwest, behind the SDK's batch
//! processor with a bounded queue whose drops are counted.
//!
//! The SDK's `BatchSpanProcessor` exports from its own thread and never blocks the caller, but
//! keeps the count of spans it drops to itself. So the queue is bounded one step earlier, by
//! [`Bounded`]: it counts the spans handed on and not yet taken for export, refuses (and counts)
//! one more than the processor's queue holds, so the processor itself never has to drop; and
//! [`Counted`] counts the spans of an export that failed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;

use gateway_core::config::{OtlpProtocol, TelemetryConfig};

use crate::wire;

/// Spans waiting for export at most; past it new spans are dropped (and counted).
pub const QUEUE: usize = 4096;
/// Spans per export request.
const BATCH: usize = 512;
/// A batch that does not fill is sent after this long.
const DELAY: Duration = Duration::from_millis(1000);
/// One export request may take this long before it counts as failed.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP exporter for `endpoint`, with the collector's headers read from the environment
/// variable the config names (`k1=v1,k2=v2`, values percent-decoded as OTLP's own variable).
/// Protobuf is written by [`crate::wire`] and posted here; JSON goes through
/// `opentelemetry-otlp`.
pub fn exporter(
    t: &TelemetryConfig,
    endpoint: &str,
    rt: tokio::runtime::Handle,
) -> Result<Counted<Exporter>, String> {
    let headers = match std::env::var(&t.headers_env) {
        Ok(text) => parse_headers(&text).map_err(|e| format!("{}: {e}", t.headers_env))?,
        Err(_) => HashMap::new(),
    };
    let client = reqwest::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| format!("telemetry: cannot build the HTTP client: {e}"))?;
    let inner = match t.protocol {
        OtlpProtocol::HttpProtobuf => {
            let url = reqwest::Url::parse(endpoint)
                .map_err(|e| format!("telemetry: invalid OTLP endpoint: {e}"))?;
            let mut map = http::HeaderMap::new();
            for (k, v) in &headers {
                let name = http::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| format!("{}: invalid header name", t.headers_env))?;
                let value = http::HeaderValue::from_str(v)
                    .map_err(|_| format!("{}: invalid header value", t.headers_env))?;
                map.insert(name, value);
            }
            map.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/x-protobuf"),
            );
            Exporter::Protobuf(Protobuf {
                client,
                rt,
                url,
                headers: map,
                encoder: Mutex::new(wire::Encoder::default()),
            })
        }
        OtlpProtocol::HttpJson => Exporter::Json(
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(Collector { client, rt })
                .with_endpoint(endpoint)
                .with_protocol(Protocol::HttpJson)
                .with_timeout(EXPORT_TIMEOUT)
                .with_headers(headers)
                .build()
                .map_err(|e| format!("telemetry: cannot build the OTLP exporter: {e}"))?,
        ),
    };
    Ok(Counted {
        inner,
        pending: Arc::new(AtomicUsize::new(0)),
        failed: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["export_failed"]),
    })
}

/// The way a batch leaves: protobuf written here, or JSON through `opentelemetry-otlp`.
#[derive(Debug)]
pub enum Exporter {
    Protobuf(Protobuf),
    Json(opentelemetry_otlp::SpanExporter),
}

impl SpanExporter for Exporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match self {
            Exporter::Protobuf(p) => p.export(batch).await,
            Exporter::Json(j) => j.export(batch).await,
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        match self {
            Exporter::Protobuf(_) => Ok(()),
            Exporter::Json(j) => j.shutdown_with_timeout(timeout),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        match self {
            Exporter::Protobuf(_) => Ok(()),
            Exporter::Json(j) => j.force_flush(),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        match self {
            Exporter::Protobuf(p) => p.encoder_mut().set_resource(resource),
            Exporter::Json(j) => j.set_resource(resource),
        }
    }
}

/// OTLP/HTTP with a protobuf body: one POST per batch over the client's kept-alive connection,
/// run on the storage runtime (the batch processor's thread has none); a batch that fails is
/// not retried (it is counted by [`Counted`]).
#[derive(Debug)]
pub struct Protobuf {
    client: reqwest::Client,
    rt: tokio::runtime::Handle,
    url: reqwest::Url,
    headers: http::HeaderMap,
    /// Only the batch processor's thread encodes; the lock is never contended.
    encoder: Mutex<wire::Encoder>,
}

impl Protobuf {
    fn encoder_mut(&mut self) -> &mut wire::Encoder {
        self.encoder
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = self
            .encoder
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .encode(&batch);
        drop(batch);
        let request = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body);
        let sent = self.rt.spawn(async move {
            let response = request.send().await?;
            let status = response.status();
            // Read to the end so the connection is kept for the next batch.
            let _ = response.bytes().await;
            Ok::<_, reqwest::Error>(status)
        });
        match sent.await {
            Ok(Ok(status)) if status.is_success() => Ok(()),
            Ok(Ok(status)) => Err(OTelSdkError::InternalFailure(format!(
                "the collector answered {status}"
            ))),
            Ok(Err(e)) => Err(OTelSdkError::InternalFailure(format!(
                "export failed: {}",
                e.without_url()
            ))),
            Err(e) => Err(OTelSdkError::InternalFailure(format!("export task: {e}"))),
        }
    }
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

/// The batch processor behind the bounded queue.
pub fn bounded(exporter: Counted<Exporter>) -> Bounded {
    let pending = exporter.pending.clone();
    let config = BatchConfigBuilder::default()
        .with_max_queue_size(QUEUE)
        .with_max_export_batch_size(BATCH)
        .with_scheduled_delay(DELAY)
        .build();
    Bounded {
        inner: BatchSpanProcessor::new(exporter, config),
        pending,
        full: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["queue_full"]),
    }
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

/// Bounds the spans queued for export and counts the ones refused.
#[derive(Debug)]
pub struct Bounded {
    inner: BatchSpanProcessor,
    /// Spans handed to `inner` and not yet taken for export (shared with [`Counted`]).
    pending: Arc<AtomicUsize>,
    full: IntCounter,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= QUEUE {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.full.inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter, counting what leaves the queue and what fails to reach the collector.
#[derive(Debug)]
pub struct Counted<E> {
    inner: E,
    pending: Arc<AtomicUsize>,
    failed: IntCounter,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.pending.fetch_sub(n, Ordering::AcqRel);
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            self.failed.inc_by(n as u64);
            log::debug!("telemetry: {n} spans not exported: {e}");
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
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
}
