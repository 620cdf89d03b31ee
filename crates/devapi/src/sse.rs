//! Streaming usage accounting.
//!
//! The gateway bills from what the provider reports, but it sits in the
//! middle of a byte stream: it must not delay or alter what the client sees
//! beyond dropping the usage-only chunk the client never asked for. So the
//! parser hands back every event with its exact bytes, and the tracker reads
//! usage and delivered text out of them without owning the stream.
//!
//! Both take hostile input from the network: nothing here panics, every loop
//! is bounded by the input, and every buffer has a cap.

use std::borrow::Cow;
use std::sync::LazyLock;

use bytes::Bytes;
use gateway_core::domain::Usage;
use memchr::memmem;
use serde_json::value::RawValue;
use serde_json::Value;

/// A single event larger than this is not a real model event; buffering it
/// would let one misbehaving upstream grow a worker's memory without bound.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Enough text for fallback counting of any realistic reply; past it a cut
/// stream is billed on the estimate of what fit.
pub const MAX_DELIVERED_TEXT_BYTES: usize = 4 * 1024 * 1024;

/// Error messages end up in logs and records; a provider could send anything.
const MAX_ERROR_MESSAGE_BYTES: usize = 4 * 1024;

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// One blank-line-terminated block of the stream.
///
/// Every input byte ends up in exactly one event's `raw` (comment-only blocks
/// and stray blank lines included), so concatenating the `raw` of everything
/// `feed` and `finish` return reproduces the input, except for events dropped
/// for exceeding [`MAX_EVENT_BYTES`]. That is what lets the caller forward or
/// drop whole events without re-serializing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if the block had one.
    pub event: Option<String>,
    /// The `data:` lines joined by `\n`; empty for comment-only blocks.
    pub data: String,
    /// The exact bytes of the block, including its terminating blank line; empty from a parser
    /// made by [`SseParser::without_raw`].
    pub raw: Bytes,
}

/// Incremental SSE parser that accepts arbitrary chunk boundaries.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Raw bytes of the pending event, including its complete lines.
    raw: Vec<u8>,
    /// Offset in `raw` where the current (unterminated) line starts.
    line_start: usize,
    event: Option<String>,
    data: String,
    has_data: bool,
    /// The previous byte was a `\r` line ending; a following `\n` belongs to
    /// the same line ending.
    after_cr: bool,
    /// A blank line ended with `\r` at a chunk boundary. Dispatch waits for the
    /// next byte so a split `\r\n` still lands inside this event's `raw`.
    dispatch_after_cr: bool,
    /// Dropping an oversized event until its blank line.
    discarding: bool,
    /// Only meaningful while discarding: the current line has content.
    discard_line_nonempty: bool,
    /// No line has been completed yet, so a leading BOM is still possible.
    at_stream_start: bool,
    started: bool,
    /// The caller relays the provider's bytes itself and reads only `event` and `data`.
    skip_raw: bool,
}

/// Buffers grown past this are not kept for the next event: one large event must not pin its
/// size for the rest of a stream.
const KEPT_CAPACITY: usize = 64 * 1024;

/// Appends `bytes` as text, invalid UTF-8 replaced by U+FFFD. Valid text (every provider's)
/// is checked by `str::from_utf8`, which runs a word at a time over ASCII; `from_utf8_lossy`
/// walks its input byte by byte even when there is nothing to replace.
fn push_lossy(dst: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => dst.push_str(text),
        Err(_) => dst.push_str(&String::from_utf8_lossy(bytes)),
    }
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser whose events carry no `raw` bytes, for callers that relay the chunks as they
    /// came or write events of their own: a copy of every event saved.
    pub fn without_raw() -> Self {
        Self {
            skip_raw: true,
            ..Self::default()
        }
    }

    /// Returns the events completed by this chunk. A blank line terminated by
    /// a lone `\r` at the very end of a chunk is held until the next byte (or
    /// `finish`), since it may be the first half of `\r\n`.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        if !self.started {
            self.started = true;
            self.at_stream_start = true;
        }
        let mut out = Vec::new();
        let mut rest = chunk;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    self.push_raw(b"\n");
                    self.line_start = self.raw.len();
                    rest = &rest[1..];
                    if self.dispatch_after_cr {
                        self.dispatch_after_cr = false;
                        self.dispatch(&mut out);
                    }
                    continue;
                }
                if self.dispatch_after_cr {
                    self.dispatch_after_cr = false;
                    self.dispatch(&mut out);
                }
            }
            // A line is a few hundred bytes of JSON: memchr finds its end a word at a time
            // rather than a byte at a time, on every line of every stream.
            match memchr::memchr2(b'\n', b'\r', rest) {
                None => {
                    self.push_line_bytes(rest);
                    rest = &[];
                }
                Some(i) => {
                    self.push_line_bytes(&rest[..i]);
                    let terminator = rest[i];
                    rest = &rest[i + 1..];
                    self.end_line(terminator, &mut out);
                }
            }
        }
        out
    }

    /// Flushes what the stream left unterminated, which a cut upstream
    /// connection typically does. The parser is reset and can be reused.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut out = Vec::new();
        if self.after_cr && self.dispatch_after_cr {
            self.dispatch(&mut out);
        } else if !self.discarding && self.line_start < self.raw.len() {
            self.process_line();
        }
        if !self.discarding && !self.raw.is_empty() {
            self.dispatch(&mut out);
        }
        *self = Self {
            skip_raw: self.skip_raw,
            ..Self::default()
        };
        out.pop()
    }

    fn push_raw(&mut self, bytes: &[u8]) {
        if self.discarding {
            return;
        }
        if self.raw.len().saturating_add(bytes.len()) > MAX_EVENT_BYTES {
            log::warn!(
                "dropping SSE event larger than {MAX_EVENT_BYTES} bytes (event: {:?})",
                self.event
            );
            self.start_discarding();
            return;
        }
        self.raw.extend_from_slice(bytes);
    }

    /// Callers set `discard_line_nonempty` for the position they are at.
    fn start_discarding(&mut self) {
        self.discard_line_nonempty = false;
        self.discarding = true;
        self.raw = Vec::new();
        self.line_start = 0;
        self.event = None;
        self.data = String::new();
        self.has_data = false;
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if self.discarding {
            self.discard_line_nonempty = true;
            return;
        }
        self.push_raw(bytes);
        if self.discarding {
            self.discard_line_nonempty = true;
        }
    }

    fn end_line(&mut self, terminator: u8, out: &mut Vec<SseEvent>) {
        let blank = if self.discarding {
            !std::mem::take(&mut self.discard_line_nonempty)
        } else {
            self.line_start == self.raw.len()
        };
        if !blank && !self.discarding {
            self.process_line();
        }
        self.push_raw(&[terminator]);
        // Whether or not that overflowed, a new line starts here.
        self.discard_line_nonempty = false;
        self.line_start = self.raw.len();
        if terminator == b'\r' {
            self.after_cr = true;
            if blank {
                self.dispatch_after_cr = true;
            }
        } else if blank {
            self.dispatch(out);
        }
    }

    /// Interprets the complete line at `raw[line_start..]` (no terminator).
    fn process_line(&mut self) {
        let mut line = self.raw.get(self.line_start..).unwrap_or_default();
        if std::mem::take(&mut self.at_stream_start) {
            line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
        }
        if line.is_empty() || line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                push_lossy(&mut self.data, value);
                self.has_data = true;
            }
            b"event" => self.event = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        self.at_stream_start = false;
        if self.discarding {
            self.discarding = false;
            self.discard_line_nonempty = false;
            self.raw = Vec::new();
            self.line_start = 0;
            return;
        }
        // Copied out, and the buffers kept: the next event is about as long as this one, and a
        // buffer taken (left empty) grew again from nothing by doubling, five or six
        // reallocations an event for each of the two.
        let raw = if self.skip_raw {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(&self.raw)
        };
        let data = self.data.clone();
        self.raw.clear();
        self.data.clear();
        if self.raw.capacity() > KEPT_CAPACITY {
            self.raw = Vec::new();
        }
        if self.data.capacity() > KEPT_CAPACITY {
            self.data = String::new();
        }
        self.line_start = 0;
        self.has_data = false;
        out.push(SseEvent {
            event: self.event.take(),
            data,
            raw,
        });
    }
}

