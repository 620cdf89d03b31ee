//! Anthropic's messages API: usage reported piecewise and cumulatively over a stream.

use gateway_core::domain::Usage;
use serde_json::Value;

use super::object::{count_at, UsageObject};
use super::received::Received;

/// Anthropic reports usage piecewise and cumulatively; keeping the raw
/// components (each replaced when re-reported) is what makes double counting
/// impossible.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AnthropicParts {
    input: u64,
    cache_creation: u64,
    cache_read: u64,
    output: u64,
}

impl AnthropicParts {
    pub(super) fn update<U: UsageObject + ?Sized>(&mut self, usage: &U) -> bool {
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

    pub(super) fn usage(&self) -> Usage {
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

pub(super) fn observe_anthropic(
    parts: &mut AnthropicParts,
    received: &mut Received,
    ty: &str,
    json: &Value,
) {
    match ty {
        "message_start" => {
            if let Some(u) = json.get("message").and_then(|m| m.get("usage")) {
                if parts.update(u) {
                    received.usage = Some(parts.usage());
                }
            }
        }
        "message_delta" => {
            if let Some(u) = json.get("usage") {
                if parts.update(u) {
                    received.usage = Some(parts.usage());
                }
            }
        }
        "message_stop" => received.terminal = true,
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
                received.deliver(t);
            }
        }
        _ => {}
    }
}
