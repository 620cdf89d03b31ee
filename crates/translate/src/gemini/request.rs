//! The request direction: an OpenAI chat request to a Gemini `GenerateContentRequest`.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::signature_of;
use crate::{args_to_object, bad, chat_messages, opt_u64, push_merged, str_field, TranslateError};

/// Thinking budgets per OpenAI `reasoning_effort` (Gemini 2.5's `thinkingBudget`).
fn effort_budget(effort: &str) -> Option<i64> {
    match effort {
        "none" | "minimal" => Some(0),
        "low" => Some(1024),
        "medium" => Some(8192),
        "high" | "xhigh" => Some(24576),
        _ => None,
    }
}

fn text_part(text: &str) -> Value {
    json!({ "text": text })
}

/// The media type a URL's file name suggests, for `fileData` (Gemini wants one).
fn media_type_of(url: &str) -> &'static str {
    let path = url
        .split(['?', '#'])
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    match path.rsplit('.').next().unwrap_or("") {
        "png" => "image/png",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "pdf" => "application/pdf",
        _ => "image/jpeg",
    }
}

/// A `data:` URL as `inlineData`, or an http(s) URL as `fileData`.
fn media_part(url: &str) -> Result<Value, TranslateError> {
    if let Some(rest) = url.strip_prefix("data:") {
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
        return Ok(json!({ "inlineData": { "mimeType": media_type, "data": data } }));
    }
    if url.starts_with("https://") || url.starts_with("http://") || url.starts_with("gs://") {
        return Ok(json!({ "fileData": { "mimeType": media_type_of(url), "fileUri": url } }));
    }
    Err(bad("image_url.url must be an http(s) or base64 data: URL"))
}

/// OpenAI content (a string or parts) as Gemini parts; empty text is dropped.
fn content_parts(content: Option<&Value>) -> Result<Vec<Value>, TranslateError> {
    let mut parts = Vec::new();
    match content {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            if !s.is_empty() {
                parts.push(text_part(s));
            }
        }
        Some(Value::Array(items)) => {
            for item in items {
                match str_field(item, "type").unwrap_or("text") {
                    "text" | "input_text" | "output_text" => {
                        if let Some(t) = str_field(item, "text").filter(|t| !t.is_empty()) {
                            parts.push(text_part(t));
                        }
                    }
                    "refusal" => {
                        if let Some(t) = str_field(item, "refusal").filter(|t| !t.is_empty()) {
                            parts.push(text_part(t));
                        }
                    }
                    "image_url" => {
                        let url = match item.get("image_url") {
                            Some(Value::String(s)) => s.as_str(),
                            Some(obj) => str_field(obj, "url").unwrap_or(""),
                            None => "",
                        };
                        parts.push(media_part(url)?);
                    }
                    "file" => {
                        let data = item.get("file").and_then(|f| str_field(f, "file_data"));
                        match data.map(media_part) {
                            Some(Ok(p)) => parts.push(p),
                            _ => log::debug!("dropping unrepresentable file content part"),
                        }
                    }
                    other => log::debug!("dropping unsupported content part type {other:?}"),
                }
            }
        }
        Some(_) => return Err(bad("message content must be a string or an array")),
    }
    Ok(parts)
}

/// Flattens content to text (system instructions take text only).
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                _ => str_field(p, "text"),
            })
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The parts of an assistant turn: its text, then its calls. A call's signature (carried in
/// its id) goes back on its part, and its id (without the signature) as the call's `id`.
fn model_parts(
    m: &Value,
    i: usize,
    names: &mut HashMap<String, String>,
) -> Result<Vec<Value>, TranslateError> {
    let mut parts = content_parts(m.get("content"))?;
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        for (j, call) in calls.iter().enumerate() {
            let function = call.get("function").unwrap_or(&Value::Null);
            let name = str_field(function, "name").ok_or_else(|| {
                bad(format!(
                    "messages[{i}].tool_calls[{j}].function.name is missing"
                ))
            })?;
            let id = str_field(call, "id").unwrap_or("");
            names.insert(id.to_string(), name.to_string());
            let mut part = Map::new();
            part.insert(
                "functionCall".into(),
                json!({ "name": name, "args": args_to_object(function.get("arguments")) }),
            );
            if let Some(sig) = signature_of(id) {
                part.insert("thoughtSignature".into(), json!(sig));
            }
            parts.push(Value::Object(part));
        }
    }
    Ok(parts)
}

