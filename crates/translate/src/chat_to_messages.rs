//! The client speaks OpenAI chat completions; the provider is Anthropic-style.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{
    anthropic_error_to_openai, args_to_object, bad, body_text, now_unix, random_id, sse_data,
    sse_done, str_field, u64_field, TranslateError,
};

/// Thinking budgets per OpenAI `reasoning_effort`. 1024 is Anthropic's minimum budget.
fn effort_budget(effort: &str) -> Option<u64> {
    match effort {
        "low" => Some(1024),
        "medium" => Some(4096),
        "high" | "xhigh" => Some(16384),
        _ => None,
    }
}

/// Parses an optional non-negative integer option. Clients written in JavaScript
/// sometimes send `1024.0`, which is harmless; a negative or fractional value is a
/// client bug worth a 400 rather than a silent default.
fn opt_u64(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>, TranslateError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            if let Some(n) = v.as_u64() {
                return Ok(Some(n));
            }
            match v.as_f64() {
                Some(f) if f >= 0.0 && f.fract() == 0.0 && f < u64::MAX as f64 => {
                    Ok(Some(f as u64))
                }
                _ => Err(bad(format!("`{key}` must be a non-negative integer"))),
            }
        }
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

fn assistant_blocks(m: &Value, i: usize) -> Result<Vec<Value>, TranslateError> {
    let mut blocks = content_blocks(m.get("content"))?;
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

/// Appends blocks to the conversation, merging into the previous message when the role
/// repeats: Anthropic requires user/assistant alternation, OpenAI does not.
fn push_merged(out: &mut Vec<(&'static str, Vec<Value>)>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((last_role, last)) if *last_role == role => last.extend(blocks),
        _ => out.push((role, blocks)),
    }
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
    let obj = body
        .as_object()
        .ok_or_else(|| bad("request body must be a JSON object"))?;
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be an array"))?;
    if opt_u64(obj, "n")?.is_some_and(|n| n > 1) {
        return Err(bad("`n` greater than 1 is not supported by this model"));
    }

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

fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// OpenAI counts cached tokens inside `prompt_tokens`; Anthropic reports them
/// separately, so they are added back.
fn openai_usage(input: u64, cache_read: u64, cache_creation: u64, output: u64) -> Value {
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
/// most OpenAI-compatible reasoning clients read.
pub fn response(body: &Value, client_model: &str) -> Value {
    let id = str_field(body, "id")
        .map(|id| format!("chatcmpl-{id}"))
        .unwrap_or_else(|| random_id("chatcmpl-"));
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    for block in body
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        match str_field(block, "type") {
            Some("text") => text.push_str(str_field(block, "text").unwrap_or("")),
            Some("thinking") => reasoning.push_str(str_field(block, "thinking").unwrap_or("")),
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

/// Where a tool_use content block landed in the OpenAI `tool_calls` numbering.
struct ToolBlock {
    block_index: u64,
    tool_index: usize,
    saw_delta: bool,
    /// Anthropic normally streams input as deltas after an empty `{}`; if a start
    /// carries a non-empty input and no deltas follow, it is sent at block stop.
    initial_input: Option<Value>,
}

/// Translates an Anthropic event stream into OpenAI `chat.completion.chunk` frames.
///
/// A stream that ends without `message_delta.stop_reason` (upstream cut) gets no
/// `finish_reason` chunk: a missing finish reason is how OpenAI clients learn the
/// answer is incomplete, and inventing one would hide that.
pub struct StreamTranslator {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    /// Once any chunk is out the id is frozen: every chunk must share it.
    emitted: bool,
    role_sent: bool,
    finish_sent: bool,
    done: bool,
    tools: Vec<ToolBlock>,
    input_tokens: u64,
    cache_read: u64,
    cache_creation: u64,
    output_tokens: u64,
}

impl StreamTranslator {
    /// `include_usage` mirrors the client's `stream_options.include_usage`.
    pub fn new(client_model: &str, include_usage: bool) -> Self {
        Self {
            id: random_id("chatcmpl-"),
            created: now_unix(),
            model: client_model.to_string(),
            include_usage,
            emitted: false,
            role_sent: false,
            finish_sent: false,
            done: false,
            tools: Vec::new(),
            input_tokens: 0,
            cache_read: 0,
            cache_creation: 0,
            output_tokens: 0,
        }
    }

    fn chunk(&mut self, delta: Value, finish_reason: Option<&str>) -> Bytes {
        self.emitted = true;
        sse_data(&json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        }))
    }

    /// OpenAI clients expect the role on the first chunk; tolerate streams whose
    /// `message_start` was lost.
    fn ensure_role(&mut self, out: &mut Vec<Bytes>) {
        if !self.role_sent {
            self.role_sent = true;
            let frame = self.chunk(json!({ "role": "assistant", "content": "" }), None);
            out.push(frame);
        }
    }

    fn read_usage(&mut self, usage: &Value) {
        // Fields are only overwritten when present: message_delta usually carries just
        // the cumulative output_tokens.
        if let Some(n) = usage.get("input_tokens").and_then(Value::as_u64) {
            self.input_tokens = n;
        }
        if let Some(n) = usage.get("cache_read_input_tokens").and_then(Value::as_u64) {
            self.cache_read = n;
        }
        if let Some(n) = usage
            .get("cache_creation_input_tokens")
            .and_then(Value::as_u64)
        {
            self.cache_creation = n;
        }
        if let Some(n) = usage.get("output_tokens").and_then(Value::as_u64) {
            self.output_tokens = n;
        }
    }

    /// One Anthropic SSE event (event name if any, JSON data) -> zero or more complete
    /// SSE frames for the client. The `type` inside the data wins over the event name,
    /// which some providers omit.
    pub fn on_event(&mut self, event: Option<&str>, data: &str) -> Vec<Bytes> {
        if self.done {
            return Vec::new();
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                log::debug!("ignoring unparsable upstream event {event:?}: {e}");
                return Vec::new();
            }
        };
        let kind = str_field(&v, "type").or(event).unwrap_or("");
        let mut out = Vec::new();
        match kind {
            "message_start" => {
                let message = v.get("message").unwrap_or(&Value::Null);
                if let (false, Some(id)) = (self.emitted, str_field(message, "id")) {
                    self.id = format!("chatcmpl-{id}");
                }
                if let Some(usage) = message.get("usage") {
                    self.read_usage(usage);
                }
                self.ensure_role(&mut out);
            }
            "content_block_start" => self.block_start(&v, &mut out),
            "content_block_delta" => self.block_delta(&v, &mut out),
            "content_block_stop" => self.block_stop(&v, &mut out),
            "message_delta" => {
                if let Some(usage) = v.get("usage") {
                    self.read_usage(usage);
                }
                let reason = v.get("delta").and_then(|d| str_field(d, "stop_reason"));
                if let (Some(reason), false) = (reason, self.finish_sent) {
                    self.finish_sent = true;
                    self.ensure_role(&mut out);
                    let frame = self.chunk(json!({}), Some(finish_reason(reason)));
                    out.push(frame);
                }
            }
            "message_stop" => out = self.finish(),
            "error" => {
                let e = v.get("error").unwrap_or(&Value::Null);
                let message = str_field(e, "message").unwrap_or("upstream stream error");
                let kind = str_field(e, "type").unwrap_or("api_error");
                out.push(sse_data(
                    &json!({ "error": anthropic_error_to_openai(kind, message) }),
                ));
                out.push(sse_done());
                self.done = true;
            }
            "ping" => {}
            other => log::debug!("ignoring upstream event type {other:?}"),
        }
        out
    }

    fn block_start(&mut self, v: &Value, out: &mut Vec<Bytes>) {
        let block = v.get("content_block").unwrap_or(&Value::Null);
        let Some(block_index) = v.get("index").and_then(Value::as_u64) else {
            return;
        };
        match str_field(block, "type") {
            Some("tool_use") => {
                let tool_index = self.tools.len();
                let initial_input = block
                    .get("input")
                    .filter(|i| i.as_object().is_some_and(|m| !m.is_empty()))
                    .cloned();
                self.tools.push(ToolBlock {
                    block_index,
                    tool_index,
                    saw_delta: false,
                    initial_input,
                });
                self.ensure_role(out);
                let frame = self.chunk(
                    json!({ "tool_calls": [{
                        "index": tool_index,
                        "id": str_field(block, "id").unwrap_or(""),
                        "type": "function",
                        "function": {
                            "name": str_field(block, "name").unwrap_or(""),
                            "arguments": "",
                        },
                    }]}),
                    None,
                );
                out.push(frame);
            }
            Some("text") => {
                // Text normally starts empty; a non-empty start must not be lost.
                if let Some(t) = str_field(block, "text").filter(|t| !t.is_empty()) {
                    self.ensure_role(out);
                    let frame = self.chunk(json!({ "content": t }), None);
                    out.push(frame);
                }
            }
            _ => {}
        }
    }

    fn block_delta(&mut self, v: &Value, out: &mut Vec<Bytes>) {
        let delta = v.get("delta").unwrap_or(&Value::Null);
        let index = v.get("index").and_then(Value::as_u64);
        let (key, value) = match str_field(delta, "type") {
            Some("text_delta") => ("content", str_field(delta, "text")),
            Some("thinking_delta") => ("reasoning_content", str_field(delta, "thinking")),
            Some("input_json_delta") => {
                let Some(partial) = str_field(delta, "partial_json").filter(|p| !p.is_empty())
                else {
                    return;
                };
                let Some(tool) = self.tools.iter_mut().find(|t| Some(t.block_index) == index)
                else {
                    log::debug!("input_json_delta for unknown block {index:?}");
                    return;
                };
                tool.saw_delta = true;
                let tool_index = tool.tool_index;
                self.ensure_role(out);
                let frame = self.chunk(
                    json!({ "tool_calls": [{
                        "index": tool_index,
                        "function": { "arguments": partial },
                    }]}),
                    None,
                );
                out.push(frame);
                return;
            }
            // signature_delta and citations have no OpenAI equivalent.
            _ => return,
        };
        if let Some(text) = value.filter(|t| !t.is_empty()) {
            self.ensure_role(out);
            let frame = self.chunk(json!({ key: text }), None);
            out.push(frame);
        }
    }

    fn block_stop(&mut self, v: &Value, out: &mut Vec<Bytes>) {
        let index = v.get("index").and_then(Value::as_u64);
        let Some(tool) = self.tools.iter_mut().find(|t| Some(t.block_index) == index) else {
            return;
        };
        if tool.saw_delta {
            return;
        }
        let Some(input) = tool.initial_input.take() else {
            return;
        };
        let tool_index = tool.tool_index;
        let frame = self.chunk(
            json!({ "tool_calls": [{
                "index": tool_index,
                "function": { "arguments": input.to_string() },
            }]}),
            None,
        );
        out.push(frame);
    }

    /// Called once at the end (also when the upstream stream was cut): returns the
    /// usage chunk (only if `include_usage`) and `data: [DONE]`, unless the stream was
    /// already terminated by `message_stop` or an `error` event. Safe to call again.
    pub fn finish(&mut self) -> Vec<Bytes> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut out = Vec::new();
        if self.include_usage {
            self.emitted = true;
            out.push(sse_data(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": openai_usage(
                    self.input_tokens,
                    self.cache_read,
                    self.cache_creation,
                    self.output_tokens,
                ),
            })));
        }
        out.push(sse_done());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_frames;
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

    fn feed(t: &mut StreamTranslator, events: &[(&str, Value)]) -> Vec<Bytes> {
        let mut out = Vec::new();
        for (name, data) in events {
            out.extend(t.on_event(Some(name), &data.to_string()));
        }
        out
    }

    fn realistic_events() -> Vec<(&'static str, Value)> {
        vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_01", "type": "message",
                "role": "assistant", "model": "claude-up", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 25, "cache_read_input_tokens": 10, "cache_creation_input_tokens": 5, "output_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            ("ping", json!({"type": "ping"})),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me check"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "."}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {}}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 42}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ]
    }

    fn chunk(t: &StreamTranslator, delta: Value, finish: Value) -> (Option<String>, Value) {
        (
            None,
            json!({"id": "chatcmpl-msg_01", "object": "chat.completion.chunk", "created": t.created,
                   "model": "gpt-client",
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]}),
        )
    }

    #[test]
    fn stream_realistic_sequence_exact_frames() {
        let mut t = StreamTranslator::new("gpt-client", true);
        let mut frames = feed(&mut t, &realistic_events());
        frames.extend(t.finish());
        let got = parse_frames(&frames);
        let want = vec![
            chunk(&t, json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(&t, json!({"content": "Let me check"}), Value::Null),
            chunk(&t, json!({"content": "."}), Value::Null),
            chunk(
                &t,
                json!({"tool_calls": [{"index": 0, "id": "toolu_01", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                &t,
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
                Value::Null,
            ),
            chunk(
                &t,
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
                Value::Null,
            ),
            chunk(&t, json!({}), json!("tool_calls")),
            (
                None,
                json!({"id": "chatcmpl-msg_01", "object": "chat.completion.chunk", "created": t.created,
                       "model": "gpt-client", "choices": [],
                       "usage": {"prompt_tokens": 40, "completion_tokens": 42, "total_tokens": 82,
                                 "prompt_tokens_details": {"cached_tokens": 10}}}),
            ),
            (None, json!("[DONE]")),
        ];
        assert_eq!(got, want);
        assert_eq!(&frames[0][..6], b"data: ");
        // finish after message_stop adds nothing.
        assert!(t.finish().is_empty());
        assert!(t.on_event(None, "{\"type\":\"ping\"}").is_empty());
    }

    #[test]
    fn stream_without_usage_and_second_tool_counts_tools_not_blocks() {
        let mut t = StreamTranslator::new("gpt-client", false);
        let events = vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_01", "usage": {"input_tokens": 1}}}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "ponder"}}),
            ),
            (
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "abc"}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "a", "name": "f", "input": {}}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 1}),
            ),
            (
                "content_block_start",
                json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "b", "name": "g", "input": {"x": 1}}}),
            ),
            (
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 2}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 3}}),
            ),
            ("message_stop", json!({"type": "message_stop"})),
        ];
        let frames = feed(&mut t, &events);
        let got = parse_frames(&frames);
        let want = vec![
            chunk(&t, json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(&t, json!({"reasoning_content": "ponder"}), Value::Null),
            chunk(
                &t,
                json!({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                &t,
                json!({"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                &t,
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"x\":1}"}}]}),
                Value::Null,
            ),
            chunk(&t, json!({}), json!("length")),
            (None, json!("[DONE]")),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn stream_error_event_ends_with_done() {
        let mut t = StreamTranslator::new("gpt-client", true);
        let mut frames = feed(&mut t, &realistic_events()[..4]);
        frames.extend(t.on_event(
            Some("error"),
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ));
        frames.extend(t.on_event(None, r#"{"type":"message_stop"}"#));
        frames.extend(t.finish());
        let got = parse_frames(&frames);
        assert_eq!(got.len(), 4);
        assert_eq!(
            got[2],
            (
                None,
                json!({"error": {"message": "Overloaded", "type": "server_error", "code": "overloaded", "param": null}})
            )
        );
        assert_eq!(got[3], (None, json!("[DONE]")));
    }

    #[test]
    fn stream_cut_still_ends_with_usage_and_done_once() {
        let mut t = StreamTranslator::new("gpt-client", true);
        let mut frames = feed(&mut t, &realistic_events()[..9]);
        frames.extend(t.finish());
        frames.extend(t.finish());
        let got = parse_frames(&frames);
        let n = got.len();
        assert_eq!(got[n - 1], (None, json!("[DONE]")));
        assert_eq!(got[n - 2].1["usage"]["prompt_tokens"], 40);
        assert_eq!(got[n - 2].1["usage"]["completion_tokens"], 1);
        assert_eq!(got.iter().filter(|(_, v)| v == &json!("[DONE]")).count(), 1);
        // No finish_reason was invented for the cut stream.
        assert!(got
            .iter()
            .all(|(_, v)| v["choices"][0]["finish_reason"].is_null()));
        // All chunks share id and created.
        for (_, v) in &got[..n - 1] {
            assert_eq!(v["id"], "chatcmpl-msg_01");
            assert_eq!(v["created"], t.created);
        }
    }

    #[test]
    fn stream_empty_upstream_still_terminates() {
        let mut t = StreamTranslator::new("gpt-client", false);
        assert_eq!(parse_frames(&t.finish()), vec![(None, json!("[DONE]"))]);
    }

    #[test]
    fn stream_without_message_start_still_sends_role_first_and_keeps_id() {
        let mut t = StreamTranslator::new("gpt-client", false);
        let frames = t.on_event(
            None,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#,
        );
        let late = t.on_event(None, r#"{"type":"message_start","message":{"id":"late"}}"#);
        assert!(late.is_empty());
        let got = parse_frames(&frames);
        assert_eq!(got[0].1["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(got[1].1["choices"][0]["delta"]["content"], "hi");
        let more = parse_frames(&t.on_event(
            None,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}"#,
        ));
        assert_eq!(more[0].1["id"], got[0].1["id"]);
    }

    #[test]
    fn stream_garbage_never_panics() {
        let garbage = [
            "",
            "not json",
            "[DONE]",
            "null",
            "[]",
            "42",
            "\"str\"",
            "{}",
            r#"{"type":"content_block_start"}"#,
            r#"{"type":"content_block_start","index":"x","content_block":5}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use"}}"#,
            r#"{"type":"content_block_delta","index":99,"delta":{"type":"input_json_delta","partial_json":"x"}}"#,
            r#"{"type":"content_block_delta","delta":null}"#,
            r#"{"type":"content_block_stop","index":-1}"#,
            r#"{"type":"message_delta","delta":[],"usage":{"output_tokens":-5}}"#,
            r#"{"type":"message_start","message":[]}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":"many"}}}"#,
            r#"{"type":"error"}"#,
        ];
        for include_usage in [true, false] {
            let mut t = StreamTranslator::new("m", include_usage);
            for g in garbage {
                let _ = t.on_event(None, g);
                let _ = t.on_event(Some("content_block_delta"), g);
            }
            let _ = t.finish();
        }
    }
}
