//! Streamed answers: Anthropic events or chat chunks as the Responses event stream.

use bytes::Bytes;
use serde_json::Value;

use super::events::{End, Writer};
use crate::{openai_error_type_to_anthropic, str_field, u64_field};

const CUT_MESSAGE: &str = "The upstream stream was interrupted.";

fn parse(event: Option<&str>, data: &str) -> Option<Value> {
    match serde_json::from_str(data) {
        Ok(v) => Some(v),
        Err(e) => {
            log::debug!("ignoring unparsable upstream event {event:?}: {e}");
            None
        }
    }
}

/// A stream that broke off, or ended without saying how, is a failure the client must see
/// rather than a silently short answer.
fn fail_cut(w: &mut Writer, out: &mut Vec<Bytes>) {
    w.end(
        End::Failed {
            code: "upstream_error",
            message: CUT_MESSAGE,
        },
        out,
    );
}

/// Anthropic events -> Responses events.
pub struct MessagesStream {
    w: Writer,
    stop_reason: Option<String>,
    /// Tool blocks whose input came whole in `content_block_start` (sent at their stop
    /// unless deltas followed).
    initial_input: Option<(u64, String)>,
}

impl MessagesStream {
    pub fn new(client_model: &str) -> Self {
        MessagesStream {
            w: Writer::new(client_model),
            stop_reason: None,
            initial_input: None,
        }
    }

    fn read_usage(&mut self, u: &Value) {
        let c = &mut self.w.counts;
        // message_start carries the input; message_delta the cumulative output (and, on
        // some providers, the input again).
        if u.get("input_tokens").is_some() {
            c.cached = u64_field(u, "cache_read_input_tokens");
            c.input = u64_field(u, "input_tokens")
                .saturating_add(c.cached)
                .saturating_add(u64_field(u, "cache_creation_input_tokens"));
        }
        if let Some(n) = u.get("output_tokens").and_then(Value::as_u64) {
            c.output = n;
        }
    }

