//! The tracker a streamed answer passes through: reads usage, completion and delivered text
//! out of each event without holding the stream up.

use std::sync::LazyLock;

use gateway_core::domain::Usage;
use gateway_core::response_items::Issued;
use memchr::memmem;
use serde_json::Value;

use super::anthropic::{self, AnthropicParts};
use super::kind::{EventVerdict, StreamKind};
use super::openai::{self, ChatChunk};
use super::received::{Received, MAX_DELIVERED_TEXT_BYTES};
use super::FinishReasons;
use crate::sse::SseEvent;

/// Reads usage, completion and delivered text out of a provider stream.
#[derive(Debug)]
pub struct StreamUsageTracker {
    kind: StreamKind,
    received: Received,
    anthropic: AnthropicParts,
    /// The `data` of the chat chunks not read yet (see [`Self::observe`]), back to back in
    /// arrival order: one buffer, not a string allocated for each chunk.
    deferred: String,
    /// Where each kept chunk ends in `deferred`.
    deferred_ends: Vec<usize>,
    /// The response and item ids a Responses stream showed.
    issued: Issued,
    /// The finish reasons the events state, when the request is traced.
    reasons: Option<FinishReasons>,
}

/// The search [`carries_usage`] runs over every chat chunk, built once (`str::find` sets up a
/// Two-Way searcher on each call and has no vector fast path).
static USAGE_KEY: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\""));

/// Whether a chat chunk may carry a usage object: a `"usage"` key with anything but `null`.
/// Errs towards yes (the chunk is then read at once).
fn carries_usage(data: &str) -> bool {
    let mut rest = data;
    while let Some(at) = USAGE_KEY.find(rest.as_bytes()) {
        rest = &rest[at + 7..];
        match rest.trim_start().strip_prefix(':') {
            Some(value) if value.trim_start().starts_with("null") => continue,
            _ => return true,
        }
    }
    false
}

/// Deferred chat chunks past this size are read at once, so a long stream's memory stays
/// bounded by the delivered-text cap.
const MAX_DEFERRED_BYTES: usize = MAX_DELIVERED_TEXT_BYTES;

impl StreamUsageTracker {
    pub fn new(kind: StreamKind) -> Self {
        Self {
            kind,
            received: Received::default(),
            anthropic: AnthropicParts::default(),
            deferred: String::new(),
            deferred_ends: Vec::new(),
            issued: Issued::default(),
            reasons: None,
        }
    }

    /// Also collects the finish reasons the events state (a traced request).
    pub fn want_finish_reasons(&mut self) {
        self.reasons.get_or_insert_with(FinishReasons::default);
    }

    /// The finish reasons collected (see [`Self::want_finish_reasons`]).
    pub fn take_finish_reasons(&mut self) -> Option<FinishReasons> {
        self.reasons.take()
    }

    /// work on a stream.
    pub fn observe(&mut self, ev: &SseEvent) -> EventVerdict {
        if let Some(r) = &mut self.reasons {
            r.scan(ev.data.as_bytes());
        }
        let deferrable = self.kind == StreamKind::OpenAiChat
            && ev.event.is_none()
            && !ev.data.contains("error")
            && ev.data.trim() != "[DONE]";
        if !deferrable {
            return self.observe_now(ev.event.as_deref(), &ev.data);
        }
        // A chunk with usage is read now for it (OpenAI sends `"usage":null` on every chunk
        // when usage is on, and the object on the last); its text waits with the others so the
        // delivered text keeps the stream's order.
        let verdict = if carries_usage(&ev.data) {
            self.received.quiet = true;
            let v = self.observe_now(None, &ev.data);
            self.received.quiet = false;
            v
        } else {
            EventVerdict::Forward
        };
        if !self.received.delivered_truncated {
            self.deferred.push_str(&ev.data);
            self.deferred_ends.push(self.deferred.len());
            if self.deferred.len() > MAX_DEFERRED_BYTES {
                self.catch_up();
            }
        }
        verdict
    }

    /// Reads the chunks [`Self::observe`] kept, in order.
    fn catch_up(&mut self) {
        let text = std::mem::take(&mut self.deferred);
        let mut start = 0;
        for end in std::mem::take(&mut self.deferred_ends) {
            // Each end was the buffer's length after a whole `&str`: a character boundary.
            self.observe_now(None, &text[start..end]);
            start = end;
        }
    }

