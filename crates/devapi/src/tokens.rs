//! Token estimation for requests before they are forwarded.
//!
//! The gateway has to make admission and budget decisions before the provider
//! has said anything, so it estimates what a request will cost from its body.
//! The estimate is deliberately approximate (one tokenizer, `o200k_base`, for
//! every provider) but it must be cheap, bounded and impossible to crash with a
//! hostile body, because it runs on the request path for every call.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::LazyLock;

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

use gateway_core::util::FastHash;

/// Flat charge for an image (or other binary attachment) part. Counting the
/// base64 payload as text would overestimate by orders of magnitude, and the
/// real cost depends on resolution and model; 85 is OpenAI's "low detail" cost
/// and is what the gateway has always assumed.
pub const IMAGE_PART_TOKENS: u64 = 85;

/// Per-message framing (role markers and separators), as in OpenAI's cookbook.
const TOKENS_PER_MESSAGE: u64 = 3;
/// The cookbook charges one extra token whenever a message carries `name`.
const TOKENS_PER_NAME: u64 = 1;
/// Every reply is primed with `<|start|>assistant<|message|>`.
const REPLY_PRIMING_TOKENS: u64 = 3;

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
const EXACT_BUDGET_BYTES: usize = 512 * 1024;

/// Extrapolation never assumes fewer tokens than one per this many bytes, so a
/// body that opens with cheap text cannot make its expensive tail look free.
const MIN_BYTES_PER_TOKEN_FLOOR: u64 = 4;

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

/// Shared, immutable tokenizer. Building the BPE tables takes the better part
/// of a second, so the gateway builds one at start and shares it in an `Arc`.
pub struct TokenCounter {
    bpe: CoreBPE,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("encoding", &"o200k_base")
            .finish()
    }
}

impl TokenCounter {
    /// Fails only if the embedded vocabulary cannot be loaded, which is a
    /// build problem; the caller decides whether that is fatal at start.
    pub fn new() -> Result<Self, String> {
        let bpe = tiktoken_rs::o200k_base().map_err(|e| format!("loading o200k_base: {e}"))?;
        Ok(Self { bpe })
    }

    /// Special-token text such as `<|endoftext|>` is counted as ordinary text,
    /// which is both what providers bill and the only safe choice for
    /// untrusted input. Texts beyond the exact budget are extrapolated.
    pub fn count(&self, text: &str) -> u64 {
        let mut tally = Tally::new(self);
        tally.text(text);
        tally.total()
    }

    /// Covers OpenAI chat, Anthropic messages, OpenAI responses, embeddings,
    /// images and speech bodies. A body of unknown shape still yields a count
    /// of the strings found under the keys that usually carry text, so a
    /// provider-specific variant is underestimated rather than rejected.
    pub fn estimate_input(&self, body: &Value) -> u64 {
        let Some(obj) = body.as_object() else {
            return 0;
        };
        // One walk over the body's keys (a lookup per key would search the map once for each
        // of the seven names), then the parts in their fixed order: the exact-count budget is
        // spent in the same order whatever order the client wrote the keys in.
        let mut parts = TopLevel::default();
        for (key, value) in obj {
            match key.as_str() {
                "messages" => parts.messages = Some(value),
                "system" => parts.system = Some(value),
                "tools" => parts.tools = Some(value),
                "functions" => parts.functions = Some(value),
                "instructions" => parts.instructions = Some(value),
                "input" => parts.input = Some(value),
                "prompt" => parts.prompt = Some(value),
                _ => {}
            }
        }
        let mut t = Tally::new(self);
        if let Some(messages) = parts.messages {
            t.messages(messages, 0);
        }
        if let Some(system) = parts.system {
            t.content(system, 0);
        }
        for defs in [parts.tools, parts.functions].into_iter().flatten() {
            match defs {
                Value::Array(defs) => {
                    for def in defs {
                        t.serialized(def, 1);
                    }
                }
                other => t.generic(other, 1),
            }
        }
        if let Some(instructions) = parts.instructions {
            t.content(instructions, 0);
        }
        if let Some(input) = parts.input {
            t.input(input, 0);
        }
        if let Some(prompt) = parts.prompt {
            t.input(prompt, 0);
        }
        t.total()
    }

