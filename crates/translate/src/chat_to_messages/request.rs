//! The request direction.

use serde_json::{json, Map, Value};

use crate::{args_to_object, bad, chat_messages, opt_u64, push_merged, str_field, TranslateError};

/// Thinking budgets per OpenAI `reasoning_effort`. 1024 is Anthropic's minimum budget.
fn effort_budget(effort: &str) -> Option<u64> {
    match effort {
        "low" => Some(1024),
        "medium" => Some(4096),
        "high" | "xhigh" => Some(16384),
        _ => None,
    }
}

/// Flattens OpenAI content (string or array of parts) into plain text; used where
/// Anthropic only accepts text (the system prompt).
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                _ => str_field(p, "text").or_else(|| str_field(p, "refusal")),
            })
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// Anthropic rejects `data:` URLs as image URLs, so they must be unpacked into a
/// base64 source; only base64 payloads can be represented.
fn data_url_source(url: &str) -> Result<Value, TranslateError> {
    let rest = url.get(5..).unwrap_or("");
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| bad("malformed data: URL in image_url"))?;
    let media_type = meta
        .strip_suffix(";base64")
        .ok_or_else(|| bad("only base64 data: URLs are supported for images"))?;
    let media_type = if media_type.is_empty() {
        "image/png"
    } else {
        media_type
    };
    Ok(json!({ "type": "base64", "media_type": media_type, "data": data }))
}

fn image_block(part: &Value) -> Result<Value, TranslateError> {
    let url = match part.get("image_url") {
        Some(Value::String(s)) => s.as_str(),
        Some(obj) => str_field(obj, "url").unwrap_or(""),
        None => "",
    };
    let source = if url.starts_with("data:") {
        data_url_source(url)?
    } else if url.starts_with("https://") || url.starts_with("http://") {
        json!({ "type": "url", "url": url })
    } else {
        return Err(bad("image_url.url must be an http(s) or base64 data: URL"));
    };
    Ok(json!({ "type": "image", "source": source }))
}

/// OpenAI `file` parts carry PDFs as data URLs; Anthropic takes them as document
/// blocks. File ids refer to OpenAI's storage and cannot be represented.
fn file_block(part: &Value) -> Option<Value> {
    let data = part.get("file").and_then(|f| str_field(f, "file_data"))?;
    match data_url_source(data) {
        Ok(source) => Some(json!({ "type": "document", "source": source })),
        Err(_) => None,
    }
}

/// Converts OpenAI content to Anthropic blocks. Empty text is dropped because Anthropic
/// rejects empty text blocks.
fn content_blocks(content: Option<&Value>) -> Result<Vec<Value>, TranslateError> {
    let mut blocks = Vec::new();
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            if !s.is_empty() {
                blocks.push(text_block(s));
            }
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                match str_field(part, "type").unwrap_or("text") {
                    "text" | "input_text" | "output_text" => {
                        if let Some(t) = str_field(part, "text").filter(|t| !t.is_empty()) {
                            blocks.push(text_block(t));
                        }
                    }
                    "refusal" => {
                        if let Some(t) = str_field(part, "refusal").filter(|t| !t.is_empty()) {
                            blocks.push(text_block(t));
                        }
                    }
                    "image_url" => blocks.push(image_block(part)?),
                    "file" => match file_block(part) {
                        Some(b) => blocks.push(b),
                        None => log::debug!("dropping unrepresentable file content part"),
                    },
                    other => log::debug!("dropping unsupported content part type {other:?}"),
                }
            }
        }
        Some(_) => return Err(bad("message content must be a string or an array")),
    }
    Ok(blocks)
}

/// Signed thinking from an earlier answer, sent back in `thinking_blocks` (the field this
/// gateway's chat answers and other OpenAI-compatible gateways use). Anthropic needs them,
/// signature intact, before the tool use they led to; unsigned reasoning cannot be verified
/// by Anthropic and is dropped.
fn thinking_blocks(m: &Value) -> Vec<Value> {
    let Some(blocks) = m.get("thinking_blocks").and_then(Value::as_array) else {
        return Vec::new();
    };
    blocks
        .iter()
        .filter_map(|b| match str_field(b, "type") {
            Some("thinking") => {
                let signature = str_field(b, "signature").filter(|s| !s.is_empty())?;
                Some(json!({
                    "type": "thinking",
                    "thinking": str_field(b, "thinking").unwrap_or(""),
                    "signature": signature,
                }))
            }
            Some("redacted_thinking") => {
                let data = str_field(b, "data").filter(|d| !d.is_empty())?;
                Some(json!({ "type": "redacted_thinking", "data": data }))
            }
            _ => None,
        })
        .collect()
}