/// Which provider protocol a stream speaks; the usage fields differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
}

/// What the caller should do with the event it just observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventVerdict {
    Forward,
    /// An OpenAI chat chunk that only carries usage. The gateway always asks
    /// for usage, so it drops these when the client did not.
    UsageOnly,
}

/// Anthropic reports usage piecewise and cumulatively; keeping the raw
/// components (each replaced when re-reported) is what makes double counting
/// impossible.
#[derive(Debug, Clone, Copy, Default)]
struct AnthropicParts {
    input: u64,
    cache_creation: u64,
    cache_read: u64,
    output: u64,
}

impl AnthropicParts {
    fn update<U: UsageObject + ?Sized>(&mut self, usage: &U) -> bool {
        let mut any = false;
        for (key, slot) in [
            ("input_tokens", &mut self.input),
            ("cache_creation_input_tokens", &mut self.cache_creation),
            ("cache_read_input_tokens", &mut self.cache_read),
            ("output_tokens", &mut self.output),
        ] {
            if let Some(n) = count_at(usage, &[key]) {
                *slot = n;
                any = true;
            }
        }
        any
    }

    fn usage(&self) -> Usage {
        Usage {
            input_tokens: self
                .input
                .saturating_add(self.cache_creation)
                .saturating_add(self.cache_read),
            output_tokens: self.output,
            cached_tokens: self.cache_read,
            reasoning_tokens: 0,
        }
    }
}

