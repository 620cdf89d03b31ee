//! Whole answers, usage and error bodies.

use serde_json::{json, Map, Value};

use super::call_id;
use crate::{anthropic_error_to_openai, body_text, now_unix, random_id, str_field, u64_field};

/// A candidate's `finishReason` as a chat `finish_reason`; `calls` says whether the answer
/// calls tools (Gemini says `STOP` for those too).
pub(super) fn finish_reason(reason: &str, calls: bool) -> &'static str {
    match reason {
        "MAX_TOKENS" => "length",
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY"
        | "LANGUAGE" => "content_filter",
        _ if calls => "tool_calls",
        _ => "stop",
    }
}

/// `usageMetadata` as chat usage. Gemini counts thinking apart from the answer
/// (`thoughtsTokenCount` beside `candidatesTokenCount`) and cached tokens inside the prompt
/// (`cachedContentTokenCount` of `promptTokenCount`); tool-use prompts (search results and
/// the like) are input too. Chat counts reasoning inside the completion, as its
/// `reasoning_tokens` detail.
pub fn usage(meta: &Value) -> Value {
    let prompt = u64_field(meta, "promptTokenCount")
        .saturating_add(u64_field(meta, "toolUsePromptTokenCount"));
    let thoughts = u64_field(meta, "thoughtsTokenCount");
    let completion = u64_field(meta, "candidatesTokenCount").saturating_add(thoughts);
    let mut usage = Map::new();
    usage.insert("prompt_tokens".into(), json!(prompt));
    usage.insert("completion_tokens".into(), json!(completion));
    usage.insert(
        "total_tokens".into(),
        json!(prompt.saturating_add(completion)),
    );
    usage.insert(
        "prompt_tokens_details".into(),
        json!({ "cached_tokens": u64_field(meta, "cachedContentTokenCount") }),
    );
    if thoughts > 0 {
        usage.insert(
            "completion_tokens_details".into(),
            json!({ "reasoning_tokens": thoughts }),
        );
    }
    Value::Object(usage)
}

/// What one candidate's parts say, gathered.
#[derive(Default)]
pub(super) struct Parts {
    pub(super) text: String,
    pub(super) reasoning: String,
    /// (id, name, arguments as a JSON string)
    pub(super) calls: Vec<(String, String, String)>,
}

impl Parts {
    pub(super) fn read(content: Option<&Value>) -> Parts {
        let mut out = Parts::default();
        let parts = content
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for part in parts {
            if let Some(call) = part.get("functionCall") {
                let args = call.get("args").cloned().unwrap_or_else(|| json!({}));
                out.calls.push((
                    call_id(str_field(call, "id"), str_field(part, "thoughtSignature")),
                    str_field(call, "name").unwrap_or("").to_string(),
                    args.to_string(),
                ));
            } else if let Some(t) = str_field(part, "text") {
                if part.get("thought").and_then(Value::as_bool) == Some(true) {
                    out.reasoning.push_str(t);
                } else {
                    out.text.push_str(t);
                }
            }
        }
        out
    }
}

/// The first candidate (Gemini answers one unless asked for more, which chat requests here
/// never do).
pub(super) fn first_candidate(body: &Value) -> Option<&Value> {
    body.get("candidates")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
}

