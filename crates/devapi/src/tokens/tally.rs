//! The running count of one estimate: text counted exactly up to a budget, the rest
//! extrapolated, and the walk over request structures that feeds it.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::LazyLock;

use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

use gateway_core::util::FastHash;

/// Flat charge for an image (or other binary attachment) part. Counting the
/// base64 payload as text would overestimate by orders of magnitude, and the
/// real cost depends on resolution and model; 85 is OpenAI's "low detail" cost
/// and is what the gateway has always assumed.
pub const IMAGE_PART_TOKENS: u64 = 85;

/// Per-message framing (role markers and separators), as in OpenAI's cookbook.
pub(super) const TOKENS_PER_MESSAGE: u64 = 3;
/// The cookbook charges one extra token whenever a message carries `name`.
pub(super) const TOKENS_PER_NAME: u64 = 1;
/// Every reply is primed with `<|start|>assistant<|message|>`.
pub(super) const REPLY_PRIMING_TOKENS: u64 = 3;

/// Extrapolation never assumes fewer tokens than one per this many bytes, so a
/// body that opens with cheap text cannot make its expensive tail look free.
pub(super) const MIN_BYTES_PER_TOKEN_FLOOR: u64 = 4;

/// Text is handed to the BPE in slices of at most this many bytes. The
/// vendored tiktoken merge loop is quadratic in the length of a single
/// pre-tokenized piece, so a hostile run such as 100 KB of `a` or of spaces
/// would take seconds in one call; at 256 bytes the worst case stays around
/// 2 MB/s, and ordinary text (split before whitespace) counts exactly as if it
/// were encoded whole.
const SLICE_BYTES: usize = 256;

/// Bytes of text counted exactly per call; beyond this the rest is
/// extrapolated from the ratio seen so far. Exact counting costs roughly half
/// a microsecond per byte, so this caps the CPU one request can burn here at a
/// few hundred milliseconds however large its body is.
pub(super) const EXACT_BUDGET_BYTES: usize = 512 * 1024;

/// Structural recursion limit. Bodies parsed by `serde_json` are already
/// limited to 128 levels, but a `Value` built in code is not, and nothing
/// legitimate nests this deep.
const MAX_DEPTH: u32 = 64;

/// Keys whose values are opaque payloads (base64, URLs, encrypted blobs) or
/// discriminators, which would only inflate a count of "text the model reads".
const OPAQUE_KEYS: &[&str] = &[
    "data",
    "file_data",
    "b64_json",
    "image_url",
    "url",
    "signature",
    "encrypted_content",
    "cache_control",
    "type",
];

/// Token counts of recently seen text slices, per worker thread (no lock on the request
/// path), keyed by a randomly keyed SipHash of the slice and its length. Chat traffic re-sends
/// the same text on every turn (system prompts, tool definitions, the conversation so far);
/// BPE-encoding it again on every turn is the costliest part of admission. A key collision could only
/// change an estimate (the reservation), never what is charged: settlement uses the provider's
/// usage. Cleared when full: simpler than an LRU and as good for a working set this size.
const SEEN_SLICES_MAX: usize = 16_384;

thread_local! {
    /// The keys are already the output of a secret-keyed hash, so the map itself needs only a
    /// fast one (std's SipHash here was a second full hash of every lookup).
    static SEEN_SLICES: RefCell<HashMap<(u64, usize), u64, FastHash>> =
        RefCell::new(HashMap::default());
}

static SLICE_HASH_KEYS: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// A chat message that is a role and a string content and nothing else, borrowed from the
/// body where it has no escapes. Any other shape (content parts, tool calls, a name, a
/// repeated key) fails to read as one, and the body is read as a tree instead.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainMessage<'a> {
    #[serde(borrow)]
    pub role: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub content: std::borrow::Cow<'a, str>,
}