fn assistant_blocks(m: &Value, i: usize) -> Result<Vec<Value>, TranslateError> {
    let mut blocks = thinking_blocks(m);
    blocks.extend(content_blocks(m.get("content"))?);
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for (j, call) in calls.iter().enumerate() {
            let id = str_field(call, "id")
                .ok_or_else(|| bad(format!("messages[{i}].tool_calls[{j}].id is missing")))?;
            let function = call.get("function").unwrap_or(&Value::Null);
            let name = str_field(function, "name").ok_or_else(|| {
                bad(format!(
                    "messages[{i}].tool_calls[{j}].function.name is missing"
                ))
            })?;
            blocks.push(json!({
                "type": "tool_use",
                "id": id,
                "name": name,
                "input": args_to_object(function.get("arguments")),
            }));
        }
    }
    Ok(blocks)
}

fn tool_result_block(m: &Value, i: usize) -> Result<Value, TranslateError> {
    let id = str_field(m, "tool_call_id")
        .ok_or_else(|| bad(format!("messages[{i}].tool_call_id is missing")))?;
    let mut block = Map::new();
    block.insert("type".into(), json!("tool_result"));
    block.insert("tool_use_id".into(), json!(id));
    match m.get("content") {
        Some(Value::String(s)) if !s.is_empty() => {
            block.insert("content".into(), json!(s));
        }
        Some(c @ Value::Array(_)) => {
            let inner = content_blocks(Some(c))?;
            if !inner.is_empty() {
                block.insert("content".into(), Value::Array(inner));
            }
        }
        _ => {}
    }
    Ok(Value::Object(block))
}

fn convert_tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter_map(|t| {
            let kind = str_field(t, "type").unwrap_or("function");
            let function = t.get("function");
            let (true, Some(function)) = (kind == "function", function) else {
                log::debug!("dropping non-function tool of type {kind:?}");
                return None;
            };
            let name = str_field(function, "name")?;
            let mut schema = match function.get("parameters") {
                Some(Value::Object(p)) => p.clone(),
                _ => Map::new(),
            };
            // Anthropic insists on an object schema; OpenAI allows omitting it.
            schema
                .entry("type")
                .or_insert_with(|| Value::String("object".into()));
            if schema.get("type").and_then(Value::as_str) == Some("object") {
                schema
                    .entry("properties")
                    .or_insert_with(|| Value::Object(Map::new()));
            }
            let mut tool = Map::new();
            tool.insert("name".into(), json!(name));
            if let Some(d) = str_field(function, "description") {
                tool.insert("description".into(), json!(d));
            }
            tool.insert("input_schema".into(), Value::Object(schema));
            Some(Value::Object(tool))
        })
        .collect()
}

fn convert_tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(s) => match s.as_str() {
            "auto" => Some(json!({ "type": "auto" })),
            "none" => Some(json!({ "type": "none" })),
            "required" => Some(json!({ "type": "any" })),
            _ => None,
        },
        Value::Object(_) => {
            let name = choice.get("function").and_then(|f| str_field(f, "name"))?;
            Some(json!({ "type": "tool", "name": name }))
        }
        _ => None,
    }
}

/// The top-level fields of a chat request this translation reads; any other has no
/// Anthropic equivalent (or is newer than this translation) and is dropped.
const CARRIED: &[&str] = &[
    "model",
    "messages",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stream",
    "stream_options",
    "user",
];

