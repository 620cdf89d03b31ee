//! The request direction.

use serde_json::{json, Map, Value};

use crate::{bad, str_field, u64_field, TranslateError};

/// Anthropic system prompts and tool results may be a string or a list of blocks; only
/// their text can be carried into an OpenAI string field.
pub(super) fn blocks_text(v: Option<&Value>, sep: &str) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter(|b| str_field(b, "type").unwrap_or("text") == "text")
            .filter_map(|b| str_field(b, "text"))
            .collect::<Vec<_>>()
            .join(sep),
        _ => String::new(),
    }
}

fn image_part(block: &Value) -> Option<Value> {
    let source = block.get("source")?;
    let url = match str_field(source, "type") {
        Some("base64") => format!(
            "data:{};base64,{}",
            str_field(source, "media_type").unwrap_or("image/png"),
            str_field(source, "data")?
        ),
        Some("url") => str_field(source, "url")?.to_string(),
        _ => return None,
    };
    Some(json!({ "type": "image_url", "image_url": { "url": url } }))
}

/// PDFs travel as OpenAI `file` parts; plain-text documents simply become text.
fn document_part(block: &Value) -> Option<Value> {
    let source = block.get("source")?;
    match str_field(source, "type") {
        Some("base64") => {
            let media_type = str_field(source, "media_type").unwrap_or("application/pdf");
            Some(json!({ "type": "file", "file": {
                "filename": str_field(block, "title").unwrap_or("document.pdf"),
                "file_data": format!("data:{media_type};base64,{}", str_field(source, "data")?),
            }}))
        }
        Some("text") => Some(json!({ "type": "text", "text": str_field(source, "data")? })),
        _ => None,
    }
}

/// Many OpenAI-compatible servers only accept string content, so text-only content is
/// flattened; parts are used only when an image or file forces it.
fn parts_to_content(parts: Vec<Value>) -> Value {
    if parts.iter().all(|p| str_field(p, "type") == Some("text")) {
        let texts: Vec<&str> = parts.iter().filter_map(|p| str_field(p, "text")).collect();
        Value::String(texts.join("\n"))
    } else {
        Value::Array(parts)
    }
}

/// One Anthropic user turn can become several OpenAI messages: each `tool_result` is
/// its own `tool` message, and OpenAI requires those to directly follow the assistant's
/// `tool_calls`, so they come before whatever the user wrote alongside them.
fn user_messages(content: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), TranslateError> {
    let blocks = match content {
        Value::String(s) => {
            out.push(json!({ "role": "user", "content": s }));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => {
            return Err(bad(format!(
                "messages[{i}].content must be a string or an array"
            )))
        }
    };
    let mut parts = Vec::new();
    for block in blocks {
        match str_field(block, "type") {
            Some("text") => {
                if let Some(t) = str_field(block, "text") {
                    parts.push(json!({ "type": "text", "text": t }));
                }
            }
            Some("image") => match image_part(block) {
                Some(p) => parts.push(p),
                None => log::debug!("dropping unrepresentable image block"),
            },
            Some("document") => match document_part(block) {
                Some(p) => parts.push(p),
                None => log::debug!("dropping unrepresentable document block"),
            },
            Some("tool_result") => {
                let id = str_field(block, "tool_use_id").ok_or_else(|| {
                    bad(format!("messages[{i}] tool_result is missing tool_use_id"))
                })?;
                let inner = block.get("content");
                // OpenAI tool messages are text-only; images ride along in the
                // following user message so the model still sees them.
                if let Some(Value::Array(items)) = inner {
                    parts.extend(items.iter().filter_map(|b| match str_field(b, "type") {
                        Some("image") => image_part(b),
                        _ => None,
                    }));
                }
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": id,
                    "content": blocks_text(inner, "\n"),
                }));
            }
            other => log::debug!("dropping user content block {other:?}"),
        }
    }
    if !parts.is_empty() {
        out.push(json!({ "role": "user", "content": parts_to_content(parts) }));
    }
    Ok(())
}

fn assistant_message(content: &Value, i: usize) -> Result<Option<Value>, TranslateError> {
    let blocks = match content {
        Value::String(s) => return Ok(Some(json!({ "role": "assistant", "content": s }))),
        Value::Array(b) => b,
        _ => {
            return Err(bad(format!(
                "messages[{i}].content must be a string or an array"
            )))
        }
    };
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match str_field(block, "type") {
            Some("text") => text.push_str(str_field(block, "text").unwrap_or("")),
            Some("tool_use") => {
                let id = str_field(block, "id")
                    .ok_or_else(|| bad(format!("messages[{i}] tool_use is missing id")))?;
                let name = str_field(block, "name")
                    .ok_or_else(|| bad(format!("messages[{i}] tool_use is missing name")))?;
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": { "name": name, "arguments": input.to_string() },
                }));
            }
            // Thinking carries an Anthropic-only signature; OpenAI providers can't use it.
            other => log::debug!("dropping assistant content block {other:?}"),
        }
    }
    if text.is_empty() && tool_calls.is_empty() {
        return Ok(None);
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    let content = if text.is_empty() {
        Value::Null
    } else {
        Value::String(text)
    };
    m.insert("content".into(), content);
    if !tool_calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    Ok(Some(Value::Object(m)))
}