/// The parts of one chat message that carry input text; `extra` holds `reasoning_content`,
/// `refusal` and `tool_call_id`, counted as they are.
#[derive(Default)]
struct MessageFields<'a> {
    role: Option<&'a Value>,
    name: Option<&'a Value>,
    content: Option<&'a Value>,
    extra: [Option<&'a Value>; 3],
    tool_calls: Option<&'a Value>,
    function_call: Option<&'a Value>,
}

/// Accumulates one estimate, spending the exact-count budget across every
/// string of the body so the total cost is bounded by the body, not per field.
pub(super) struct Tally<'a> {
    bpe: &'a CoreBPE,
    budget_left: usize,
    exact_bytes: u64,
    exact_tokens: u64,
    extrapolated_bytes: u64,
    fixed: u64,
}

impl<'a> Tally<'a> {
    pub(super) fn new(bpe: &'a CoreBPE) -> Self {
        Self {
            bpe,
            budget_left: EXACT_BUDGET_BYTES,
            exact_bytes: 0,
            exact_tokens: 0,
            extrapolated_bytes: 0,
            fixed: 0,
        }
    }

    pub(super) fn total(&self) -> u64 {
        let extra = if self.extrapolated_bytes == 0 {
            0
        } else {
            let floor = self.extrapolated_bytes.div_ceil(MIN_BYTES_PER_TOKEN_FLOOR);
            let ratio = if self.exact_bytes == 0 {
                0
            } else {
                let scaled = u128::from(self.extrapolated_bytes) * u128::from(self.exact_tokens);
                let q = scaled.div_ceil(u128::from(self.exact_bytes));
                u64::try_from(q).unwrap_or(u64::MAX)
            };
            floor.max(ratio)
        };
        self.exact_tokens
            .saturating_add(self.fixed)
            .saturating_add(extra)
    }

    pub(super) fn fixed(&mut self, n: u64) {
        self.fixed = self.fixed.saturating_add(n);
    }

    pub(super) fn text(&mut self, mut s: &str) {
        while !s.is_empty() {
            if self.budget_left == 0 {
                self.extrapolated_bytes = self.extrapolated_bytes.saturating_add(s.len() as u64);
                return;
            }
            let cut = split_point(s, SLICE_BYTES.min(self.budget_left));
            if cut == 0 {
                // Budget smaller than the next character: spend the rest on
                // extrapolation rather than loop.
                self.budget_left = 0;
                continue;
            }
            let (head, tail) = s.split_at(cut);
            self.exact_tokens = self.exact_tokens.saturating_add(self.encode(head));
            self.exact_bytes = self.exact_bytes.saturating_add(head.len() as u64);
            self.budget_left = self.budget_left.saturating_sub(head.len());
            s = tail;
        }
    }

    /// tiktoken unwraps regex results internally; slicing keeps its
    /// backtracking far below the limit, and this guard turns any remaining
    /// panic into a byte-based guess instead of a dead worker.
    pub(super) fn encode(&self, slice: &str) -> u64 {
        let key = (SLICE_HASH_KEYS.hash_one(slice), slice.len());
        if let Some(n) = SEEN_SLICES.with(|seen| seen.borrow().get(&key).copied()) {
            return n;
        }
        let n = self.encode_uncached(slice);
        SEEN_SLICES.with(|seen| {
            let mut seen = seen.borrow_mut();
            if seen.len() >= SEEN_SLICES_MAX {
                seen.clear();
            }
            seen.insert(key, n);
        });
        n
    }

    pub(super) fn encode_uncached(&self, slice: &str) -> u64 {
        let bpe = self.bpe;
        match catch_unwind(AssertUnwindSafe(|| bpe.encode_ordinary(slice).len())) {
            Ok(n) => n as u64,
            Err(_) => {
                log::warn!(
                    "tokenizer panicked on a {}-byte slice; estimating",
                    slice.len()
                );
                (slice.len() as u64).div_ceil(MIN_BYTES_PER_TOKEN_FLOOR)
            }
        }
    }