    /// One Anthropic SSE event -> zero or more Responses frames.
    pub fn on_event(&mut self, event: Option<&str>, data: &str) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.w.is_done() {
            return out;
        }
        let Some(v) = parse(event, data) else {
            return out;
        };
        let index = v.get("index").and_then(Value::as_u64);
        match str_field(&v, "type").or(event).unwrap_or("") {
            "message_start" => {
                let message = v.get("message").unwrap_or(&Value::Null);
                self.w.set_id(str_field(message, "id").unwrap_or(""));
                if let Some(u) = message.get("usage") {
                    self.read_usage(u);
                }
                self.w.start(&mut out);
            }
            "content_block_start" => {
                let block = v.get("content_block").unwrap_or(&Value::Null);
                match str_field(block, "type") {
                    Some("text") => self
                        .w
                        .text(str_field(block, "text").unwrap_or(""), &mut out),
                    Some("thinking") => {
                        self.w
                            .reasoning(str_field(block, "thinking").unwrap_or(""), &mut out);
                        self.w
                            .signature(str_field(block, "signature").unwrap_or(""), &mut out);
                    }
                    Some("tool_use") => {
                        let key = index.unwrap_or(u64::MAX);
                        let call_id = str_field(block, "id").unwrap_or("");
                        let name = str_field(block, "name").unwrap_or("");
                        self.w.call_start(key, call_id, name, &mut out);
                        self.initial_input = block
                            .get("input")
                            .filter(|i| i.as_object().is_some_and(|m| !m.is_empty()))
                            .map(|i| (key, i.to_string()));
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = v.get("delta").unwrap_or(&Value::Null);
                let text = |k: &str| str_field(delta, k).unwrap_or("");
                match str_field(delta, "type") {
                    Some("text_delta") => self.w.text(text("text"), &mut out),
                    Some("thinking_delta") => self.w.reasoning(text("thinking"), &mut out),
                    Some("signature_delta") => self.w.signature(text("signature"), &mut out),
                    Some("input_json_delta") => {
                        let key = index.unwrap_or(u64::MAX);
                        if !text("partial_json").is_empty() {
                            self.initial_input = None;
                        }
                        self.w.call_args(key, text("partial_json"), &mut out);
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some((key, input)) = self.initial_input.take() {
                    if Some(key) == index {
                        self.w.call_args(key, &input, &mut out);
                    }
                }
                self.w.close(&mut out);
            }
            "message_delta" => {
                if let Some(u) = v.get("usage") {
                    self.read_usage(u);
                }
                if let Some(r) = v.get("delta").and_then(|d| str_field(d, "stop_reason")) {
                    self.stop_reason = Some(r.to_string());
                }
            }
            "message_stop" => {
                let end = match self.stop_reason.as_deref() {
                    Some("max_tokens") | Some("model_context_window_exceeded") => {
                        End::Incomplete("max_output_tokens")
                    }
                    _ => End::Completed,
                };
                self.w.end(end, &mut out);
            }
            "error" => {
                let e = v.get("error").unwrap_or(&Value::Null);
                let message = str_field(e, "message").unwrap_or("upstream stream error");
                let code = str_field(e, "type").unwrap_or("api_error");
                self.w.end(End::Failed { code, message }, &mut out);
            }
            _ => {}
        }
        out
    }

    /// The output items the stream sent whole (every item, once it ended), taken out: the
    /// gateway keeps them for later `item_reference`s.
    pub fn take_output(&mut self) -> Vec<Value> {
        self.w.take_output()
    }

    /// Ends the stream once: nothing when it already ended, else `response.completed` when
    /// the provider said it had finished and `response.failed` when it was `cut`.
    pub fn finish(&mut self, cut: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.stop_reason.is_some() && !cut {
            self.on_event(None, r#"{"type":"message_stop"}"#)
        } else {
            fail_cut(&mut self.w, &mut out);
            out
        }
    }
}

/// Chat completion chunks -> Responses events.
pub struct ChatStream {
    w: Writer,
    finish_reason: Option<String>,
}

impl ChatStream {
    pub fn new(client_model: &str) -> Self {
        ChatStream {
            w: Writer::new(client_model),
            finish_reason: None,
        }
    }

    fn end_normally(&mut self, out: &mut Vec<Bytes>) {
        let end = match self.finish_reason.as_deref() {
            Some("length") => End::Incomplete("max_output_tokens"),
            Some("content_filter") => End::Incomplete("content_filter"),
            _ => End::Completed,
        };
        self.w.end(end, out);
    }

    /// One chat SSE event (`data:` payload) -> zero or more Responses frames.
    pub fn on_event(&mut self, event: Option<&str>, data: &str) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.w.is_done() {
            return out;
        }
        if data.trim() == "[DONE]" {
            self.end_normally(&mut out);
            return out;
        }
        let Some(v) = parse(event, data) else {
            return out;
        };
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let message = str_field(e, "message").unwrap_or("upstream stream error");
            let code = str_field(e, "code").unwrap_or_else(|| openai_error_type_to_anthropic(e));
            self.w.end(End::Failed { code, message }, &mut out);
            return out;
        }
        self.w.set_id(str_field(&v, "id").unwrap_or(""));
        self.w.start(&mut out);
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let detail = |k: &str, f: &str| u.get(k).map(|d| u64_field(d, f)).unwrap_or(0);
            let c = &mut self.w.counts;
            c.input = u64_field(u, "prompt_tokens");
            c.cached = detail("prompt_tokens_details", "cached_tokens");
            c.output = u64_field(u, "completion_tokens");
            c.reasoning = detail("completion_tokens_details", "reasoning_tokens");
        }
        let choice = v
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
            .unwrap_or(&Value::Null);
        let delta = choice.get("delta").unwrap_or(&Value::Null);
        if let Some(r) =
            str_field(delta, "reasoning_content").or_else(|| str_field(delta, "reasoning"))
        {
            self.w.reasoning(r, &mut out);
        }
        if let Some(t) = str_field(delta, "content") {
            self.w.text(t, &mut out);
        }
        for call in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let key = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let function = call.get("function").unwrap_or(&Value::Null);
            if !self.w.call_is_open(key) {
                let call_id = str_field(call, "id").unwrap_or("");
                let name = str_field(function, "name").unwrap_or("");
                self.w.call_start(key, call_id, name, &mut out);
            }
            self.w.call_args(
                key,
                str_field(function, "arguments").unwrap_or(""),
                &mut out,
            );
        }
        if let Some(r) = str_field(choice, "finish_reason") {
            self.finish_reason = Some(r.to_string());
        }
        out
    }

    /// [`MessagesStream::take_output`].
    pub fn take_output(&mut self) -> Vec<Value> {
        self.w.take_output()
    }

