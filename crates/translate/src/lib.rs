//! Cross-style translation between the OpenAI chat-completions API and the
//! Anthropic messages API, in both directions and for streams, from the OpenAI
//! Responses API to either of them, and between chat completions and the Gemini API.
//!
//! Everything here is pure: the proxy layer owns I/O, status codes and the parsing of
//! the upstream SSE stream, so these functions can be tested without a network and
//! can never block a connection. Input on both sides is hostile (clients and providers
//! alike send malformed or unexpected JSON), so nothing in this module may panic; the
//! lint gate below makes the compiler hold us to that.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Map, Value};

pub mod chat_to_messages;
pub mod gemini;
pub mod messages_to_chat;
pub mod responses;

/// Errors a translation can report; the gateway maps them to a 400 with code
/// `invalid_request`.
///
/// Only requests can fail: a provider's response that makes no sense is still turned
/// into the best-effort client shape, because by then the tokens are already spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslateError(pub String);

impl fmt::Display for TranslateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TranslateError {}

pub(crate) fn bad(msg: impl Into<String>) -> TranslateError {
    TranslateError(msg.into())
}

/// Parses an optional non-negative integer option. Clients written in JavaScript
/// sometimes send `1024.0`, which is harmless; a negative or fractional value is a
/// client bug worth a 400 rather than a silent default.
pub(crate) fn opt_u64(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, TranslateError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            if let Some(n) = v.as_u64() {
                return Ok(Some(n));
            }
            match v.as_f64() {
                Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => {
                    Ok(Some(f as u64))
                }
                _ => Err(bad(format!("`{key}` must be a non-negative integer"))),
            }
        }
    }
}

/// Appends blocks (or parts) to the conversation, merging into the previous turn when the role
/// repeats: Anthropic and Gemini require alternation, OpenAI does not.
pub(crate) fn push_merged(
    out: &mut Vec<(&'static str, Vec<Value>)>,
    role: &'static str,
    blocks: Vec<Value>,
) {
    if blocks.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((last_role, last)) if *last_role == role => last.extend(blocks),
        _ => out.push((role, blocks)),
    }
}

/// A request body's object and its `messages` array (Chat Completions and Messages alike).
pub(crate) fn body_messages(
    body: &Value,
) -> Result<(&Map<String, Value>, &Vec<Value>), TranslateError> {
    let obj = body
        .as_object()
        .ok_or_else(|| bad("request body must be a JSON object"))?;
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be an array"))?;
    Ok((obj, messages))
}

/// A Chat Completions body's object and its `messages`, with `n` > 1 refused: what every
/// translation of a chat request starts from.
pub(crate) fn chat_messages(
    body: &Value,
) -> Result<(&Map<String, Value>, &Vec<Value>), TranslateError> {
    let (obj, messages) = body_messages(body)?;
    if opt_u64(obj, "n")?.is_some_and(|n| n > 1) {
        return Err(bad("`n` greater than 1 is not supported by this model"));
    }
    Ok((obj, messages))
}

/// One `chat.completion.chunk` of a stream translated into Chat Completions.
pub(crate) fn chat_chunk(
    id: &str,
    created: u64,
    model: &str,
    delta: Value,
    finish_reason: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
        }],
    })
}

/// OpenAI-style frame; also used for the literal `[DONE]` sentinel.
pub(crate) fn sse_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

pub(crate) fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// Anthropic-style frame: Anthropic SDKs dispatch on the `event:` line, so it must
/// always be present and match the `type` inside the data.
pub(crate) fn sse_event(name: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Used only when the upstream gave no id: clients use ids for logging and
/// de-duplication, so an empty or constant one would be worse than a random one.
pub(crate) fn random_id(prefix: &str) -> String {
    format!(
        "{prefix}{:016x}{:08x}",
        rand::random::<u64>(),
        rand::random::<u32>()
    )
}

pub(crate) fn str_field<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Token counts are absent, null or even negative on some providers; zero is the
/// only safe reading of any of those.
pub(crate) fn u64_field(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Tool arguments arrive as a JSON *string* from OpenAI-style models, which are free to
/// emit invalid JSON; both Anthropic and OpenAI clients expect an object, so anything
/// else degrades to `{}` rather than failing a response whose tokens were already paid.
pub(crate) fn args_to_object(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => Value::Object(m),
            _ => Value::Object(Map::new()),
        },
        Some(Value::Object(m)) => Value::Object(m.clone()),
        _ => Value::Object(Map::new()),
    }
}

