//! The cloud providers: Azure OpenAI, Anthropic on AWS Bedrock and on Google Vertex AI, and
//! the Gemini API, each at its own paths, with its own credentials checked as the real one
//! checks them, its own error answers, and (Bedrock) its own stream framing.
//!
//! A request that fails a check gets the provider's real refusal: Azure's 401 for a wrong
//! `api-key` and 404 without `api-version`; AWS's 403s for a missing, unknown or wrong SigV4
//! signature ([`sigv4`]); Vertex's 401 for a token the mock's token endpoint did not issue
//! ([`oauth`]); Gemini's 403 without a key and 400 `API_KEY_INVALID` for a wrong one. Bodies are
//! checked too: Bedrock and Vertex refuse a `model` field and want their `anthropic_version`.
//! What passes is answered like the direct providers' requests (replays included: the model is
//! read from the path where the cloud puts it there).

pub(crate) mod eventstream;
pub(crate) mod gemini;
pub(crate) mod oauth;
pub(crate) mod sigv4;

use std::time::SystemTime;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::StatusCode;
use serde_json::{json, Value};

use crate::anthropic::{anthropic_message, messages_stream};
use crate::endpoints::model_reply;
use crate::faults::{forced_status, select_behaviour, Behaviour, Failure};
use crate::recording::State;
use crate::replay;
use crate::reply::Reply;
use crate::request::{ends_with_tool_result, RequestInfo, Route};

/// Which cloud a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cloud {
    Azure,
    Bedrock,
    Vertex,
    Gemini,
}

/// A request to one of the clouds' paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloudCall {
    pub(crate) cloud: Cloud,
    /// The endpoint the call stands for (Gemini's `generateContent` is its own).
    pub(crate) route: Route,
    /// The model (deployment) the path names, decoded.
    pub(crate) model: Option<String>,
    /// Whether the path asks for a stream (Bedrock, Vertex, Gemini).
    pub(crate) stream: Option<bool>,
    /// Azure's deployment and `/openai/responses` paths need `api-version`.
    pub(crate) needs_api_version: bool,
}

fn decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8_lossy()
        .into_owned()
}

impl CloudCall {
    /// The cloud call a path is, if it is one.
    pub(crate) fn parse(path: &str) -> Option<CloudCall> {
        let call = |cloud, route, model: Option<&str>, stream, needs_api_version| {
            Some(CloudCall {
                cloud,
                route,
                model: model.map(decode),
                stream,
                needs_api_version,
            })
        };
        if let Some(rest) = path.strip_prefix("/openai/") {
            if let Some(op) = rest.strip_prefix("v1/") {
                return call(
                    Cloud::Azure,
                    Route::from_path(&format!("/{op}")),
                    None,
                    None,
                    false,
                );
            }
            if let Some(rest) = rest.strip_prefix("deployments/") {
                let (deployment, op) = rest.split_once('/')?;
                let route = Route::from_path(&format!("/{op}"));
                return call(Cloud::Azure, route, Some(deployment), None, true);
            }
            return call(
                Cloud::Azure,
                Route::from_path(&format!("/{rest}")),
                None,
                None,
                true,
            );
        }
        if let Some(rest) = path.strip_prefix("/model/") {
            let (model, action) = rest.rsplit_once('/')?;
            let stream = match action {
                "invoke" => false,
                "invoke-with-response-stream" => true,
                _ => return None,
            };
            return call(
                Cloud::Bedrock,
                Route::Messages,
                Some(model),
                Some(stream),
                false,
            );
        }
        if path.starts_with("/v1/projects/") && path.contains("/publishers/anthropic/models/") {
            let (_, rest) = path.split_once("/publishers/anthropic/models/")?;
            let (model, method) = rest.rsplit_once(':')?;
            let stream = match method {
                "rawPredict" => false,
                "streamRawPredict" => true,
                _ => return None,
            };
            return call(
                Cloud::Vertex,
                Route::Messages,
                Some(model),
                Some(stream),
                false,
            );
        }
        for version in ["/v1beta/models/", "/v1/models/", "/v1alpha/models/"] {
            if let Some(rest) = path.strip_prefix(version) {
                let (model, method) = rest.rsplit_once(':')?;
                let stream = match method {
                    "generateContent" => false,
                    "streamGenerateContent" => true,
                    _ => return None,
                };
                return call(
                    Cloud::Gemini,
                    Route::NotFound,
                    Some(model),
                    Some(stream),
                    false,
                );
            }
        }
        None
    }
}

