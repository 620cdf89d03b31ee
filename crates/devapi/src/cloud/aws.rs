//! AWS: Signature Version 4 for Bedrock's requests, and the binary event-stream framing of its
//! streamed answers.

use std::borrow::Cow;
use std::time::SystemTime;

use aws_sigv4::http_request::{sign as sigv4, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::Message;
use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

use super::errors::aws_error_kind;
use crate::sse::SseEvent;
use gateway_core::config::AwsCredentials;

/// The name Bedrock's runtime signs under.
const SERVICE: &str = "bedrock";

/// Signs a Bedrock request: adds `x-amz-date`, `x-amz-security-token` (with temporary
/// credentials) and `authorization` to `headers`. The host, content type and accept headers
/// are signed with the body; the others (user agent, encodings) are not, as AWS's own SDKs do.
pub(super) fn sign(
    creds: &AwsCredentials,
    region: &str,
    host: &str,
    path: &str,
    headers: &mut Vec<(&'static str, Cow<'static, str>)>,
    body: &[u8],
) -> Result<(), String> {
    let identity = aws_credential_types::Credentials::new(
        creds.access_key_id.clone(),
        creds.secret_access_key.clone(),
        creds.session_token.clone(),
        None,
        "gateway-environment",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("SigV4 parameters: {e}"))?
        .into();
    let signed: Vec<(&str, &str)> = std::iter::once(("host", host))
        .chain(
            headers
                .iter()
                .filter(|(n, _)| matches!(*n, "content-type" | "accept"))
                .map(|(n, v)| (*n, v.as_ref())),
        )
        .collect();
    // The scheme is not part of what is signed; the path is, as it goes on the wire.
    let url = format!("https://{host}{path}");
    let request = SignableRequest::new("POST", &url, signed.into_iter(), SignableBody::Bytes(body))
        .map_err(|e| format!("SigV4 request: {e}"))?;
    let (instructions, _signature) = sigv4(request, &params)
        .map_err(|e| format!("SigV4 signing: {e}"))?
        .into_parts();
    let (added, _query) = instructions.into_parts();
    for h in added {
        headers.push((h.name(), Cow::Owned(h.value().to_string())));
    }
    Ok(())
}

/// Larger than any event Bedrock sends (the format's own limit is 16 MiB); a stream whose
/// frame claims more is refused rather than buffered.
const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024 + 64 * 1024;

/// Reads Bedrock's `application/vnd.amazon.eventstream` answers: binary messages (length,
/// headers, payload, checksums) decoded by AWS's own decoder. Each `chunk` event carries one
/// Anthropic stream event, base64-encoded; it comes out as the [`SseEvent`] Anthropic would have
/// sent (its `raw` bytes written as SSE, for relaying). An exception message (throttling, a
/// model error) comes out as Anthropic's `error` event.
#[derive(Default)]
pub struct EventStreamReader {
    buf: BytesMut,
    decoder: MessageFrameDecoder,
    /// A frame could not be read: nothing after it can be trusted.
    broken: bool,
}

impl std::fmt::Debug for EventStreamReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStreamReader")
            .field("buffered", &self.buf.len())
            .field("broken", &self.broken)
            .finish()
    }
}

impl EventStreamReader {
    /// The events completed by `chunk`, which may end anywhere inside a frame.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.broken {
            return out;
        }
        self.buf.extend_from_slice(chunk);
        loop {
            match self.decoder.decode_frame(&mut self.buf) {
                Ok(DecodedFrame::Complete(message)) => out.extend(event_of(&message)),
                Ok(DecodedFrame::Incomplete) => break,
                Err(e) => {
                    self.broken = true;
                    out.push(error_event(
                        "api_error",
                        &format!("The provider's event stream could not be read: {e}"),
                    ));
                    return out;
                }
            }
        }
        if self.buf.len() > MAX_FRAME_BYTES {
            self.broken = true;
            self.buf = BytesMut::new();
            out.push(error_event(
                "api_error",
                "The provider's event stream sent an oversized frame.",
            ));
        }
        out
    }

    /// A frame left incomplete at the end is a cut stream, which the caller sees from how
    /// the body ended: nothing comes of it.
    pub fn finish(&mut self) -> Option<SseEvent> {
        self.buf.clear();
        None
    }
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| h.value().as_string().ok())
        .map(|s| s.as_str())
}