    pub(super) fn messages(&mut self, messages: &Value, depth: u32) {
        let Value::Array(list) = messages else {
            self.generic(messages, depth + 1);
            return;
        };
        for msg in list {
            self.fixed(TOKENS_PER_MESSAGE);
            match msg {
                Value::Object(m) => self.message(m, depth + 1),
                other => self.generic(other, depth + 1),
            }
        }
        if !list.is_empty() {
            self.fixed(REPLY_PRIMING_TOKENS);
        }
    }

    pub(super) fn message(&mut self, m: &Map<String, Value>, depth: u32) {
        // One walk over the message's keys, then its parts in a fixed order (see
        // `estimate_input`).
        let mut f = MessageFields::default();
        for (key, value) in m {
            match key.as_str() {
                "role" => f.role = Some(value),
                "name" => f.name = Some(value),
                "content" => f.content = Some(value),
                "reasoning_content" => f.extra[0] = Some(value),
                "refusal" => f.extra[1] = Some(value),
                "tool_call_id" => f.extra[2] = Some(value),
                "tool_calls" => f.tool_calls = Some(value),
                "function_call" => f.function_call = Some(value),
                _ => {}
            }
        }
        if let Some(Value::String(role)) = f.role {
            self.text(role);
        }
        if let Some(name) = f.name {
            self.fixed(TOKENS_PER_NAME);
            self.generic(name, depth + 1);
        }
        if let Some(content) = f.content {
            self.content(content, depth + 1);
        }
        for v in f.extra.into_iter().flatten() {
            self.generic(v, depth + 1);
        }
        if let Some(Value::Array(calls)) = f.tool_calls {
            for call in calls {
                match call.get("function") {
                    Some(f) => self.function_call(f, depth + 2),
                    None => self.generic(call, depth + 2),
                }
            }
        }
        if let Some(f) = f.function_call {
            self.function_call(f, depth + 1);
        }
    }

    /// `arguments` is a JSON string in OpenAI's API, but some clients send an
    /// object; either way the model sees the serialized form.
    pub(super) fn function_call(&mut self, f: &Value, depth: u32) {
        let Value::Object(f) = f else {
            self.generic(f, depth + 1);
            return;
        };
        if let Some(name) = f.get("name") {
            self.generic(name, depth + 1);
        }
        match f.get("arguments") {
            Some(Value::String(args)) => self.text(args),
            Some(other) => self.serialized(other, depth + 1),
            None => {}
        }
    }

    /// Message content in any of the shapes the APIs allow: a plain string,
    /// a list of parts, or a single part.
    pub(super) fn content(&mut self, content: &Value, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        match content {
            Value::String(s) => self.text(s),
            Value::Array(parts) => {
                for part in parts {
                    self.part(part, depth + 1);
                }
            }
            Value::Object(_) => self.part(content, depth + 1),
            _ => {}
        }
    }

    pub(super) fn part(&mut self, part: &Value, depth: u32) {
        match part {
            Value::Object(p) => self.part_object(p, depth),
            other => self.generic(other, depth + 1),
        }
    }