/// Server tools (web search, code execution, computer use…) run inside Anthropic and
/// have no OpenAI function equivalent, so only client (custom) tools survive.
fn convert_tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter(|t| matches!(str_field(t, "type"), None | Some("custom")))
        .filter_map(|t| {
            let name = str_field(t, "name")?;
            let mut function = Map::new();
            function.insert("name".into(), json!(name));
            if let Some(d) = str_field(t, "description") {
                function.insert("description".into(), json!(d));
            }
            let params = t
                .get("input_schema")
                .filter(|s| s.is_object())
                .cloned()
                .unwrap_or_else(|| json!({ "type": "object", "properties": {} }));
            function.insert("parameters".into(), params);
            Some(json!({ "type": "function", "function": function }))
        })
        .collect()
}

fn convert_tool_choice(choice: &Value) -> Option<Value> {
    match str_field(choice, "type")? {
        "auto" => Some(json!("auto")),
        "any" => Some(json!("required")),
        "none" => Some(json!("none")),
        "tool" => {
            Some(json!({ "type": "function", "function": { "name": str_field(choice, "name")? } }))
        }
        _ => None,
    }
}

fn reasoning_effort(budget: u64) -> &'static str {
    match budget {
        0..=2048 => "low",
        2049..=8192 => "medium",
        _ => "high",
    }
}

/// The top-level fields of a messages request this translation reads; any other (a newer
/// Anthropic feature, `top_k`, `service_tier`…) has no OpenAI equivalent and is dropped.
const CARRIED: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "temperature",
    "top_p",
    "stop_sequences",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "stream",
];

