//! Misbehaviour on request: failures, slowness, cut and broken streams, chosen from the
//! model name or the `x-mock-status` header.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde_json::json;

use crate::reply::{error_value, Reply};

/// Extra wait for models whose name contains `slow`.
pub(crate) const SLOW_DELAY: Duration = Duration::from_millis(3000);
/// Number of deltas sent before a `midstream-error` stream fails.
pub(crate) const MIDSTREAM_ERROR_AFTER: usize = 3;

/// A forced error answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// `fail500` in the model name.
    Server,
    /// `fail429` in the model name.
    RateLimited,
    /// `fail400` in the model name.
    BadRequest,
    /// `x-mock-status` header.
    Status(StatusCode),
}

/// How to misbehave, chosen from the model name and the `x-mock-status`
/// header; flags combine (e.g. `slow-cut`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behaviour {
    pub(crate) failure: Option<Failure>,
    pub(crate) slow: bool,
    pub(crate) cut: bool,
    pub(crate) midstream_error: bool,
    pub(crate) no_usage: bool,
    pub(crate) tools: bool,
    /// `think` in the model name: Anthropic answers open with a signed thinking block.
    pub(crate) thinking: bool,
}

/// Pick the behaviour. The header wins over model-name failures, and among
/// those 500 beats 429 beats 400, so a name can't be ambiguous.
pub(crate) fn select_behaviour(model: &str, forced_status: Option<StatusCode>) -> Behaviour {
    let model_failure = if model.contains("fail500") {
        Some(Failure::Server)
    } else if model.contains("fail429") {
        Some(Failure::RateLimited)
    } else if model.contains("fail400") {
        Some(Failure::BadRequest)
    } else {
        None
    };
    Behaviour {
        failure: forced_status.map(Failure::Status).or(model_failure),
        slow: model.contains("slow"),
        cut: model.contains("cut"),
        midstream_error: model.contains("midstream-error"),
        no_usage: model.contains("nousage"),
        tools: model.contains("tools"),
        thinking: model.contains("think"),
    }
}

/// Parse `x-mock-status`; values outside 200..=599 are ignored because hyper
/// cannot send 1xx as a final answer and anything else is not HTTP.
pub(crate) fn forced_status(headers: &http::HeaderMap) -> Option<StatusCode> {
    let raw = headers.get("x-mock-status")?.to_str().ok()?;
    let code: u16 = raw.trim().parse().ok()?;
    if (200..=599).contains(&code) {
        StatusCode::from_u16(code).ok()
    } else {
        None
    }
}

/// The error answer for a forced failure.
pub(crate) fn failure_reply(failure: Failure) -> Reply {
    match failure {
        Failure::Server => Reply::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &error_value("mock failure", "server_error"),
        ),
        Failure::RateLimited => Reply::Json {
            status: StatusCode::TOO_MANY_REQUESTS,
            body: Bytes::from(error_value("rate limited by mock", "rate_limit_error").to_string()),
            retry_after: Some(1),
        },
        Failure::BadRequest => Reply::json(
            StatusCode::BAD_REQUEST,
            &json!({ "error": {
                "message": "bad request from mock",
                "type": "invalid_request_error",
                "code": "mock_bad_request"
            }}),
        ),
        Failure::Status(status) => {
            let kind = if status.is_server_error() {
                "server_error"
            } else if status == StatusCode::TOO_MANY_REQUESTS {
                "rate_limit_error"
            } else {
                "invalid_request_error"
            };
            Reply::Json {
                status,
                body: Bytes::from(
                    error_value(&format!("mock status {}", status.as_u16()), kind).to_string(),
                ),
                retry_after: (status == StatusCode::TOO_MANY_REQUESTS).then_some(1),
            }
        }
    }
}

/// The model-name prefix of the echo mode: `echo-key:<form>` answers 400 with an error whose
/// message quotes the credential the request carried, written in `<form>` (as a careless
/// provider might), so tests can check that the gateway masks every encoding of its key.
const ECHO_KEY: &str = "echo-key:";

/// The 400 answer of the echo mode, or `None` when the model does not ask for it. An unknown
/// form is a 400 of its own that quotes nothing.
pub(crate) fn echo_key_reply(model: &str, headers: &http::HeaderMap) -> Option<Reply> {
    let form = model.strip_prefix(ECHO_KEY)?;
    let key = headers
        .get("x-api-key")
        .or_else(|| headers.get(http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v))
        .unwrap_or("");
    let Some(quoted) = echo_form(form, key) else {
        return Some(Reply::json(
            StatusCode::BAD_REQUEST,
            &error_value(
                &format!("unknown echo form {form:?}"),
                "invalid_request_error",
            ),
        ));
    };
    // Written by hand: the escapes of the JSON forms must reach the wire as they are.
    let body = format!(
        "{{\"error\":{{\"message\":\"Incorrect API key provided: {quoted}. Check it.\",\
         \"type\":\"invalid_request_error\",\"code\":\"invalid_api_key\"}}}}"
    );
    Some(Reply::Json {
        status: StatusCode::BAD_REQUEST,
        body: Bytes::from(body),
        retry_after: None,
    })
}

/// `key` written in `form`, as the inside of a JSON string.
fn echo_form(form: &str, key: &str) -> Option<String> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    use base64::Engine;
    /// Every byte but ASCII letters and digits (and all of them when `all`) as `<lead>hh`.
    fn escaped(key: &str, all: bool, upper: bool, lead: &str) -> String {
        key.bytes()
            .map(|b| match b {
                b if !all && b.is_ascii_alphanumeric() => char::from(b).to_string(),
                b if upper => format!("{lead}{b:02X}"),
                b => format!("{lead}{b:02x}"),
            })
            .collect()
    }
    let json = |s: &str| {
        let quoted = serde_json::Value::from(s).to_string();
        quoted[1..quoted.len() - 1].to_string()
    };
    // A key inside a larger encoded blob, starting at each of the three byte alignments.
    let blob = |prefix: &str| format!("{prefix}{key}\"}}");
    let quoted = match form {
        "plain" => json(key),
        "pct-upper" => escaped(key, false, true, "%"),
        "pct-lower" => escaped(key, false, false, "%"),
        "pct-all" => escaped(key, true, true, "%"),
        "form" => key
            .split(' ')
            .map(|part| escaped(part, false, true, "%"))
            .collect::<Vec<_>>()
            .join("+"),
        "json-upper" => escaped(key, false, true, "\\u00"),
        "json-lower" => escaped(key, false, false, "\\u00"),
        "json-slash" => json(key).replace('/', "\\/"),
        "hex" => hex::encode(key),
        "hex-upper" => hex::encode_upper(key),
        "b64-0" => STANDARD_NO_PAD.encode(blob("")),
        "b64-1" => STANDARD_NO_PAD.encode(blob("u")),
        "b64-2" => STANDARD_NO_PAD.encode(blob("us")),
        "b64url-0" => URL_SAFE_NO_PAD.encode(blob("{\"k\":\"")),
        "b64url-1" => URL_SAFE_NO_PAD.encode(blob("user:")),
        "b64url-2" => URL_SAFE_NO_PAD.encode(blob("user")),
        "b64-json" => STANDARD_NO_PAD.encode(blob("u")).replace('/', "\\/"),
        "b64-pct" => STANDARD_NO_PAD
            .encode(blob("us"))
            .replace('+', "%2B")
            .replace('/', "%2F"),
        _ => return None,
    };
    Some(quoted)
}
