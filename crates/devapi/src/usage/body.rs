//! Usage from a whole (non-streamed) answer.

use std::sync::LazyLock;

use gateway_core::domain::Usage;
use memchr::memmem;
use serde_json::value::RawValue;
use serde_json::Value;

use std::borrow::Cow;

use gateway_core::response_items::Issued;

use super::anthropic::AnthropicParts;
use super::kind::StreamKind;
use super::object::{UsageFields, UsageObject};
use super::openai::openai_usage;

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
    if kind == StreamKind::Gemini {
        return super::gemini::usage_from_body(body);
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

/// The usage and the ids of a whole Responses answer (`id` and each `output[].id`), read in
/// one pass: the rest of the answer is skipped unbuilt. An answer of another shape (duplicate
/// keys, an id that is no string) is read as a tree.
pub fn responses_answer(body: &[u8]) -> (Option<Usage>, Issued) {
    #[derive(serde::Deserialize)]
    struct Answer<'a> {
        #[serde(default, borrow)]
        id: Option<Cow<'a, str>>,
        #[serde(default, borrow)]
        output: Option<Vec<Item<'a>>>,
        #[serde(default, borrow)]
        usage: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Item<'a> {
        #[serde(default, borrow)]
        id: Option<Cow<'a, str>>,
    }
    let kind = StreamKind::OpenAiResponses;
    let mut issued = Issued::default();
    match serde_json::from_slice::<Answer>(body) {
        Ok(answer) => {
            issued.provider_id(answer.id.as_deref().unwrap_or(""));
            for item in answer.output.iter().flatten() {
                issued.provider_id(item.id.as_deref().unwrap_or(""));
            }
            let usage = answer
                .usage
                .filter(|raw| raw.get().starts_with('{'))
                .and_then(|raw| usage_of_raw(kind, raw));
            (usage, issued)
        }
        Err(_) => {
            let Ok(tree) = serde_json::from_slice::<Value>(body) else {
                return (None, issued);
            };
            super::openai::response_ids(&mut issued, &tree);
            (usage_from_tree(kind, &tree), issued)
        }
    }
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
    // Checked as UTF-8 once and read as text, as a request body is (`pipeline::reading`).
    let fields = std::str::from_utf8(object)
        .ok()
        .and_then(|text| serde_json::from_str::<UsageFields>(text).ok());
    if let Some(fields) = fields {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole Responses answer gives its usage and its ids in one reading, whatever its
    /// shape.
    #[test]
    fn responses_answers_give_usage_and_ids() {
        let ids = |i: &Issued| i.ids.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
        let body = br#"{"id":"resp_1","object":"response","output":[{"id":"rs_1","type":"reasoning"},
            {"type":"message","id":"msg_1","content":[{"type":"output_text","text":"\"id\":\"x\""}]}],
            "usage":{"input_tokens":3,"output_tokens":4},"user":null}"#;
        let (usage, issued) = responses_answer(body);
        assert_eq!(
            usage.map(|u| (u.input_tokens, u.output_tokens)),
            Some((3, 4))
        );
        assert_eq!(ids(&issued), ["resp_1", "rs_1", "msg_1"]);
        // Duplicate keys and odd ids: read as a tree.
        let odd = br#"{"id":"resp_1","id":"resp_2","output":[{"id":5},{"id":"msg_2"}],"usage":{"input_tokens":1}}"#;
        let (usage, issued) = responses_answer(odd);
        assert_eq!(usage.map(|u| u.input_tokens), Some(1));
        assert_eq!(ids(&issued), ["resp_2", "msg_2"]);
        for junk in [&b"[]"[..], b"", b"{\"output\":3}", b"\xff"] {
            let (usage, issued) = responses_answer(junk);
            assert!(usage.is_none() && issued.is_empty());
        }
    }

    /// A trailing usage object is checked as UTF-8 before it is read as text: one that is not
    /// counts nothing, and one that is reads as before.
    #[test]
    fn a_trailing_usage_that_is_not_utf8_counts_nothing() {
        let kind = StreamKind::OpenAiChat;
        let good = b"{\"id\":\"c\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}";
        let usage = usage_from_body(kind, good).expect("usage");
        assert_eq!((usage.input_tokens, usage.output_tokens), (3, 4));
        let bad = b"{\"id\":\"c\",\"usage\":{\"prompt_tokens\":3,\"x\xff\":1}}";
        assert!(usage_from_body(kind, bad).is_none());
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
            "{\"audio_tokens\":1,\"cached_tokens\":4,\"reasoning_tokens\":[],\"cached_tokens\":5}",
            "{\"cached_tokens\":{\"cached_tokens\":1},\"accepted_prediction_tokens\":{}}",
            "{\"cached\\u005ftokens\":6,\"reasoning_tokens\":7.0}",
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
        // Counts beside each details value, so that the details are read (with the counts
        // themselves made of the same value, the readers stop before the details).
        for k in keys.iter().filter(|k| k.ends_with("_details")) {
            for v in values {
                usages.push(format!(
                    "{{\"prompt_tokens\":1,\"completion_tokens\":2,\"{k}\":{v}}}"
                ));
                usages.push(format!(
                    "{{\"input_tokens\":3,\"output_tokens\":4,\"{k}\":{v},\"total_tokens\":7}}"
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
