//! A usage object as the readers see it, whichever way it was parsed, and its token counts.

use serde_json::Value;

/// A usage object as the readers see it: a JSON tree, or [`UsageFields`].
pub(super) trait UsageObject {
    /// The value at `key`; `Some(Null)` for a key present with `null`, as in a tree.
    fn field(&self, key: &str) -> Option<&Value>;

    /// The value at `inner` in the details object at `key` (`prompt_tokens_details`, ...);
    /// `None` when `key` holds no object or the object has no `inner`.
    fn detail(&self, key: &str, inner: &str) -> Option<&Value> {
        self.field(key)?.get(inner)
    }
}

impl UsageObject for Value {
    fn field(&self, key: &str) -> Option<&Value> {
        self.get(key)
    }
}

/// The fields of a usage object that [`openai_usage`] and [`AnthropicParts`] read, and only
/// those, read without building the object's tree (numbers need no allocation; a details
/// object keeps only the two counts read from it, see [`Details`]). Only ever read from text
/// that starts with `{`, so serde's sequence form of a struct cannot apply.
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
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
    #[serde(default)]
    input_tokens_details: Option<Details>,
    #[serde(default)]
    completion_tokens_details: Option<Details>,
    #[serde(default)]
    output_tokens_details: Option<Details>,
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
            _ => {
                debug_assert!(false, "usage field {key} is not read by UsageFields");
                None
            }
        }
    }

    fn detail(&self, key: &str, inner: &str) -> Option<&Value> {
        let details = match key {
            "prompt_tokens_details" => self.prompt_tokens_details.as_ref(),
            "input_tokens_details" => self.input_tokens_details.as_ref(),
            "completion_tokens_details" => self.completion_tokens_details.as_ref(),
            "output_tokens_details" => self.output_tokens_details.as_ref(),
            _ => {
                debug_assert!(false, "usage details {key} are not read by UsageFields");
                None
            }
        }?;
        match inner {
            "cached_tokens" => details.cached_tokens.as_ref(),
            "reasoning_tokens" => details.reasoning_tokens.as_ref(),
            _ => {
                debug_assert!(false, "usage detail {inner} is not read by UsageFields");
                None
            }
        }
    }
}

/// A details object (`prompt_tokens_details`, ...) as the readers see it: the two counts read
/// from one, every other member skipped unbuilt (OpenAI's answers carry four or more, each a
/// key and a map entry in a tree). Only an object is read (`null` is an absent one); anything
/// else fails the whole reading, and the answer's tree is read instead, as for duplicate keys
/// in the usage object. A key given twice keeps its last value, as a tree does. Skipped
/// members are not checked (a number out of range there is not an error), as the usage
/// object's own unread members are not.
#[derive(Default)]
pub(super) struct Details {
    cached_tokens: Option<Value>,
    reasoning_tokens: Option<Value>,
}

impl<'de> serde::Deserialize<'de> for Details {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(field_identifier, rename_all = "snake_case")]
        enum Key {
            CachedTokens,
            ReasoningTokens,
            #[serde(other)]
            Other,
        }
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Details;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a usage details object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Details, A::Error> {
                let mut details = Details::default();
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::CachedTokens => details.cached_tokens = Some(map.next_value()?),
                        Key::ReasoningTokens => details.reasoning_tokens = Some(map.next_value()?),
                        Key::Other => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(details)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// A token count at `path`. Some providers send integral floats (`12.0`);
/// negative, fractional or absurd values are treated as absent rather than
/// wrapped or saturated into a bill.
pub(super) fn count_at<U: UsageObject + ?Sized>(usage: &U, path: &[&str]) -> Option<u64> {
    let cur = match path {
        [key] => usage.field(key)?,
        [key, inner] => usage.detail(key, inner)?,
        _ => {
            debug_assert!(false, "no usage count is read at {path:?}");
            return None;
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenAI's usage object, details and all, is read field by field: its details objects
    /// with their other members do not send the answer down the tree's path.
    #[test]
    fn an_openai_usage_object_reads_without_its_tree() {
        let text = r#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,
            "prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},
            "completion_tokens_details":{"reasoning_tokens":4,"audio_tokens":0,
            "accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#;
        let fields: UsageFields = serde_json::from_str(text).expect("read field by field");
        assert_eq!(count_at(&fields, &["prompt_tokens"]), Some(19));
        assert_eq!(
            count_at(&fields, &["prompt_tokens_details", "cached_tokens"]),
            Some(3)
        );
        assert_eq!(
            count_at(&fields, &["completion_tokens_details", "reasoning_tokens"]),
            Some(4)
        );
        assert_eq!(
            count_at(&fields, &["output_tokens_details", "reasoning_tokens"]),
            None
        );
        // Details that are `null` are absent; details of another shape are not read here.
        let null: UsageFields =
            serde_json::from_str(r#"{"prompt_tokens_details":null}"#).expect("null details");
        assert_eq!(
            count_at(&null, &["prompt_tokens_details", "cached_tokens"]),
            None
        );
        assert!(serde_json::from_str::<UsageFields>(r#"{"prompt_tokens_details":[3]}"#).is_err());
    }
}