/// A provider's refusal with headers of its own (AWS names its errors in one).
fn refusal(status: StatusCode, headers: Vec<(HeaderName, HeaderValue)>, body: &Value) -> Reply {
    Reply::Raw {
        status,
        headers,
        body: Bytes::from(body.to_string()),
    }
}

fn aws_error(status: StatusCode, error_type: &str, message: &str) -> Reply {
    let value = format!("{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/");
    let headers = vec![
        (
            HeaderName::from_static("x-amzn-errortype"),
            HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("Exception")),
        ),
        (
            HeaderName::from_static("x-amzn-requestid"),
            HeaderValue::from_static("6c1a8c39-3f4a-4bde-9b1a-0d6f1e0c8b21"),
        ),
    ];
    refusal(status, headers, &json!({ "message": message }))
}

fn google_error(status: StatusCode, message: &str, status_name: &str) -> Reply {
    Reply::json(
        status,
        &json!({ "error": { "code": status.as_u16(), "message": message, "status": status_name } }),
    )
}

fn anthropic_error(status: StatusCode, kind: &str, message: &str) -> Reply {
    Reply::json(
        status,
        &json!({ "type": "error", "error": { "type": kind, "message": message } }),
    )
}

/// Checks the credentials a call carries, as its cloud does.
fn check_credentials(
    call: &CloudCall,
    parts: &http::request::Parts,
    body: &[u8],
    state: &State,
) -> Result<(), Reply> {
    let creds = &state.config.clouds;
    let header = |n: &str| parts.headers.get(n).and_then(|v| v.to_str().ok());
    match call.cloud {
        Cloud::Azure => {
            if let Some(key) = &creds.azure_key {
                if header("api-key") != Some(key.as_str()) {
                    return Err(Reply::json(
                        StatusCode::UNAUTHORIZED,
                        &json!({ "error": { "code": "401", "message": "Access denied due to \
                            invalid subscription key or wrong API endpoint. Make sure to provide \
                            a valid key for an active subscription and use a correct regional \
                            API endpoint for your resource." } }),
                    ));
                }
            }
            let has_version = parts.uri.query().is_some_and(|q| {
                form_urlencoded::parse(q.as_bytes())
                    .any(|(k, v)| k == "api-version" && !v.is_empty())
            });
            if call.needs_api_version && !has_version {
                return Err(Reply::json(
                    StatusCode::NOT_FOUND,
                    &json!({ "error": { "code": "404", "message": "Resource not found" } }),
                ));
            }
            Ok(())
        }
        Cloud::Bedrock => {
            let Some(aws) = &creds.aws else {
                return Ok(());
            };
            let arrived = sigv4::Arrived {
                method: parts.method.as_str(),
                path: parts.uri.path(),
                query: parts.uri.query(),
                headers: &parts.headers,
                body,
            };
            sigv4::verify(aws, "bedrock", &arrived, SystemTime::now())
                .map_err(|r| aws_error(StatusCode::FORBIDDEN, r.error_type, &r.message))
        }
        Cloud::Vertex => match &creds.google {
            Some(_) => oauth::check_bearer(&state.google_tokens, &parts.headers),
            None => Ok(()),
        },
        Cloud::Gemini => {
            let Some(key) = &creds.gemini_key else {
                return Ok(());
            };
            match header("x-goog-api-key") {
                Some(k) if k == key => Ok(()),
                Some(_) => Err(Reply::json(
                    StatusCode::BAD_REQUEST,
                    &json!({ "error": {
                        "code": 400,
                        "message": "API key not valid. Please pass a valid API key.",
                        "status": "INVALID_ARGUMENT",
                        "details": [{
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                            "metadata": { "service": "generativelanguage.googleapis.com" }
                        }]
                    }}),
                )),
                None => Err(google_error(
                    StatusCode::FORBIDDEN,
                    "Method doesn't allow unregistered callers (callers without established \
                     identity). Please use API Key or other form of API consumer identity to \
                     call this API.",
                    "PERMISSION_DENIED",
                )),
            }
        }
    }
}

