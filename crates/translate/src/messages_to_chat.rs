//! The client speaks Anthropic messages; the provider is OpenAI-style.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{
    args_to_object, bad, body_text, openai_error_type_to_anthropic, random_id, sse_event,
    str_field, u64_field, TranslateError,
};

/// Anthropic system prompts and tool results may be a string or a list of blocks; only
/// their text can be carried into an OpenAI string field.
fn blocks_text(v: Option<&Value>, sep: &str) -> String {
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

/// Anthropic /v1/messages body -> OpenAI chat request. `upstream_model` replaces
/// `model`. When `stream` is true, `stream_options.include_usage` is forced on because
/// Anthropic clients expect token counts in `message_delta`.
///
/// `top_k`, `cache_control`, thinking blocks and server tools are dropped: OpenAI-style
/// providers have no equivalent. A thinking budget becomes `reasoning_effort`
/// (≤2048 low, ≤8192 medium, else high).
pub fn request(body: &Value, upstream_model: &str) -> Result<Value, TranslateError> {
    let obj = body
        .as_object()
        .ok_or_else(|| bad("request body must be a JSON object"))?;
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be an array"))?;

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

/// Some OpenAI-compatible servers report `stop` even when the message carries tool
/// calls; Anthropic clients decide whether to run tools from `stop_reason`, so tool
/// calls win over a plain `stop`.
fn stop_reason(finish_reason: Option<&str>, has_tools: bool) -> &'static str {
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
fn split_usage(usage: &Value) -> (u64, u64, u64) {
    let prompt = u64_field(usage, "prompt_tokens");
    let cached = usage
        .get("prompt_tokens_details")
        .map(|d| u64_field(d, "cached_tokens"))
        .unwrap_or(0);
    let output = u64_field(usage, "completion_tokens");
    (prompt.saturating_sub(cached), cached, output)
}

fn message_id(openai_id: Option<&str>) -> String {
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

#[derive(Debug, Clone, PartialEq)]
enum OpenKind {
    Text,
    Thinking,
    Tool { openai_index: u64, id: String },
}

#[derive(Debug, Clone, PartialEq)]
struct OpenBlock {
    kind: OpenKind,
    index: u64,
}

/// How the stream is being ended, which decides the stop_reason when the provider
/// never sent a `finish_reason`.
#[derive(Clone, Copy, PartialEq)]
enum EndCause {
    /// `[DONE]` or finish_reason plus usage: the provider finished normally.
    Complete,
    /// `finish()` without either: the upstream was cut; stop_reason stays null so the
    /// client can tell the message is incomplete.
    Cut,
}

/// Translates OpenAI `chat.completion.chunk`s into Anthropic stream events.
///
/// OpenAI interleaves text and tool-call fragments freely inside one message, while
/// Anthropic has strictly sequential content blocks; a block is therefore closed
/// whenever the kind of content changes, and tool-call fragments for a call whose block
/// was already closed are dropped (logged), since Anthropic cannot reopen a block.
pub struct StreamTranslator {
    id: Option<String>,
    model: String,
    started: bool,
    ended: bool,
    next_index: u64,
    open: Option<OpenBlock>,
    /// OpenAI tool_call indexes that already got a block.
    seen_tools: Vec<u64>,
    raw_finish: Option<String>,
    /// `(input, cached, output)` from the provider's usage report.
    usage: Option<(u64, u64, u64)>,
}

impl StreamTranslator {
    pub fn new(client_model: &str) -> Self {
        Self {
            id: None,
            model: client_model.to_string(),
            started: false,
            ended: false,
            next_index: 0,
            open: None,
            seen_tools: Vec::new(),
            raw_finish: None,
            usage: None,
        }
    }

    fn start(&mut self, chunk: &Value, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        let id = message_id(str_field(chunk, "id"));
        self.id = Some(id.clone());
        let (input, cached, output) = self.usage.unwrap_or((0, 0, 0));
        let mut usage = json!({ "input_tokens": input, "output_tokens": output });
        if let (Value::Object(u), true) = (&mut usage, cached > 0) {
            u.insert("cache_read_input_tokens".into(), json!(cached));
        }
        out.push(sse_event(
            "message_start",
            &json!({
                "type": "message_start",
                "message": {
                    "id": id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": null,
                    "stop_sequence": null,
                    "usage": usage,
                },
            }),
        ));
    }

    fn close_block(&mut self, out: &mut Vec<Bytes>) {
        if let Some(block) = self.open.take() {
            out.push(sse_event(
                "content_block_stop",
                &json!({ "type": "content_block_stop", "index": block.index }),
            ));
        }
    }

    fn open_block(&mut self, kind: OpenKind, content_block: Value, out: &mut Vec<Bytes>) -> u64 {
        self.close_block(out);
        let index = self.next_index;
        self.next_index += 1;
        out.push(sse_event(
            "content_block_start",
            &json!({ "type": "content_block_start", "index": index, "content_block": content_block }),
        ));
        self.open = Some(OpenBlock { kind, index });
        index
    }

    fn delta(index: u64, delta: Value) -> Bytes {
        sse_event(
            "content_block_delta",
            &json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        )
    }

    fn on_text(&mut self, text: &str, out: &mut Vec<Bytes>) {
        let index = match &self.open {
            Some(OpenBlock {
                kind: OpenKind::Text,
                index,
            }) => *index,
            _ => self.open_block(OpenKind::Text, json!({ "type": "text", "text": "" }), out),
        };
        out.push(Self::delta(
            index,
            json!({ "type": "text_delta", "text": text }),
        ));
    }

    fn on_thinking(&mut self, text: &str, out: &mut Vec<Bytes>) {
        let index = match &self.open {
            Some(OpenBlock {
                kind: OpenKind::Thinking,
                index,
            }) => *index,
            _ => self.open_block(
                OpenKind::Thinking,
                json!({ "type": "thinking", "thinking": "", "signature": "" }),
                out,
            ),
        };
        out.push(Self::delta(
            index,
            json!({ "type": "thinking_delta", "thinking": text }),
        ));
    }

    fn on_tool_call(&mut self, call: &Value, out: &mut Vec<Bytes>) {
        let id = str_field(call, "id").filter(|s| !s.is_empty());
        let function = call.get("function").unwrap_or(&Value::Null);
        let name = str_field(function, "name").filter(|s| !s.is_empty());
        let args = str_field(function, "arguments").unwrap_or("");
        let open_tool = match &self.open {
            Some(OpenBlock {
                kind: OpenKind::Tool { openai_index, id },
                index,
            }) => Some((*openai_index, id.clone(), *index)),
            _ => None,
        };
        // Providers that omit `index` send one call at a time.
        let openai_index =
            call.get("index")
                .and_then(Value::as_u64)
                .unwrap_or(match (&open_tool, id) {
                    (Some((i, _, _)), None) => *i,
                    _ => self.seen_tools.len() as u64,
                });

        let continues = open_tool.as_ref().and_then(|(oi, open_id, block)| {
            (*oi == openai_index && id.is_none_or(|id| id == open_id)).then_some(*block)
        });
        let block = match continues {
            Some(block) => block,
            None if self.seen_tools.contains(&openai_index) && id.is_none() => {
                log::warn!("dropping fragment for already closed tool call {openai_index}");
                return;
            }
            None => {
                let id = id
                    .map(str::to_string)
                    .unwrap_or_else(|| random_id("toolu_"));
                self.seen_tools.push(openai_index);
                self.open_block(
                    OpenKind::Tool {
                        openai_index,
                        id: id.clone(),
                    },
                    json!({ "type": "tool_use", "id": id, "name": name.unwrap_or(""), "input": {} }),
                    out,
                )
            }
        };
        if !args.is_empty() {
            out.push(Self::delta(
                block,
                json!({ "type": "input_json_delta", "partial_json": args }),
            ));
        }
    }

    fn on_error(&mut self, err: &Value) -> Vec<Bytes> {
        self.ended = true;
        let message = str_field(err, "message")
            .filter(|m| !m.is_empty())
            .unwrap_or("upstream stream error");
        vec![sse_event(
            "error",
            &json!({
                "type": "error",
                "error": { "type": openai_error_type_to_anthropic(err), "message": message },
            }),
        )]
    }

    /// One OpenAI SSE event (a chunk's JSON or `[DONE]`) -> zero or more Anthropic
    /// frames (`event: X\ndata: {...}\n\n`).
    pub fn on_event(&mut self, event: Option<&str>, data: &str) -> Vec<Bytes> {
        if self.ended {
            return Vec::new();
        }
        if data.trim() == "[DONE]" {
            return self.end(EndCause::Complete);
        }
        let chunk: Value = match serde_json::from_str(data) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                log::debug!("ignoring unparsable upstream chunk");
                return Vec::new();
            }
        };
        if let Some(err) = chunk.get("error").filter(|e| !e.is_null()) {
            let err = match err {
                Value::String(s) => json!({ "message": s }),
                other => other.clone(),
            };
            return self.on_error(&err);
        }
        if event == Some("error") {
            return self.on_error(&chunk);
        }

        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(split_usage(usage));
        }
        let mut out = Vec::new();
        self.start(&chunk, &mut out);

        let choice = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|ch| ch.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
            });
        if let Some(choice) = choice {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(r) = str_field(delta, "reasoning_content")
                .or_else(|| str_field(delta, "reasoning"))
                .filter(|r| !r.is_empty())
            {
                self.on_thinking(r, &mut out);
            }
            if let Some(t) = str_field(delta, "content")
                .or_else(|| str_field(delta, "refusal"))
                .filter(|t| !t.is_empty())
            {
                self.on_text(t, &mut out);
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for call in calls {
                    self.on_tool_call(call, &mut out);
                }
            }
            if let Some(reason) = str_field(choice, "finish_reason") {
                self.close_block(&mut out);
                self.raw_finish = Some(reason.to_string());
            }
        }
        if self.raw_finish.is_some() && self.usage.is_some() {
            out.extend(self.end(EndCause::Complete));
        }
        out
    }

    fn end(&mut self, cause: EndCause) -> Vec<Bytes> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        let mut out = Vec::new();
        self.start(&Value::Null, &mut out);
        self.close_block(&mut out);
        let has_tools = !self.seen_tools.is_empty();
        let reason = match (&self.raw_finish, cause) {
            (Some(r), _) => json!(stop_reason(Some(r), has_tools)),
            (None, EndCause::Complete) => json!(stop_reason(None, has_tools)),
            (None, EndCause::Cut) => Value::Null,
        };
        let usage = match self.usage {
            Some((input, cached, output)) => json!({
                "input_tokens": input,
                "cache_read_input_tokens": cached,
                "output_tokens": output,
            }),
            None => json!({ "output_tokens": 0 }),
        };
        out.push(sse_event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": { "stop_reason": reason, "stop_sequence": null },
                "usage": usage,
            }),
        ));
        out.push(sse_event(
            "message_stop",
            &json!({ "type": "message_stop" }),
        ));
        out
    }

    /// Called once at the end (also when the upstream was cut). Always leaves a
    /// well-formed Anthropic stream: open block closed, `message_delta` and
    /// `message_stop` sent exactly once. After an `error` event nothing more is sent,
    /// as Anthropic's own streams end there. Safe to call again.
    pub fn finish(&mut self) -> Vec<Bytes> {
        self.end(EndCause::Cut)
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_frames;
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
            json!({"messages": [{"role": "system", "content": "s"}]}),
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

    fn chunk(delta: Value, finish: Value) -> String {
        json!({"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "gpt-up",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    }

    fn realistic_chunks() -> Vec<String> {
        vec![
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(json!({"content": "Let me"}), Value::Null),
            chunk(json!({"content": " check."}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}), Value::Null),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "ty\": \"Par"}}]}), Value::Null),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "is\"}"}}]}), Value::Null),
            chunk(json!({}), json!("tool_calls")),
            json!({"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "gpt-up",
                   "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70,
                                            "prompt_tokens_details": {"cached_tokens": 30}}})
            .to_string(),
            "[DONE]".to_string(),
        ]
    }

    fn ev(name: &str, data: Value) -> (Option<String>, Value) {
        (Some(name.to_string()), data)
    }

    fn feed(t: &mut StreamTranslator, chunks: &[String]) -> Vec<Bytes> {
        chunks.iter().flat_map(|c| t.on_event(None, c)).collect()
    }

    #[test]
    fn stream_realistic_sequence_exact_frames() {
        let mut t = StreamTranslator::new("claude-client");
        let mut frames = feed(&mut t, &realistic_chunks());
        frames.extend(t.finish());
        let want = vec![
            ev(
                "message_start",
                json!({"type": "message_start", "message": {
                "id": "msg_chatcmpl-abc", "type": "message", "role": "assistant", "model": "claude-client",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}}),
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Let me"}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": " check."}}),
            ),
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "{\"ci"}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "ty\": \"Par"}}),
            ),
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": "is\"}"}}),
            ),
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            ev(
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"input_tokens": 20, "cache_read_input_tokens": 30, "output_tokens": 20}}),
            ),
            ev("message_stop", json!({"type": "message_stop"})),
        ];
        assert_eq!(parse_frames(&frames), want);
        assert!(frames[0].starts_with(b"event: message_start\ndata: {"));
        assert!(t.finish().is_empty());
    }

    #[test]
    fn stream_text_after_tool_opens_new_block_and_parallel_tools() {
        let mut t = StreamTranslator::new("c");
        let chunks = vec![
            chunk(json!({"reasoning_content": "hmm"}), Value::Null),
            chunk(
                json!({"tool_calls": [
                {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}},
                {"index": 1, "id": "b", "function": {"name": "g", "arguments": "{\"x\""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "function": {"arguments": ":1}"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "late"}}]}),
                Value::Null,
            ),
            chunk(json!({"content": "done"}), Value::Null),
            chunk(json!({}), json!("stop")),
            "[DONE]".to_string(),
        ];
        let got = parse_frames(&feed(&mut t, &chunks));
        let summary: Vec<String> = got
            .iter()
            .map(|(e, d)| {
                let e = e.clone().unwrap_or_default();
                match e.as_str() {
                    "content_block_start" => {
                        format!("start {} {}", d["index"], d["content_block"]["type"])
                    }
                    "content_block_delta" => format!("delta {} {}", d["index"], d["delta"]["type"]),
                    "content_block_stop" => format!("stop {}", d["index"]),
                    "message_delta" => format!("message_delta {}", d["delta"]["stop_reason"]),
                    other => other.to_string(),
                }
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                "message_start",
                "start 0 \"thinking\"",
                "delta 0 \"thinking_delta\"",
                "stop 0",
                "start 1 \"tool_use\"",
                "delta 1 \"input_json_delta\"",
                "stop 1",
                "start 2 \"tool_use\"",
                "delta 2 \"input_json_delta\"",
                "delta 2 \"input_json_delta\"",
                "stop 2",
                "start 3 \"text\"",
                "delta 3 \"text_delta\"",
                "stop 3",
                "message_delta \"tool_use\"",
                "message_stop",
            ]
        );
        // No usage was reported: only output_tokens 0.
        assert_eq!(got[14].1["usage"], json!({"output_tokens": 0}));
    }

    #[test]
    fn stream_usage_in_finish_chunk_ends_immediately() {
        let mut t = StreamTranslator::new("c");
        let last = json!({"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}],
                          "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        .to_string();
        let got = parse_frames(&t.on_event(None, &last));
        let names: Vec<_> = got.iter().filter_map(|(e, _)| e.clone()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(got[4].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(got[4].1["usage"]["input_tokens"], 3);
        assert!(t.on_event(None, "[DONE]").is_empty());
        assert!(t.finish().is_empty());
    }

    #[test]
    fn stream_cut_mid_tool_call_finishes_well_formed_once() {
        let mut t = StreamTranslator::new("c");
        let mut frames = feed(&mut t, &realistic_chunks()[..5]);
        frames.extend(t.finish());
        frames.extend(t.finish());
        frames.extend(t.on_event(None, "[DONE]"));
        let got = parse_frames(&frames);
        let names: Vec<_> = got.iter().filter_map(|(e, _)| e.clone()).collect();
        assert_eq!(
            names[names.len() - 4..],
            [
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(names.iter().filter(|n| *n == "message_stop").count(), 1);
        assert_eq!(got[got.len() - 2].1["delta"]["stop_reason"], Value::Null);
        assert_eq!(got[got.len() - 3].1["index"], 1);
    }

    #[test]
    fn stream_done_without_finish_reason_infers_stop_reason() {
        let mut t = StreamTranslator::new("c");
        let mut frames = feed(&mut t, &realistic_chunks()[..3]);
        frames.extend(t.on_event(None, "[DONE]"));
        let got = parse_frames(&frames);
        assert_eq!(got[got.len() - 2].1["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn stream_empty_upstream_still_well_formed() {
        let mut t = StreamTranslator::new("c");
        let got = parse_frames(&t.finish());
        let names: Vec<_> = got.iter().filter_map(|(e, _)| e.clone()).collect();
        assert_eq!(names, ["message_start", "message_delta", "message_stop"]);
        assert!(got[0].1["message"]["id"]
            .as_str()
            .is_some_and(|s| s.starts_with("msg_")));
    }

    #[test]
    fn stream_error_chunk_becomes_error_event() {
        let mut t = StreamTranslator::new("c");
        let mut frames = feed(&mut t, &realistic_chunks()[..2]);
        frames.extend(t.on_event(
            None,
            r#"{"error":{"message":"boom","type":"server_error"}}"#,
        ));
        frames.extend(t.on_event(None, &realistic_chunks()[2]));
        frames.extend(t.finish());
        let got = parse_frames(&frames);
        assert_eq!(
            got.last(),
            Some(&ev(
                "error",
                json!({"type": "error", "error": {"type": "api_error", "message": "boom"}})
            ))
        );
        let mut t = StreamTranslator::new("c");
        let got = parse_frames(&t.on_event(
            Some("error"),
            r#"{"message":"slow","code":"rate_limit_exceeded"}"#,
        ));
        assert_eq!(
            got,
            vec![ev(
                "error",
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}})
            )]
        );
    }

    #[test]
    fn stream_tolerates_missing_ids_indexes_and_choices() {
        let mut t = StreamTranslator::new("c");
        let chunks = vec![
            json!({"object": "chat.completion.chunk"}).to_string(),
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"name": "f", "arguments": "{\"a\""}}]}}]}).to_string(),
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": ":1}"}}]}}]}).to_string(),
            json!({"choices": [{"index": 1, "delta": {"content": "other choice ignored"}}]}).to_string(),
            "[DONE]".to_string(),
        ];
        let got = parse_frames(&feed(&mut t, &chunks));
        let names: Vec<_> = got.iter().filter_map(|(e, _)| e.clone()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(got[1].1["content_block"]["id"]
            .as_str()
            .is_some_and(|s| s.starts_with("toolu_")));
        assert_eq!(got[5].1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn stream_garbage_never_panics() {
        let garbage = [
            "",
            "not json",
            "null",
            "[]",
            "7",
            "{}",
            r#"{"choices":"x"}"#,
            r#"{"choices":[null,1,"a"]}"#,
            r#"{"choices":[{"delta":null,"finish_reason":7}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":"x"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[null,{"index":-1},{"index":"a","function":5}]}}]}"#,
            r#"{"choices":[{"delta":{"content":5,"reasoning_content":[]}}]}"#,
            r#"{"usage":"many"}"#,
            r#"{"usage":{"prompt_tokens":-4,"completion_tokens":1.5}}"#,
            r#"{"error":null}"#,
        ];
        let mut t = StreamTranslator::new("c");
        for g in garbage {
            let _ = t.on_event(None, g);
        }
        let frames = t.finish();
        let names: Vec<_> = parse_frames(&frames)
            .into_iter()
            .filter_map(|(e, _)| e)
            .collect();
        assert_eq!(names.last().map(String::as_str), Some("message_stop"));
        let mut t = StreamTranslator::new("c");
        let _ = t.on_event(None, r#"{"error":5}"#);
        assert!(t.finish().is_empty());
    }
}
