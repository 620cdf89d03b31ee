//! What the clouds' error answers say, in their own shapes: AWS names its errors in the
//! `x-amzn-ErrorType` header above a `{"message"}` body, Google writes
//! `{"error":{"code","message","status"}}`, and Gemini refuses a bad API key with a 400 whose
//! body alone says so. Read here for the deployment's health ([`judge`]) and turned into the
//! protocol's own error shape for the client ([`Dialect`]).

use bytes::Bytes;
use serde_json::{json, Value};

use crate::routing::{Failure, Verdict};
use crate::upstream::Exchange;
use gateway_core::domain::ProviderStyle;

/// Error bodies read to judge an answer are bounded.
const JUDGED_BODY_LIMIT: usize = 1024 * 1024;

/// How a cloud answer's errors differ from its protocol's own shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dialect {
    /// Bedrock: `{"message"}` bodies typed by `x-amzn-ErrorType` (its name, as
    /// [`aws_error_name`] reads it); streams in AWS event-stream framing.
    Aws { error_type: Option<String> },
    /// Vertex AI: Google's error shape from its front end (the model's own errors come in
    /// Anthropic's shape and pass as they are).
    Google,
}

impl Dialect {
    /// A cloud error body in Anthropic's shape (the protocol of both Anthropic clouds), or
    /// `None` when it is in that shape already.
    pub fn error_body(&self, status: u16, body: &[u8]) -> Option<Vec<u8>> {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        if parsed
            .as_ref()
            .and_then(|v| v.get("type"))
            .and_then(Value::as_str)
            == Some("error")
        {
            return None;
        }
        let (kind, message) = match self {
            Dialect::Aws { error_type } => {
                let message = parsed
                    .as_ref()
                    .and_then(|v| v.get("message").or_else(|| v.get("Message")))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
                (
                    aws_error_kind(error_type.as_deref().unwrap_or(""), status),
                    message,
                )
            }
            Dialect::Google => {
                let root = match &parsed {
                    Some(Value::Array(items)) => items.first(),
                    other => other.as_ref(),
                };
                let e = root
                    .and_then(|v| v.get("error"))
                    .filter(|e| e.is_object())?;
                let message = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("upstream error")
                    .to_string();
                let status_name = e.get("status").and_then(Value::as_str).unwrap_or("");
                (google_error_kind(status_name, status), message)
            }
        };
        let message = if message.is_empty() {
            "upstream error".to_string()
        } else {
            message
        };
        let out = json!({ "type": "error", "error": { "type": kind, "message": message } });
        serde_json::to_vec(&out).ok()
    }
}

/// The error's name in an `x-amzn-ErrorType` value (`ThrottlingException:http://...`).
pub fn aws_error_name(header: &str) -> String {
    header.split(':').next().unwrap_or("").trim().to_string()
}

/// An AWS error name (`ThrottlingException`, or `throttlingException` as a stream's exception
/// says it) as an Anthropic error type; an unknown name goes by the status.
pub fn aws_error_kind(name: &str, status: u16) -> &'static str {
    let name = name.to_ascii_lowercase();
    let name = name.strip_suffix("exception").unwrap_or(&name);
    match name {
        "throttling" | "servicequotaexceeded" | "toomanyrequests" => "rate_limit_error",
        "validation" | "serialization" => "invalid_request_error",
        "accessdenied" => "permission_error",
        "unrecognizedclient"
        | "invalidsignature"
        | "incompletesignature"
        | "expiredtoken"
        | "missingauthenticationtoken" => "authentication_error",
        "resourcenotfound" => "not_found_error",
        "modelnotready" | "serviceunavailable" => "overloaded_error",
        "modeltimeout" | "modelerror" | "modelstreamerror" | "internalserver" => "api_error",
        _ => match status {
            400 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        },
    }
}

/// A Google RPC status name as an Anthropic error type.
fn google_error_kind(status_name: &str, status: u16) -> &'static str {
    match status_name {
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => "invalid_request_error",
        "UNAUTHENTICATED" => "authentication_error",
        "PERMISSION_DENIED" => "permission_error",
        "NOT_FOUND" => "not_found_error",
        "RESOURCE_EXHAUSTED" => "rate_limit_error",
        "UNAVAILABLE" => "overloaded_error",
        _ => aws_error_kind("", status),
    }
}

/// How a cloud deployment's answer counts for its health, by what its error shape says beyond
/// the status: a Bedrock throttle answered 400 (`ServiceQuotaExceededException`) is a rate
/// limit, a model timeout (408) or model error (424) a failure of the deployment, a Gemini 400
/// that names an invalid API key the operator's credential refused. A body read to judge is
/// handed back, to be relayed.
pub async fn judge(style: ProviderStyle, ex: &mut Exchange) -> (Verdict, Option<Bytes>) {
    let status = ex.status();
    let by_status = Verdict::of_status(status);
    if status < 400 {
        return (by_status, None);
    }
    match style {
        ProviderStyle::Bedrock => {
            let name = ex
                .header()
                .get("x-amzn-errortype")
                .and_then(|v| v.to_str().ok())
                .map(aws_error_name)
                .unwrap_or_default();
            let verdict = match aws_error_kind(&name, status) {
                "rate_limit_error" => Verdict::Failed(Failure::RateLimited),
                "authentication_error" | "permission_error" => Verdict::Failed(Failure::Credential),
                "overloaded_error" | "api_error" if status < 500 && !name.is_empty() => {
                    Verdict::Failed(Failure::ServerError)
                }
                _ => by_status,
            };
            (verdict, None)
        }
        ProviderStyle::Gemini if status == 400 => match ex.read_all(JUDGED_BODY_LIMIT).await {
            Ok(body) => {
                let verdict = if names_invalid_key(&body) {
                    Verdict::Failed(Failure::Credential)
                } else {
                    by_status
                };
                (verdict, Some(body))
            }
            Err(e) => {
                log::warn!("reading a Gemini error answer failed: {e}");
                (Verdict::Failed(Failure::Broken), None)
            }
        },
        _ => (by_status, None),
    }
}

/// Gemini's answer to a key it does not know: 400 `INVALID_ARGUMENT` with the reason
/// `API_KEY_INVALID` in its details.
fn names_invalid_key(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"API_KEY_INVALID").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aws_errors_take_anthropic_shapes() {
        let d = Dialect::Aws {
            error_type: Some(aws_error_name(
                "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/",
            )),
        };
        let out = d
            .error_body(
                429,
                br#"{"message":"Too many requests, please wait before trying again."}"#,
            )
            .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert_eq!(
            v["error"]["message"],
            "Too many requests, please wait before trying again."
        );
        let anthropic =
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#;
        assert_eq!(d.error_body(400, anthropic), None);
        assert_eq!(
            aws_error_kind("modelStreamErrorException", 424),
            "api_error"
        );
        assert_eq!(aws_error_kind("Whatever", 503), "overloaded_error");
    }

    #[test]
    fn google_errors_take_anthropic_shapes() {
        let body = br#"{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model","status":"RESOURCE_EXHAUSTED"}}"#;
        let out = Dialect::Google.error_body(429, body).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert!(v["error"]["message"].as_str().unwrap().starts_with("Quota"));
        assert_eq!(Dialect::Google.error_body(500, b"<html>"), None);
        assert!(names_invalid_key(
            br#"{"error":{"details":[{"reason":"API_KEY_INVALID"}]}}"#
        ));
    }
}