/// The Anthropic event one event-stream message carries, if any.
fn event_of(message: &Message) -> Option<SseEvent> {
    match header(message, ":message-type") {
        Some("event") if header(message, ":event-type") == Some("chunk") => {
            chunk_event(message.payload())
        }
        Some("exception") | Some("error") => {
            let name = header(message, ":exception-type")
                .or_else(|| header(message, ":error-code"))
                .unwrap_or("");
            let payload: Value = serde_json::from_slice(message.payload()).unwrap_or(Value::Null);
            let text = payload
                .get("message")
                .or_else(|| payload.get("Message"))
                .and_then(Value::as_str)
                .or_else(|| header(message, ":error-message"))
                .unwrap_or("The provider's stream failed.");
            log::warn!("Bedrock stream exception {name}: {text}");
            Some(error_event(aws_error_kind(name, 0), text))
        }
        _ => None,
    }
}

/// A `chunk` event's payload, `{"bytes":"<base64 of an Anthropic event>"}`, as that event.
/// Bedrock's invocation metrics on the last event are the operator's business: dropped.
fn chunk_event(payload: &Bytes) -> Option<SseEvent> {
    #[derive(serde::Deserialize)]
    struct Chunk<'a> {
        #[serde(borrow)]
        bytes: Cow<'a, str>,
    }
    let chunk: Chunk = serde_json::from_slice(payload).ok()?;
    let inner = base64::engine::general_purpose::STANDARD
        .decode(chunk.bytes.as_bytes())
        .ok()?;
    let mut event: Value = serde_json::from_slice(&inner).ok()?;
    let kind = event.get("type").and_then(Value::as_str)?.to_string();
    if let Some(obj) = event.as_object_mut() {
        obj.remove("amazon-bedrock-invocationMetrics");
    }
    Some(sse_event(kind, event.to_string()))
}

fn error_event(kind: &str, message: &str) -> SseEvent {
    let data = json!({ "type": "error", "error": { "type": kind, "message": message } });
    sse_event("error".into(), data.to_string())
}

/// The event as Anthropic writes it (compact JSON: no line breaks inside `data`).
fn sse_event(kind: String, data: String) -> SseEvent {
    let raw = Bytes::from(format!("event: {kind}\ndata: {data}\n\n"));
    SseEvent {
        event: Some(kind),
        data,
        raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::{Header, HeaderValue};

    fn frame(headers: &[(&str, &str)], payload: &str) -> Vec<u8> {
        let mut m = Message::new(Bytes::from(payload.to_string()));
        for (n, v) in headers {
            m = m.add_header(Header::new(
                n.to_string(),
                HeaderValue::String(v.to_string().into()),
            ));
        }
        let mut out = BytesMut::new();
        write_message_to(&m, &mut out).unwrap();
        out.to_vec()
    }

    fn chunk(event: &Value) -> Vec<u8> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(event.to_string());
        let payload = json!({ "bytes": b64, "p": "abcdefgh" }).to_string();
        frame(
            &[
                (":event-type", "chunk"),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            &payload,
        )
    }

    #[test]
    fn frames_cut_anywhere_give_the_anthropic_events() {
        let mut body =
            chunk(&json!({"type": "message_start", "message": {"usage": {"input_tokens": 9}}}));
        body.extend(chunk(&json!({"type": "content_block_delta", "index": 0,
                                  "delta": {"type": "text_delta", "text": "héllo"}})));
        body.extend(chunk(&json!({"type": "message_stop",
            "amazon-bedrock-invocationMetrics": {"inputTokenCount": 9, "outputTokenCount": 1}})));
        body.extend(frame(
            &[
                (":exception-type", "throttlingException"),
                (":message-type", "exception"),
            ],
            r#"{"message":"Too many requests, please wait before trying again."}"#,
        ));
        for step in [1, 3, 7, 1000] {
            let mut r = EventStreamReader::default();
            let mut events = Vec::new();
            for piece in body.chunks(step) {
                events.extend(r.feed(piece));
            }
            let kinds: Vec<_> = events.iter().map(|e| e.event.clone().unwrap()).collect();
            assert_eq!(
                kinds,
                [
                    "message_start",
                    "content_block_delta",
                    "message_stop",
                    "error"
                ],
                "step {step}"
            );
            assert!(events[1].data.contains("héllo"));
            assert_eq!(events[2].data, r#"{"type":"message_stop"}"#);
            assert_eq!(
                &events[2].raw[..],
                b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
            );
            let err: Value = serde_json::from_str(&events[3].data).unwrap();
            assert_eq!(err["error"]["type"], "rate_limit_error");
        }
    }

    #[test]
    fn corrupt_frames_end_the_stream_with_an_error() {
        let mut body = chunk(&json!({"type": "ping"}));
        let last = body.len() - 1;
        body[last] ^= 0xff;
        let mut r = EventStreamReader::default();
        let events = r.feed(&body);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event.as_deref(), Some("error"));
        assert!(r.feed(&chunk(&json!({"type": "ping"}))).is_empty());
    }
}