/// Gemini `GenerateContentResponse` -> OpenAI `chat.completion`. A prompt Gemini blocked (no
/// candidate, `promptFeedback.blockReason`) is an empty answer finished by `content_filter`.
pub fn response(body: &Value, client_model: &str) -> Value {
    let id = str_field(body, "responseId")
        .map(|id| format!("chatcmpl-{id}"))
        .unwrap_or_else(|| random_id("chatcmpl-"));
    let candidate = first_candidate(body);
    let parts = Parts::read(candidate.and_then(|c| c.get("content")));
    let blocked = candidate.is_none()
        && body
            .get("promptFeedback")
            .and_then(|f| str_field(f, "blockReason"))
            .is_some();
    let finish = match candidate.and_then(|c| str_field(c, "finishReason")) {
        Some(r) => finish_reason(r, !parts.calls.is_empty()),
        None if blocked => "content_filter",
        None if !parts.calls.is_empty() => "tool_calls",
        None => "stop",
    };
    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    let content = if parts.text.is_empty() && !parts.calls.is_empty() {
        Value::Null
    } else {
        Value::String(parts.text)
    };
    message.insert("content".into(), content);
    if !parts.reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(parts.reasoning));
    }
    if !parts.calls.is_empty() {
        let calls: Vec<Value> = parts
            .calls
            .into_iter()
            .map(|(id, name, args)| {
                json!({ "id": id, "type": "function",
                        "function": { "name": name, "arguments": args } })
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    json!({
        "id": id,
        "object": "chat.completion",
        "created": now_unix(),
        "model": client_model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": usage(body.get("usageMetadata").unwrap_or(&Value::Null)),
    })
}

/// A Google RPC status (`error.status`) as an Anthropic error type, the vocabulary
/// [`anthropic_error_to_openai`] speaks.
fn status_kind(status: &str, code: u64) -> &'static str {
    match status {
        "INVALID_ARGUMENT" | "FAILED_PRECONDITION" | "OUT_OF_RANGE" => "invalid_request_error",
        "UNAUTHENTICATED" => "authentication_error",
        "PERMISSION_DENIED" => "permission_error",
        "NOT_FOUND" => "not_found_error",
        "RESOURCE_EXHAUSTED" => "rate_limit_error",
        "UNAVAILABLE" => "overloaded_error",
        "INTERNAL" | "UNKNOWN" | "DEADLINE_EXCEEDED" => "api_error",
        _ => match code {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        },
    }
}

/// A Google error body (`{"error":{"code","message","status"}}`, also wrapped in an array as
/// the streaming endpoint writes it) -> OpenAI error shape `{error:{message,type,code,param}}`.
/// Any other body keeps its text as the message.
pub fn error(body: &[u8]) -> Value {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let root = match &parsed {
        Some(Value::Array(items)) => items.first(),
        other => other.as_ref(),
    };
    let inner = root.and_then(|v| v.get("error"));
    let (kind, message) = match inner {
        Some(e @ Value::Object(_)) => (
            status_kind(
                str_field(e, "status").unwrap_or(""),
                e.get("code").and_then(Value::as_u64).unwrap_or(0),
            ),
            str_field(e, "message")
                .map(str::to_string)
                .unwrap_or_else(|| body_text(body)),
        ),
        Some(Value::String(s)) => ("api_error", s.clone()),
        _ => ("api_error", body_text(body)),
    };
    let message = if message.is_empty() {
        "upstream error".to_string()
    } else {
        message
    };
    json!({ "error": anthropic_error_to_openai(kind, &message) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_answer_with_thoughts_calls_and_usage() {
        let body = json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "Planning.", "thought": true},
                {"text": "Checking."},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                 "thoughtSignature": "U0lH"}]},
                "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 120, "candidatesTokenCount": 20,
                "thoughtsTokenCount": 50, "cachedContentTokenCount": 100, "totalTokenCount": 190},
            "modelVersion": "gemini-2.5-flash", "responseId": "resp-1"
        });
        let out = response(&body, "client-model");
        assert_eq!(out["id"], "chatcmpl-resp-1");
        assert_eq!(out["model"], "client-model");
        let choice = &out["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], "Checking.");
        assert_eq!(choice["message"]["reasoning_content"], "Planning.");
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert!(call["id"].as_str().unwrap().ends_with("~sig~U0lH"));
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens": 120, "completion_tokens": 70, "total_tokens": 190,
                   "prompt_tokens_details": {"cached_tokens": 100},
                   "completion_tokens_details": {"reasoning_tokens": 50}})
        );
    }

    #[test]
    fn blocked_prompts_and_odd_bodies_still_answer() {
        let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"},
                             "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7}});
        let out = response(&blocked, "m");
        assert_eq!(out["choices"][0]["finish_reason"], "content_filter");
        assert_eq!(out["choices"][0]["message"]["content"], "");
        assert_eq!(out["usage"]["prompt_tokens"], 7);
        for odd in [
            json!(null),
            json!([]),
            json!({"candidates": "x"}),
            json!({"candidates": [{}]}),
        ] {
            let out = response(&odd, "m");
            assert_eq!(out["choices"][0]["finish_reason"], "stop", "{odd}");
        }
        let out = response(
            &json!({"candidates": [{"content": {"parts": [{"text": "a"}]}, "finishReason": "MAX_TOKENS"}]}),
            "m",
        );
        assert_eq!(out["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn google_errors_become_openai_errors() {
        let cases = [
            (&br#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED"}}"#[..], "rate_limit_error", "rate_limit_exceeded"),
            (&br#"[{"error":{"code":400,"message":"bad","status":"INVALID_ARGUMENT"}}]"#[..], "invalid_request_error", "invalid_request"),
            (&br#"{"error":{"code":403,"message":"no","status":"PERMISSION_DENIED"}}"#[..], "permission_error", "permission_denied"),
            (&br#"{"error":{"code":503,"message":"busy","status":"UNAVAILABLE"}}"#[..], "server_error", "overloaded"),
            (&b"<html>bad gateway</html>"[..], "server_error", "api_error"),
        ];
        for (body, ty, code) in cases {
            let e = error(body);
            assert_eq!(e["error"]["type"], ty, "{}", String::from_utf8_lossy(body));
            assert_eq!(e["error"]["code"], code);
            assert!(!e["error"]["message"].as_str().unwrap().is_empty());
        }
    }
}
