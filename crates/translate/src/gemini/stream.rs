//! Streamed answers: Gemini's `streamGenerateContent?alt=sse` events to chat chunks.
//!
//! Each Gemini event is a whole `GenerateContentResponse` holding what is new: text as it
//! comes, each function call whole, the usage so far, and on the last one the candidate's
//! `finishReason`. There is no end event: the body ends.

use bytes::Bytes;
use serde_json::{json, Value};

use super::answer::{finish_reason, first_candidate, usage, Parts};
use crate::{chat_chunk, now_unix, random_id, sse_data, sse_done, str_field};

/// Translates a Gemini event stream into OpenAI `chat.completion.chunk` objects (for a chat
/// client, framed by [`StreamTranslator::on_event_frames`] and
/// [`StreamTranslator::finish_frames`]; for the other clients, fed on to their translator).
///
/// A stream that ends without a `finishReason` (cut) gets no `finish_reason` chunk, as in the
/// other translations: a missing finish reason is how chat clients learn the answer is
/// incomplete.
pub struct StreamTranslator {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    emitted: bool,
    role_sent: bool,
    finished: bool,
    /// An error event ended the stream: nothing more is sent.
    failed: bool,
    done: bool,
    next_tool: usize,
    usage: Value,
}

impl StreamTranslator {
    /// `include_usage` mirrors the client's `stream_options.include_usage` (a translation that
    /// feeds another one asks for it: the next needs the usage).
    pub fn new(client_model: &str, include_usage: bool) -> Self {
        Self {
            id: random_id("chatcmpl-"),
            created: now_unix(),
            model: client_model.to_string(),
            include_usage,
            emitted: false,
            role_sent: false,
            finished: false,
            failed: false,
            done: false,
            next_tool: 0,
            usage: Value::Null,
        }
    }

    /// True once a candidate said why it finished: the stream was complete.
    pub fn finished(&self) -> bool {
        self.finished
    }

    fn chunk(&mut self, delta: Value, finish_reason: Option<&str>) -> Value {
        self.emitted = true;
        chat_chunk(&self.id, self.created, &self.model, delta, finish_reason)
    }

    fn ensure_role(&mut self, out: &mut Vec<Value>) {
        if !self.role_sent {
            self.role_sent = true;
            let c = self.chunk(json!({ "role": "assistant", "content": "" }), None);
            out.push(c);
        }
    }