/// Reads usage, completion and delivered text out of a provider stream.
#[derive(Debug)]
pub struct StreamUsageTracker {
    kind: StreamKind,
    usage: Option<Usage>,
    anthropic: AnthropicParts,
    terminal: bool,
    error: Option<String>,
    /// The provider's code (or type) of that error, e.g. `overloaded_error`.
    error_code: Option<String>,
    delivered: String,
    delivered_truncated: bool,
    /// The `data` of the chat chunks not read yet (see [`Self::observe`]), back to back in
    /// arrival order: one buffer, not a string allocated for each chunk.
    deferred: String,
    /// Where each kept chunk ends in `deferred`.
    deferred_ends: Vec<usize>,
    /// While set, text is not collected (a chunk read early for its usage).
    quiet: bool,
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
            usage: None,
            anthropic: AnthropicParts::default(),
            terminal: false,
            error: None,
            error_code: None,
            delivered: String::new(),
            delivered_truncated: false,
            deferred: String::new(),
            deferred_ends: Vec::new(),
            quiet: false,
        }
    }

    /// Never fails: events that are not JSON, or JSON of an unexpected shape,
    /// are forwarded untouched and simply contribute nothing.
    ///
    /// An OpenAI chat chunk that cannot carry usage or an error (no `"usage"` key other than
    /// `null`, no `error` anywhere) is kept unread: the text it delivers matters only if the
    /// provider reports no usage or cuts the stream, and [`Self::delivered_text`] reads the kept
    /// chunks then. Reading every chunk as it passed was the largest part of the gateway's own
    /// work on a stream.
    pub fn observe(&mut self, ev: &SseEvent) -> EventVerdict {
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
            self.quiet = true;
            let v = self.observe_now(None, &ev.data);
            self.quiet = false;
            v
        } else {
            EventVerdict::Forward
        };
        if !self.delivered_truncated {
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
                self.terminal = true;
            }
            return EventVerdict::Forward;
        }
        if self.kind == StreamKind::OpenAiChat && event != Some("error") {
            if let Ok(chunk) = serde_json::from_str::<ChatChunk<'_>>(data) {
                if !chunk.is_error() {
                    return self.observe_chat_chunk(chunk);
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
        if ty == "error" || event == Some("error") {
            self.record_error(&json);
        }
        match self.kind {
            StreamKind::OpenAiChat => self.observe_chat(&json),
            StreamKind::OpenAiResponses => {
                self.observe_responses(ty, &json);
                EventVerdict::Forward
            }
            StreamKind::Anthropic => {
                self.observe_anthropic(ty, &json);
                EventVerdict::Forward
            }
        }
    }

    /// True once the provider ended the stream deliberately: `[DONE]` for
    /// chat, `response.completed` or `response.incomplete` for responses,
    /// `message_stop` for Anthropic. False means the stream was cut.
    pub fn saw_terminal(&self) -> bool {
        self.terminal
    }

    /// The first error the provider reported mid-stream, if any.
    pub fn error_event(&self) -> Option<String> {
        self.error.clone()
    }

    /// The code (or, lacking one, the type) of the first error the provider reported
    /// mid-stream, as the provider spelled it.
    pub fn error_code(&self) -> Option<&str> {
        self.error_code.as_deref()
    }

    /// What the client was actually sent, for estimating output when the
    /// provider never reported usage (capped at [`MAX_DELIVERED_TEXT_BYTES`]).
    pub fn delivered_text(&mut self) -> &str {
        self.catch_up();
        &self.delivered
    }

    /// Whether [`Self::delivered_text`] hit its cap, so an estimate from it
    /// is a lower bound.
    pub fn delivered_text_truncated(&mut self) -> bool {
        self.catch_up();
        self.delivered_truncated
    }

    /// `Some` only if the provider reported usage; the caller falls back to
    /// estimating otherwise.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn observe_chat(&mut self, json: &Value) -> EventVerdict {
        if json.get("error").is_some_and(|e| !e.is_null()) {
            self.record_error(json);
        }
        if let Some(choices) = json.get("choices").and_then(Value::as_array) {
            for choice in choices {
                self.chat_choice_text(choice);
            }
        }
        let Some(usage) = json.get("usage").filter(|u| u.is_object()) else {
            return EventVerdict::Forward;
        };
        // A chunk is only dropped if it carried usage this code understood.
        let Some(u) = openai_usage(usage) else {
            return EventVerdict::Forward;
        };
        self.usage = Some(u);
        let no_choices = match json.get("choices") {
            None | Some(Value::Null) => true,
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        if no_choices {
            EventVerdict::UsageOnly
        } else {
            EventVerdict::Forward
        }
    }

    /// [`Self::observe_chat`] for a chunk read into [`ChatChunk`]: the same result without
    /// building the event's JSON tree (a chat stream is mostly such chunks).
    fn observe_chat_chunk(&mut self, chunk: ChatChunk<'_>) -> EventVerdict {
        for choice in chunk.choices.iter().flatten() {
            if let Some(t) = &choice.text {
                self.deliver(t);
            }
            let Some(delta) = &choice.delta else {
                continue;
            };
            for t in [&delta.content, &delta.reasoning_content, &delta.refusal]
                .into_iter()
                .flatten()
            {
                self.deliver(t);
            }
            if let Some(calls) = delta.tool_calls.as_ref().and_then(Value::as_array) {
                for call in calls {
                    if let Some(f) = call.get("function") {
                        self.deliver_function(f);
                    }
                }
            }
            if let Some(f) = &delta.function_call {
                self.deliver_function(f);
            }
        }
        let Some(u) = chunk
            .usage
            .as_ref()
            .filter(|u| u.is_object())
            .and_then(openai_usage)
        else {
            return EventVerdict::Forward;
        };
        self.usage = Some(u);
        if chunk.choices.is_none_or(|c| c.is_empty()) {
            EventVerdict::UsageOnly
        } else {
            EventVerdict::Forward
        }
    }

    fn chat_choice_text(&mut self, choice: &Value) {
        // `text` is the legacy completions stream, which shares this shape.
        if let Some(t) = choice.get("text").and_then(Value::as_str) {
            self.deliver(t);
        }
        let Some(delta) = choice.get("delta") else {
            return;
        };
        for key in ["content", "reasoning_content", "refusal"] {
            if let Some(t) = delta.get(key).and_then(Value::as_str) {
                self.deliver(t);
            }
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                if let Some(f) = call.get("function") {
                    self.deliver_function(f);
                }
            }
        }
        if let Some(f) = delta.get("function_call") {
            self.deliver_function(f);
        }
    }

    fn deliver_function(&mut self, f: &Value) {
        for key in ["name", "arguments"] {
            if let Some(t) = f.get(key).and_then(Value::as_str) {
                self.deliver(t);
            }
        }
    }

    fn observe_responses(&mut self, ty: &str, json: &Value) {
        match ty {
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(u) = json
                    .get("response")
                    .and_then(|r| r.get("usage"))
                    .filter(|u| u.is_object())
                    .and_then(openai_usage)
                {
                    self.usage = Some(u);
                }
                if ty == "response.failed" {
                    if let Some(resp) = json.get("response") {
                        self.record_error(resp);
                    }
                } else {
                    self.terminal = true;
                }
            }
            "response.output_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta"
            | "response.reasoning_text.delta"
            | "response.reasoning_summary_text.delta" => {
                if let Some(t) = json.get("delta").and_then(Value::as_str) {
                    self.deliver(t);
                }
            }
            _ => {}
        }
    }

    fn observe_anthropic(&mut self, ty: &str, json: &Value) {
        match ty {
            "message_start" => {
                if let Some(u) = json.get("message").and_then(|m| m.get("usage")) {
                    if self.anthropic.update(u) {
                        self.usage = Some(self.anthropic.usage());
                    }
                }
            }
            "message_delta" => {
                if let Some(u) = json.get("usage") {
                    if self.anthropic.update(u) {
                        self.usage = Some(self.anthropic.usage());
                    }
                }
            }
            "message_stop" => self.terminal = true,
            "content_block_delta" => {
                let Some(delta) = json.get("delta") else {
                    return;
                };
                let key = match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => "text",
                    Some("input_json_delta") => "partial_json",
                    Some("thinking_delta") => "thinking",
                    _ => return,
                };
                if let Some(t) = delta.get(key).and_then(Value::as_str) {
                    self.deliver(t);
                }
            }
            _ => {}
        }
    }

    /// Keeps the first error: later ones are usually consequences of it.
    fn record_error(&mut self, json: &Value) {
        if self.error.is_some() {
            return;
        }
        let err = json.get("error").filter(|e| !e.is_null()).unwrap_or(json);
        self.error_code = ["code", "type"]
            .iter()
            .filter_map(|k| err.get(*k).and_then(Value::as_str))
            .find(|c| !c.is_empty() && *c != "error")
            .map(|c| truncate_to(c.to_owned(), 64));
        let msg = match err {
            Value::String(s) => s.clone(),
            _ => match err.get("message").and_then(Value::as_str) {
                Some(m) => m.to_owned(),
                None => err.to_string(),
            },
        };
        self.error = Some(truncate_to(msg, MAX_ERROR_MESSAGE_BYTES));
    }

    fn deliver(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        let room = MAX_DELIVERED_TEXT_BYTES.saturating_sub(self.delivered.len());
        if text.len() <= room {
            self.delivered.push_str(text);
            return;
        }
        self.delivered_truncated = true;
        let mut cut = room;
        while cut > 0 && !text.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Some(head) = text.get(..cut) {
            self.delivered.push_str(head);
        }
    }
}