/// OpenAI chat request body -> Anthropic /v1/messages body. `upstream_model` replaces
/// `model`. `default_max_tokens` is used when the client gave neither `max_tokens` nor
/// `max_completion_tokens` (Anthropic requires one, OpenAI does not).
///
/// Decisions a caller should know:
/// - `reasoning_effort` low/medium/high becomes a thinking budget of 1024/4096/16384;
///   when `max_tokens` does not exceed the budget it is raised to `budget + max_tokens`
///   so the visible answer keeps the room the client asked for.
/// - With thinking on, `temperature`/`top_p`/`top_k` are dropped (Anthropic rejects
///   them), and a forced tool choice (`required` or a named function) wins over
///   thinking, which is then left off (Anthropic rejects the combination).
/// - `temperature` is clamped to Anthropic's 0..=1 range.
/// - `n` > 1 is rejected: silently returning one choice would break the client.
/// - `response_format`, penalties, `seed`, `logprobs`, `logit_bias` and other options
///   Anthropic has no equivalent for are dropped.
pub fn request(
    body: &Value,
    upstream_model: &str,
    default_max_tokens: u64,
) -> Result<Value, TranslateError> {
    let (obj, messages) = chat_messages(body)?;

    let mut system = Vec::new();
    let mut convo: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role =
            str_field(m, "role").ok_or_else(|| bad(format!("messages[{i}].role is missing")))?;
        match role {
            "system" | "developer" => {
                let text = content_text(m.get("content"));
                if !text.is_empty() {
                    system.push(text);
                }
            }
            "user" => push_merged(&mut convo, "user", content_blocks(m.get("content"))?),
            "assistant" => push_merged(&mut convo, "assistant", assistant_blocks(m, i)?),
            "tool" => push_merged(&mut convo, "user", vec![tool_result_block(m, i)?]),
            "function" => log::debug!("dropping legacy function-role message"),
            other => {
                return Err(bad(format!(
                    "messages[{i}].role {other:?} is not supported"
                )))
            }
        }
    }

    // Anthropic wants tool results first in their user turn, right after the tool_use.
    for (role, blocks) in &mut convo {
        if *role == "user" {
            blocks.sort_by_key(|b| str_field(b, "type") != Some("tool_result"));
        }
    }
    // Anthropic rejects a final (prefill) assistant turn ending in whitespace.
    if let Some(("assistant", blocks)) = convo.last_mut() {
        if let Some(Value::Object(last)) = blocks.last_mut() {
            if let Some(Value::String(t)) = last.get_mut("text") {
                let trimmed = t.trim_end().len();
                t.truncate(trimmed);
            }
        }
        blocks.retain(|b| str_field(b, "text") != Some(""));
        if blocks.is_empty() {
            convo.pop();
        }
    }
    if convo.is_empty() {
        return Err(bad(
            "`messages` must contain at least one non-system message",
        ));
    }

    crate::log_dropped(obj, CARRIED);
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert(
        "messages".into(),
        Value::Array(
            convo
                .into_iter()
                .map(|(role, content)| json!({ "role": role, "content": content }))
                .collect(),
        ),
    );
    if !system.is_empty() {
        out.insert("system".into(), json!(system.join("\n\n")));
    }

    let mut max_tokens = match opt_u64(obj, "max_completion_tokens")? {
        Some(n) => n,
        None => opt_u64(obj, "max_tokens")?.unwrap_or(default_max_tokens),
    };

    let tools = obj
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| convert_tools(t))
        .unwrap_or_default();
    let mut tool_choice = None;
    if !tools.is_empty() {
        tool_choice = obj.get("tool_choice").and_then(convert_tool_choice);
        if obj.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
            let mut choice = tool_choice.unwrap_or_else(|| json!({ "type": "auto" }));
            if let Value::Object(c) = &mut choice {
                if c.get("type").and_then(Value::as_str) != Some("none") {
                    c.insert("disable_parallel_tool_use".into(), json!(true));
                }
            }
            tool_choice = Some(choice);
        }
        out.insert("tools".into(), Value::Array(tools));
    }
    let forced_tool = tool_choice
        .as_ref()
        .and_then(|c| str_field(c, "type"))
        .is_some_and(|t| t == "any" || t == "tool");
    if let Some(c) = tool_choice {
        out.insert("tool_choice".into(), c);
    }

    let budget = str_field(body, "reasoning_effort").and_then(effort_budget);
    let thinking = match budget {
        Some(_) if forced_tool => {
            log::debug!(
                "dropping reasoning_effort: Anthropic forbids thinking with forced tool use"
            );
            None
        }
        b => b,
    };
    if let Some(budget) = thinking {
        if max_tokens <= budget {
            max_tokens = budget.saturating_add(max_tokens);
        }
        out.insert(
            "thinking".into(),
            json!({ "type": "enabled", "budget_tokens": budget }),
        );
    } else {
        if let Some(t) = obj.get("temperature").and_then(Value::as_f64) {
            out.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
        }
        if let Some(p) = obj.get("top_p").and_then(Value::as_f64) {
            out.insert("top_p".into(), json!(p));
        }
        if let Some(k) = obj.get("top_k").and_then(Value::as_u64) {
            out.insert("top_k".into(), json!(k));
        }
    }
    out.insert("max_tokens".into(), json!(max_tokens));

    let stop: Vec<&str> = match obj.get("stop") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    // Anthropic rejects whitespace-only stop sequences.
    let stop: Vec<&str> = stop.into_iter().filter(|s| !s.trim().is_empty()).collect();
    if !stop.is_empty() {
        out.insert("stop_sequences".into(), json!(stop));
    }
    if let Some(s) = obj.get("stream").and_then(Value::as_bool) {
        out.insert("stream".into(), json!(s));
    }
    if let Some(u) = str_field(body, "user").filter(|u| !u.is_empty()) {
        out.insert("metadata".into(), json!({ "user_id": u }));
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {

    use super::*;

    fn req(body: Value) -> Value {
        request(&body, "claude-up", 1000).expect("request translates")
    }

    #[test]
    fn request_rules() {
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "minimal: model replaced, default max_tokens, string content becomes blocks",
                json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "system and developer messages join into top-level system",
                json!({"messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "developer", "content": [{"type": "text", "text": "be kind"}]},
                    {"role": "user", "content": "hi"}]}),
                json!({"model": "claude-up", "max_tokens": 1000, "system": "be brief\n\nbe kind",
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "stop string, max_tokens, temperature, top_p, stream, user",
                json!({"messages": [{"role": "user", "content": "hi"}], "stop": "END",
                       "max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "stream": true,
                       "user": "u-1", "stream_options": {"include_usage": true},
                       "presence_penalty": 1, "seed": 3, "logprobs": true}),
                json!({"model": "claude-up", "max_tokens": 50, "stop_sequences": ["END"],
                       "temperature": 0.5, "top_p": 0.9, "stream": true,
                       "metadata": {"user_id": "u-1"},
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "stop array drops blank entries; max_completion_tokens wins; temperature clamped",
                json!({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", " ", "b"],
                       "max_tokens": 50, "max_completion_tokens": 70, "temperature": 1.7}),
                json!({"model": "claude-up", "max_tokens": 70, "stop_sequences": ["a", "b"],
                       "temperature": 1.0,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "tools and tool_choice auto",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [
                           {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                           {"type": "function", "function": {"name": "noargs"}},
                           {"type": "custom", "custom": {"name": "grammar"}}],
                       "tool_choice": "auto"}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "tools": [
                           {"name": "get_weather", "description": "Weather",
                            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                           {"name": "noargs", "input_schema": {"type": "object", "properties": {}}}],
                       "tool_choice": {"type": "auto"}}),
            ),
            (
                "tool_choice none",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                       "tool_choice": {"type": "none"}}),
            ),
            (
                "tool_choice required + parallel_tool_calls false",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
                       "parallel_tool_calls": false}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                       "tool_choice": {"type": "any", "disable_parallel_tool_use": true}}),
            ),
            (
                "named tool_choice",
                json!({"messages": [{"role": "user", "content": "hi"}],
                       "tools": [{"type": "function", "function": {"name": "f"}}],
                       "tool_choice": {"type": "function", "function": {"name": "f"}}}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                       "tool_choice": {"type": "tool", "name": "f"}}),
            ),
            (
                "tool_choice without tools is dropped",
                json!({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "assistant tool_calls, tool results merged, then user text after results",
                json!({"messages": [
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": "Checking.", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\"}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "w", "arguments": "not json"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "rainy"}]},
                    {"role": "user", "content": "thanks"}]}),
                json!({"model": "claude-up", "max_tokens": 1000, "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "call_1", "name": "w", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "call_2", "name": "w", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                        {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "rainy"}]},
                        {"type": "text", "text": "thanks"}]}]}),
            ),
            (
                "consecutive same-role messages merge; tool results sorted first; empty dropped",
                json!({"messages": [
                    {"role": "user", "content": "a"},
                    {"role": "user", "content": ""},
                    {"role": "user", "content": "b"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                    {"role": "user", "content": "c"},
                    {"role": "tool", "tool_call_id": "t", "content": ""}]}),
                json!({"model": "claude-up", "max_tokens": 1000, "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t"},
                        {"type": "text", "text": "c"}]}]}),
            ),
            (
                "images: data URL to base64, https to url, files to documents",
                json!({"messages": [{"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA", "detail": "high"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                    {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBE"}},
                    {"type": "file", "file": {"file_id": "file-123"}},
                    {"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}]}]}),
                json!({"model": "claude-up", "max_tokens": 1000, "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]}]}),
            ),
            (
                "reasoning_effort medium with small max_tokens raises max_tokens and drops sampling",
                json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "medium",
                       "max_tokens": 1000, "temperature": 0.2}),
                json!({"model": "claude-up", "max_tokens": 5096,
                       "thinking": {"type": "enabled", "budget_tokens": 4096},
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "reasoning_effort high with room keeps max_tokens",
                json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high",
                       "max_completion_tokens": 32000}),
                json!({"model": "claude-up", "max_tokens": 32000,
                       "thinking": {"type": "enabled", "budget_tokens": 16384},
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "reasoning_effort low uses default max_tokens + budget",
                json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}),
                json!({"model": "claude-up", "max_tokens": 2024,
                       "thinking": {"type": "enabled", "budget_tokens": 1024},
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "reasoning_effort minimal means no thinking",
                json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "minimal"}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
            ),
            (
                "reasoning_effort with forced tool drops thinking",
                json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high",
                       "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}),
                json!({"model": "claude-up", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                       "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
                       "tool_choice": {"type": "any"}}),
            ),
            (
                "final assistant prefill loses trailing whitespace",
                json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: \n"}]}),
                json!({"model": "claude-up", "max_tokens": 1000, "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Sure:"}]}]}),
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(req(input), want, "case: {name}");
        }
    }

    #[test]
    fn request_rejects_bad_input() {
        let cases = vec![
            ("not an object", json!([1])),
            ("no messages", json!({"model": "x"})),
            ("messages not array", json!({"messages": "hi"})),
            (
                "only system",
                json!({"messages": [{"role": "system", "content": "s"}]}),
            ),
            ("no role", json!({"messages": [{"content": "hi"}]})),
            (
                "unknown role",
                json!({"messages": [{"role": "wizard", "content": "hi"}]}),
            ),
            (
                "tool without id",
                json!({"messages": [{"role": "tool", "content": "x"}]}),
            ),
            (
                "n > 1",
                json!({"n": 2, "messages": [{"role": "user", "content": "hi"}]}),
            ),
            (
                "negative max_tokens",
                json!({"max_tokens": -1, "messages": [{"role": "user", "content": "hi"}]}),
            ),
            (
                "content is a number",
                json!({"messages": [{"role": "user", "content": 5}]}),
            ),
            (
                "ftp image",
                json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]}),
            ),
            (
                "non-base64 data url",
                json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png,abc"}}]}]}),
            ),
            (
                "tool call without id",
                json!({"messages": [{"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "f"}}]}]}),
            ),
        ];
        for (name, input) in cases {
            assert!(request(&input, "m", 10).is_err(), "case: {name}");
        }
        // A float that is a whole number is accepted.
        let ok = json!({"max_tokens": 64.0, "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(
            request(&ok, "m", 10).map(|v| v["max_tokens"].clone()),
            Ok(json!(64))
        );
    }

    #[test]
    fn signed_thinking_goes_back_first_and_unknown_fields_are_dropped() {
        let sent = req(json!({"model": "gpt-x", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "reasoning_content": "think",
             "thinking_blocks": [
                 {"type": "thinking", "thinking": "think", "signature": "sig-1"},
                 {"type": "thinking", "thinking": "unsigned"},
                 {"type": "redacted_thinking", "data": "opaque"}],
             "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "sunny"}],
            "prediction": {"type": "content", "content": "x"}, "web_search_options": {}}));
        assert_eq!(
            sent["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "think", "signature": "sig-1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]})
        );
        assert!(sent.get("prediction").is_none() && sent.get("web_search_options").is_none());
    }
}