/// Checks what the Anthropic clouds want in the body, and Gemini's streaming query.
fn check_request(call: &CloudCall, parts: &http::request::Parts, body: &[u8]) -> Result<(), Reply> {
    let json: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match call.cloud {
        Cloud::Bedrock => {
            for key in ["model", "stream"] {
                if json.get(key).is_some() {
                    return Err(aws_error(
                        StatusCode::BAD_REQUEST,
                        "ValidationException",
                        &format!(
                            "Malformed input request: #: extraneous key [{key}] is not \
                             permitted, please reformat your input and try again."
                        ),
                    ));
                }
            }
            if json.get("anthropic_version").and_then(Value::as_str) != Some("bedrock-2023-05-31") {
                return Err(aws_error(
                    StatusCode::BAD_REQUEST,
                    "ValidationException",
                    "Malformed input request: #: required key [anthropic_version] not found, \
                     please reformat your input and try again.",
                ));
            }
            Ok(())
        }
        Cloud::Vertex => {
            if json.get("model").is_some() {
                return Err(anthropic_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "model: Extra inputs are not permitted",
                ));
            }
            if json.get("anthropic_version").and_then(Value::as_str) != Some("vertex-2023-10-16") {
                return Err(anthropic_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "anthropic_version: Input should be 'vertex-2023-10-16'",
                ));
            }
            Ok(())
        }
        Cloud::Gemini => {
            let sse = parts.uri.query().is_some_and(|q| {
                form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "alt" && v == "sse")
            });
            if call.stream == Some(true) && !sse {
                return Err(google_error(
                    StatusCode::BAD_REQUEST,
                    "mock: streamGenerateContent is served with alt=sse only",
                    "INVALID_ARGUMENT",
                ));
            }
            if json
                .get("contents")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                return Err(google_error(
                    StatusCode::BAD_REQUEST,
                    "* GenerateContentRequest.contents: contents is not specified\n",
                    "INVALID_ARGUMENT",
                ));
            }
            Ok(())
        }
        Cloud::Azure => Ok(()),
    }
}

/// A forced failure in the cloud's own words.
fn failure_reply(cloud: Cloud, failure: Failure) -> Reply {
    let status = match failure {
        Failure::Server => StatusCode::INTERNAL_SERVER_ERROR,
        Failure::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        Failure::BadRequest => StatusCode::BAD_REQUEST,
        Failure::Status(s) => s,
    };
    match cloud {
        Cloud::Azure => crate::faults::failure_reply(failure),
        Cloud::Bedrock => {
            let (kind, message) = match status.as_u16() {
                429 => (
                    "ThrottlingException",
                    "Too many requests, please wait before trying again.",
                ),
                400 => ("ValidationException", "mock: invalid request"),
                403 => (
                    "AccessDeniedException",
                    "You don't have access to the model with the specified model ID.",
                ),
                503 => (
                    "ServiceUnavailableException",
                    "Bedrock is unable to process your request.",
                ),
                _ => (
                    "InternalServerException",
                    "The server encountered an error processing your request.",
                ),
            };
            aws_error(status, kind, message)
        }
        Cloud::Vertex | Cloud::Gemini => {
            let name = match status.as_u16() {
                400 => "INVALID_ARGUMENT",
                401 => "UNAUTHENTICATED",
                403 => "PERMISSION_DENIED",
                404 => "NOT_FOUND",
                429 => "RESOURCE_EXHAUSTED",
                503 => "UNAVAILABLE",
                _ => "INTERNAL",
            };
            google_error(status, &format!("mock status {}", status.as_u16()), name)
        }
    }
}