/// Usage from a non-streamed response body.
///
/// Lenient on purpose: embeddings (`prompt_tokens` only), images
/// (`input_tokens`/`output_tokens`) and OpenAI-compatible providers mix the
/// two naming schemes, so both are tried whatever `kind` says. `kind` only
/// decides that an `input_tokens` total excludes cache fields (Anthropic),
/// which is also assumed whenever the Anthropic cache fields are present.
pub fn usage_from_body(kind: StreamKind, body: &[u8]) -> Option<Usage> {
    // Only `usage` (or `response.usage`) is read: the rest of the answer is skipped while
    // parsing, and the usage object is read field by field (`UsageFields`) instead of being
    // built into a tree. Bodies this shape does not fit (duplicate keys, a non-object
    // `response`) take the general path, which reads the same fields out of the tree.
    #[derive(serde::Deserialize)]
    struct Carrier<'a> {
        #[serde(default, borrow)]
        usage: Option<&'a RawValue>,
        #[serde(default, borrow)]
        response: Option<Inner<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Inner<'a> {
        #[serde(default, borrow)]
        usage: Option<&'a RawValue>,
    }
    if let Some(usage) = trailing_usage(kind, body) {
        return usage;
    }
    // A raw value starts at its first byte (whitespace before it is skipped).
    let is_object = |raw: &&RawValue| raw.get().starts_with('{');
    let Ok(carrier) = serde_json::from_slice::<Carrier>(body) else {
        return usage_from_tree(kind, &serde_json::from_slice(body).ok()?);
    };
    let raw = carrier
        .usage
        .filter(is_object)
        .or_else(|| carrier.response.and_then(|r| r.usage).filter(is_object))?;
    usage_of_raw(kind, raw)
}

/// The usage of a raw usage object (text starting with `{`).
fn usage_of_raw(kind: StreamKind, raw: &RawValue) -> Option<Usage> {
    match serde_json::from_str::<UsageFields>(raw.get()) {
        Ok(fields) => usage_of(kind, &fields),
        // Duplicate keys: the tree keeps the last, as the general path does.
        Err(_) => usage_of(kind, &serde_json::from_str::<Value>(raw.get()).ok()?),
    }
}

/// The usage of the answer's top-level `usage` object when it is the answer's last member,
/// found from the end: chat completions, embeddings and Anthropic messages put it there, and
/// the text before it (the whole generated answer) then need not be read at all, however long
/// the answer. `Some` is the object's usage (itself
/// `None` when the object names no tokens); `None` means the body must be read from the start.
///
/// The last `"usage"` in the body is the top-level key when it is followed by `:` and an
/// object, that object by the body's final `}` alone, and it is preceded by `{` or `,`.
/// Within a JSON string every `"` is escaped, so a quote preceded by `{` or `,` is a real
/// opening quote; a string followed by `:` is a key; and the object its value closes, with
/// nothing after it, is the outermost one. Any other shape (usage elsewhere, `null`, nested
/// in `response`, something after it) returns `None` and the body is read from the start.
/// The bytes before the key are not checked to be JSON: the provider's statement of usage is
/// taken as it is written, as it is when a stream's usage event is read on its own.
///
/// The object's text is read once, straight into [`UsageFields`]: parsing it checks that it
/// is exactly one object (anything after it is an error), so it is not first scanned for its
/// end (serde's `RawValue` through a stream reader would read it twice).
fn trailing_usage(kind: StreamKind, body: &[u8]) -> Option<Option<Usage>> {
    let object = trailing_usage_text(body)?;
    if let Ok(fields) = serde_json::from_slice::<UsageFields>(object) {
        return Some(usage_of(kind, &fields));
    }
    // Duplicate keys (the tree keeps the last, as the general path does); text that is not
    // one JSON object fails here too and goes to the general path.
    let tree = serde_json::from_slice::<Value>(object).ok()?;
    Some(usage_of(kind, &tree))
}

/// The text from the `{` that opens the trailing `usage` value to the `}` before the body's
/// final one, when the body ends in that shape (see [`trailing_usage`]); not checked to be JSON.
fn trailing_usage_text(body: &[u8]) -> Option<&[u8]> {
    /// Built once, not for every answer.
    static KEY: LazyLock<memmem::FinderRev<'static>> =
        LazyLock::new(|| memmem::FinderRev::new(b"\"usage\""));
    /// JSON's whitespace (`is_ascii_whitespace` would also take form feed).
    fn is_space(b: &u8) -> bool {
        matches!(b, b' ' | b'\n' | b'\r' | b'\t')
    }
    fn trim(text: &[u8]) -> &[u8] {
        let start = text.iter().position(|b| !is_space(b)).unwrap_or(text.len());
        let end = text
            .iter()
            .rposition(|b| !is_space(b))
            .map_or(start, |i| i + 1);
        &text[start..end]
    }
    let at = KEY.rfind(body)?;
    let before = body[..at].iter().rev().find(|b| !is_space(b))?;
    if !matches!(before, b'{' | b',') {
        return None;
    }
    let after_key = trim(&body[at + KEY.needle().len()..]);
    let value = after_key.strip_prefix(b":")?;
    // The body's final `}` closes the answer; what is left is the object, `{` to `}`.
    let object = trim(trim(value).strip_suffix(b"}")?);
    (object.first() == Some(&b'{') && object.last() == Some(&b'}')).then_some(object)
}

