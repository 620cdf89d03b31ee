//! Whole answers and error bodies.

use serde_json::{json, Value};

use super::request::blocks_text;
use crate::{
    args_to_object, body_text, openai_error_type_to_anthropic, random_id, str_field, u64_field,
};

/// Some OpenAI-compatible servers report `stop` even when the message carries tool
/// calls; Anthropic clients decide whether to run tools from `stop_reason`, so tool
/// calls win over a plain `stop`.
pub(super) fn stop_reason(finish_reason: Option<&str>, has_tools: bool) -> &'static str {
    match finish_reason {
        Some("length") => "max_tokens",
        Some("tool_calls") | Some("function_call") => "tool_use",
        Some("content_filter") => "end_turn",
        _ if has_tools => "tool_use",
        _ => "end_turn",
    }
}

/// Anthropic counts cached tokens separately from `input_tokens`; OpenAI includes them
/// in `prompt_tokens`.
pub(super) fn split_usage(usage: &Value) -> (u64, u64, u64) {
    let prompt = u64_field(usage, "prompt_tokens");
    let cached = usage
        .get("prompt_tokens_details")
        .map(|d| u64_field(d, "cached_tokens"))
        .unwrap_or(0);
    let output = u64_field(usage, "completion_tokens");
    (prompt.saturating_sub(cached), cached, output)
}

pub(super) fn message_id(openai_id: Option<&str>) -> String {
    match openai_id.filter(|s| !s.is_empty()) {
        Some(id) => format!("msg_{id}"),
        None => random_id("msg_"),
    }
}

/// OpenAI `chat.completion` -> Anthropic message. Only the first choice is used.
///
/// Reasoning text (`reasoning_content` or `reasoning`) becomes a leading thinking block
/// with an empty signature, which Anthropic SDKs accept and display; it is dropped
/// again if the client sends it back.
pub fn response(body: &Value, client_model: &str) -> Value {
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);

    let mut content = Vec::new();
    let reasoning = str_field(message, "reasoning_content")
        .or_else(|| str_field(message, "reasoning"))
        .unwrap_or("");
    if !reasoning.is_empty() {
        content.push(json!({ "type": "thinking", "thinking": reasoning, "signature": "" }));
    }
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(parts @ Value::Array(_)) => blocks_text(Some(parts), ""),
        _ => str_field(message, "refusal").unwrap_or("").to_string(),
    };
    if !text.is_empty() {
        content.push(json!({ "type": "text", "text": text }));
    }
    let mut has_tools = false;
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let function = call.get("function").unwrap_or(&Value::Null);
        has_tools = true;
        content.push(json!({
            "type": "tool_use",
            "id": str_field(call, "id").map(str::to_string).unwrap_or_else(|| random_id("toolu_")),
            "name": str_field(function, "name").unwrap_or(""),
            "input": args_to_object(function.get("arguments")),
        }));
    }

    let (input, cached, output) = split_usage(body.get("usage").unwrap_or(&Value::Null));
    json!({
        "id": message_id(str_field(body, "id")),
        "type": "message",
        "role": "assistant",
        "model": client_model,
        "content": content,
        "stop_reason": stop_reason(str_field(choice, "finish_reason"), has_tools),
        "stop_sequence": null,
        "usage": {
            "input_tokens": input,
            "cache_read_input_tokens": cached,
            "output_tokens": output,
        },
    })
}

/// Pulls `(error object or null, message)` out of the many error shapes OpenAI-style
/// providers use: `{error:{...}}`, `{error:"..."}`, `{message:"..."}`, `[{error:{...}}]`.
fn openai_error_parts(body: &[u8]) -> (Value, String) {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let root = match &parsed {
        Value::Array(items) => items.first().unwrap_or(&Value::Null),
        other => other,
    };
    match root.get("error") {
        Some(e @ Value::Object(_)) => {
            let msg = str_field(e, "message")
                .map(str::to_string)
                .unwrap_or_else(|| body_text(body));
            (e.clone(), msg)
        }
        Some(Value::String(s)) => (Value::Null, s.clone()),
        _ => match str_field(root, "message") {
            Some(m) => (root.clone(), m.to_string()),
            None => (Value::Null, body_text(body)),
        },
    }
}

