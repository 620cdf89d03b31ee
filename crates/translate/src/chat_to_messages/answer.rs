//! Whole answers and error bodies.

use serde_json::{json, Map, Value};

use crate::{anthropic_error_to_openai, body_text, now_unix, random_id, str_field, u64_field};

pub(super) fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// OpenAI counts cached tokens inside `prompt_tokens`; Anthropic reports them
/// separately, so they are added back.
pub(super) fn openai_usage(input: u64, cache_read: u64, cache_creation: u64, output: u64) -> Value {
    let prompt = input
        .saturating_add(cache_read)
        .saturating_add(cache_creation);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt.saturating_add(output),
        "prompt_tokens_details": { "cached_tokens": cache_read },
    })
}

/// Anthropic non-stream response -> OpenAI `chat.completion` object. `client_model` is
/// echoed in `model` so clients see the name they asked for.
///
/// Thinking text is exposed as the non-standard `message.reasoning_content`, the field
/// most OpenAI-compatible reasoning clients read, and the blocks themselves, signatures
/// included, as `message.thinking_blocks`: a client that sends them back with the
/// assistant turn keeps Anthropic's extended thinking working across tool calls.
pub fn response(body: &Value, client_model: &str) -> Value {
    let id = str_field(body, "id")
        .map(|id| format!("chatcmpl-{id}"))
        .unwrap_or_else(|| random_id("chatcmpl-"));
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    let mut thinking_blocks = Vec::new();
    for block in body
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        match str_field(block, "type") {
            Some("text") => text.push_str(str_field(block, "text").unwrap_or("")),
            Some("thinking") => {
                reasoning.push_str(str_field(block, "thinking").unwrap_or(""));
                thinking_blocks.push(block.clone());
            }
            Some("redacted_thinking") => thinking_blocks.push(block.clone()),
            Some("tool_use") => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": str_field(block, "id").unwrap_or(""),
                    "type": "function",
                    "function": {
                        "name": str_field(block, "name").unwrap_or(""),
                        "arguments": input.to_string(),
                    },
                }));
            }
            _ => {}
        }
    }
    let finish = match str_field(body, "stop_reason") {
        Some(r) => finish_reason(r),
        None if !tool_calls.is_empty() => "tool_calls",
        None => "stop",
    };

    let mut message = Map::new();
    message.insert("role".into(), json!("assistant"));
    let content = if text.is_empty() && !tool_calls.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    message.insert("content".into(), content);
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    if !thinking_blocks.is_empty() {
        message.insert("thinking_blocks".into(), Value::Array(thinking_blocks));
    }
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }

    let usage = body.get("usage").unwrap_or(&Value::Null);
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
        "usage": openai_usage(
            u64_field(usage, "input_tokens"),
            u64_field(usage, "cache_read_input_tokens"),
            u64_field(usage, "cache_creation_input_tokens"),
            u64_field(usage, "output_tokens"),
        ),
    })
}