    fn observe_now(&mut self, event: Option<&str>, data: &str) -> EventVerdict {
        let data = data.trim();
        if data.is_empty() {
            return EventVerdict::Forward;
        }
        if data == "[DONE]" {
            if self.kind == StreamKind::OpenAiChat {
                self.received.terminal = true;
            }
            return EventVerdict::Forward;
        }
        if self.kind == StreamKind::OpenAiChat && event != Some("error") {
            if let Ok(chunk) = serde_json::from_str::<ChatChunk<'_>>(data) {
                if !chunk.is_error() {
                    return openai::observe_chat_chunk(&mut self.received, chunk);
                }
            }
        }
        let Ok(json) = serde_json::from_str::<Value>(data) else {
            return EventVerdict::Forward;
        };
        let ty = json
            .get("type")
            .and_then(Value::as_str)
            .or(event)
            .unwrap_or("");
        if (ty == "error" || event == Some("error")) && self.kind != StreamKind::Gemini {
            self.received.record_error(&json);
        }
        match self.kind {
            StreamKind::OpenAiChat => openai::observe_chat(&mut self.received, &json),
            StreamKind::OpenAiResponses => {
                openai::observe_responses(&mut self.received, ty, &json);
                openai::issued_ids(&mut self.issued, ty, &json);
                EventVerdict::Forward
            }
            StreamKind::Anthropic => {
                anthropic::observe_anthropic(&mut self.anthropic, &mut self.received, ty, &json);
                EventVerdict::Forward
            }
            StreamKind::Gemini => {
                super::gemini::observe_gemini(&mut self.received, &json);
                EventVerdict::Forward
            }
        }
    }

    /// True once the provider ended the stream deliberately: `[DONE]` for
    /// chat, `response.completed` or `response.incomplete` for responses,
    /// `message_stop` for Anthropic. False means the stream was cut.
    pub fn saw_terminal(&self) -> bool {
        self.received.terminal
    }

    /// The first error the provider reported mid-stream, if any.
    pub fn error_event(&self) -> Option<String> {
        self.received.error.clone()
    }

    /// The code (or, lacking one, the type) of the first error the provider reported
    /// mid-stream, as the provider spelled it.
    pub fn error_code(&self) -> Option<&str> {
        self.received.error_code.as_deref()
    }

    /// What the client was actually sent, for estimating output when the
    /// provider never reported usage (capped at [`MAX_DELIVERED_TEXT_BYTES`]).
    pub fn delivered_text(&mut self) -> &str {
        self.catch_up();
        &self.received.delivered
    }

    /// Whether [`Self::delivered_text`] hit its cap, so an estimate from it
    /// is a lower bound.
    pub fn delivered_text_truncated(&mut self) -> bool {
        self.catch_up();
        self.received.delivered_truncated
    }

    /// The response and output item ids a Responses stream showed so far, taken out.
    pub fn take_issued(&mut self) -> Issued {
        std::mem::take(&mut self.issued)
    }

    /// `Some` only if the provider reported usage; the caller falls back to
    /// estimating otherwise.
    pub fn usage(&self) -> Option<Usage> {
        self.received.usage
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::body::usage_from_body;
    use super::super::received::MAX_ERROR_MESSAGE_BYTES;
    use super::*;
    use crate::sse::SseParser;

    fn ev(event: Option<&str>, data: &str) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: data.to_owned(),
            raw: Bytes::new(),
        }
    }

    fn run(kind: StreamKind, stream: &str) -> (StreamUsageTracker, Vec<EventVerdict>) {
        let mut p = SseParser::new();
        let mut t = StreamUsageTracker::new(kind);
        let mut evs = p.feed(stream.as_bytes());
        evs.extend(p.finish());
        let verdicts = evs.iter().map(|e| t.observe(e)).collect();
        (t, verdicts)
    }

    const CHAT_STREAM: &str = "\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n\
data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,\"total_tokens\":15,\
\"prompt_tokens_details\":{\"cached_tokens\":4},\"completion_tokens_details\":{\"reasoning_tokens\":2}}}\n\n\
data: [DONE]\n\n";

    #[test]
    fn chunks_are_read_early_only_when_they_may_carry_usage() {
        assert!(!carries_usage(r#"{"choices":[{"delta":{"content":"x"}}]}"#));
        assert!(!carries_usage(r#"{"choices":[],"usage":null}"#));
        assert!(!carries_usage(r#"{"usage" : null,"x":{"usage":null}}"#));
        assert!(!carries_usage(
            r#"{"choices":[{"delta":{"content":"say \"usage\": 1"}}]}"#
        ));
        assert!(carries_usage(
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#
        ));
        assert!(carries_usage(
            r#"{"usage":null,"usage":{"prompt_tokens":1}}"#
        ));
        assert!(carries_usage(r#"{"type":"usage"}"#));
    }

    #[test]
    fn text_of_a_chunk_read_early_keeps_its_place() {
        // Usage arrives on a chunk that also delivers text, between chunks kept unread.
        let stream = "\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"}}],\"usage\":null}\n\n";
        let (mut t, verdicts) = run(StreamKind::OpenAiChat, stream);
        assert_eq!(verdicts, vec![EventVerdict::Forward; 3]);
        assert_eq!(
            t.usage().map(|u| (u.input_tokens, u.output_tokens)),
            Some((3, 2))
        );
        assert!(!t.saw_terminal());
        assert_eq!(t.delivered_text(), "abc");
    }

    #[test]
    fn openai_chat_usage_only_chunk() {
        let (mut t, verdicts) = run(StreamKind::OpenAiChat, CHAT_STREAM);
        assert_eq!(
            verdicts,
            vec![
                EventVerdict::Forward,
                EventVerdict::Forward,
                EventVerdict::Forward,
                EventVerdict::UsageOnly,
                EventVerdict::Forward,
            ]
        );
        assert_eq!(
            t.usage(),
            Some(Usage {
                input_tokens: 10,
                output_tokens: 5,
                cached_tokens: 4,
                reasoning_tokens: 2
            })
        );
        assert!(t.saw_terminal());
        assert_eq!(t.delivered_text(), "Hellof{}");
        assert!(t.error_event().is_none());
    }

    #[test]
    fn openai_chat_usage_with_choices_is_forwarded() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiChat);
        let v = t.observe(&ev(
            None,
            r#"{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        ));
        assert_eq!(v, EventVerdict::Forward);
        let v = t.observe(&ev(
            None,
            r#"{"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        ));
        assert_eq!(v, EventVerdict::UsageOnly);
        // Later reports replace earlier ones (some servers send running totals).
        assert_eq!(t.usage().map(|u| u.output_tokens), Some(2));
    }

    #[test]
    fn openai_chat_cut_stream() {
        let cut = CHAT_STREAM
            .split("data: {\"id\":\"c\",\"choices\":[],")
            .next();
        let (mut t, _) = run(StreamKind::OpenAiChat, cut.unwrap_or_default());
        assert!(!t.saw_terminal());
        assert!(t.usage().is_none());
        assert_eq!(t.delivered_text(), "Hellof{}");
    }

    #[test]
    fn openai_chat_error_chunk() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiChat);
        t.observe(&ev(
            None,
            r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
        ));
        assert_eq!(t.error_event().as_deref(), Some("overloaded"));
        assert!(!t.saw_terminal());
    }

    const RESPONSES_STREAM: &str = "\
event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n\
event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" there\"}\n\n\
event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\
\"input_tokens\":20,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":7,\
\"output_tokens_details\":{\"reasoning_tokens\":3},\"total_tokens\":27}}}\n\n";

    #[test]
    fn responses_completed() {
        let (mut t, verdicts) = run(StreamKind::OpenAiResponses, RESPONSES_STREAM);
        assert!(verdicts.iter().all(|v| *v == EventVerdict::Forward));
        assert!(t.saw_terminal());
        assert_eq!(
            t.usage(),
            Some(Usage {
                input_tokens: 20,
                output_tokens: 7,
                cached_tokens: 8,
                reasoning_tokens: 3
            })
        );
        assert_eq!(t.delivered_text(), "Hi there");
        assert_eq!(
            t.take_issued()
                .ids
                .iter()
                .map(|i| i.id.as_str())
                .collect::<Vec<_>>(),
            ["r"]
        );
    }

    /// The ids of a stream: the response's and each item's, once each.
    #[test]
    fn responses_stream_ids() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiResponses);
        for data in [
            r#"{"type":"response.created","response":{"id":"resp_1","output":[]}}"#,
            r#"{"type":"response.output_item.added","item":{"id":"rs_1","type":"reasoning"}}"#,
            r#"{"type":"response.output_item.done","item":{"id":"rs_1","type":"reasoning"}}"#,
            r#"{"type":"response.output_item.added","item":{"id":"msg_1","type":"message"}}"#,
            r#"{"type":"response.output_text.delta","item_id":"msg_x","delta":"d"}"#,
            r#"{"type":"response.completed","response":{"id":"resp_1","output":[{"id":"rs_1"},{"id":"msg_1"},{"id":"fc_1"}]}}"#,
        ] {
            t.observe(&ev(None, data));
        }
        let ids: Vec<String> = t.take_issued().ids.into_iter().map(|i| i.id).collect();
        assert_eq!(ids, ["resp_1", "rs_1", "msg_1", "fc_1"]);
    }

    #[test]
    fn responses_type_from_sse_event_field_only() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiResponses);
        t.observe(&ev(
            Some("response.completed"),
            r#"{"response":{"usage":{"input_tokens":1,"output_tokens":2}}}"#,
        ));
        assert!(t.saw_terminal());
        assert_eq!(t.usage().map(|u| u.output_tokens), Some(2));
    }

    #[test]
    fn responses_incomplete_and_failed() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiResponses);
        t.observe(&ev(
            None,
            r#"{"type":"response.incomplete","response":{"usage":{"input_tokens":5,"output_tokens":9}}}"#,
        ));
        assert!(t.saw_terminal());
        assert_eq!(t.usage().map(|u| u.output_tokens), Some(9));

        let mut t = StreamUsageTracker::new(StreamKind::OpenAiResponses);
        t.observe(&ev(
            None,
            r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"boom"},"usage":{"input_tokens":5,"output_tokens":1}}}"#,
        ));
        assert!(!t.saw_terminal());
        assert_eq!(t.error_event().as_deref(), Some("boom"));
        assert_eq!(t.usage().map(|u| u.input_tokens), Some(5));

        let mut t = StreamUsageTracker::new(StreamKind::OpenAiResponses);
        t.observe(&ev(
            Some("error"),
            r#"{"type":"error","code":"x","message":"rate limited"}"#,
        ));
        assert_eq!(t.error_event().as_deref(), Some("rate limited"));
    }

    #[test]
    fn responses_cut_stream() {
        let cut = RESPONSES_STREAM
            .split("event: response.completed")
            .next()
            .unwrap_or_default();
        let (mut t, _) = run(StreamKind::OpenAiResponses, cut);
        assert!(!t.saw_terminal());
        assert!(t.usage().is_none());
        assert_eq!(t.delivered_text(), "Hi there");
    }

    const ANTHROPIC_STREAM: &str = "\
event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":100,\
\"cache_creation_input_tokens\":20,\"cache_read_input_tokens\":30,\"output_tokens\":1}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: ping\ndata: {\"type\":\"ping\"}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm \"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"SIG\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"output_tokens\":10}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":25}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

    #[test]
    fn anthropic_cumulative_deltas_not_double_counted() {
        let (mut t, verdicts) = run(StreamKind::Anthropic, ANTHROPIC_STREAM);
        assert!(verdicts.iter().all(|v| *v == EventVerdict::Forward));
        assert!(t.saw_terminal());
        assert_eq!(
            t.usage(),
            Some(Usage {
                input_tokens: 150,
                output_tokens: 25,
                cached_tokens: 30,
                reasoning_tokens: 0
            })
        );
        assert_eq!(t.delivered_text(), "hmm Hello{\"a\":");
        // Same result however the bytes arrive.
        let mut p = SseParser::new();
        let mut t2 = StreamUsageTracker::new(StreamKind::Anthropic);
        for b in ANTHROPIC_STREAM.as_bytes().chunks(7) {
            for e in p.feed(b) {
                t2.observe(&e);
            }
        }
        assert_eq!(t2.usage(), t.usage());
    }

    #[test]
    fn anthropic_delta_with_input_replaces_input() {
        let mut t = StreamUsageTracker::new(StreamKind::Anthropic);
        t.observe(&ev(
            Some("message_start"),
            r#"{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}"#,
        ));
        t.observe(&ev(
            Some("message_delta"),
            r#"{"type":"message_delta","usage":{"input_tokens":12,"cache_read_input_tokens":3,"output_tokens":40}}"#,
        ));
        t.observe(&ev(
            Some("message_delta"),
            r#"{"type":"message_delta","usage":{"output_tokens":41}}"#,
        ));
        assert_eq!(
            t.usage(),
            Some(Usage {
                input_tokens: 15,
                output_tokens: 41,
                cached_tokens: 3,
                reasoning_tokens: 0
            })
        );
    }

    #[test]
    fn anthropic_cut_stream_and_error() {
        let cut = ANTHROPIC_STREAM
            .split("event: message_delta")
            .next()
            .unwrap_or_default();
        let (t, _) = run(StreamKind::Anthropic, cut);
        assert!(!t.saw_terminal());
        // message_start already reported input and a provisional output.
        assert_eq!(
            t.usage().map(|u| (u.input_tokens, u.output_tokens)),
            Some((150, 1))
        );

        let mut t = StreamUsageTracker::new(StreamKind::Anthropic);
        t.observe(&ev(
            Some("error"),
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ));
        assert_eq!(t.error_event().as_deref(), Some("Overloaded"));
        assert_eq!(t.error_code(), Some("overloaded_error"));
        assert!(!t.saw_terminal());
        assert!(t.usage().is_none());
    }

    #[test]
    fn tracker_ignores_non_json_and_wrong_shapes() {
        for kind in [
            StreamKind::OpenAiChat,
            StreamKind::OpenAiResponses,
            StreamKind::Anthropic,
        ] {
            let mut t = StreamUsageTracker::new(kind);
            for data in [
                "not json",
                "{",
                "[DONE]",
                "null",
                "[1,2,3]",
                "\"str\"",
                r#"{"usage":"x","choices":5}"#,
                r#"{"type":"message_delta","usage":{"output_tokens":"many"}}"#,
                r#"{"type":"message_start","message":7}"#,
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":7}}"#,
                r#"{"type":"response.completed","response":{"usage":{"input_tokens":-1}}}"#,
                r#"{"choices":[{"delta":{"content":["x"],"tool_calls":"y"}}]}"#,
            ] {
                assert_eq!(t.observe(&ev(None, data)), EventVerdict::Forward);
            }
            assert!(t.usage().is_none(), "{kind:?}");
            assert_eq!(t.delivered_text(), "");
        }
    }

    #[test]
    fn delivered_text_is_capped() {
        let mut t = StreamUsageTracker::new(StreamKind::Anthropic);
        let piece = "é".repeat(300_000); // 600 KB per event
        let data = serde_json::json!({
            "type": "content_block_delta",
            "delta": {"type": "text_delta", "text": piece}
        })
        .to_string();
        let e = ev(None, &data);
        for _ in 0..10 {
            t.observe(&e);
        }
        assert!(t.delivered_text().len() <= MAX_DELIVERED_TEXT_BYTES);
        assert!(t.delivered_text().len() > MAX_DELIVERED_TEXT_BYTES - 4);
        assert!(t.delivered_text_truncated());
    }

    /// Chat chunks kept unread past the cap are read then, in order, and the ones after them
    /// are kept again: the delivered text is the chunks' text in stream order, multi-byte
    /// characters whole, up to the cap.
    #[test]
    fn chat_chunks_kept_past_the_cap_are_read_in_order() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiChat);
        let mut expected = String::new();
        for i in 0..12 {
            let piece = format!("<{i}>{}", "é".repeat(200_000)); // ~400 KB a chunk
            let data = serde_json::json!({"choices": [{"index": 0, "delta": {"content": piece}}]})
                .to_string();
            assert_eq!(t.observe(&ev(None, &data)), EventVerdict::Forward);
            expected.push_str(&piece);
        }
        let got = t.delivered_text().to_string();
        assert!(got.len() <= MAX_DELIVERED_TEXT_BYTES && got.len() > MAX_DELIVERED_TEXT_BYTES - 4);
        assert!(expected.starts_with(&got), "the text is out of order");
        assert!(
            got.contains("<9>") && !got.contains("<11>"),
            "{}",
            got.len()
        );
        assert!(t.delivered_text_truncated());
    }

    #[test]
    fn error_message_is_bounded() {
        let mut t = StreamUsageTracker::new(StreamKind::OpenAiChat);
        let msg = "ü".repeat(10_000);
        let data = serde_json::json!({"error": {"message": msg}}).to_string();
        t.observe(&ev(None, &data));
        let got = t.error_event().unwrap_or_default();
        assert!(got.len() <= MAX_ERROR_MESSAGE_BYTES && got.len() > 4000);
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut p = SseParser::new();
        let mut tracker = StreamUsageTracker::new(StreamKind::Anthropic);
        let alphabet = b"data: event:\r\n{}[]\":,0123456789 \xff\xc3 type usage error";
        for _ in 0..2_000 {
            let mut chunk = Vec::new();
            for _ in 0..64 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                chunk.push(alphabet[(seed % alphabet.len() as u64) as usize]);
            }
            for ev in p.feed(&chunk) {
                let _ = tracker.observe(&ev);
            }
        }
        let _ = p.finish();
        for kind in [
            StreamKind::OpenAiChat,
            StreamKind::OpenAiResponses,
            StreamKind::Anthropic,
        ] {
            let _ = usage_from_body(kind, b"\xff\x00garbage");
            let _ = usage_from_body(kind, "[".repeat(100_000).as_bytes());
            let _ = usage_from_body(kind, b"{\"usage\": {\"prompt_tokens\": -5}}");
        }
    }
}