/// OpenAI-style error body (status passed through) -> Anthropic error shape
/// `{"type":"error","error":{"type":..,"message":..}}`.
pub fn error(body: &[u8]) -> Value {
    let (err, message) = openai_error_parts(body);
    let message = if message.is_empty() {
        "upstream error".to_string()
    } else {
        message
    };
    json!({
        "type": "error",
        "error": { "type": openai_error_type_to_anthropic(&err), "message": message },
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn response_rules() {
        let cases: Vec<(&str, Value, Value, &str)> = vec![
            (
                "text stop",
                json!({"id": "chatcmpl-1", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]}),
                json!([{"type": "text", "text": "Hi"}]),
                "end_turn",
            ),
            (
                "length",
                json!({"choices": [{"message": {"content": "Hi"}, "finish_reason": "length"}]}),
                json!([{"type": "text", "text": "Hi"}]),
                "max_tokens",
            ),
            (
                "content_filter",
                json!({"choices": [{"message": {"content": null, "refusal": "no"}, "finish_reason": "content_filter"}]}),
                json!([{"type": "text", "text": "no"}]),
                "end_turn",
            ),
            (
                "tool calls with bad args and reasoning",
                json!({"choices": [{"message": {"content": "ok", "reasoning_content": "think",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{oops"}}]},
                    "finish_reason": "tool_calls"}]}),
                json!([{"type": "thinking", "thinking": "think", "signature": ""},
                       {"type": "text", "text": "ok"},
                       {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
                       {"type": "tool_use", "id": "call_2", "name": "g", "input": {}}]),
                "tool_use",
            ),
            (
                "legacy function_call finish",
                json!({"choices": [{"message": {"content": "x"}, "finish_reason": "function_call"}]}),
                json!([{"type": "text", "text": "x"}]),
                "tool_use",
            ),
            (
                "tool calls reported with stop still mean tool_use",
                json!({"choices": [{"message": {"tool_calls": [
                    {"id": "c", "function": {"name": "f", "arguments": "{}"}}]}, "finish_reason": "stop"}]}),
                json!([{"type": "tool_use", "id": "c", "name": "f", "input": {}}]),
                "tool_use",
            ),
            ("no choices", json!({"choices": []}), json!([]), "end_turn"),
            ("garbage", json!(17), json!([]), "end_turn"),
        ];
        for (name, input, want_content, want_stop) in cases {
            let got = response(&input, "claude-client");
            assert_eq!(got["type"], "message", "{name}");
            assert_eq!(got["role"], "assistant", "{name}");
            assert_eq!(got["model"], "claude-client", "{name}");
            assert_eq!(got["content"], want_content, "{name}");
            assert_eq!(got["stop_reason"], want_stop, "{name}");
            assert!(
                got["id"].as_str().is_some_and(|s| s.starts_with("msg_")),
                "{name}"
            );
        }
        let got = response(
            &json!({"id": "chatcmpl-9", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 7,
                    "total_tokens": 107, "prompt_tokens_details": {"cached_tokens": 60}}}),
            "c",
        );
        assert_eq!(got["id"], "msg_chatcmpl-9");
        assert_eq!(
            got["usage"],
            json!({"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 7})
        );
        // Cached > prompt (buggy provider) must not underflow.
        let got = response(
            &json!({"usage": {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 5}}}),
            "c",
        );
        assert_eq!(got["usage"]["input_tokens"], 0);
    }

    #[test]
    fn error_rules() {
        let cases: Vec<(&[u8], &str, &str)> = vec![
            (br#"{"error":{"message":"Incorrect API key","type":"invalid_request_error","code":"invalid_api_key"}}"#, "authentication_error", "Incorrect API key"),
            (br#"{"error":{"message":"bad","type":"invalid_request_error","param":"x","code":null}}"#, "invalid_request_error", "bad"),
            (br#"{"error":{"message":"slow","type":"requests","code":"rate_limit_exceeded"}}"#, "rate_limit_error", "slow"),
            (br#"{"error":{"message":"quota","type":"insufficient_quota"}}"#, "rate_limit_error", "quota"),
            (br#"{"error":{"message":"no model","type":"invalid_request_error","code":"model_not_found"}}"#, "not_found_error", "no model"),
            (br#"{"error":{"message":"denied","type":"permission_error"}}"#, "permission_error", "denied"),
            (br#"{"error":{"message":"boom","type":"server_error"}}"#, "api_error", "boom"),
            (br#"{"error":{"message":"busy","code":503}}"#, "overloaded_error", "busy"),
            (br#"[{"error":{"message":"gem","code":429}}]"#, "rate_limit_error", "gem"),
            (br#"{"error":"flat string"}"#, "api_error", "flat string"),
            (br#"{"message":"top level","type":"authentication_error"}"#, "authentication_error", "top level"),
            (b"upstream connect error", "api_error", "upstream connect error"),
            (b"", "api_error", "upstream error"),
        ];
        for (input, want_type, want_msg) in cases {
            let got = error(input);
            assert_eq!(
                got,
                json!({"type": "error", "error": {"type": want_type, "message": want_msg}}),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }
}
