//! Streamed answers.

use bytes::Bytes;
use serde_json::{json, Value};

use super::answer::{message_id, split_usage, stop_reason};
use crate::{openai_error_type_to_anthropic, random_id, sse_event, str_field};

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

    /// Adds `delta` to the open block when it is of `kind`; otherwise closes the open block and
    /// starts one of `kind` (`content_block`, built only then) for it.
    fn extend_block(
        &mut self,
        kind: OpenKind,
        content_block: impl FnOnce() -> Value,
        delta: Value,
        out: &mut Vec<Bytes>,
    ) {
        let index = match &self.open {
            Some(open) if open.kind == kind => open.index,
            _ => self.open_block(kind, content_block(), out),
        };
        out.push(Self::delta(index, delta));
    }

    fn on_text(&mut self, text: &str, out: &mut Vec<Bytes>) {
        self.extend_block(
            OpenKind::Text,
            || json!({ "type": "text", "text": "" }),
            json!({ "type": "text_delta", "text": text }),
            out,
        );
    }

    fn on_thinking(&mut self, text: &str, out: &mut Vec<Bytes>) {
        self.extend_block(
            OpenKind::Thinking,
            || json!({ "type": "thinking", "thinking": "", "signature": "" }),
            json!({ "type": "thinking_delta", "thinking": text }),
            out,
        );
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
    use super::*;
    use crate::parse_frames;

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

    fn block_start(index: u64, block: Value) -> (Option<String>, Value) {
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        )
    }

    fn block_delta(index: u64, delta: Value) -> (Option<String>, Value) {
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }

    fn block_stop(index: u64) -> (Option<String>, Value) {
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
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
            block_start(0, json!({"type": "text", "text": ""})),
            block_delta(0, json!({"type": "text_delta", "text": "Let me"})),
            block_delta(0, json!({"type": "text_delta", "text": " check."})),
            block_stop(0),
            block_start(
                1,
                json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}),
            ),
            block_delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "{\"ci"}),
            ),
            block_delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "ty\": \"Par"}),
            ),
            block_delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "is\"}"}),
            ),
            block_stop(1),
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
