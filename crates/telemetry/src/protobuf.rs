//! OTLP/HTTP with protobuf bodies: each batch written by [`crate::wire`] and posted with the
//! workspace's reqwest on the storage runtime (the export thread has none).
//!
//! Failures are retried as OTLP/HTTP asks: a connection or transport failure, 429, 502, 503 and
//! 504, with growing pauses, within the export's deadline; any other status fails the batch at
//! once. A collector's `Retry-After` (in seconds) is waited for when it is short; one asking for
//! longer than [`LONGEST_PAUSE`], past the deadline, or as a date fails the batch instead of
//! being asked again too early. A collector that accepts only part of a batch says how many
//! spans it rejected, and those are counted as failed exports.

use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::Resource;
use prost::Message;

use crate::export::{EXPORT_TIMEOUT, SCOPE};
use crate::wire;

/// A collector that does not take the connection in this long counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Retries after the first attempt, at most.
const RETRIES: u32 = 3;
/// The pause before the first retry; each later one doubles it.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest `Retry-After` waited for; a collector asking for more gets the batch dropped.
const LONGEST_PAUSE: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Protobuf {
    client: reqwest::Client,
    rt: tokio::runtime::Handle,
    endpoint: reqwest::Url,
    headers: http::HeaderMap,
    /// The process's `Resource` message, written once.
    resource: Vec<u8>,
    schema_url: String,
    rejected: prometheus::IntCounter,
    /// The last export's body, handed back once posted: the next one is written into memory
    /// already mapped instead of a fresh allocation of a batch's size.
    spare: std::sync::Mutex<Vec<u8>>,
}

impl Protobuf {
    /// The exporter for `endpoint` (`…/v1/traces`), sending `headers` with every request.
    pub fn new(
        endpoint: &str,
        mut headers: http::HeaderMap,
        rt: tokio::runtime::Handle,
    ) -> Result<Self, String> {
        let endpoint = reqwest::Url::parse(endpoint)
            .map_err(|e| format!("telemetry: invalid OTLP endpoint: {e}"))?;
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-protobuf"),
        );
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!(
                "llm-gateway/",
                env!("CARGO_PKG_VERSION"),
                " (otlp)"
            ))
            .build()
            .map_err(|e| format!("telemetry: cannot build the HTTP client: {e}"))?;
        Ok(Self {
            client,
            rt,
            endpoint,
            headers,
            resource: wire::resource(&Resource::builder_empty().build()),
            schema_url: String::new(),
            rejected: gateway_core::metrics::SPANS_DROPPED.with_label_values(&["export_failed"]),
            spare: std::sync::Mutex::default(),
        })
    }

    pub fn set_resource(&mut self, resource: &Resource) {
        self.resource = wire::resource(resource);
        self.schema_url = resource.schema_url().unwrap_or_default().to_owned();
    }

    /// Exports the spans written in `chunks`.
    pub async fn export(&self, chunks: &[&[u8]]) -> OTelSdkResult {
        let written: usize = chunks.iter().map(|c| c.len()).sum();
        let room = self.resource.len() + 64 + written;
        let mut body = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|e| e.into_inner()));
        if body.capacity() < room {
            // Allocated anew rather than grown: growing would copy the old body's bytes.
            body = Vec::with_capacity(room);
        }
        wire::export_request(&mut body, &self.resource, &self.schema_url, SCOPE, chunks);
        let body = Bytes::from(body);
        let client = self.client.clone();
        let url = self.endpoint.clone();
        let headers = self.headers.clone();
        let (answer, body) = self
            .rt
            .spawn(async move {
                // Each attempt is bounded by the client's timeout, the whole export by this.
                let deadline = tokio::time::Instant::now() + EXPORT_TIMEOUT;
                let answer = tokio::time::timeout_at(
                    deadline,
                    post_with_retries(&client, url, headers, &body, deadline),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(OTelSdkError::InternalFailure(
                        "the collector did not answer in time".into(),
                    ))
                });
                (answer, body)
            })
            .await
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        // The client has let go of its copies once the exchange is over; where one is still
        // held (a connection not yet done writing it), the next body is allocated anew.
        if let Ok(spare) = body.try_into_mut() {
            let mut spare = Vec::from(spare);
            spare.clear();
            *self.spare.lock().unwrap_or_else(|e| e.into_inner()) = spare;
        }
        let answer = answer?;
        if let Ok(response) = ExportTraceServiceResponse::decode(answer) {
            if let Some(partial) = response.partial_success {
                if partial.rejected_spans > 0 {
                    self.rejected.inc_by(partial.rejected_spans as u64);
                    log::debug!(
                        "telemetry: the collector rejected {} spans: {}",
                        partial.rejected_spans,
                        partial.error_message
                    );
                }
            }
        }
        Ok(())
    }
}

/// Posts `body`, retrying what OTLP/HTTP calls retryable while a pause still ends before
/// `deadline`; the collector's answer on success.
async fn post_with_retries(
    client: &reqwest::Client,
    url: reqwest::Url,
    headers: http::HeaderMap,
    body: &Bytes,
    deadline: tokio::time::Instant,
) -> Result<Bytes, OTelSdkError> {
    let mut pause = FIRST_PAUSE;
    let mut attempt = 0;
    loop {
        let sent = client
            .post(url.clone())
            .headers(headers.clone())
            .body(body.clone())
            .send()
            .await;
        let (failure, wait) = match sent {
            Ok(response) if response.status().is_success() => {
                // Accepted: an answer that cannot be read only loses its partial-success note.
                return Ok(response.bytes().await.unwrap_or_default());
            }
            Ok(response) => {
                let status = response.status().as_u16();
                let failure = format!("the collector answered {status}");
                if !matches!(status, 429 | 502 | 503 | 504) {
                    return Err(OTelSdkError::InternalFailure(failure));
                }
                let asked = response.headers().get(reqwest::header::RETRY_AFTER);
                let wait = match asked {
                    None => pause,
                    Some(v) => match v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()) {
                        Some(s) if Duration::from_secs(s) <= LONGEST_PAUSE => {
                            Duration::from_secs(s)
                        }
                        // Longer than we wait, or a date: not asked again before it said.
                        _ => return Err(OTelSdkError::InternalFailure(failure)),
                    },
                };
                // Read to its end, so the kept-alive connection serves the next attempt.
                let _ = response.bytes().await;
                (failure, wait)
            }
            // Without the URL: an endpoint may carry a user and password.
            Err(e) => (
                format!("the collector could not be reached: {}", e.without_url()),
                pause,
            ),
        };
        if attempt >= RETRIES || tokio::time::Instant::now() + wait >= deadline {
            return Err(OTelSdkError::InternalFailure(failure));
        }
        tokio::time::sleep(wait).await;
        attempt += 1;
        pause *= 2;
    }
}
