//! The request direction: a Responses request as a chat request (and, through
//! [`crate::chat_to_messages`], as a messages request).

use serde_json::{json, Map, Value};

use super::SIGNATURE_MARK;
use crate::{bad, chat_to_messages, str_field, TranslateError};

/// The top-level fields this translation reads; any other is dropped with a debug log.
const CARRIED: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "max_output_tokens",
    "temperature",
    "top_p",
    "text",
    "user",
    "metadata",
    "stream",
    "store",
    "include",
    "previous_response_id",
    "background",
    "conversation",
];

/// Refuses what only a provider that keeps whole conversations could serve.
fn refuse_state(obj: &Map<String, Value>) -> Result<(), TranslateError> {
    let set = |k: &str| !matches!(obj.get(k), None | Some(Value::Null));
    if set("previous_response_id") || set("conversation") {
        return Err(bad(
            "`previous_response_id` and `conversation` are not supported for this model: send \
             the history in `input` (earlier output items may be sent as `item_reference`s)",
        ));
    }
    if obj.get("background") == Some(&Value::Bool(true)) {
        return Err(bad(
            "`background: true` is not supported for this model: send `background: false`",
        ));
    }
    Ok(())
}

/// Content of a message item as chat content: a string, or parts when an image or file
/// forces it. Text-only content is flattened, since many chat servers only take strings.
fn content(v: Option<&Value>, i: usize) -> Result<Value, TranslateError> {
    let parts = match v {
        None | Some(Value::Null) => return Ok(json!("")),
        Some(Value::String(s)) => return Ok(json!(s)),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(bad(format!(
                "input[{i}].content must be a string or an array"
            )))
        }
    };
    let mut out = Vec::new();
    for part in parts {
        match str_field(part, "type") {
            Some("input_text" | "output_text" | "text") => {
                if let Some(t) = str_field(part, "text") {
                    out.push(json!({ "type": "text", "text": t }));
                }
            }
            Some("refusal") => {
                if let Some(t) = str_field(part, "refusal") {
                    out.push(json!({ "type": "text", "text": t }));
                }
            }
            Some("input_image") => match str_field(part, "image_url") {
                Some(url) => out.push(json!({ "type": "image_url", "image_url": { "url": url } })),
                None => log::debug!("dropping input_image without image_url (file ids are stored)"),
            },
            Some("input_file") => match str_field(part, "file_data") {
                Some(data) => out.push(json!({ "type": "file", "file": {
                    "filename": str_field(part, "filename").unwrap_or("document.pdf"),
                    "file_data": data,
                }})),
                None => log::debug!("dropping input_file without file_data"),
            },
            other => log::debug!("dropping content part {other:?}"),
        }
    }
    if out.iter().all(|p| str_field(p, "type") == Some("text")) {
        let texts: Vec<&str> = out.iter().filter_map(|p| str_field(p, "text")).collect();
        return Ok(json!(texts.join("\n")));
    }
    Ok(Value::Array(out))
}

/// Builds the chat conversation. Consecutive assistant output (text, function calls, the
/// reasoning before them) becomes one assistant message, as chat and messages expect.
struct Conversation {
    messages: Vec<Value>,
    /// Signed thinking waiting for the assistant message it belongs to.
    thinking: Vec<Value>,
    keep_thinking: bool,
}