/// Anthropic /v1/messages body -> OpenAI chat request. `upstream_model` replaces
/// `model`. When `stream` is true, `stream_options.include_usage` is forced on because
/// Anthropic clients expect token counts in `message_delta`.
///
/// A `system` turn inside `messages` stays a system message at its place. `top_k`,
/// `cache_control`, thinking blocks, server tools and unknown fields are dropped (never
/// refused): OpenAI-style providers have no equivalent. A thinking budget becomes `reasoning_effort`
/// (≤2048 low, ≤8192 medium, else high).
pub fn request(body: &Value, upstream_model: &str) -> Result<Value, TranslateError> {
    let (obj, messages) = crate::body_messages(body)?;

    let mut out_messages = Vec::new();
    let system = blocks_text(obj.get("system"), "\n");
    if !system.is_empty() {
        out_messages.push(json!({ "role": "system", "content": system }));
    }
    for (i, m) in messages.iter().enumerate() {
        let content = m.get("content").unwrap_or(&Value::Null);
        match str_field(m, "role") {
            Some("user") => user_messages(content, i, &mut out_messages)?,
            Some("assistant") => {
                if let Some(msg) = assistant_message(content, i)? {
                    out_messages.push(msg);
                }
            }
            // Agents insert instructions mid-conversation; OpenAI providers take a system
            // message anywhere, so it stays where the client put it.
            Some("system") => {
                let text = blocks_text(Some(content), "\n");
                if !text.is_empty() {
                    out_messages.push(json!({ "role": "system", "content": text }));
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "messages[{i}].role {other:?} is not supported"
                )))
            }
            None => return Err(bad(format!("messages[{i}].role is missing"))),
        }
    }
    if messages.is_empty() {
        return Err(bad("`messages` must not be empty"));
    }

    crate::log_dropped(obj, CARRIED);
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("messages".into(), Value::Array(out_messages));
    if let Some(n) = obj.get("max_tokens").and_then(Value::as_u64) {
        out.insert("max_tokens".into(), json!(n));
    }
    for key in ["temperature", "top_p"] {
        if let Some(x) = obj.get(key).filter(|x| x.is_number()) {
            out.insert(key.into(), x.clone());
        }
    }
    if let Some(stops) = obj.get("stop_sequences").and_then(Value::as_array) {
        let stops: Vec<&str> = stops.iter().filter_map(Value::as_str).collect();
        if !stops.is_empty() {
            out.insert("stop".into(), json!(stops));
        }
    }
    let tools = obj
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| convert_tools(t))
        .unwrap_or_default();
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = obj.get("tool_choice") {
            if let Some(c) = convert_tool_choice(choice) {
                out.insert("tool_choice".into(), c);
            }
            if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
                out.insert("parallel_tool_calls".into(), json!(false));
            }
        }
    }
    if let Some(thinking) = obj.get("thinking") {
        if str_field(thinking, "type") == Some("enabled") {
            let budget = u64_field(thinking, "budget_tokens");
            out.insert("reasoning_effort".into(), json!(reasoning_effort(budget)));
        }
    }
    if let Some(user) = obj
        .get("metadata")
        .and_then(|m| str_field(m, "user_id"))
        .filter(|u| !u.is_empty())
    {
        out.insert("user".into(), json!(user));
    }
    if let Some(stream) = obj.get("stream").and_then(Value::as_bool) {
        out.insert("stream".into(), json!(stream));
        if stream {
            out.insert("stream_options".into(), json!({ "include_usage": true }));
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {

    use super::*;

    fn req(body: Value) -> Value {
        request(&body, "gpt-up").expect("request translates")
    }

    #[test]
    fn request_rules() {
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "minimal",
                json!({"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}),
                json!({"model": "gpt-up", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}),
            ),
            (
                "system string, sampling, stop, metadata, stream",
                json!({"system": "be brief", "max_tokens": 10, "temperature": 0.3, "top_p": 0.8, "top_k": 5,
                       "stop_sequences": ["END"], "metadata": {"user_id": "u1"}, "stream": true,
                       "messages": [{"role": "user", "content": "hi"}]}),
                json!({"model": "gpt-up", "max_tokens": 10, "temperature": 0.3, "top_p": 0.8,
                       "stop": ["END"], "user": "u1", "stream": true, "stream_options": {"include_usage": true},
                       "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}),
            ),
            (
                "system blocks joined, text-only blocks flattened to a string",
                json!({"system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "b"}],
                       "stream": false,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}]}),
                json!({"model": "gpt-up", "stream": false,
                       "messages": [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "x\ny"}]}),
            ),
            (
                "images become image_url parts",
                json!({"messages": [{"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
                    {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                    {"type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64,JVBE"}}]}]}),
            ),
            (
                "tool_use -> tool_calls, tool_result -> tool messages before user text",
                json!({"messages": [
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "text", "text": "also this"},
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true, "content": [
                            {"type": "text", "text": "failed"},
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QQ"}}]}]}]}),
                json!({"model": "gpt-up", "messages": [
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": "Checking.", "tool_calls": [
                        {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "toolu_2", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                    {"role": "tool", "tool_call_id": "toolu_2", "content": "failed"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "also this"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ"}}]}]}),
            ),
            (
                "assistant with only tool_use has null content; user turn of only results has no user message",
                json!({"messages": [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": [1]}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}),
                json!({"model": "gpt-up", "messages": [
                    {"role": "user", "content": "go"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{\"a\":[1]}"}}]},
                    {"role": "tool", "tool_call_id": "t", "content": ""}]}),
            ),
            (
                "tools and tool_choice any; server tools dropped",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [
                           {"name": "w", "description": "Weather", "input_schema": {"type": "object", "properties": {"c": {"type": "string"}}}},
                           {"type": "custom", "name": "n"},
                           {"type": "web_search_20250305", "name": "web_search"}],
                       "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [
                           {"type": "function", "function": {"name": "w", "description": "Weather",
                             "parameters": {"type": "object", "properties": {"c": {"type": "string"}}}}},
                           {"type": "function", "function": {"name": "n", "parameters": {"type": "object", "properties": {}}}}],
                       "tool_choice": "required", "parallel_tool_calls": false}),
            ),
            (
                "tool_choice tool / auto / none",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"name": "w", "input_schema": {"type": "object"}}],
                       "tool_choice": {"type": "tool", "name": "w"}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
                       "tool_choice": {"type": "function", "function": {"name": "w"}}}),
            ),
            (
                "tool_choice auto",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"name": "w", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
                       "tool_choice": "auto"}),
            ),
            (
                "tool_choice none",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"name": "w", "input_schema": {"type": "object"}}], "tool_choice": {"type": "none"}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
                       "tool_choice": "none"}),
            ),
            (
                "thinking budget low",
                json!({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "enabled", "budget_tokens": 2048}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}),
            ),
            (
                "thinking budget medium",
                json!({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "enabled", "budget_tokens": 8192}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "medium"}),
            ),
            (
                "thinking budget high",
                json!({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "enabled", "budget_tokens": 8193}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"}),
            ),
            (
                "thinking disabled",
                json!({"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "disabled"}}),
                json!({"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}]}),
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(req(input), want, "case: {name}");
        }
    }

    #[test]
    fn request_rejects_bad_input() {
        let cases = vec![
            json!(null),
            json!({"model": "x"}),
            json!({"messages": []}),
            json!({"messages": [{"role": "tool", "content": "s"}]}),
            json!({"messages": [{"content": "s"}]}),
            json!({"messages": [{"role": "user", "content": 3}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}),
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]}),
        ];
        for input in cases {
            assert!(request(&input, "m").is_err(), "{input}");
        }
    }

    #[test]
    fn agent_features_carry_or_drop_but_never_refuse() {
        let sent = req(json!({
            "model": "claude-x", "max_tokens": 10,
            "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
                {"role": "system", "content": "reminder"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "xx"},
                    {"type": "text", "text": "b"}]},
                {"role": "system", "content": [{"type": "text", "text": "late"}]},
                {"role": "user", "content": "c"}],
            "context_management": {"edits": []}, "service_tier": "auto", "top_k": 3,
            "brand_new_field": {"x": 1}}));
        assert_eq!(
            sent,
            json!({"model": "gpt-up", "max_tokens": 10, "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "a"},
                {"role": "system", "content": "reminder"},
                {"role": "assistant", "content": "b"},
                {"role": "system", "content": "late"},
                {"role": "user", "content": "c"}]})
        );
    }
}