    /// One Gemini event's `data` -> zero or more chat chunks. An error event becomes the chat
    /// error object (`{"error":{...}}`) and ends the stream.
    pub fn on_event(&mut self, data: &str) -> Vec<Value> {
        if self.done || self.failed {
            return Vec::new();
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                log::debug!("ignoring unparsable upstream event");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        if v.get("error").is_some_and(|e| !e.is_null()) {
            self.failed = true;
            out.push(super::error(data.as_bytes()));
            return out;
        }
        if let (false, Some(id)) = (self.emitted, str_field(&v, "responseId")) {
            self.id = format!("chatcmpl-{id}");
        }
        if let Some(meta) = v.get("usageMetadata").filter(|m| m.is_object()) {
            self.usage = meta.clone();
        }
        let candidate = first_candidate(&v);
        let parts = Parts::read(candidate.and_then(|c| c.get("content")));
        if !parts.reasoning.is_empty() {
            self.ensure_role(&mut out);
            let c = self.chunk(json!({ "reasoning_content": parts.reasoning }), None);
            out.push(c);
        }
        if !parts.text.is_empty() {
            self.ensure_role(&mut out);
            let c = self.chunk(json!({ "content": parts.text }), None);
            out.push(c);
        }
        let calls = !parts.calls.is_empty();
        for (id, name, args) in parts.calls {
            self.ensure_role(&mut out);
            let index = self.next_tool;
            self.next_tool += 1;
            let c = self.chunk(
                json!({ "tool_calls": [{
                    "index": index,
                    "id": id,
                    "type": "function",
                    "function": { "name": name, "arguments": args },
                }]}),
                None,
            );
            out.push(c);
        }
        let reason = candidate.and_then(|c| str_field(c, "finishReason"));
        let blocked = candidate.is_none()
            && v.get("promptFeedback")
                .and_then(|f| str_field(f, "blockReason"))
                .is_some();
        let finish = match reason {
            Some(r) => Some(finish_reason(r, calls || self.next_tool > 0)),
            None if blocked => Some("content_filter"),
            None => None,
        };
        if let (Some(finish), false) = (finish, self.finished) {
            self.finished = true;
            self.ensure_role(&mut out);
            let c = self.chunk(json!({}), Some(finish));
            out.push(c);
        }
        out
    }

    /// Called once at the end (also when the stream was cut): the usage chunk, when asked
    /// for, unless an error ended the stream. Safe to call again.
    pub fn finish(&mut self) -> Vec<Value> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        if self.failed || !self.include_usage {
            return Vec::new();
        }
        self.emitted = true;
        vec![json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(&self.usage),
        })]
    }

    /// [`StreamTranslator::on_event`] as SSE frames for a chat client; an error frame is
    /// followed by `[DONE]`.
    pub fn on_event_frames(&mut self, data: &str) -> Vec<Bytes> {
        let failed = self.failed;
        let mut frames: Vec<Bytes> = self.on_event(data).iter().map(sse_data).collect();
        if self.failed && !failed {
            self.done = true;
            frames.push(sse_done());
        }
        frames
    }

    /// [`StreamTranslator::finish`] as SSE frames, `[DONE]` last. Empty when the stream
    /// already ended (an error event).
    pub fn finish_frames(&mut self) -> Vec<Bytes> {
        if self.done {
            return Vec::new();
        }
        let mut frames: Vec<Bytes> = self.finish().iter().map(sse_data).collect();
        frames.push(sse_done());
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_frames;

    fn events() -> Vec<String> {
        [
            json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "Thinking it over.", "thought": true}]}, "index": 0}],
                "usageMetadata": {"promptTokenCount": 30, "totalTokenCount": 30},
                "responseId": "r1"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Let me "}]}, "index": 0}],
                "responseId": "r1"}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "check."},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "U0lH"}]},
                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 30, "candidatesTokenCount": 12,
                    "thoughtsTokenCount": 8, "cachedContentTokenCount": 10, "totalTokenCount": 50},
                "responseId": "r1"}),
        ]
        .iter()
        .map(Value::to_string)
        .collect()
    }

    #[test]
    fn a_stream_becomes_chat_chunks_with_one_usage_chunk() {
        let mut t = StreamTranslator::new("client", true);
        let mut frames = Vec::new();
        for e in events() {
            frames.extend(t.on_event_frames(&e));
        }
        assert!(t.finished());
        frames.extend(t.finish_frames());
        let parsed = parse_frames(&frames);
        let deltas: Vec<&Value> = parsed
            .iter()
            .filter_map(|(_, v)| v.get("choices").and_then(|c| c.get(0)))
            .collect();
        assert_eq!(deltas[0]["delta"]["role"], "assistant");
        assert_eq!(deltas[1]["delta"]["reasoning_content"], "Thinking it over.");
        assert_eq!(deltas[2]["delta"]["content"], "Let me ");
        assert_eq!(deltas[3]["delta"]["content"], "check.");
        let call = &deltas[4]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert!(call["id"].as_str().unwrap().ends_with("~sig~U0lH"));
        assert_eq!(deltas[5]["finish_reason"], "tool_calls");
        let usage = &parsed[parsed.len() - 2].1;
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["prompt_tokens"], 30);
        assert_eq!(usage["usage"]["completion_tokens"], 20);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
        assert_eq!(parsed.last().unwrap().1, json!("[DONE]"));
        assert!(parsed
            .iter()
            .filter_map(|(_, v)| v.get("id"))
            .all(|id| id == "chatcmpl-r1"));
        assert!(t.finish_frames().is_empty());
    }

    #[test]
    fn errors_end_the_stream_and_cuts_have_no_finish_reason() {
        let mut t = StreamTranslator::new("m", false);
        let first = t.on_event_frames(&events()[1]);
        assert_eq!(first.len(), 2);
        let err = t.on_event_frames(
            r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#,
        );
        let parsed = parse_frames(&err);
        assert_eq!(parsed[0].1["error"]["code"], "overloaded");
        assert_eq!(parsed[1].1, json!("[DONE]"));
        assert!(t.on_event_frames(&events()[2]).is_empty());
        assert!(t.finish_frames().is_empty());

        let mut cut = StreamTranslator::new("m", false);
        cut.on_event_frames(&events()[1]);
        assert!(!cut.finished());
        let tail = parse_frames(&cut.finish_frames());
        assert_eq!(tail, vec![(None, json!("[DONE]"))]);
    }
}
