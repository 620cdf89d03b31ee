//! A usage object as the readers see it, whichever way it was parsed, and its token counts.

use serde_json::Value;

/// A usage object as the readers see it: a JSON tree, or [`UsageFields`].
pub(super) trait UsageObject {
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
pub(super) struct UsageFields {
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

/// A token count at `path`. Some providers send integral floats (`12.0`);
/// negative, fractional or absurd values are treated as absent rather than
/// wrapped or saturated into a bill.
pub(super) fn count_at<U: UsageObject + ?Sized>(usage: &U, path: &[&str]) -> Option<u64> {
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
