//! The way out: OTLP over HTTP through the workspace's reqwest, or over gRPC through tonic,
//! behind the SDK's batch processor with a bounded queue whose drops are counted.
//!
//! OTLP/HTTP with protobuf, the default, is sent by [`Protobuf`], which writes each batch with
//! [`crate::wire`]; JSON and gRPC go through `opentelemetry-otlp`'s own exporters.
//!
//! The SDK's `BatchSpanProcessor` exports from its own thread and never blocks the caller, but
//! keeps the count of spans it drops to itself. So the queue is bounded one step earlier, by
//! [`Bounded`]: it counts the spans handed on and not yet taken for export, refuses (and counts)
//! one more than the processor's queue holds, so the processor itself never has to drop; and
//! [`Counted`] counts the spans of an export that failed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::tonic_types::metadata::MetadataMap;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;

use gateway_core::config::{OtlpProtocol, TelemetryConfig};

use crate::protobuf::Protobuf;

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
) -> Result<Counted<Otlp>, String> {
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
    Ok(Counted {
        inner,
        pending: Arc::new(AtomicUsize::new(0)),
        failed: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["export_failed"]),
    })
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

impl SpanExporter for Otlp {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        match self {
            Otlp::Protobuf(e) => e.export(batch).await,
            Otlp::Http(e) => e.export(batch).await,
            Otlp::Grpc { inner, rt } => {
                let inner = inner.clone();
                rt.spawn(async move { inner.export(batch).await })
                    .await
                    .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?
            }
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        match self {
            Otlp::Protobuf(_) => Ok(()),
            Otlp::Http(e) => e.shutdown_with_timeout(timeout),
            Otlp::Grpc { inner, .. } => inner.shutdown_with_timeout(timeout),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        match self {
            Otlp::Protobuf(_) => Ok(()),
            Otlp::Http(e) => e.force_flush(),
            Otlp::Grpc { inner, .. } => inner.force_flush(),
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        match self {
            Otlp::Protobuf(e) => e.set_resource(resource),
            Otlp::Http(e) => e.set_resource(resource),
            // Set once, when the processor is built and before any export shares the exporter.
            Otlp::Grpc { inner, .. } => {
                if let Some(e) = Arc::get_mut(inner) {
                    e.set_resource(resource);
                }
            }
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

/// The batch processor behind the bounded queue.
pub fn bounded(exporter: Counted<Otlp>) -> Bounded {
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