/// Logs, at debug level, the top-level request fields a translation does not carry:
/// clients adopt new provider features faster than translations learn them, and a field
/// the other style cannot express is dropped rather than refused.
pub(crate) fn log_dropped(obj: &Map<String, Value>, carried: &[&str]) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let dropped: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !carried.contains(k))
        .collect();
    if !dropped.is_empty() {
        log::debug!("translation drops request fields {dropped:?}");
    }
}

/// Error bodies can be HTML pages from a load balancer; keep enough to diagnose without
/// echoing megabytes back to the client.
pub(crate) fn body_text(body: &[u8]) -> String {
    const MAX: usize = 2000;
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.chars().count() <= MAX {
        return text.to_string();
    }
    let mut out: String = text.chars().take(MAX).collect();
    out.push('…');
    out
}

/// Classifies one OpenAI-ish error `type` or `code` string into an Anthropic error type.
/// OpenAI overloads `type` (a 401 is `invalid_request_error` with code
/// `invalid_api_key`), so callers try the code first.
fn classify_openai_error(s: &str) -> Option<&'static str> {
    Some(match s {
        "authentication_error" | "invalid_api_key" | "unauthorized" | "invalid_authentication" => {
            "authentication_error"
        }
        "permission_error"
        | "permission_denied"
        | "insufficient_permissions"
        | "unsupported_country_region_territory" => "permission_error",
        "not_found_error" | "not_found" | "model_not_found" => "not_found_error",
        "request_too_large" => "request_too_large",
        "rate_limit_error"
        | "rate_limit_exceeded"
        | "insufficient_quota"
        | "requests"
        | "tokens" => "rate_limit_error",
        "overloaded_error" | "overloaded" | "engine_overloaded" | "service_unavailable" => {
            "overloaded_error"
        }
        "invalid_request_error"
        | "invalid_request"
        | "context_length_exceeded"
        | "invalid_value"
        | "bad_request"
        | "content_filter" => "invalid_request_error",
        "api_error" | "server_error" | "internal_error" | "internal_server_error" => "api_error",
        _ => return None,
    })
}

/// Some OpenAI-compatible providers put the HTTP status in `code` as a number.
fn classify_status(code: u64) -> Option<&'static str> {
    Some(match code {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 | 403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500..=599 => "api_error",
        _ => return None,
    })
}

/// Maps an OpenAI error object (`{message, type, code}`) to an Anthropic error type.
pub(crate) fn openai_error_type_to_anthropic(err: &Value) -> &'static str {
    let code = err.get("code");
    // Azure writes the status as a string code (`"code": "429"`).
    let numeric = code
        .and_then(Value::as_u64)
        .or_else(|| code.and_then(Value::as_str).and_then(|c| c.parse().ok()));
    code.and_then(Value::as_str)
        .and_then(classify_openai_error)
        .or_else(|| numeric.and_then(classify_status))
        .or_else(|| str_field(err, "type").and_then(classify_openai_error))
        .unwrap_or("api_error")
}

/// Builds the inner OpenAI error object for an Anthropic error type. The `code` values
/// are chosen so that [`openai_error_type_to_anthropic`] maps them back to the same
/// Anthropic type, keeping a double translation lossless.
pub(crate) fn anthropic_error_to_openai(kind: &str, message: &str) -> Value {
    let (ty, code) = match kind {
        "invalid_request_error" => ("invalid_request_error", "invalid_request"),
        "authentication_error" => ("authentication_error", "invalid_api_key"),
        "permission_error" => ("permission_error", "permission_denied"),
        "not_found_error" => ("not_found_error", "not_found"),
        "request_too_large" => ("invalid_request_error", "request_too_large"),
        "rate_limit_error" => ("rate_limit_error", "rate_limit_exceeded"),
        "overloaded_error" => ("server_error", "overloaded"),
        _ => ("server_error", "api_error"),
    };
    json!({ "message": message, "type": ty, "code": code, "param": null })
}