    /// Ends the stream once, as [`MessagesStream::finish`] does.
    pub fn finish(&mut self, cut: bool) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.finish_reason.is_some() && !cut {
            self.end_normally(&mut out);
        } else {
            fail_cut(&mut self.w, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_frames;
    use serde_json::json;

    fn types(frames: &[Bytes]) -> Vec<String> {
        parse_frames(frames)
            .into_iter()
            .map(|(event, data)| {
                assert_eq!(event.as_deref(), data["type"].as_str(), "{data}");
                data["type"].as_str().unwrap_or("").to_string()
            })
            .collect()
    }

    fn anthropic(events: &[Value]) -> (Vec<Bytes>, MessagesStream) {
        let mut t = MessagesStream::new("claude-x");
        let mut out = Vec::new();
        for e in events {
            out.extend(t.on_event(e["type"].as_str(), &e.to_string()));
        }
        (out, t)
    }

    fn thinking_text_tool() -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "plan"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {}}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"a\""}}),
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ":1}"}}),
            json!({"type": "content_block_stop", "index": 2}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 24}}),
            json!({"type": "message_stop"}),
        ]
    }

    #[test]
    fn anthropic_stream_full_event_sequence() {
        let (frames, mut t) = anthropic(&thinking_text_tool());
        assert_eq!(
            types(&frames),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let parsed = parse_frames(&frames);
        for (i, (_, data)) in parsed.iter().enumerate() {
            assert_eq!(data["sequence_number"], i, "{data}");
        }
        let done = &parsed[parsed.len() - 1].1["response"];
        assert_eq!(done["id"], "resp_msg_1");
        assert_eq!(done["status"], "completed");
        assert_eq!(
            done["usage"],
            json!({"input_tokens": 25, "input_tokens_details": {"cached_tokens": 5},
                   "output_tokens": 24, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 49})
        );
        let output = done["output"].as_array().expect("output");
        assert_eq!(output.len(), 3);
        assert_eq!(output[0]["encrypted_content"], "gw-anthropic-signature:sig");
        assert_eq!(output[0]["summary"][0]["text"], "plan");
        assert_eq!(output[1]["content"][0]["text"], "Hi");
        assert_eq!(output[2]["arguments"], "{\"a\":1}");
        assert_eq!(output[2]["call_id"], "toolu_1");
        assert_eq!(parsed[14].1["item"]["name"], "shell");
        assert!(t.finish(true).is_empty(), "ended once");
        // The items the client was sent, for the gateway to keep.
        let kept = t.take_output();
        assert_eq!(&kept, output);
        assert!(kept
            .iter()
            .all(|i| super::super::is_issued_item_id(i["id"].as_str().unwrap_or(""))));
    }

    #[test]
    fn anthropic_cut_error_and_max_tokens() {
        let events = thinking_text_tool();
        let (mut frames, mut t) = anthropic(&events[..8]);
        frames.extend(t.finish(true));
        let parsed = parse_frames(&frames);
        let last = &parsed[parsed.len() - 1].1;
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["response"]["error"]["code"], "upstream_error");
        assert_eq!(last["response"]["output"][1]["content"][0]["text"], "Hi");

        let mut error = events[..3].to_vec();
        error.push(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}));
        let (frames, _) = anthropic(&error);
        let parsed = parse_frames(&frames);
        let last = &parsed[parsed.len() - 1].1;
        assert_eq!(
            last["response"]["error"],
            json!({"code": "overloaded_error", "message": "Overloaded"})
        );

        let mut cut = events[5..9].to_vec();
        cut.push(json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 3}}));
        let (mut frames, mut t) = anthropic(&cut);
        frames.extend(t.finish(false));
        let parsed = parse_frames(&frames);
        let last = &parsed[parsed.len() - 1].1;
        assert_eq!(last["type"], "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
    }

    #[test]
    fn chat_stream_text_tools_usage() {
        let chunks = [
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\""}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}]}}]}),
            json!({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"id": "c1", "choices": [], "usage": {"prompt_tokens": 25, "completion_tokens": 24,
                   "prompt_tokens_details": {"cached_tokens": 5}, "completion_tokens_details": {"reasoning_tokens": 3}}}),
        ];
        let mut t = ChatStream::new("gpt-x");
        let mut frames = Vec::new();
        for c in &chunks {
            frames.extend(t.on_event(None, &c.to_string()));
        }
        frames.extend(t.on_event(None, "[DONE]"));
        frames.extend(t.finish(false));
        let parsed = parse_frames(&frames);
        let last = &parsed[parsed.len() - 1].1;
        assert_eq!(last["type"], "response.completed");
        assert_eq!(last["response"]["id"], "resp_c1");
        let output = last["response"]["output"].as_array().expect("output");
        let kinds: Vec<&str> = output.iter().filter_map(|o| o["type"].as_str()).collect();
        assert_eq!(
            kinds,
            ["reasoning", "message", "function_call", "function_call"]
        );
        assert_eq!(output[2]["arguments"], "{\"a\":1}");
        assert_eq!(output[3]["call_id"], "call_2");
        assert_eq!(last["response"]["usage"]["input_tokens"], 25);
        assert_eq!(
            last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"],
            3
        );
        assert_eq!(
            types(&frames)
                .iter()
                .filter(|t| t.ends_with(".done"))
                .count(),
            4 + 2 + 2 + 2
        );

        // Cut before the finish reason: failed; an error chunk: failed with its code.
        let mut t = ChatStream::new("gpt-x");
        let mut frames = t.on_event(None, &chunks[2].to_string());
        frames.extend(t.finish(false));
        assert_eq!(
            parse_frames(&frames).last().map(|f| f.1["type"].clone()),
            Some(json!("response.failed"))
        );
        let mut t = ChatStream::new("gpt-x");
        let frames = t.on_event(
            None,
            r#"{"error":{"message":"slow","type":"requests","code":"rate_limit_exceeded"}}"#,
        );
        assert_eq!(
            parse_frames(&frames)
                .last()
                .map(|f| f.1["response"]["error"]["code"].clone()),
            Some(json!("rate_limit_exceeded"))
        );
    }

    #[test]
    fn garbage_never_panics() {
        for g in [
            "",
            "x",
            "null",
            "[]",
            "{}",
            r#"{"type":"content_block_delta","delta":5}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":"a"}]}}]}"#,
            r#"{"usage":{"prompt_tokens":-1}}"#,
        ] {
            let mut a = MessagesStream::new("m");
            let _ = a.on_event(None, g);
            let _ = a.finish(true);
            let mut c = ChatStream::new("m");
            let _ = c.on_event(None, g);
            let _ = c.finish(false);
        }
    }
}