impl Conversation {
    /// Adds to the assistant message output goes into: the last message if it is one,
    /// else a new one. Pending signed thinking joins it.
    fn with_assistant(&mut self, add: impl FnOnce(&mut Map<String, Value>)) {
        let mut m = match self.messages.pop() {
            Some(Value::Object(m))
                if m.get("role").and_then(Value::as_str) == Some("assistant") =>
            {
                m
            }
            other => {
                self.messages.extend(other);
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert("content".into(), Value::Null);
                m
            }
        };
        let thinking = std::mem::take(&mut self.thinking);
        if !thinking.is_empty() {
            if let Value::Array(b) = m
                .entry("thinking_blocks")
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                b.extend(thinking);
            }
        }
        add(&mut m);
        self.messages.push(Value::Object(m));
    }

    fn push(&mut self, item: &Value, i: usize) -> Result<(), TranslateError> {
        let kind = str_field(item, "type").unwrap_or("message");
        match kind {
            "message" => {
                let role = str_field(item, "role")
                    .ok_or_else(|| bad(format!("input[{i}].role is missing")))?;
                let content = content(item.get("content"), i)?;
                match role {
                    "user" | "system" | "developer" => {
                        let role = if role == "user" { "user" } else { "system" };
                        self.messages
                            .push(json!({ "role": role, "content": content }));
                    }
                    "assistant" => {
                        let text = match &content {
                            Value::String(s) => s.clone(),
                            _ => String::new(),
                        };
                        if !text.is_empty() {
                            self.with_assistant(|m| {
                                let joined = match m.get("content").and_then(Value::as_str) {
                                    Some(before) if !before.is_empty() => {
                                        format!("{before}\n{text}")
                                    }
                                    _ => text,
                                };
                                m.insert("content".into(), json!(joined));
                            });
                        }
                    }
                    other => {
                        return Err(bad(format!("input[{i}].role {other:?} is not supported")))
                    }
                }
            }
            "function_call" => {
                let call_id = str_field(item, "call_id")
                    .ok_or_else(|| bad(format!("input[{i}].call_id is missing")))?;
                let name = str_field(item, "name")
                    .ok_or_else(|| bad(format!("input[{i}].name is missing")))?;
                let arguments = match item.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Object(_)) => v.to_string(),
                    _ => "{}".to_string(),
                };
                let call = json!({ "id": call_id, "type": "function",
                                   "function": { "name": name, "arguments": arguments } });
                self.with_assistant(|m| {
                    if let Value::Array(c) = m
                        .entry("tool_calls")
                        .or_insert_with(|| Value::Array(Vec::new()))
                    {
                        c.push(call);
                    }
                });
            }
            "function_call_output" => {
                let call_id = str_field(item, "call_id")
                    .ok_or_else(|| bad(format!("input[{i}].call_id is missing")))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(parts @ Value::Array(_)) => match content(Some(parts), i)? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    },
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                self.messages
                    .push(json!({ "role": "tool", "tool_call_id": call_id, "content": output }));
            }
            "reasoning" => {
                let signature = str_field(item, "encrypted_content")
                    .and_then(|c| c.strip_prefix(SIGNATURE_MARK));
                if let (true, Some(signature)) = (self.keep_thinking, signature) {
                    let text: Vec<&str> = item
                        .get("summary")
                        .and_then(Value::as_array)
                        .map(|s| s.iter().filter_map(|p| str_field(p, "text")).collect())
                        .unwrap_or_default();
                    self.thinking.push(json!({ "type": "thinking",
                        "thinking": text.join("\n\n"), "signature": signature }));
                } else {
                    log::debug!("dropping reasoning item the provider cannot verify");
                }
            }
            "item_reference" => {
                return Err(bad(format!(
                    "input[{i}] is an item_reference this model cannot resolve"
                )))
            }
            other => log::debug!("dropping input item of type {other:?}"),
        }
        Ok(())
    }
}

fn convert_tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter_map(|t| {
            let kind = str_field(t, "type").unwrap_or("function");
            if kind != "function" {
                log::debug!("dropping tool of type {kind:?}: only function tools translate");
                return None;
            }
            let mut function = Map::new();
            function.insert("name".into(), json!(str_field(t, "name")?));
            if let Some(d) = str_field(t, "description") {
                function.insert("description".into(), json!(d));
            }
            if let Some(p) = t.get("parameters").filter(|p| p.is_object()) {
                function.insert("parameters".into(), p.clone());
            }
            Some(json!({ "type": "function", "function": function }))
        })
        .collect()
}

fn convert_tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Some(choice.clone())
        }
        Value::Object(_) if str_field(choice, "type") == Some("function") => {
            Some(json!({ "type": "function", "function": { "name": str_field(choice, "name")? } }))
        }
        _ => None,
    }
}

/// Responses request -> chat request. `keep_thinking` keeps the client's signed thinking in
/// `thinking_blocks` (for an Anthropic-style provider, through [`to_messages`]); an
/// OpenAI-style provider gets none.
///
/// Mapped: `instructions` and system/developer items to system messages, message items
/// (text, images, files), `function_call`/`function_call_output` items, function tools,
/// `tool_choice`, `parallel_tool_calls`, `reasoning.effort`, `max_output_tokens`,
/// `temperature`, `top_p`, a JSON-schema `text.format`, `user`. Dropped: other tool types,
/// `metadata`, `include`, and anything unknown.
pub fn to_chat(
    body: &Value,
    upstream_model: &str,
    keep_thinking: bool,
) -> Result<Value, TranslateError> {
    let obj = body
        .as_object()
        .ok_or_else(|| bad("request body must be a JSON object"))?;
    refuse_state(obj)?;
    crate::log_dropped(obj, CARRIED);
    let mut convo = Conversation {
        messages: Vec::new(),
        thinking: Vec::new(),
        keep_thinking,
    };
    if let Some(instructions) = str_field(body, "instructions").filter(|s| !s.is_empty()) {
        convo
            .messages
            .push(json!({ "role": "system", "content": instructions }));
    }
    match obj.get("input") {
        Some(Value::String(s)) => convo.messages.push(json!({ "role": "user", "content": s })),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                convo.push(item, i)?;
            }
        }
        _ => return Err(bad("`input` must be a string or an array")),
    }

    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("messages".into(), Value::Array(convo.messages));
    if let Some(n) = obj.get("max_output_tokens").filter(|n| !n.is_null()) {
        out.insert("max_completion_tokens".into(), n.clone());
    }
    for key in ["temperature", "top_p", "parallel_tool_calls"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    let tools = obj
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| convert_tools(t))
        .unwrap_or_default();
    if !tools.is_empty() {
        out.insert("tools".into(), Value::Array(tools));
        if let Some(c) = obj.get("tool_choice").and_then(convert_tool_choice) {
            out.insert("tool_choice".into(), c);
        }
    } else {
        out.remove("parallel_tool_calls");
    }
    if let Some(effort) = obj.get("reasoning").and_then(|r| str_field(r, "effort")) {
        out.insert("reasoning_effort".into(), json!(effort));
    }
    let format = obj.get("text").and_then(|t| t.get("format"));
    if let Some(f) = format.filter(|f| str_field(f, "type") == Some("json_schema")) {
        let mut schema = f.clone();
        if let Value::Object(s) = &mut schema {
            s.remove("type");
        }
        out.insert(
            "response_format".into(),
            json!({ "type": "json_schema", "json_schema": schema }),
        );
    } else if format.is_some_and(|f| str_field(f, "type") == Some("json_object")) {
        out.insert("response_format".into(), json!({ "type": "json_object" }));
    }
    if let Some(u) = str_field(body, "user").filter(|u| !u.is_empty()) {
        out.insert("user".into(), json!(u));
    }
    if obj.get("stream") == Some(&Value::Bool(true)) {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    Ok(Value::Object(out))
}

