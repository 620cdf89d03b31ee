//! Token estimation for requests before they are forwarded.
//!
//! The gateway has to make admission and budget decisions before the provider
//! has said anything, so it estimates what a request will cost from its body.
//! The estimate is deliberately approximate (one tokenizer, `o200k_base`, for
//! every provider) but it must be cheap, bounded and impossible to crash with a
//! hostile body, because it runs on the request path for every call.

mod output;
mod tally;
#[cfg(test)]
mod tests;

use serde_json::value::RawValue;
use serde_json::Value;
use tiktoken_rs::CoreBPE;

pub use output::{clamp_output, requested_output, requested_output_of, OUTPUT_FIELDS};
use tally::Tally;
pub use tally::{PlainMessage, IMAGE_PART_TOKENS};
use tally::{MIN_BYTES_PER_TOKEN_FLOOR, REPLY_PRIMING_TOKENS, TOKENS_PER_MESSAGE};

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
        let mut tally = Tally::new(&self.bpe);
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
        let mut t = Tally::new(&self.bpe);
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
        let mut t = Tally::new(&self.bpe);
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
        self.estimate_raw_seeing(parts, &mut |_, _| {})
    }

    /// [`estimate_raw`](Self::estimate_raw), showing `seen` each element of an `input` array
    /// as it is read (its position, and its tree or, when too large to build, its text): what
    /// else admission reads from the items costs no second walk.
    pub fn estimate_raw_seeing(
        &self,
        parts: &RawParts<'_>,
        seen: &mut dyn FnMut(usize, Element<'_>),
    ) -> Result<u64, serde_json::Error> {
        let mut none = |_: usize, _: Element<'_>| {};
        let mut t = Tally::new(&self.bpe);
        if let Some(messages) = parts.messages {
            let mut any = false;
            each_element(
                messages,
                &mut t,
                &mut none,
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
            each_element(
                system,
                &mut t,
                &mut none,
                |t, v| t.content(v, 0),
                |t, p| t.part(p, 1),
            )?;
        }
        for defs in [parts.tools, parts.functions].into_iter().flatten() {
            each_element(
                defs,
                &mut t,
                &mut none,
                |t, v| t.generic(v, 1),
                |t, d| t.serialized(d, 1),
            )?;
        }
        if let Some(instructions) = parts.instructions {
            each_element(
                instructions,
                &mut t,
                &mut none,
                |t, v| t.content(v, 0),
                |t, p| t.part(p, 1),
            )?;
        }
        for input in [parts.input, parts.prompt].into_iter().flatten() {
            each_element(
                input,
                &mut t,
                &mut *seen,
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

/// An element of an array part as [`TokenCounter::estimate_raw_seeing`] shows it.
pub enum Element<'a> {
    /// Built as a tree.
    Built(&'a Value),
    /// Too large to build ([`ELEMENT_TREE_MAX`]): its JSON text.
    Raw(&'a str),
}

/// Calls `item` with each element of `raw` when it is an array, built one at a time (and shows
/// `seen` each), else `whole` with `raw` built whole; either way a value over
/// [`ELEMENT_TREE_MAX`] that is not a string is charged by its size instead.
fn each_element(
    raw: &RawValue,
    t: &mut Tally<'_>,
    seen: &mut dyn FnMut(usize, Element<'_>),
    mut whole: impl FnMut(&mut Tally<'_>, &Value),
    mut item: impl FnMut(&mut Tally<'_>, &Value),
) -> Result<(), serde_json::Error> {
    let text = raw.get();
    if !text.starts_with('[') {
        return built(text, t, &mut whole).map(|_| ());
    }
    /// Counts each element as it is read: only one element's tree exists at a time.
    struct Elements<'v, 'c, F> {
        t: &'v mut Tally<'c>,
        seen: &'v mut dyn FnMut(usize, Element<'_>),
        item: &'v mut F,
    }
    impl<'de, F: FnMut(&mut Tally<'_>, &Value)> serde::de::Visitor<'de> for Elements<'_, '_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut index = 0;
            while let Some(e) = seq.next_element::<&'de RawValue>()? {
                match built(e.get(), self.t, self.item).map_err(serde::de::Error::custom)? {
                    Some(v) => (self.seen)(index, Element::Built(&v)),
                    None => (self.seen)(index, Element::Raw(e.get())),
                }
                index += 1;
            }
            Ok(())
        }
    }
    use serde::Deserializer as _;
    let mut de = serde_json::Deserializer::from_str(text);
    de.deserialize_seq(Elements {
        t,
        seen,
        item: &mut item,
    })
}

/// Builds `text` as a tree for `f` and hands the tree back, unless it is too large to (see
/// [`each_element`]): then `None`.
fn built(
    text: &str,
    t: &mut Tally<'_>,
    f: &mut impl FnMut(&mut Tally<'_>, &Value),
) -> Result<Option<Value>, serde_json::Error> {
    if text.len() > ELEMENT_TREE_MAX && !text.starts_with('"') {
        t.fixed((text.len() as u64).div_ceil(MIN_BYTES_PER_TOKEN_FLOOR));
        return Ok(None);
    }
    let v: Value = serde_json::from_str(text)?;
    f(t, &v);
    Ok(Some(v))
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
