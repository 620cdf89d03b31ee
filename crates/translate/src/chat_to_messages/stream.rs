//! Streamed answers.

use bytes::Bytes;
use serde_json::{json, Value};

use super::answer::{finish_reason, openai_usage};
use crate::{
    anthropic_error_to_openai, chat_chunk, now_unix, random_id, sse_data, sse_done, str_field,
};

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
        sse_data(&chat_chunk(
            &self.id,
            self.created,
            &self.model,
            delta,
            finish_reason,
        ))
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
    use super::*;
    use crate::parse_frames;

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