    pub(super) fn part_object(&mut self, p: &Map<String, Value>, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "image_url" | "image" | "input_image" | "document" | "input_file" | "file"
            | "input_audio" => self.fixed(IMAGE_PART_TOKENS),
            "tool_use" | "server_tool_use" => {
                if let Some(name) = p.get("name") {
                    self.generic(name, depth + 1);
                }
                if let Some(input) = p.get("input") {
                    self.serialized(input, depth + 1);
                }
            }
            "tool_result" => {
                if let Some(c) = p.get("content") {
                    self.content(c, depth + 1);
                }
            }
            "thinking" => {
                if let Some(Value::String(t)) = p.get("thinking") {
                    self.text(t);
                }
            }
            "redacted_thinking" => {}
            _ => match p.get("text") {
                Some(Value::String(t)) => self.text(t),
                _ => self.generic_object(p, depth + 1),
            },
        }
    }

    /// Responses-API `input`, embeddings `input`, and `prompt`: a string, a
    /// list of strings, token ids (one token each), or a list of items.
    pub(super) fn input(&mut self, input: &Value, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        match input {
            Value::String(s) => self.text(s),
            Value::Number(_) => self.fixed(1),
            Value::Array(items) => {
                for item in items {
                    match item {
                        Value::Object(obj) => self.input_item(obj, depth + 1),
                        other => self.input(other, depth + 1),
                    }
                }
            }
            Value::Object(obj) => self.input_item(obj, depth + 1),
            _ => {}
        }
    }

    pub(super) fn input_item(&mut self, item: &Map<String, Value>, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "function_call" | "custom_tool_call" => {
                self.fixed(TOKENS_PER_MESSAGE);
                if let Some(name) = item.get("name") {
                    self.generic(name, depth + 1);
                }
                for key in ["arguments", "input"] {
                    match item.get(key) {
                        Some(Value::String(args)) => self.text(args),
                        Some(other) => self.serialized(other, depth + 1),
                        None => {}
                    }
                }
            }
            "function_call_output" | "custom_tool_call_output" => {
                self.fixed(TOKENS_PER_MESSAGE);
                if let Some(out) = item.get("output") {
                    self.content(out, depth + 1);
                }
            }
            "reasoning" => {
                if let Some(summary) = item.get("summary") {
                    self.content(summary, depth + 1);
                }
            }
            _ if kind == "message" || item.contains_key("role") => {
                self.fixed(TOKENS_PER_MESSAGE);
                if let Some(Value::String(role)) = item.get("role") {
                    self.text(role);
                }
                if let Some(content) = item.get("content") {
                    self.content(content, depth + 1);
                }
            }
            _ => self.part_object(item, depth + 1),
        }
    }

    /// The model reads tool definitions and tool inputs as JSON, so their
    /// serialized form is the honest thing to count.
    pub(super) fn serialized(&mut self, v: &Value, depth: u32) {
        if depth > MAX_DEPTH || nesting_exceeds(v, MAX_DEPTH.saturating_sub(depth)) {
            // serde_json's serializer recurses without a limit.
            self.generic(v, depth);
            return;
        }
        match serde_json::to_string(v) {
            Ok(s) => self.text(&s),
            Err(_) => self.generic(v, depth),
        }
    }

    /// Counts every string value except opaque payloads, for shapes the
    /// gateway does not know.
    pub(super) fn generic(&mut self, v: &Value, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        match v {
            Value::String(s) => self.text(s),
            Value::Array(items) => {
                for item in items {
                    self.generic(item, depth + 1);
                }
            }
            Value::Object(obj) => self.generic_object(obj, depth),
            _ => {}
        }
    }

    pub(super) fn generic_object(&mut self, obj: &Map<String, Value>, depth: u32) {
        if depth > MAX_DEPTH {
            return;
        }
        for (k, item) in obj {
            if !OPAQUE_KEYS.contains(&k.as_str()) {
                self.generic(item, depth + 1);
            }
        }
    }
}

/// Iterative so that the check itself cannot overflow the stack.
fn nesting_exceeds(v: &Value, limit: u32) -> bool {
    let mut stack: Vec<(&Value, u32)> = vec![(v, 0)];
    while let Some((node, d)) = stack.pop() {
        if d > limit {
            return true;
        }
        match node {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(obj) => stack.extend(obj.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    false
}

/// Where to cut `s` so the head is at most `max` bytes: just before the last
/// whitespace in range, which leaves BPE pieces intact for ordinary text, or
/// at a char boundary when there is none. Returns 0 only if `max` is smaller
/// than the first character.
pub(super) fn split_point(s: &str, max: usize) -> usize {
    if s.len() <= max {
        return s.len();
    }
    let mut cut = max;
    while cut > 0 && !s.is_char_boundary(cut) {
        cut -= 1;
    }
    let window = &s[..cut];
    window
        .char_indices()
        .rev()
        .find(|&(p, c)| p > 0 && c.is_whitespace())
        .map_or(cut, |(p, _)| p)
}