    /// [`estimate_input`](Self::estimate_input) of a body whose only text is `messages` of
    /// plain `{role, content}` strings: the same count, from a body read without a tree.
    pub fn estimate_plain(&self, messages: &[PlainMessage<'_>]) -> u64 {
        let mut t = Tally::new(self);
        for m in messages {
            t.fixed(TOKENS_PER_MESSAGE);
            t.text(&m.role);
            t.text(&m.content);
        }
        if !messages.is_empty() {
            t.fixed(REPLY_PRIMING_TOKENS);
        }
        t.total()
    }
}

/// The text-carrying top-level parts of a body, borrowed raw (unparsed) from it.
#[derive(Default)]
pub struct RawParts<'a> {
    pub messages: Option<&'a RawValue>,
    pub system: Option<&'a RawValue>,
    pub tools: Option<&'a RawValue>,
    pub functions: Option<&'a RawValue>,
    pub instructions: Option<&'a RawValue>,
    pub input: Option<&'a RawValue>,
    pub prompt: Option<&'a RawValue>,
}

/// An element of a large body larger than this (other than a string) is not built as a tree
/// but charged by its size: a tree of many tiny values costs tens of times its JSON.
pub const ELEMENT_TREE_MAX: usize = 256 * 1024;

impl TokenCounter {
    /// [`estimate_input`](Self::estimate_input) of a large body without its tree: each part
    /// that is an array is built one element at a time (the element counted, then dropped), so
    /// memory stays near one element's tree whatever the body holds. An element over
    /// [`ELEMENT_TREE_MAX`] that is not a string is charged one token per four bytes. The same
    /// count as the tree's for every body without such elements.
    pub fn estimate_raw(&self, parts: &RawParts<'_>) -> Result<u64, serde_json::Error> {
        let mut t = Tally::new(self);
        if let Some(messages) = parts.messages {
            let mut any = false;
            each_element(
                messages,
                &mut t,
                |t, v| t.messages(v, 0),
                |t, m| {
                    any = true;
                    t.fixed(TOKENS_PER_MESSAGE);
                    match m {
                        Value::Object(m) => t.message(m, 1),
                        other => t.generic(other, 1),
                    }
                },
            )?;
            if any {
                t.fixed(REPLY_PRIMING_TOKENS);
            }
        }
        if let Some(system) = parts.system {
            each_element(system, &mut t, |t, v| t.content(v, 0), |t, p| t.part(p, 1))?;
        }
        for defs in [parts.tools, parts.functions].into_iter().flatten() {
            each_element(
                defs,
                &mut t,
                |t, v| t.generic(v, 1),
                |t, d| t.serialized(d, 1),
            )?;
        }
        if let Some(instructions) = parts.instructions {
            each_element(
                instructions,
                &mut t,
                |t, v| t.content(v, 0),
                |t, p| t.part(p, 1),
            )?;
        }
        for input in [parts.input, parts.prompt].into_iter().flatten() {
            each_element(
                input,
                &mut t,
                |t, v| t.input(v, 0),
                |t, item| match item {
                    Value::Object(obj) => t.input_item(obj, 1),
                    other => t.input(other, 1),
                },
            )?;
        }
        Ok(t.total())
    }
}