/// Responses request -> Anthropic messages request, through [`to_chat`] and
/// [`chat_to_messages::request`] (whose rules apply: effort to thinking budget, system
/// messages joined into `system`, `user` to `metadata.user_id`, `parallel_tool_calls: false`
/// to `disable_parallel_tool_use`).
pub fn to_messages(
    body: &Value,
    upstream_model: &str,
    default_max_tokens: u64,
) -> Result<Value, TranslateError> {
    let chat = to_chat(body, upstream_model, true)?;
    chat_to_messages::request(&chat, upstream_model, default_max_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Value {
        to_chat(&body, "up", false).expect("translates")
    }

    #[test]
    fn codex_like_request_maps_to_chat() {
        let body = json!({
            "model": "m", "instructions": "You are Codex.", "store": false, "stream": true,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "abc",
            "reasoning": {"effort": "medium", "summary": "auto"}, "parallel_tool_calls": false,
            "tool_choice": "auto", "max_output_tokens": 500, "user": "u1", "metadata": {"a": "b"},
            "tools": [
                {"type": "function", "name": "shell", "description": "Run", "strict": false,
                 "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}},
                {"type": "web_search"}],
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "https://x/y.png"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}],
                 "encrypted_content": "gw-anthropic-signature:sig"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"role": "user", "content": "next"}]
        });
        assert_eq!(
            chat(body.clone()),
            json!({"model": "up", "stream": true, "stream_options": {"include_usage": true},
                   "max_completion_tokens": 500, "parallel_tool_calls": false, "tool_choice": "auto",
                   "reasoning_effort": "medium", "user": "u1",
                   "tools": [{"type": "function", "function": {"name": "shell", "description": "Run",
                       "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}}],
                   "messages": [
                       {"role": "system", "content": "You are Codex."},
                       {"role": "system", "content": "dev"},
                       {"role": "user", "content": [{"type": "text", "text": "look"},
                           {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
                       {"role": "assistant", "content": "ok", "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}}]},
                       {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
                       {"role": "user", "content": "next"}]})
        );
        let messages = to_messages(&body, "claude-up", 100).expect("translates");
        assert_eq!(
            messages["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "think", "signature": "sig"},
                {"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "c1", "name": "shell", "input": {"command": ["ls"]}}]})
        );
        assert_eq!(messages["system"], "You are Codex.\n\ndev");
        assert_eq!(messages["thinking"]["budget_tokens"], 4096);
        assert_eq!(
            messages["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
        assert_eq!(messages["metadata"], json!({"user_id": "u1"}));
    }

    #[test]
    fn string_input_schema_format_and_foreign_reasoning() {
        let got = to_messages(
            &json!({"model": "m", "input": [
                {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAopenai"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "r"}]}]}),
            "up",
            10,
        )
        .expect("translates");
        assert_eq!(got["messages"][0]["content"][0]["type"], "tool_use");
        assert_eq!(got["messages"][1]["content"][0]["content"], "r");
        let got = chat(
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
            "schema": {"type": "object"}, "strict": true}}}),
        );
        assert_eq!(got["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(
            got["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}})
        );
    }

    #[test]
    fn state_and_bad_input_are_refused() {
        for body in [
            json!({"input": "hi", "previous_response_id": "resp_1"}),
            json!({"input": "hi", "background": true}),
            json!({"input": "hi", "conversation": "conv_1"}),
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            json!({"input": 3}),
            json!({}),
            json!([]),
            json!({"input": [{"type": "message", "content": "x"}]}),
            json!({"input": [{"type": "function_call", "name": "f"}]}),
            json!({"input": [{"type": "function_call_output", "output": "x"}]}),
            json!({"input": [{"role": "user", "content": 5}]}),
        ] {
            assert!(to_chat(&body, "m", true).is_err(), "{body}");
        }
        let ok = chat(json!({"input": "hi", "store": false, "previous_response_id": null}));
        assert_eq!(ok["messages"][0]["content"], "hi");
        let ok = chat(json!({"input": "hi", "store": true}));
        assert_eq!(ok["messages"][0]["content"], "hi");
    }
}