/// A tool message as a `functionResponse` part. Gemini names the function (chat names only
/// the call), and wants an object: a JSON object result is sent as it is, anything else as
/// `{"content": ...}`.
fn function_response(
    m: &Value,
    i: usize,
    names: &HashMap<String, String>,
) -> Result<Value, TranslateError> {
    let id = str_field(m, "tool_call_id")
        .ok_or_else(|| bad(format!("messages[{i}].tool_call_id is missing")))?;
    let name = names
        .get(id)
        .cloned()
        .or_else(|| str_field(m, "name").map(str::to_string))
        .ok_or_else(|| {
            bad(format!(
                "messages[{i}].tool_call_id {id:?} answers no earlier tool call"
            ))
        })?;
    let text = content_text(m.get("content"));
    let response = match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({ "content": text }),
    };
    Ok(json!({ "functionResponse": { "name": name, "response": response } }))
}

/// OpenAI function tools as one Gemini tool of `functionDeclarations`. The schema goes as
/// `parametersJsonSchema`, which takes JSON Schema as clients write it (`parameters` takes only
/// an OpenAPI subset and refuses common keywords).
fn function_declarations(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter_map(|t| {
            let kind = str_field(t, "type").unwrap_or("function");
            let function = t.get("function").filter(|_| kind == "function")?;
            let name = str_field(function, "name")?;
            let mut decl = Map::new();
            decl.insert("name".into(), json!(name));
            if let Some(d) = str_field(function, "description") {
                decl.insert("description".into(), json!(d));
            }
            if let Some(p @ Value::Object(_)) = function.get("parameters") {
                decl.insert("parametersJsonSchema".into(), p.clone());
            }
            Some(Value::Object(decl))
        })
        .collect()
}

fn tool_config(choice: &Value) -> Option<Value> {
    let config = match choice {
        Value::String(s) => match s.as_str() {
            "auto" => json!({ "mode": "AUTO" }),
            "none" => json!({ "mode": "NONE" }),
            "required" => json!({ "mode": "ANY" }),
            _ => return None,
        },
        Value::Object(_) => {
            let name = choice.get("function").and_then(|f| str_field(f, "name"))?;
            json!({ "mode": "ANY", "allowedFunctionNames": [name] })
        }
        _ => return None,
    };
    Some(json!({ "functionCallingConfig": config }))
}

/// The top-level fields of a chat request this translation reads; others are dropped.
const CARRIED: &[&str] = &[
    "model",
    "messages",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "reasoning_effort",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "stream",
    "stream_options",
    "user",
];

/// OpenAI chat request body -> Gemini `GenerateContentRequest` (the model goes in the path,
/// not the body; streaming is chosen by the path too).
///
/// - System and developer messages become `systemInstruction`.
/// - Assistant turns become `model` turns; tool calls `functionCall` parts and tool messages
///   `functionResponse` parts in a `user` turn, named after the call they answer.
/// - `max_completion_tokens` (or `max_tokens`) becomes `maxOutputTokens`; `reasoning_effort`
///   a `thinkingBudget` with thought summaries on; `response_format` a JSON response (with its
///   schema); `stop`, `temperature`, `top_p`, `top_k`, `seed` and the penalties their
///   `generationConfig` fields.
/// - `n` > 1 is refused, as elsewhere.
pub fn request(body: &Value) -> Result<Value, TranslateError> {
    let (obj, messages) = chat_messages(body)?;
    let mut system = Vec::new();
    let mut names = HashMap::new();
    let mut contents: Vec<(&'static str, Vec<Value>)> = Vec::new();
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
            "user" => push_merged(&mut contents, "user", content_parts(m.get("content"))?),
            "assistant" => {
                let parts = model_parts(m, i, &mut names)?;
                push_merged(&mut contents, "model", parts);
            }
            "tool" => {
                let part = function_response(m, i, &names)?;
                push_merged(&mut contents, "user", vec![part]);
            }
            "function" => log::debug!("dropping legacy function-role message"),
            other => {
                return Err(bad(format!(
                    "messages[{i}].role {other:?} is not supported"
                )))
            }
        }
    }
    if contents.is_empty() {
        return Err(bad(
            "`messages` must contain at least one non-system message",
        ));
    }
    crate::log_dropped(obj, CARRIED);

    let mut out = Map::new();
    out.insert(
        "contents".into(),
        Value::Array(
            contents
                .into_iter()
                .map(|(role, parts)| json!({ "role": role, "parts": parts }))
                .collect(),
        ),
    );
    if !system.is_empty() {
        out.insert(
            "systemInstruction".into(),
            json!({ "parts": [{ "text": system.join("\n\n") }] }),
        );
    }
    let declarations = obj
        .get("tools")
        .and_then(Value::as_array)
        .map(|t| function_declarations(t))
        .unwrap_or_default();
    if !declarations.is_empty() {
        out.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
        if let Some(config) = obj.get("tool_choice").and_then(tool_config) {
            out.insert("toolConfig".into(), config);
        }
    }
    let generation = generation_config(obj)?;
    if !generation.is_empty() {
        out.insert("generationConfig".into(), Value::Object(generation));
    }
    Ok(Value::Object(out))
}