/// Calls `item` with each element of `raw` when it is an array, built one at a time, else
/// `whole` with `raw` built whole; either way a value over [`ELEMENT_TREE_MAX`] that is not a
/// string is charged by its size instead.
fn each_element(
    raw: &RawValue,
    t: &mut Tally<'_>,
    mut whole: impl FnMut(&mut Tally<'_>, &Value),
    mut item: impl FnMut(&mut Tally<'_>, &Value),
) -> Result<(), serde_json::Error> {
    let text = raw.get();
    if !text.starts_with('[') {
        return built(text, t, &mut whole);
    }
    /// Counts each element as it is read: only one element's tree exists at a time.
    struct Elements<'v, 'c, F> {
        t: &'v mut Tally<'c>,
        item: &'v mut F,
    }
    impl<'de, F: FnMut(&mut Tally<'_>, &Value)> serde::de::Visitor<'de> for Elements<'_, '_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(e) = seq.next_element::<&'de RawValue>()? {
                built(e.get(), self.t, self.item).map_err(serde::de::Error::custom)?;
            }
            Ok(())
        }
    }
    use serde::Deserializer as _;
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_seq(Elements { t, item: &mut item })
}

/// Builds `text` as a tree for `f`, unless it is too large to (see [`each_element`]).
fn built(
    text: &str,
    t: &mut Tally<'_>,
    f: &mut impl FnMut(&mut Tally<'_>, &Value),
) -> Result<(), serde_json::Error> {
    if text.len() > ELEMENT_TREE_MAX && !text.starts_with('"') {
        t.fixed((text.len() as u64).div_ceil(MIN_BYTES_PER_TOKEN_FLOOR));
        return Ok(());
    }
    let v: Value = serde_json::from_str(text)?;
    f(t, &v);
    Ok(())
}

/// The output ceiling the client asked for, under whichever name its API
/// uses. Values that are not non-negative integers are skipped rather than
/// trusted, so a hostile `-1` or `1e300` cannot turn into a huge reservation.
pub fn requested_output(body: &Value) -> Option<u64> {
    let obj = body.as_object()?;
    requested_output_of(OUTPUT_FIELDS.map(|key| obj.get(key)))
}

/// The names a request's output ceiling goes by, in the APIs the gateway serves.
pub const OUTPUT_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// [`requested_output`] of the values of [`OUTPUT_FIELDS`], however they were read. The
/// largest of them: a provider may honour any, so checking only the first would let
/// `max_tokens: 10, max_completion_tokens: 100000` slip past the output limits.
pub fn requested_output_of(values: [Option<&Value>; OUTPUT_FIELDS.len()]) -> Option<u64> {
    values
        .into_iter()
        .filter_map(|v| v.and_then(non_negative_integer))
        .max()
}

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

fn non_negative_integer(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    // 2^53: beyond it floats are no longer exact integers.
    if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0 {
        // Exact: the value is a non-negative integer below 2^53.
        Some(f as u64)
    } else {
        None
    }
}

/// The top-level parts of a request body that carry input text.
#[derive(Default)]
struct TopLevel<'a> {
    messages: Option<&'a Value>,
    system: Option<&'a Value>,
    tools: Option<&'a Value>,
    functions: Option<&'a Value>,
    instructions: Option<&'a Value>,
    input: Option<&'a Value>,
    prompt: Option<&'a Value>,
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
struct Tally<'a> {
    counter: &'a TokenCounter,
    budget_left: usize,
    exact_bytes: u64,
    exact_tokens: u64,
    extrapolated_bytes: u64,
    fixed: u64,
}

impl<'a> Tally<'a> {
    fn new(counter: &'a TokenCounter) -> Self {
        Self {
            counter,
            budget_left: EXACT_BUDGET_BYTES,
            exact_bytes: 0,
            exact_tokens: 0,
            extrapolated_bytes: 0,
            fixed: 0,
        }
    }

