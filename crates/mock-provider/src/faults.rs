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