/// Anthropic error body (the gateway passes the status through) -> OpenAI error shape
/// `{error:{message,type,code,param}}`. Non-JSON bodies (proxies, load balancers) keep
/// their text as the message.
pub fn error(body: &[u8]) -> Value {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let inner = parsed.as_ref().and_then(|v| v.get("error"));
    let (kind, message) = match inner {
        Some(e @ Value::Object(_)) => (
            str_field(e, "type").unwrap_or("api_error").to_string(),
            str_field(e, "message")
                .map(str::to_string)
                .unwrap_or_else(|| body_text(body)),
        ),
        Some(Value::String(s)) => ("api_error".to_string(), s.clone()),
        _ => ("api_error".to_string(), body_text(body)),
    };
    let message = if message.is_empty() {
        "upstream error".to_string()
    } else {
        message
    };
    json!({ "error": anthropic_error_to_openai(&kind, &message) })
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn response_rules() {
        let cases: Vec<(&str, Value, Value, Value)> = vec![
            (
                "text, end_turn, usage with cache",
                json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-up",
                       "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " world"}],
                       "stop_reason": "end_turn",
                       "usage": {"input_tokens": 10, "output_tokens": 5,
                                 "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}}),
                json!({"role": "assistant", "content": "Hello world"}),
                json!("stop"),
            ),
            (
                "tool_use with thinking",
                json!({"id": "msg_2", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}}],
                    "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}}),
                json!({"role": "assistant", "content": null, "reasoning_content": "hmm",
                       "thinking_blocks": [{"type": "thinking", "thinking": "hmm", "signature": "sig"}],
                       "tool_calls": [{"id": "toolu_1", "type": "function",
                                       "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}}]}),
                json!("tool_calls"),
            ),
            (
                "max_tokens -> length",
                json!({"id": "m", "content": [{"type": "text", "text": "x"}], "stop_reason": "max_tokens"}),
                json!({"role": "assistant", "content": "x"}),
                json!("length"),
            ),
            (
                "stop_sequence -> stop",
                json!({"id": "m", "content": [], "stop_reason": "stop_sequence", "stop_sequence": "END"}),
                json!({"role": "assistant", "content": ""}),
                json!("stop"),
            ),
            (
                "refusal -> content_filter",
                json!({"id": "m", "content": [], "stop_reason": "refusal"}),
                json!({"role": "assistant", "content": ""}),
                json!("content_filter"),
            ),
            (
                "garbage body still yields a chat.completion",
                json!("nonsense"),
                json!({"role": "assistant", "content": ""}),
                json!("stop"),
            ),
        ];
        for (name, input, want_message, want_finish) in cases {
            let got = response(&input, "gpt-client");
            assert_eq!(got["object"], "chat.completion", "{name}");
            assert_eq!(got["model"], "gpt-client", "{name}");
            assert!(
                got["created"].as_u64().is_some_and(|c| c > 1_600_000_000),
                "{name}"
            );
            assert_eq!(got["choices"][0]["message"], want_message, "{name}");
            assert_eq!(got["choices"][0]["finish_reason"], want_finish, "{name}");
            assert_eq!(got["choices"][0]["index"], 0, "{name}");
        }
        let got = response(
            &json!({"id": "msg_1", "content": [], "stop_reason": "end_turn",
                    "usage": {"input_tokens": 10, "output_tokens": 5,
                              "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}}),
            "gpt-client",
        );
        assert_eq!(got["id"], "chatcmpl-msg_1");
        assert_eq!(
            got["usage"],
            json!({"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135,
                   "prompt_tokens_details": {"cached_tokens": 100}})
        );
        assert!(response(&json!({}), "m")["id"]
            .as_str()
            .is_some_and(|s| s.starts_with("chatcmpl-")));
    }

    #[test]
    fn error_rules() {
        let cases: Vec<(&[u8], Value)> = vec![
            (
                br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
                json!({"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limit_exceeded", "param": null}}),
            ),
            (
                br#"{"type":"error","error":{"type":"authentication_error","message":"bad key"}}"#,
                json!({"error": {"message": "bad key", "type": "authentication_error", "code": "invalid_api_key", "param": null}}),
            ),
            (
                br#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
                json!({"error": {"message": "bad", "type": "invalid_request_error", "code": "invalid_request", "param": null}}),
            ),
            (
                br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
                json!({"error": {"message": "busy", "type": "server_error", "code": "overloaded", "param": null}}),
            ),
            (
                br#"{"type":"error","error":{"type":"not_found_error","message":"no model"}}"#,
                json!({"error": {"message": "no model", "type": "not_found_error", "code": "not_found", "param": null}}),
            ),
            (
                br#"{"type":"error","error":{"type":"permission_error","message":"no"}}"#,
                json!({"error": {"message": "no", "type": "permission_error", "code": "permission_denied", "param": null}}),
            ),
            (
                br#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
                json!({"error": {"message": "boom", "type": "server_error", "code": "api_error", "param": null}}),
            ),
            (
                b"<html>502 Bad Gateway</html>",
                json!({"error": {"message": "<html>502 Bad Gateway</html>", "type": "server_error", "code": "api_error", "param": null}}),
            ),
            (
                b"",
                json!({"error": {"message": "upstream error", "type": "server_error", "code": "api_error", "param": null}}),
            ),
            (
                br#"{"error":"plain"}"#,
                json!({"error": {"message": "plain", "type": "server_error", "code": "api_error", "param": null}}),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(error(input), want, "{}", String::from_utf8_lossy(input));
        }
    }
}