    fn total(&self) -> u64 {
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

    fn fixed(&mut self, n: u64) {
        self.fixed = self.fixed.saturating_add(n);
    }

    fn text(&mut self, mut s: &str) {
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
    fn encode(&self, slice: &str) -> u64 {
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

    fn encode_uncached(&self, slice: &str) -> u64 {
        let bpe = &self.counter.bpe;
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

    fn messages(&mut self, messages: &Value, depth: u32) {
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

    fn message(&mut self, m: &Map<String, Value>, depth: u32) {
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
    fn function_call(&mut self, f: &Value, depth: u32) {
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
    fn content(&mut self, content: &Value, depth: u32) {
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

    fn part(&mut self, part: &Value, depth: u32) {
        match part {
            Value::Object(p) => self.part_object(p, depth),
            other => self.generic(other, depth + 1),
        }
    }

    fn part_object(&mut self, p: &Map<String, Value>, depth: u32) {
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
    fn input(&mut self, input: &Value, depth: u32) {
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

    fn input_item(&mut self, item: &Map<String, Value>, depth: u32) {
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
    fn serialized(&mut self, v: &Value, depth: u32) {
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
    fn generic(&mut self, v: &Value, depth: u32) {
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

    fn generic_object(&mut self, obj: &Map<String, Value>, depth: u32) {
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
fn split_point(s: &str, max: usize) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::{Arc, OnceLock};

    fn tc() -> &'static TokenCounter {
        static TC: OnceLock<TokenCounter> = OnceLock::new();
        TC.get_or_init(|| TokenCounter::new().expect("o200k_base loads"))
    }

    #[test]
    fn send_sync_and_arc() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TokenCounter>();
        let shared = Arc::new(TokenCounter::new().expect("loads"));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let c = Arc::clone(&shared);
                std::thread::spawn(move || c.count(&format!("thread {i} says hello world")))
            })
            .collect();
        for h in handles {
            assert!(h.join().expect("thread ok") > 0);
        }
    }

    #[test]
    fn known_counts() {
        assert_eq!(tc().count(""), 0);
        assert_eq!(tc().count("hello world"), 2);
        assert_eq!(tc().count("Hello, world!"), 4);
        assert_eq!(tc().count("a"), 1);
    }

    #[test]
    fn slicing_matches_whole_encoding_for_ordinary_text() {
        let text = "The quick brown fox jumps over the lazy dog.\n\n  Don't panic, it's fine! \
                    fn main() { println!(\"{}\", 1 + 2); }\r\n\t- item\n"
            .repeat(40);
        let whole = tc().bpe.encode_ordinary(&text).len() as u64;
        assert_eq!(tc().count(&text), whole);
    }

    #[test]
    fn split_point_respects_char_boundaries() {
        let s = "é".repeat(300);
        let p = split_point(&s, 255);
        assert!(s.is_char_boundary(p));
        assert!(p > 0 && p <= 255);
        assert_eq!(split_point("😀", 2), 0);
        assert_eq!(split_point("ab cd", 4), 2);
        assert_eq!(split_point("abc", 10), 3);
    }

    #[test]
    fn hostile_special_tokens_are_ordinary_text() {
        let s = "<|endoftext|><|im_start|>system<|im_end|><|endofprompt|>";
        let n = tc().count(s);
        assert!(n > 5, "special markers must be split as text, got {n}");
        let body = json!({"messages": [{"role": "user", "content": s}]});
        assert!(tc().estimate_input(&body) > n);
    }

    #[test]
    fn pathological_runs_are_bounded() {
        // Quadratic BPE merges would make these take seconds unsliced.
        for s in [
            "a".repeat(30_000),
            " ".repeat(30_000),
            "\n".repeat(30_000),
            "!".repeat(30_000),
            "😀".repeat(8_000),
        ] {
            let n = tc().count(&s);
            assert!(n > 0);
        }
    }

    #[test]
    fn huge_text_is_extrapolated_not_undercounted() {
        let unit = "go ";
        let big = unit.repeat(EXACT_BUDGET_BYTES / unit.len() * 3);
        let n = tc().count(&big);
        let words = (big.len() / unit.len()) as u64;
        // Each " go" is one token, denser than the extrapolation floor.
        assert!(n >= words, "{n} < {words}");
        assert!(n <= words + words / 10 + 10, "{n} far above {words}");
        // A cheap head cannot make an expensive tail look cheaper than
        // one token per four bytes.
        let mut mixed = "a".repeat(EXACT_BUDGET_BYTES);
        mixed.push_str(&"x".repeat(400_000));
        assert!(tc().count(&mixed) >= 100_000);
    }

    #[test]
    fn openai_chat_shape() {
        let hello = tc().count("hello world");
        let body = json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "user", "content": "hello world"}
            ]
        });
        let user = tc().count("user");
        assert_eq!(
            tc().estimate_input(&body),
            TOKENS_PER_MESSAGE + user + hello + REPLY_PRIMING_TOKENS
        );

        let parts = json!({
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hello world"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA".repeat(1000)}}
            ]}]
        });
        assert_eq!(
            tc().estimate_input(&parts),
            TOKENS_PER_MESSAGE + user + hello + IMAGE_PART_TOKENS + REPLY_PRIMING_TOKENS
        );

        let with_name =
            json!({"messages": [{"role": "user", "name": "bob", "content": "hello world"}]});
        assert_eq!(
            tc().estimate_input(&with_name),
            tc().estimate_input(&body) + TOKENS_PER_NAME + tc().count("bob")
        );

        let tool_calls = json!({"messages": [{
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]
        }]});
        let expect = TOKENS_PER_MESSAGE
            + tc().count("assistant")
            + tc().count("get_weather")
            + tc().count("{\"city\":\"Paris\"}")
            + REPLY_PRIMING_TOKENS;
        assert_eq!(tc().estimate_input(&tool_calls), expect);
    }

