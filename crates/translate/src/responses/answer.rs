//! Whole answers: a chat completion or an Anthropic message as a Responses object.

use serde_json::{json, Value};

use super::{call_item, message_item, reasoning_item, response_object, set, usage};
use crate::{chat_to_messages, now_unix, random_id, str_field, u64_field};

/// Chat `finish_reason` -> Responses status and incomplete reason.
fn status(finish_reason: Option<&str>) -> (&'static str, Option<&'static str>) {
    match finish_reason {
        Some("length") => ("incomplete", Some("max_output_tokens")),
        Some("content_filter") => ("incomplete", Some("content_filter")),
        _ => ("completed", None),
    }
}

/// Reasoning output items for a chat message: one per signed thinking block when the
/// provider was Anthropic-style, else one for the plain reasoning text.
fn reasoning_items(message: &Value) -> Vec<Value> {
    let blocks = message
        .get("thinking_blocks")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let signed: Vec<Value> = blocks
        .iter()
        .filter(|b| str_field(b, "type") == Some("thinking"))
        .map(|b| {
            reasoning_item(
                &super::item_id("rs_"),
                str_field(b, "thinking").unwrap_or(""),
                str_field(b, "signature"),
            )
        })
        .collect();
    if !signed.is_empty() {
        return signed;
    }
    let text = str_field(message, "reasoning_content")
        .or_else(|| str_field(message, "reasoning"))
        .unwrap_or("");
    if text.is_empty() {
        return Vec::new();
    }
    vec![reasoning_item(&super::item_id("rs_"), text, None)]
}

/// Chat completion -> Responses object. `client_model` is echoed as `model`.
pub fn from_chat(body: &Value, client_model: &str) -> Value {
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .unwrap_or(&Value::Null);
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut output = reasoning_items(message);
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| str_field(p, "text"))
            .collect::<String>(),
        _ => String::new(),
    };
    if !text.is_empty() {
        output.push(message_item(&super::item_id("msg_"), &text, "completed"));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let function = call.get("function").unwrap_or(&Value::Null);
        let arguments = match function.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(v @ Value::Object(_)) => v.to_string(),
            _ => "{}".to_string(),
        };
        output.push(call_item(
            &super::item_id("fc_"),
            str_field(call, "id").unwrap_or(""),
            str_field(function, "name").unwrap_or(""),
            &arguments,
            "completed",
        ));
    }

    let id = match str_field(body, "id").filter(|s| !s.is_empty()) {
        Some(id) => format!("resp_{id}"),
        None => random_id("resp_"),
    };
    let (status, reason) = status(str_field(choice, "finish_reason"));
    let mut out = response_object(&id, now_unix(), client_model, status);
    if let Some(reason) = reason {
        set(&mut out, "incomplete_details", json!({ "reason": reason }));
    }
    set(&mut out, "output", Value::Array(output));
    if let Some(u) = body.get("usage").filter(|u| u.is_object()) {
        let detail = |key: &str, field: &str| u.get(key).map(|d| u64_field(d, field)).unwrap_or(0);
        set(
            &mut out,
            "usage",
            usage(
                u64_field(u, "prompt_tokens"),
                detail("prompt_tokens_details", "cached_tokens"),
                u64_field(u, "completion_tokens"),
                detail("completion_tokens_details", "reasoning_tokens"),
            ),
        );
    }
    out
}

/// Anthropic message -> Responses object, read as a chat answer first
/// ([`chat_to_messages::response`] keeps the signed thinking in `thinking_blocks`).
pub fn from_messages(body: &Value, client_model: &str) -> Value {
    let chat = chat_to_messages::response(body, client_model);
    let mut out = from_chat(&chat, client_model);
    if let Some(id) = str_field(body, "id").filter(|s| !s.is_empty()) {
        set(&mut out, "id", json!(format!("resp_{id}")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn without_ids(mut v: Value) -> Value {
        if let Some(items) = v["output"].as_array_mut() {
            for item in items {
                item["id"] = json!("-");
            }
        }
        v["created_at"] = json!(0);
        v
    }

    #[test]
    fn anthropic_answer_with_thinking_text_and_tool() {
        let body = json!({"id": "msg_1", "content": [
            {"type": "thinking", "thinking": "plan", "signature": "sig"},
            {"type": "text", "text": "Running ls."},
            {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"command": ["ls"]}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 24}});
        assert_eq!(
            without_ids(from_messages(&body, "claude-x")),
            json!({"id": "resp_msg_1", "object": "response", "created_at": 0, "status": "completed",
                   "error": null, "incomplete_details": null, "model": "claude-x",
                   "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
                   "output": [
                       {"id": "-", "type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
                        "encrypted_content": "gw-anthropic-signature:sig"},
                       {"id": "-", "type": "message", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "Running ls.", "annotations": []}]},
                       {"id": "-", "type": "function_call", "status": "completed", "call_id": "toolu_1",
                        "name": "shell", "arguments": "{\"command\":[\"ls\"]}"}],
                   "usage": {"input_tokens": 25, "input_tokens_details": {"cached_tokens": 5},
                             "output_tokens": 24, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 49}})
        );
    }

    #[test]
    fn chat_answer_cut_by_length_and_reasoning_tokens() {
        let body = json!({"id": "c1", "choices": [{"message": {"role": "assistant", "content": "par",
            "reasoning_content": "hm"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 25, "completion_tokens": 24, "prompt_tokens_details": {"cached_tokens": 5},
                      "completion_tokens_details": {"reasoning_tokens": 7}}});
        let v = from_chat(&body, "gpt-x");
        assert_eq!(v["id"], "resp_c1");
        assert_eq!(v["status"], "incomplete");
        assert_eq!(
            v["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(v["output"][0]["type"], "reasoning");
        assert!(v["output"][0].get("encrypted_content").is_none());
        assert_eq!(v["output"][1]["content"][0]["text"], "par");
        assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 7);
        assert_eq!(v["usage"]["input_tokens"], 25);
        // Garbage never panics and still has the Responses shape.
        for junk in [
            json!(null),
            json!([]),
            json!({"choices": 3}),
            json!({"content": "x"}),
        ] {
            assert_eq!(from_chat(&junk, "m")["object"], "response");
            assert_eq!(from_messages(&junk, "m")["object"], "response");
        }
    }
}
