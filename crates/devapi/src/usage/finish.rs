//! `gen_ai.response.finish_reasons` of a traced request: why the model stopped, as the provider
//! said it, found in its answer's bytes by a search rather than a parse, and only for a request
//! whose span is recorded.
//!
//! The keys: `finish_reason` (OpenAI chat, each choice and the stream's last chunks),
//! `stop_reason` (Anthropic messages and `message_delta`), `finishReason` (Gemini). A `null`
//! (a stream's chunks before the last) is skipped; the Responses API states no reason of this
//! kind and gets none.

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem;
use smallvec::SmallVec;

/// What the three keys end with: one search over the answer finds them all, each hit's key
/// then checked by what precedes it.
static ENDING: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"eason\""));
/// The keys' openings before [`ENDING`].
const OPENINGS: [&[u8]; 3] = [b"\"finish_r", b"\"stop_r", b"\"finishR"];

/// Distinct reasons kept at most (one per choice; an answer may have many).
const MAX_REASONS: usize = 8;
/// A reason longer than this is not one (hostile or broken input).
const MAX_LEN: usize = 64;

/// The reasons the providers document (OpenAI, Anthropic, Gemini): one of these is kept as a
/// reference to it, with nothing allocated.
const KNOWN: [&str; 21] = [
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "function_call",
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
    "STOP",
    "MAX_TOKENS",
    "SAFETY",
    "RECITATION",
    "OTHER",
    "BLOCKLIST",
    "PROHIBITED_CONTENT",
    "SPII",
    "MALFORMED_FUNCTION_CALL",
];

/// The distinct reasons seen so far, in the order they first appeared; most answers state
/// one, held inline.
#[derive(Debug, Default)]
pub struct FinishReasons(SmallVec<[Cow<'static, str>; 2]>);

impl FinishReasons {
    /// Adds the reasons `bytes` (a whole answer, or one stream event's data) states.
    pub fn scan(&mut self, bytes: &[u8]) {
        let ending = ENDING.needle().len();
        for at in ENDING.find_iter(bytes) {
            let before = &bytes[..at];
            if !OPENINGS.iter().any(|o| before.ends_with(o)) {
                continue;
            }
            if let Some(reason) = string_value(&bytes[at + ending..]) {
                if self.0.len() < MAX_REASONS && !self.0.iter().any(|r| r == reason) {
                    self.0.push(
                        KNOWN
                            .iter()
                            .find(|k| **k == reason)
                            .map_or_else(|| Cow::Owned(reason.to_owned()), |k| Cow::Borrowed(*k)),
                    );
                }
            }
        }
    }

    pub fn as_slice(&self) -> &[Cow<'static, str>] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The string after `: "` at the start of `rest`, when it is a plain word (letters, digits,
/// `_`, `-`, `.`): a reason, never free text.
fn string_value(rest: &[u8]) -> Option<&str> {
    let rest = rest.trim_ascii_start().strip_prefix(b":")?;
    let rest = rest.trim_ascii_start().strip_prefix(b"\"")?;
    let end = rest.iter().take(MAX_LEN + 1).position(|b| *b == b'"')?;
    let word = &rest[..end];
    if word.is_empty()
        || !word
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return None;
    }
    std::str::from_utf8(word).ok()
}

#[cfg(test)]
mod tests {
    use super::FinishReasons;

    fn reasons(parts: &[&str]) -> Vec<String> {
        let mut r = FinishReasons::default();
        for p in parts {
            r.scan(p.as_bytes());
        }
        r.as_slice().iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn each_protocols_reasons_are_found_and_nulls_skipped() {
        assert_eq!(
            reasons(&[
                r#"{"choices":[{"index":0,"finish_reason":"stop"},{"index":1,"finish_reason" : "length"}]}"#
            ]),
            ["stop", "length"]
        );
        assert_eq!(
            reasons(&[
                r#"{"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
                r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
            ]),
            ["stop"]
        );
        assert_eq!(
            reasons(&[
                r#"{"type":"message_start","message":{"stop_reason":null}}"#,
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"}}"#,
            ]),
            ["end_turn"]
        );
        assert_eq!(
            reasons(&[r#"{"candidates":[{"finishReason": "MAX_TOKENS"}]}"#]),
            ["MAX_TOKENS"]
        );
        assert!(reasons(&[r#"{"object":"response","status":"completed"}"#]).is_empty());
    }

    #[test]
    fn text_that_is_not_a_reason_is_not_taken() {
        assert!(reasons(&[r#"{"finish_reason":"a secret prompt"}"#]).is_empty());
        assert!(reasons(&[&format!(r#"{{"finish_reason":"{}"}}"#, "x".repeat(65))]).is_empty());
        assert!(
            reasons(&[r#"{"finish_reason":"stop"#]).is_empty(),
            "unterminated"
        );
        let many: String = (0..20)
            .map(|i| format!(r#"{{"finish_reason":"r{i}"}}"#))
            .collect();
        assert_eq!(reasons(&[&many]).len(), 8);
    }
}