    #[test]
    fn anthropic_shape() {
        let body = json!({
            "model": "claude",
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "hello world"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "SIGSIGSIG"},
                    {"type": "tool_use", "id": "t1", "name": "calc", "input": {"x": 1}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUFB".repeat(5000)}}
                ]}
            ]
        });
        let expect = tc().count("be brief")
            + 3 * TOKENS_PER_MESSAGE
            + REPLY_PRIMING_TOKENS
            + tc().count("user") * 2
            + tc().count("assistant")
            + tc().count("hello world")
            + tc().count("hmm")
            + tc().count("calc")
            + tc().count("{\"x\":1}")
            + tc().count("2")
            + IMAGE_PART_TOKENS;
        assert_eq!(tc().estimate_input(&body), expect);

        let system_string = json!({"system": "be brief", "messages": []});
        assert_eq!(tc().estimate_input(&system_string), tc().count("be brief"));
    }

    #[test]
    fn chat_and_anthropic_agree_on_plain_text() {
        let chat = json!({"messages": [{"role": "user", "content": "explain rust lifetimes"}]});
        let anth = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "explain rust lifetimes"}]}]});
        assert_eq!(tc().estimate_input(&chat), tc().estimate_input(&anth));
    }

    #[test]
    fn tools_are_counted() {
        let base = json!({"messages": [{"role": "user", "content": "hi"}]});
        let tool = json!({"type": "function", "function": {
            "name": "lookup", "description": "Look something up in the catalogue",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
        let mut with_tools = base.clone();
        with_tools["tools"] = json!([tool.clone()]);
        let tool_tokens = tc().count(&serde_json::to_string(&tool).expect("serializes"));
        assert_eq!(
            tc().estimate_input(&with_tools),
            tc().estimate_input(&base) + tool_tokens
        );
        let mut with_functions = base.clone();
        with_functions["functions"] = json!([tool]);
        assert_eq!(
            tc().estimate_input(&with_functions),
            tc().estimate_input(&with_tools)
        );
    }

    #[test]
    fn responses_shape() {
        let simple = json!({"instructions": "be terse", "input": "hello world"});
        assert_eq!(
            tc().estimate_input(&simple),
            tc().count("be terse") + tc().count("hello world")
        );
        let items = json!({"input": [
            {"role": "user", "content": [
                {"type": "input_text", "text": "hello world"},
                {"type": "input_image", "image_url": "https://example.com/x.png"}
            ]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "42"}
        ]});
        let expect = 3 * TOKENS_PER_MESSAGE
            + tc().count("user")
            + tc().count("hello world")
            + IMAGE_PART_TOKENS
            + tc().count("f")
            + tc().count("{}")
            + tc().count("42");
        assert_eq!(tc().estimate_input(&items), expect);
    }

    #[test]
    fn embeddings_images_speech() {
        assert_eq!(
            tc().estimate_input(&json!({"input": ["hello world", "hello world"]})),
            2 * tc().count("hello world")
        );
        assert_eq!(tc().estimate_input(&json!({"input": [1, 2, 3]})), 3);
        assert_eq!(
            tc().estimate_input(&json!({"input": [[1, 2], [3, 4, 5]]})),
            5
        );
        assert_eq!(
            tc().estimate_input(&json!({"prompt": "a cat", "model": "dall-e"})),
            tc().count("a cat")
        );
        assert_eq!(
            tc().estimate_input(&json!({"input": "say hi", "voice": "alloy"})),
            tc().count("say hi")
        );
    }

    #[test]
    fn garbage_never_panics() {
        let bodies = [
            json!(null),
            json!(42),
            json!("just a string"),
            json!([1, 2, 3]),
            json!({"messages": "not an array"}),
            json!({"messages": [null, 1, "x", [], {"content": {"weird": true}}]}),
            json!({"messages": [{"role": 5, "name": {"a": "b"}, "tool_calls": [1, {"function": 3}]}]}),
            json!({"system": 12, "tools": "nope", "functions": {"a": "b"}}),
            json!({"input": [null, true, {"type": "function_call", "arguments": {"a": [1]}}]}),
            json!({"prompt": {"deep": [[["x"]]]}}),
            json!({"messages": [{"content": [{"type": "tool_result", "content": {"type": "tool_result"}}]}]}),
        ];
        for b in &bodies {
            let _ = tc().estimate_input(b);
        }
        assert_eq!(tc().estimate_input(&json!(null)), 0);
    }

    #[test]
    fn deeply_nested_values_are_cut_off() {
        // Built in code, so deeper than serde_json's parser would allow.
        let mut v = json!("leaf");
        for _ in 0..300 {
            v = json!({"type": "tool_result", "content": [v]});
        }
        let body = json!({"messages": [{"role": "user", "content": [v.clone()]}], "tools": [v.clone()], "input": [v.clone()]});
        let _ = tc().estimate_input(&body);
        let mut arr = json!("leaf");
        for _ in 0..300 {
            arr = json!([arr]);
        }
        let body = json!({"prompt": arr, "system": {"x": [json!(null)]}});
        assert!(tc().estimate_input(&body) <= 3);
    }

    #[test]
    fn parsed_deep_garbage_is_rejected_by_parser_not_us() {
        let s = "[".repeat(10_000);
        assert!(serde_json::from_str::<Value>(&s).is_err());
        let s = format!("{}\"x\"{}", "[".repeat(100), "]".repeat(100));
        let v: Value = serde_json::from_str(&s).expect("within limit");
        let _ = tc().estimate_input(&json!({"messages": v}));
    }

    #[test]
    fn requested_output_takes_the_largest_valid_field() {
        assert_eq!(requested_output(&json!({"max_tokens": 100})), Some(100));
        assert_eq!(
            requested_output(&json!({"max_completion_tokens": 7, "max_output_tokens": 9})),
            Some(9)
        );
        assert_eq!(requested_output(&json!({"max_output_tokens": 9})), Some(9));
        assert_eq!(
            requested_output(&json!({"max_tokens": -1, "max_output_tokens": 9})),
            Some(9)
        );
        assert_eq!(
            requested_output(&json!({"max_tokens": null, "max_completion_tokens": 5})),
            Some(5)
        );
        assert_eq!(
            requested_output(&json!({"max_tokens": 10, "max_completion_tokens": 100000})),
            Some(100000)
        );
        assert_eq!(requested_output(&json!({"max_tokens": 12.0})), Some(12));
        assert_eq!(requested_output(&json!({"max_tokens": 12.5})), None);
        assert_eq!(requested_output(&json!({"max_tokens": 1e300})), None);
        assert_eq!(requested_output(&json!({"max_tokens": "100"})), None);
        assert_eq!(requested_output(&json!({})), None);
        assert_eq!(requested_output(&json!([1])), None);
    }
}