/// The answer to a cloud call, and how it misbehaves.
pub(crate) fn answer(
    call: &CloudCall,
    parts: &http::request::Parts,
    body: &Bytes,
    state: &State,
) -> (Reply, Behaviour) {
    if let Err(reply) =
        check_credentials(call, parts, body, state).and_then(|()| check_request(call, parts, body))
    {
        return (reply, Behaviour::default());
    }
    let mut info = RequestInfo::parse(body);
    if let Some(model) = &call.model {
        info.model = Some(model.clone());
    }
    if let Some(stream) = call.stream {
        info.stream = Some(stream);
    }
    let model = info.model().to_string();
    if let Some(recorded) = replay::answer(state.config.fixtures.as_deref(), &model) {
        return (Reply::Replay(recorded), Behaviour::default());
    }
    let mut b = select_behaviour(&model, forced_status(&parts.headers));
    if let Some(failure) = b.failure {
        return (failure_reply(call.cloud, failure), b);
    }
    let cfg = &state.config;
    let reply = match call.cloud {
        Cloud::Azure => {
            if b.tools && ends_with_tool_result(call.route, body) {
                b.tools = false;
            }
            model_reply(call.route, &info, body, &b, cfg)
        }
        Cloud::Vertex => {
            if b.tools && ends_with_tool_result(Route::Messages, body) {
                b.tools = false;
            }
            model_reply(Route::Messages, &info, body, &b, cfg)
        }
        Cloud::Bedrock => {
            if b.tools && ends_with_tool_result(Route::Messages, body) {
                b.tools = false;
            }
            if info.streaming() {
                let mut plan = messages_stream(&info, &b, cfg.chunks);
                for part in [&mut plan.prelude, &mut plan.deltas, &mut plan.epilogue] {
                    for frame in part.iter_mut() {
                        *frame = eventstream::from_sse(frame);
                    }
                }
                plan.error_event = eventstream::from_sse(&plan.error_event);
                plan.content_type = Some(eventstream::CONTENT_TYPE);
                Reply::Events(plan)
            } else {
                Reply::ok(&anthropic_message(&model, &b))
            }
        }
        Cloud::Gemini => {
            let req = gemini::GeminiRequest::parse(body);
            if b.tools && req.ends_with_function_response() {
                b.tools = false;
            }
            if info.streaming() {
                Reply::Events(gemini::stream(&model, &req, &b, cfg.chunks))
            } else {
                Reply::ok(&gemini::generate(&model, &b))
            }
        }
    };
    (reply, b)
}

/// The credentials the mock checks, from its command line; a cloud without them is not checked.
#[derive(Debug, Default, Clone)]
pub(crate) struct CloudCredentials {
    pub(crate) azure_key: Option<String>,
    pub(crate) gemini_key: Option<String>,
    pub(crate) aws: Option<sigv4::AwsCredentials>,
    pub(crate) google: Option<std::sync::Arc<oauth::GoogleAccount>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_paths_name_their_model_and_stream() {
        let c = CloudCall::parse("/openai/deployments/gpt-4o%2Dmini/chat/completions").unwrap();
        assert_eq!(
            (c.cloud, c.route, c.model.as_deref(), c.needs_api_version),
            (
                Cloud::Azure,
                Route::ChatCompletions,
                Some("gpt-4o-mini"),
                true
            )
        );
        let c = CloudCall::parse("/openai/v1/embeddings").unwrap();
        assert_eq!(
            (c.route, c.model, c.needs_api_version),
            (Route::Embeddings, None, false)
        );
        let c =
            CloudCall::parse("/model/anthropic.claude-v2%3A1/invoke-with-response-stream").unwrap();
        assert_eq!(
            (c.cloud, c.model.as_deref(), c.stream),
            (Cloud::Bedrock, Some("anthropic.claude-v2:1"), Some(true))
        );
        let c = CloudCall::parse(
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude@2025:rawPredict",
        )
        .unwrap();
        assert_eq!(
            (c.cloud, c.model.as_deref(), c.stream),
            (Cloud::Vertex, Some("claude@2025"), Some(false))
        );
        let c = CloudCall::parse("/v1beta/models/gemini-2.5-flash:streamGenerateContent").unwrap();
        assert_eq!((c.cloud, c.stream), (Cloud::Gemini, Some(true)));
        assert_eq!(CloudCall::parse("/v1/chat/completions"), None);
        assert_eq!(CloudCall::parse("/model/x/delete"), None);
    }
}