fn generation_config(obj: &Map<String, Value>) -> Result<Map<String, Value>, TranslateError> {
    let mut g = Map::new();
    let max = match opt_u64(obj, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => opt_u64(obj, "max_tokens")?,
    };
    if let Some(n) = max {
        g.insert("maxOutputTokens".into(), json!(n));
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ] {
        match obj.get(from) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                g.insert(to.into(), v.clone());
            }
            Some(_) => return Err(bad(format!("`{from}` must be a number"))),
        }
    }
    for (from, to) in [("top_k", "topK"), ("seed", "seed")] {
        if let Some(v) = obj.get(from).filter(|v| v.is_i64() || v.is_u64()) {
            g.insert(to.into(), v.clone());
        }
    }
    match obj.get("stop") {
        Some(Value::String(s)) => {
            g.insert("stopSequences".into(), json!([s]));
        }
        Some(Value::Array(a)) if !a.is_empty() => {
            let stops: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
            g.insert("stopSequences".into(), json!(stops));
        }
        _ => {}
    }
    if let Some(effort) = obj.get("reasoning_effort").and_then(Value::as_str) {
        let budget = effort_budget(effort)
            .ok_or_else(|| bad(format!("`reasoning_effort` {effort:?} is not supported")))?;
        g.insert(
            "thinkingConfig".into(),
            json!({ "thinkingBudget": budget, "includeThoughts": budget > 0 }),
        );
    }
    if let Some(format) = obj.get("response_format") {
        match str_field(format, "type") {
            Some("json_object") => {
                g.insert("responseMimeType".into(), json!("application/json"));
            }
            Some("json_schema") => {
                g.insert("responseMimeType".into(), json!("application/json"));
                if let Some(schema) = format.get("json_schema").and_then(|s| s.get("schema")) {
                    g.insert("responseJsonSchema".into(), schema.clone());
                }
            }
            _ => {}
        }
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_conversation_becomes_contents_with_function_parts() {
        let body = json!({
            "model": "gemini-x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1~sig~U0lH", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1~sig~U0lH", "content": "{\"temp\":21}"},
                {"role": "tool", "tool_call_id": "call_1~sig~U0lH", "content": "sunny"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "description": "Weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}}, "additionalProperties": false}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_completion_tokens": 300,
            "temperature": 0.2,
            "stop": "END",
            "reasoning_effort": "low",
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
        });
        let out = request(&body).unwrap();
        assert_eq!(
            out,
            json!({
                "contents": [
                    {"role": "user", "parts": [
                        {"text": "Weather in Paris?"},
                        {"inlineData": {"mimeType": "image/png", "data": "iVBO"}}]},
                    {"role": "model", "parts": [{
                        "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                        "thoughtSignature": "U0lH"}]},
                    {"role": "user", "parts": [
                        {"functionResponse": {"name": "get_weather", "response": {"temp": 21}}},
                        {"functionResponse": {"name": "get_weather", "response": {"content": "sunny"}}}]}
                ],
                "systemInstruction": {"parts": [{"text": "Be brief.\n\nUse tools."}]},
                "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "Weather",
                    "parametersJsonSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                    "additionalProperties": false}}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}},
                "generationConfig": {"maxOutputTokens": 300, "temperature": 0.2, "stopSequences": ["END"],
                    "thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": true},
                    "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}}
            })
        );
    }

    #[test]
    fn bad_requests_are_refused() {
        for body in [
            json!({"messages": "x"}),
            json!({"messages": []}),
            json!({"messages": [{"role": "system", "content": "only"}]}),
            json!({"messages": [{"content": "x"}]}),
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
            json!({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}),
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}),
            json!({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}),
            json!([1, 2]),
        ] {
            assert!(request(&body).is_err(), "{body}");
        }
    }

    #[test]
    fn consecutive_turns_of_one_role_merge() {
        let body = json!({"messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"},
            {"role": "assistant", "content": ""}, {"role": "assistant", "content": "c"}]});
        let out = request(&body).unwrap();
        assert_eq!(
            out["contents"],
            json!([{"role": "user", "parts": [{"text": "a"}, {"text": "b"}]},
                   {"role": "model", "parts": [{"text": "c"}]}])
        );
        assert!(out.get("generationConfig").is_none());
    }
}
