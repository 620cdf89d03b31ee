//! What a handler wants sent, and the pieces every answer is made of.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use crate::replay;

/// Text of every non-streamed assistant answer.
pub(crate) const ANSWER_TEXT: &str = "Hello from the mock provider.";

/// Arguments of the mock tool call, split the way a model would stream them.
pub(crate) const TOOL_ARG_PARTS: [&str; 3] = ["{\"city\"", ":\"Par", "is\"}"];

// Token counts reported by every endpoint that has usage.
pub(crate) const PROMPT_TOKENS: u64 = 25;
pub(crate) const COMPLETION_TOKENS: u64 = 24;
pub(crate) const CACHED_TOKENS: u64 = 5;

/// What a handler wants sent; `render` turns it into a hyper response and
/// applies the transport-level misbehaviours (cut, pacing).
#[derive(Debug)]
pub(crate) enum Reply {
    Json {
        status: StatusCode,
        body: Bytes,
        /// Seconds sent as `retry-after`.
        retry_after: Option<u64>,
    },
    Audio(Bytes),
    Events(EventPlan),
    /// A recorded provider answer (`--fixtures`), sent as recorded.
    Replay(replay::Answer),
    /// A provider's answer with headers of its own (a cloud's refusal), sent as it is.
    Raw {
        status: StatusCode,
        headers: Vec<(http::header::HeaderName, http::header::HeaderValue)>,
        body: Bytes,
    },
}

impl Reply {
    pub(crate) fn json(status: StatusCode, value: &Value) -> Reply {
        Reply::Json {
            status,
            body: Bytes::from(value.to_string()),
            retry_after: None,
        }
    }

    pub(crate) fn ok(value: &Value) -> Reply {
        Reply::json(StatusCode::OK, value)
    }
}

/// A streamed answer split into the parts misbehaviours cut at: the opening
/// events, the content deltas, the closing events, and the event to send
/// instead of the closing ones for `midstream-error`.
#[derive(Debug, Default)]
pub(crate) struct EventPlan {
    pub(crate) prelude: Vec<Bytes>,
    pub(crate) deltas: Vec<Bytes>,
    pub(crate) epilogue: Vec<Bytes>,
    pub(crate) error_event: Bytes,
    /// The stream's media type; `None`: `text/event-stream`.
    pub(crate) content_type: Option<&'static str>,
}

/// `data: <json>\n\n` — OpenAI chat completions style SSE event.
pub(crate) fn sse_data(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// `event: <name>\ndata: <json>\n\n` — Anthropic / Responses style SSE event.
pub(crate) fn sse_event(name: &str, json: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// JSON-escape a string (with quotes) for hand-formatted hot-path events.
pub(crate) fn json_string(s: &str) -> String {
    Value::from(s).to_string()
}

pub(crate) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn error_value(message: &str, kind: &str) -> Value {
    json!({ "error": { "message": message, "type": kind } })
}

pub(crate) fn not_found() -> Reply {
    Reply::json(
        StatusCode::NOT_FOUND,
        &error_value("not found", "invalid_request_error"),
    )
}
