//! Bedrock's `application/vnd.amazon.eventstream` framing: binary messages with string
//! headers, a payload and CRC checksums, written with AWS's own encoder.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

pub(crate) const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// One message with string headers.
pub(crate) fn message(headers: &[(&str, &str)], payload: &[u8]) -> Result<Bytes, String> {
    let mut m = Message::new(Bytes::copy_from_slice(payload));
    for (name, value) in headers {
        m = m.add_header(Header::new(
            name.to_string(),
            HeaderValue::String(value.to_string().into()),
        ));
    }
    let mut out = BytesMut::new();
    write_message_to(&m, &mut out).map_err(|e| e.to_string())?;
    Ok(out.freeze())
}

/// A `chunk` event carrying one Anthropic event, as Bedrock sends it (with its padding).
pub(crate) fn chunk(event: &str) -> Bytes {
    let b64 = base64::engine::general_purpose::STANDARD.encode(event);
    let pad = &"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0"[..(event.len() % 40) + 1];
    let payload = json!({ "bytes": b64, "p": pad }).to_string();
    message(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.as_bytes(),
    )
    .unwrap_or_default()
}

/// An exception message, as Bedrock ends a stream that failed.
pub(crate) fn exception(kind: &str, text: &str) -> Bytes {
    let payload = json!({ "message": text }).to_string();
    message(
        &[
            (":exception-type", kind),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        payload.as_bytes(),
    )
    .unwrap_or_default()
}

/// One of the mock's Anthropic SSE frames as Bedrock frames it; an `error` event becomes a
/// `modelStreamErrorException`.
pub(crate) fn from_sse(frame: &Bytes) -> Bytes {
    let text = String::from_utf8_lossy(frame);
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or("{}");
    let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
    if v.get("type").and_then(Value::as_str) == Some("error") {
        let msg = v
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("The model failed.");
        return exception("modelStreamErrorException", msg);
    }
    chunk(data)
}

/// A fixture's body written as text, one message per two lines: the headers as a JSON object
/// of strings, then the payload as it goes on the wire. Returns the encoded body and where each
/// message starts in it.
pub(crate) fn encode_fixture(text: &[u8]) -> Result<(Bytes, Vec<usize>), String> {
    let text = std::str::from_utf8(text).map_err(|_| "event-stream fixture is not UTF-8")?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let mut out = BytesMut::new();
    let mut starts = Vec::new();
    while let Some(head) = lines.next() {
        let headers: serde_json::Map<String, Value> = serde_json::from_str(head)
            .map_err(|e| format!("event-stream fixture: headers line {head:?}: {e}"))?;
        let payload = lines
            .next()
            .ok_or("event-stream fixture: a headers line without its payload line")?;
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or("")))
            .collect();
        starts.push(out.len());
        out.extend_from_slice(&message(&headers, payload.as_bytes())?);
    }
    Ok((out.freeze(), starts))
}