/// [`usage_from_body`] over a parsed answer: its `usage`, else `response.usage`.
fn usage_from_tree(kind: StreamKind, json: &Value) -> Option<Usage> {
    let usage = json.get("usage").filter(|u| u.is_object()).or_else(|| {
        json.get("response")
            .and_then(|r| r.get("usage"))
            .filter(|u| u.is_object())
    })?;
    usage_of(kind, usage)
}

/// The usage of a usage object, in whichever naming scheme it uses.
fn usage_of<U: UsageObject + ?Sized>(kind: StreamKind, usage: &U) -> Option<Usage> {
    let anthropic_style = usage.field("prompt_tokens").is_none()
        && (kind == StreamKind::Anthropic
            || usage.field("cache_read_input_tokens").is_some()
            || usage.field("cache_creation_input_tokens").is_some());
    if anthropic_style {
        let mut parts = AnthropicParts::default();
        return parts.update(usage).then(|| parts.usage());
    }
    openai_usage(usage)
}

/// A usage object as the readers see it: a JSON tree, or [`UsageFields`].
trait UsageObject {
    /// The value at `key`; `Some(Null)` for a key present with `null`, as in a tree.
    fn field(&self, key: &str) -> Option<&Value>;
}

impl UsageObject for Value {
    fn field(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }
}

/// The fields of a usage object that [`openai_usage`] and [`AnthropicParts`] read, and only
/// those, read without building the object's tree (numbers need no allocation). Only ever read
/// from text that starts with `{`, so serde's sequence form of a struct cannot apply.
#[derive(serde::Deserialize)]
struct UsageFields {
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    prompt_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    completion_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    input_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    output_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    cache_read_input_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    cache_creation_input_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    prompt_tokens_details: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    input_tokens_details: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    completion_tokens_details: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    output_tokens_details: Option<Value>,
}

impl UsageObject for UsageFields {
    fn field(&self, key: &str) -> Option<&Value> {
        match key {
            "prompt_tokens" => self.prompt_tokens.as_ref(),
            "completion_tokens" => self.completion_tokens.as_ref(),
            "input_tokens" => self.input_tokens.as_ref(),
            "output_tokens" => self.output_tokens.as_ref(),
            "cache_read_input_tokens" => self.cache_read_input_tokens.as_ref(),
            "cache_creation_input_tokens" => self.cache_creation_input_tokens.as_ref(),
            "prompt_tokens_details" => self.prompt_tokens_details.as_ref(),
            "input_tokens_details" => self.input_tokens_details.as_ref(),
            "completion_tokens_details" => self.completion_tokens_details.as_ref(),
            "output_tokens_details" => self.output_tokens_details.as_ref(),
            _ => {
                debug_assert!(false, "usage field {key} is not read by UsageFields");
                None
            }
        }
    }
}

/// The parts of an OpenAI chat stream chunk the tracker reads, borrowing the text from the
/// event where it has no escapes. A chunk of another shape (a non-string `content`, duplicate
/// keys, ...) fails to deserialize and is read as a JSON tree instead, so both readings agree.
#[derive(serde::Deserialize)]
struct ChatChunk<'a> {
    #[serde(default, rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default, borrow)]
    choices: Option<Vec<ChatChoice<'a>>>,
    #[serde(default)]
    usage: Option<Value>,
}

impl ChatChunk<'_> {
    /// Error chunks take the general path, which records the error.
    fn is_error(&self) -> bool {
        self.kind.as_deref() == Some("error") || self.error.as_ref().is_some_and(|e| !e.is_null())
    }
}

#[derive(serde::Deserialize)]
struct ChatChoice<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<ChatDelta<'a>>,
}

#[derive(serde::Deserialize)]
struct ChatDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    function_call: Option<Value>,
}

/// Both OpenAI schemes: chat/embeddings (`prompt_tokens`, ...) and
/// responses/images (`input_tokens`, ...). `None` if neither total is there.
fn openai_usage<U: UsageObject + ?Sized>(usage: &U) -> Option<Usage> {
    let input = count_at(usage, &["prompt_tokens"]).or_else(|| count_at(usage, &["input_tokens"]));
    let output =
        count_at(usage, &["completion_tokens"]).or_else(|| count_at(usage, &["output_tokens"]));
    if input.is_none() && output.is_none() {
        return None;
    }
    let cached = count_at(usage, &["prompt_tokens_details", "cached_tokens"])
        .or_else(|| count_at(usage, &["input_tokens_details", "cached_tokens"]))
        .or_else(|| count_at(usage, &["cache_read_input_tokens"]))
        .unwrap_or(0);
    let reasoning = count_at(usage, &["completion_tokens_details", "reasoning_tokens"])
        .or_else(|| count_at(usage, &["output_tokens_details", "reasoning_tokens"]))
        .unwrap_or(0);
    Some(Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cached_tokens: cached,
        reasoning_tokens: reasoning,
    })
}

/// A token count at `path`. Some providers send integral floats (`12.0`);
/// negative, fractional or absurd values are treated as absent rather than
/// wrapped or saturated into a bill.
fn count_at<U: UsageObject + ?Sized>(usage: &U, path: &[&str]) -> Option<u64> {
    let (first, rest) = path.split_first()?;
    let mut cur = usage.field(first)?;
    for key in rest {
        cur = cur.get(*key)?;
    }
    if let Some(n) = cur.as_u64() {
        return Some(n);
    }
    let f = cur.as_f64()?;
    // 2^53: beyond it floats are no longer exact integers.
    if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0 {
        // Exact: a non-negative integer below 2^53.
        Some(f as u64)
    } else {
        None
    }
}