/// Splits frames into `(event name, data)` so stream tests can compare JSON by value:
/// key order inside serialized frames depends on serde_json features of the final build.
#[cfg(test)]
pub(crate) fn parse_frames(frames: &[Bytes]) -> Vec<(Option<String>, Value)> {
    frames
        .iter()
        .map(|f| {
            let s = std::str::from_utf8(f).expect("utf8 frame");
            assert!(
                s.ends_with("\n\n"),
                "frame must end with a blank line: {s:?}"
            );
            let mut event = None;
            let mut data = None;
            for line in s.trim_end().lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            let data = data.expect("data line");
            let value = if data == "[DONE]" {
                Value::String(data)
            } else {
                serde_json::from_str(&data).expect("frame data is JSON")
            };
            (event, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_round_trip_through_both_styles() {
        for kind in [
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "not_found_error",
            "request_too_large",
            "rate_limit_error",
            "api_error",
            "overloaded_error",
        ] {
            let openai = anthropic_error_to_openai(kind, "m");
            assert_eq!(openai_error_type_to_anthropic(&openai), kind, "{kind}");
        }
    }

    #[test]
    fn openai_error_classification_prefers_code() {
        let cases = [
            (
                json!({"type": "invalid_request_error", "code": "invalid_api_key"}),
                "authentication_error",
            ),
            (
                json!({"type": "invalid_request_error", "code": null}),
                "invalid_request_error",
            ),
            (
                json!({"type": "requests", "code": "rate_limit_exceeded"}),
                "rate_limit_error",
            ),
            (json!({"type": "insufficient_quota"}), "rate_limit_error"),
            (json!({"type": "server_error"}), "api_error"),
            (json!({"code": 429}), "rate_limit_error"),
            (json!({"code": 503}), "overloaded_error"),
            (json!({"code": 404}), "not_found_error"),
            (
                json!({"code": "429", "message": "Azure"}),
                "rate_limit_error",
            ),
            (
                json!({"type": null, "code": "content_filter"}),
                "invalid_request_error",
            ),
            (json!({"type": "something_new"}), "api_error"),
            (json!({}), "api_error"),
            (json!("not an object"), "api_error"),
        ];
        for (input, want) in cases {
            assert_eq!(openai_error_type_to_anthropic(&input), want, "{input}");
        }
    }

    #[test]
    fn args_to_object_never_fails() {
        assert_eq!(args_to_object(Some(&json!("{\"a\":1}"))), json!({"a": 1}));
        assert_eq!(args_to_object(Some(&json!("{\"a\":"))), json!({}));
        assert_eq!(args_to_object(Some(&json!("[1,2]"))), json!({}));
        assert_eq!(args_to_object(Some(&json!({"b": 2}))), json!({"b": 2}));
        assert_eq!(args_to_object(Some(&json!(3))), json!({}));
        assert_eq!(args_to_object(None), json!({}));
    }

    #[test]
    fn body_text_truncates_on_char_boundary() {
        let long = "é".repeat(5000);
        let t = body_text(long.as_bytes());
        assert_eq!(t.chars().count(), 2001);
        assert!(t.ends_with('…'));
        assert_eq!(
            body_text(b"\xff\xfe bad utf8 "),
            "\u{fffd}\u{fffd} bad utf8"
        );
    }

    #[test]
    fn frames_have_sse_shape() {
        assert_eq!(&sse_data(&json!({"a": 1}))[..], b"data: {\"a\":1}\n\n");
        assert_eq!(
            &sse_event("ping", &json!({"type": "ping"}))[..],
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n"
        );
        assert_eq!(&sse_done()[..], b"data: [DONE]\n\n");
    }

    #[test]
    fn random_ids_differ() {
        let a = random_id("msg_");
        assert!(a.starts_with("msg_"));
        assert_ne!(a, random_id("msg_"));
    }
}