fn truncate_to(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while cut > 0 && !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.feed(c));
        }
        out.extend(p.finish());
        out
    }

    fn whole(input: &[u8]) -> Vec<SseEvent> {
        feed_all(&[input])
    }

    fn bytewise(input: &[u8]) -> Vec<SseEvent> {
        let chunks: Vec<&[u8]> = input.chunks(1).collect();
        feed_all(&chunks)
    }

    fn concat_raw(events: &[SseEvent]) -> Vec<u8> {
        events.iter().flat_map(|e| e.raw.iter().copied()).collect()
    }

    fn data_events(events: &[SseEvent]) -> Vec<(Option<&str>, &str)> {
        events
            .iter()
            .filter(|e| !e.data.is_empty() || e.event.is_some())
            .map(|e| (e.event.as_deref(), e.data.as_str()))
            .collect()
    }

    const MIXED: &[u8] = "\u{feff}: hello\n\nevent: ping\ndata: {\"a\":1}\n\n\
data:line1\r\ndata: line2\r\n\r\n\
event: x\rdata: caf\u{e9} \u{1F600}\r\r\
data\n\n\
retry: 5\nid: 7\ndata: with id\n\n\
data: tail without blank"
        .as_bytes();

    #[test]
    fn every_split_matches_whole_feed() {
        let reference = whole(MIXED);
        assert_eq!(bytewise(MIXED), reference);
        for cut in 0..=MIXED.len() {
            let (a, b) = MIXED.split_at(cut);
            assert_eq!(feed_all(&[a, b]), reference, "cut at {cut}");
        }
        for size in 2..7 {
            let chunks: Vec<&[u8]> = MIXED.chunks(size).collect();
            assert_eq!(feed_all(&chunks), reference, "chunks of {size}");
        }
    }

    #[test]
    fn a_parser_without_raw_reads_the_same_events() {
        let reference = whole(MIXED);
        for size in 1..7 {
            let mut p = SseParser::without_raw();
            let mut got = Vec::new();
            for c in MIXED.chunks(size) {
                got.extend(p.feed(c));
            }
            got.extend(p.finish());
            assert_eq!(got.len(), reference.len(), "chunks of {size}");
            for (g, r) in got.iter().zip(&reference) {
                assert_eq!((&g.event, &g.data), (&r.event, &r.data), "chunks of {size}");
                assert!(g.raw.is_empty());
            }
            // `finish` resets the parser but keeps what it was made for.
            assert!(p.feed(b"data: again\n\n")[0].raw.is_empty());
        }
    }

    #[test]
    fn buffers_are_kept_between_events_unless_large() {
        let mut p = SseParser::new();
        let line = format!("data: {}\n\n", "x".repeat(300));
        assert_eq!(p.feed(line.as_bytes())[0].raw.len(), line.len());
        // Kept for the next event: it does not grow again from nothing.
        assert!(p.raw.capacity() >= line.len() && p.data.capacity() >= 300);
        let big = format!("data: {}\n\n", "y".repeat(KEPT_CAPACITY + 10));
        let evs = p.feed(big.as_bytes());
        assert_eq!(evs[0].data.len(), KEPT_CAPACITY + 10);
        // One large event does not pin its size for the rest of the stream.
        assert!(p.raw.capacity() <= KEPT_CAPACITY && p.data.capacity() <= KEPT_CAPACITY);
        let evs = p.feed(line.as_bytes());
        assert_eq!(&evs[0].raw[..], line.as_bytes());
        assert_eq!(evs[0].data.len(), 300);
    }

    #[test]
    fn raw_concatenation_reproduces_input() {
        assert_eq!(concat_raw(&whole(MIXED)), MIXED);
        assert_eq!(concat_raw(&bytewise(MIXED)), MIXED);
    }

    #[test]
    fn parses_fields_and_line_endings() {
        let events = whole(MIXED);
        assert_eq!(
            data_events(&events),
            vec![
                (Some("ping"), "{\"a\":1}"),
                (None, "line1\nline2"),
                (Some("x"), "caf\u{e9} \u{1F600}"),
                (None, "with id"),
                (None, "tail without blank"),
            ]
        );
        // The comment-only block is still an event, so its bytes survive.
        assert_eq!(&events[0].raw[..], "\u{feff}: hello\n\n".as_bytes());
        assert!(events[0].data.is_empty() && events[0].event.is_none());
        assert_eq!(&events[2].raw[..], b"data:line1\r\ndata: line2\r\n\r\n");
        // A bare `data` line is an (empty) data line.
        assert_eq!(&events[4].raw[..], b"data\n\n");
        assert_eq!(events[4].data, "");
    }

    #[test]
    fn crlf_split_between_cr_and_lf_stays_in_one_event() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: a\r\n\r").is_empty());
        let evs = p.feed(b"\ndata: b\r\n\r\n");
        assert_eq!(evs.len(), 2);
        assert_eq!(&evs[0].raw[..], b"data: a\r\n\r\n");
        assert_eq!(evs[0].data, "a");
        assert_eq!(&evs[1].raw[..], b"data: b\r\n\r\n");
        assert!(p.finish().is_none());
    }

    #[test]
    fn lone_cr_dispatch_is_released_by_next_byte_or_finish() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: a\r\r").is_empty());
        let evs = p.feed(b"data: b\r\r");
        assert_eq!(evs.len(), 1);
        assert_eq!(&evs[0].raw[..], b"data: a\r\r");
        let last = p.finish().expect("held event");
        assert_eq!(last.data, "b");
        assert_eq!(&last.raw[..], b"data: b\r\r");
    }

    #[test]
    fn multiline_data_and_field_edge_cases() {
        let evs = whole(b"data: one\ndata:two\ndata:  three\ndata\nevent:e\nevent: f\n\n");
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "one\ntwo\n three\n");
        assert_eq!(evs[0].event.as_deref(), Some("f"));
    }

    #[test]
    fn utf8_split_inside_char() {
        let s = "data: héllo 😀\n\n".as_bytes();
        for cut in 0..s.len() {
            let (a, b) = s.split_at(cut);
            let evs = feed_all(&[a, b]);
            assert_eq!(evs.len(), 1);
            assert_eq!(evs[0].data, "héllo 😀");
        }
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        let evs = whole(b"data: \xff\xfe ok\n\n");
        assert_eq!(evs.len(), 1);
        assert!(evs[0].data.ends_with(" ok"));
        assert_eq!(&evs[0].raw[..], b"data: \xff\xfe ok\n\n");
    }

    #[test]
    fn oversized_event_is_dropped_and_parsing_continues() {
        let mut p = SseParser::new();
        let mut events = p.feed(b"data: before\n\n");
        events.extend(p.feed(b"event: big\ndata: "));
        let blob = vec![b'x'; 64 * 1024];
        for _ in 0..40 {
            events.extend(p.feed(&blob));
        }
        // Multi-line oversized event: newlines inside must not end discarding.
        events.extend(p.feed(b"\ndata: more\n"));
        events.extend(p.feed(&blob));
        events.extend(p.feed(b"\n\ndata: after\n\n"));
        events.extend(p.finish());
        let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, vec!["before", "after"]);
        assert!(p.raw.capacity() <= MAX_EVENT_BYTES);
    }

    #[test]
    fn event_just_under_cap_is_kept() {
        let payload = "y".repeat(MAX_EVENT_BYTES - 10);
        let input = format!("data: {payload}\n\n");
        assert!(input.len() <= MAX_EVENT_BYTES);
        let evs = whole(input.as_bytes());
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data.len(), payload.len());
    }

    #[test]
    fn oversized_event_cut_by_eof_yields_nothing() {
        let mut p = SseParser::new();
        let blob = vec![b'z'; MAX_EVENT_BYTES + 1];
        assert!(p.feed(b"data: ").is_empty());
        assert!(p.feed(&blob).is_empty());
        assert!(p.finish().is_none());
        // Reusable after finish.
        let evs = p.feed(b"data: ok\n\n");
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].data, "ok");
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

    #[test]
    fn huge_unterminated_input_stays_bounded() {
        let mut p = SseParser::new();
        let blob = vec![b'a'; 1024 * 1024];
        for _ in 0..8 {
            assert!(p.feed(&blob).is_empty());
        }
        assert!(p.raw.len() <= MAX_EVENT_BYTES);
        let mut p = SseParser::new();
        let newlines = vec![b'\n'; 100_000];
        let evs = p.feed(&newlines);
        assert_eq!(evs.len(), 100_000);
    }

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

    /// Every answer, read field by field, gives what the general path (the whole tree) gives:
    /// `null` fields, numbers of every shape, non-object usage and details, duplicate keys,
    /// `response.usage`, whitespace, both naming schemes.
    #[test]
    fn body_usage_fast_path_agrees_with_the_tree() {
        let values = [
            "7",
            "7.0",
            "7.5",
            "-3",
            "1e300",
            "null",
            "\"7\"",
            "true",
            "{}",
            "[]",
            "{\"cached_tokens\":2,\"reasoning_tokens\":3}",
            "{\"cached_tokens\":null}",
        ];
        let keys = [
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "prompt_tokens_details",
            "input_tokens_details",
            "completion_tokens_details",
            "output_tokens_details",
            "total_tokens",
        ];
        let mut usages = vec![
            "null".to_string(),
            "[]".to_string(),
            "[1,2]".to_string(),
            "\"x\"".to_string(),
            "{}".to_string(),
            r#"{"prompt_tokens":1,"prompt_tokens":2}"#.to_string(),
            r#"{"input_tokens":4,"output_tokens":5,"input_tokens":6}"#.to_string(),
        ];
        // Each key with each value; pairs of keys; every key at once.
        for (i, k) in keys.iter().enumerate() {
            for v in values {
                usages.push(format!("{{\"{k}\":{v}}}"));
                let other = keys[(i + 3) % keys.len()];
                usages.push(format!(
                    "{{ \"{k}\" : {v} , \"{other}\":{v}, \"x\":[{{}}] }}"
                ));
            }
        }
        for v in values {
            let all: Vec<String> = keys.iter().map(|k| format!("\"{k}\":{v}")).collect();
            usages.push(format!("{{{}}}", all.join(",")));
        }
        // One key null or absent, the others distinct numbers: presence decides the scheme.
        for (i, k) in keys.iter().enumerate() {
            for odd in ["null", ""] {
                let mut fields: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i && j % 2 == i % 2)
                    .map(|(j, other)| format!("\"{other}\":{}", j + 1))
                    .collect();
                if !odd.is_empty() {
                    fields.push(format!("\"{k}\":{odd}"));
                }
                usages.push(format!("{{{}}}", fields.join(",")));
                let all: Vec<String> = keys
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(j, other)| format!("\"{other}\":{}", j + 1))
                    .chain((!odd.is_empty()).then(|| format!("\"{k}\":{odd}")))
                    .collect();
                usages.push(format!("{{{}}}", all.join(",")));
            }
        }
        let mut bodies = Vec::new();
        for u in &usages {
            bodies.push(format!(
                r#"{{"id":"x","choices":[{{"text":"usage"}}],"usage":{u}}}"#
            ));
            bodies.push(format!(
                r#"{{"type":"response.completed","response":{{"usage":{u}}}}}"#
            ));
            bodies.push(format!(
                r#"{{"usage":null,"response":{{"usage":{u},"id":1}}}}"#
            ));
            bodies.push(format!(r#"{{"usage":{u},"usage":{{"prompt_tokens":1}}}}"#));
            bodies.push(format!(r#"{{"response":"text","usage":{u}}}"#));
            // Found from the end: usage not last, nested, quoted inside a string, after an
            // escaped quote, or followed by more than the closing brace.
            bodies.push(format!(r#"{{"usage":{u},"id":"x"}}"#));
            bodies.push(format!(r#"{{"a":{{"usage":{u}}}}}"#));
            bodies.push(format!(r#"{{"a":[{{"usage":{u}}}],"b":{{}}}}"#));
            bodies.push(format!(
                r#"{{"usage":{u},"text":"\"usage\":{{\"prompt_tokens\":7}}"}}"#
            ));
            bodies.push(format!(r#"{{"text":"\\","usage":{u} , "x":[1,"usage"]}}"#));
            bodies.push(format!("{{\"choices\":[],\"usage\":{u}  \n}}\n"));
            bodies.push(format!(r#"{{"usage":{u}}}"#));
            bodies.push(format!(r#"{{"text":"\\","usage":{u}}}"#));
            // Pretty-printed answers: whitespace before the usage value.
            bodies.push(format!("{{\n  \"usage\" :\n\t {u}\n}}"));
            bodies.push(format!("{{\"response\": {{\"usage\":  {u} }} }}"));
        }
        for body in &bodies {
            let tree: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
            for kind in [
                StreamKind::OpenAiChat,
                StreamKind::OpenAiResponses,
                StreamKind::Anthropic,
            ] {
                assert_eq!(
                    usage_from_body(kind, body.as_bytes()),
                    usage_from_tree(kind, &tree),
                    "{kind:?} {body}"
                );
            }
        }
    }

    #[test]
    fn trailing_usage_is_taken_only_as_the_last_top_level_member() {
        let found = |body: &str| trailing_usage(StreamKind::OpenAiChat, body.as_bytes());
        let u = r#"{"prompt_tokens":2}"#;
        let two = Some(Some(Usage {
            input_tokens: 2,
            ..Usage::default()
        }));
        assert_eq!(found(&format!(r#"{{"a":"b","usage":{u}}}"#)), two);
        assert_eq!(found(&format!("{{\"usage\" :\n {u}\n}}\r\n")), two);
        assert_eq!(
            found(r#"{"usage":{"prompt_tokens":1,"prompt_tokens":2}}"#),
            two,
            "a repeated key is read as the tree reads it: the last one"
        );
        assert_eq!(found(r#"{"usage":{}}"#), Some(None));
        for body in [
            format!(r#"{{"usage":{u},"id":1}}"#),
            format!(r#"{{"a":{{"usage":{u}}}}}"#),
            format!(r#"{{"usage":{u}}}}}"#),
            format!(r#"[{{"usage":{u}}}]"#),
            r#"{"usage":null}"#.to_string(),
            r#"{"usage":[1]}"#.to_string(),
            format!(r#"{{"x":"a\"usage\":{u}}}"}}"#),
            format!(r#"{{"x":"a"usage":{u}}}"#),
            format!(r#"{{"usage":{u}"#),
            r#"{"usage":{"prompt_tokens":2}"#.to_string(),
            r#"{"usage":{"prompt_tokens":}}"#.to_string(),
            format!(r#"{{"usage":{u} {u}}}"#),
            format!(r#"{{"usage":{u}}} }}"#),
            r#"{"usage":{}"#.to_string(),
            r#"{"usage":}"#.to_string(),
            r#""usage":{}}"#.to_string(),
        ] {
            assert_eq!(found(&body), None, "{body}");
        }
    }

    #[test]
    fn body_usage_all_shapes() {
        let chat = br#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,
            "prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":1}}}"#;
        assert_eq!(
            usage_from_body(StreamKind::OpenAiChat, chat),
            Some(Usage {
                input_tokens: 9,
                output_tokens: 3,
                cached_tokens: 2,
                reasoning_tokens: 1
            })
        );
        let responses = br#"{"object":"response","usage":{"input_tokens":4,"output_tokens":6,
            "input_tokens_details":{"cached_tokens":1},"output_tokens_details":{"reasoning_tokens":5}}}"#;
        assert_eq!(
            usage_from_body(StreamKind::OpenAiResponses, responses),
            Some(Usage {
                input_tokens: 4,
                output_tokens: 6,
                cached_tokens: 1,
                reasoning_tokens: 5
            })
        );
        let anthropic =
            br#"{"type":"message","usage":{"input_tokens":10,"cache_creation_input_tokens":5,
            "cache_read_input_tokens":7,"output_tokens":3}}"#;
        assert_eq!(
            usage_from_body(StreamKind::Anthropic, anthropic),
            Some(Usage {
                input_tokens: 22,
                output_tokens: 3,
                cached_tokens: 7,
                reasoning_tokens: 0
            })
        );
        // Anthropic body seen through a chat route still sums cache fields.
        assert_eq!(
            usage_from_body(StreamKind::OpenAiChat, anthropic).map(|u| u.input_tokens),
            Some(22)
        );
        let embeddings =
            br#"{"object":"list","data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}"#;
        assert_eq!(
            usage_from_body(StreamKind::OpenAiChat, embeddings),
            Some(Usage {
                input_tokens: 8,
                ..Usage::default()
            })
        );
        let images =
            br#"{"data":[],"usage":{"input_tokens":50,"output_tokens":4160,"total_tokens":4210,
            "input_tokens_details":{"text_tokens":50,"image_tokens":0}}}"#;
        assert_eq!(
            usage_from_body(StreamKind::OpenAiChat, images)
                .map(|u| (u.input_tokens, u.output_tokens)),
            Some((50, 4160))
        );
        assert_eq!(usage_from_body(StreamKind::OpenAiChat, b"{}"), None);
        assert_eq!(
            usage_from_body(StreamKind::OpenAiChat, b"{\"usage\":null}"),
            None
        );
        assert_eq!(
            usage_from_body(StreamKind::OpenAiChat, b"{\"usage\":{}}"),
            None
        );
        assert_eq!(
            usage_from_body(
                StreamKind::OpenAiChat,
                b"{\"usage\":{\"prompt_tokens\":3.0}}"
            )
            .map(|u| u.input_tokens),
            Some(3)
        );
        assert_eq!(
            usage_from_body(
                StreamKind::OpenAiChat,
                b"{\"usage\":{\"prompt_tokens\":1e300}}"
            ),
            None
        );
    }
}
