//! Reading a request body for admission: the fields it needs and the text it counts, without
//! building a JSON tree where the body's shape allows.

use bytes::Bytes;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::error::ApiError;
use crate::items::Refs;
use crate::route::Endpoint;
use crate::state::SharedApiState;
use crate::tokens;

/// Bodies up to this size are counted on the async worker, and may be read as plain chat
/// bodies; larger ones are read as a tree and counted off the async workers.
pub(super) const INLINE_COUNT_MAX: usize = 256 * 1024;

/// The fields admission reads, borrowed from a tree or from a [`PlainBody`]. `Some(Null)` is a
/// field present with `null`, as a tree lookup gives it.
#[derive(Default)]
pub(super) struct Head<'a> {
    pub(super) model: Option<&'a Value>,
    pub(super) stream: Option<&'a Value>,
    pub(super) stream_options: Option<&'a Value>,
    pub(super) reasoning_effort: Option<&'a Value>,
    pub(super) reasoning: Option<&'a Value>,
    /// The values of [`tokens::OUTPUT_FIELDS`].
    pub(super) output: [Option<&'a Value>; tokens::OUTPUT_FIELDS.len()],
    /// The values of [`COUNT_FIELDS`], the other counts [`numbers`](super::numbers) checks.
    pub(super) counts: [Option<&'a Value>; COUNT_FIELDS.len()],
}

/// The counts a request sets besides its output ceiling, range-checked with it.
pub(super) const COUNT_FIELDS: [&str; 3] = ["max_tool_calls", "n", "top_logprobs"];

/// The top-level fields of a Responses request that refer to kept state ([`Refs`]).
const STATE_FIELDS: [&str; 4] = [
    "previous_response_id",
    "conversation",
    "background",
    "store",
];

impl<'a> Head<'a> {
    fn of_tree(j: &'a Value) -> Self {
        Head {
            model: j.get("model"),
            stream: j.get("stream"),
            stream_options: j.get("stream_options"),
            reasoning_effort: j.get("reasoning_effort"),
            reasoning: j.get("reasoning"),
            output: tokens::OUTPUT_FIELDS.map(|k| j.get(k)),
            counts: COUNT_FIELDS.map(|k| j.get(k)),
        }
    }

    /// The values [`numbers::check`](super::numbers::check) checks, in its order.
    pub(super) fn numbers(&self) -> [Option<&'a Value>; super::numbers::CHECKED.len()] {
        let [a, b, c] = self.output;
        let [d, e, f] = self.counts;
        [a, b, c, d, e, f]
    }
}

/// A chat body whose only text is `messages` of plain `{role, content}` strings: the shape of
/// most chat traffic, read field by field with the text borrowed. Reading fails (and the body
/// is read as a tree) on anything else: another message shape, one of the other text-carrying
/// fields (present at all, `null` included), a repeated field, invalid JSON.
#[derive(serde::Deserialize)]
pub(super) struct PlainBody<'a> {
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    model: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    stream: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    stream_options: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    reasoning_effort: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    reasoning: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    max_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    max_completion_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    max_output_tokens: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    max_tool_calls: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    n: Option<Value>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    top_logprobs: Option<Value>,
    /// `null` counts nothing, as in a tree.
    #[serde(default, borrow)]
    messages: Option<Vec<tokens::PlainMessage<'a>>>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    system: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    tools: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    functions: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    instructions: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    input: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "gateway_core::util::present")]
    prompt: Option<IgnoredAny>,
}

impl<'a> PlainBody<'a> {
    /// Reads `text`, the body checked as UTF-8 ([`inline_text`]).
    fn read(text: &'a str) -> Option<Self> {
        // Only an object: serde would also read a struct from an array, by position.
        if text.bytes().find(|b| !b.is_ascii_whitespace()) != Some(b'{') {
            return None;
        }
        let plain: PlainBody = serde_json::from_str(text).ok()?;
        let other_text = plain.system.is_some()
            || plain.tools.is_some()
            || plain.functions.is_some()
            || plain.instructions.is_some()
            || plain.input.is_some()
            || plain.prompt.is_some();
        (!other_text).then_some(plain)
    }

    fn head(&self) -> Head<'_> {
        Head {
            model: self.model.as_ref(),
            stream: self.stream.as_ref(),
            stream_options: self.stream_options.as_ref(),
            reasoning_effort: self.reasoning_effort.as_ref(),
            reasoning: self.reasoning.as_ref(),
            output: [
                self.max_tokens.as_ref(),
                self.max_completion_tokens.as_ref(),
                self.max_output_tokens.as_ref(),
            ],
            counts: [
                self.max_tool_calls.as_ref(),
                self.n.as_ref(),
                self.top_logprobs.as_ref(),
            ],
        }
    }
}

/// The top-level fields admission reads, in [`Head`]'s order, then [`STATE_FIELDS`], then
/// the text parts.
pub(super) const LARGE_FIELDS: [&str; 22] = [
    "model",
    "stream",
    "stream_options",
    "reasoning_effort",
    "reasoning",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "max_tool_calls",
    "n",
    "top_logprobs",
    "previous_response_id",
    "conversation",
    "background",
    "store",
    "messages",
    "system",
    "tools",
    "functions",
    "instructions",
    "input",
    "prompt",
];
/// Where the state fields and the text parts start in [`LARGE_FIELDS`].
pub(super) const LARGE_STATE_AT: usize = 11;
pub(super) const LARGE_TEXT_AT: usize = LARGE_STATE_AT + STATE_FIELDS.len();

/// A head field of a large body is built as a value only up to this size (a string of any
/// size is fine: it costs its length); larger, the body is refused.
pub(super) const HEAD_FIELD_MAX: usize = 64 * 1024;

/// What admission reads from a body over [`INLINE_COUNT_MAX`], without building its tree: the
/// top-level object is walked with every value borrowed raw, the head fields are built, and
/// the input is estimated one array element at a time ([`tokens::TokenCounter::estimate_raw`]).
/// Memory stays near the body's own size: a parsed tree of many tiny messages costs many
/// times it.
pub(super) struct LargeBody {
    head: [Option<Value>; LARGE_TEXT_AT],
    estimate: u64,
    /// What a Responses body refers to, read with its items.
    refs: Option<Refs>,
}

impl LargeBody {
    /// Reads `body`; `responses`: it is a Responses request, whose [`Refs`] are read too.
    fn read(
        counter: &tokens::TokenCounter,
        body: &[u8],
        responses: bool,
    ) -> Result<LargeBody, ApiError> {
        let text = std::str::from_utf8(body).map_err(|e| {
            ApiError::invalid(
                "invalid_json",
                format!("The request body is not valid JSON: {e}"),
            )
        })?;
        let raw = match serde_json::from_str::<TopFields<'_>>(text) {
            Ok(f) => f.0,
            // Not an object (or not JSON): worded as the tree path words it.
            Err(e) => {
                return Err(match serde_json::from_str::<IgnoredAny>(text) {
                    Ok(_) => {
                        ApiError::invalid("invalid_json", "The request body must be a JSON object.")
                    }
                    Err(_) => ApiError::invalid(
                        "invalid_json",
                        format!("The request body is not valid JSON: {e}"),
                    ),
                })
            }
        };
        let mut head: [Option<Value>; LARGE_TEXT_AT] = Default::default();
        for (i, slot) in head.iter_mut().enumerate() {
            let Some(r) = raw[i] else { continue };
            let t = r.get();
            if t.len() > HEAD_FIELD_MAX && !t.starts_with('"') {
                return Err(ApiError::invalid(
                    "invalid_request",
                    format!("`{}` is too large.", LARGE_FIELDS[i]),
                ));
            }
            *slot = Some(serde_json::from_str(t).map_err(|e| {
                ApiError::invalid(
                    "invalid_json",
                    format!("The request body is not valid JSON: {e}"),
                )
            })?);
        }
        let parts = tokens::RawParts {
            messages: raw[LARGE_TEXT_AT],
            system: raw[LARGE_TEXT_AT + 1],
            tools: raw[LARGE_TEXT_AT + 2],
            functions: raw[LARGE_TEXT_AT + 3],
            instructions: raw[LARGE_TEXT_AT + 4],
            input: raw[LARGE_TEXT_AT + 5],
            prompt: raw[LARGE_TEXT_AT + 6],
        };
        let mut refs = match responses {
            true => {
                let s = &head[LARGE_STATE_AT..LARGE_TEXT_AT];
                Some(Refs::of_fields(
                    s[0].as_ref(),
                    s[1].as_ref(),
                    s[2].as_ref(),
                    s[3].as_ref(),
                )?)
            }
            false => None,
        };
        let mut refused: Option<ApiError> = None;
        let mut seen = |i: usize, e: tokens::Element<'_>| {
            let (Some(r), None) = (refs.as_mut(), refused.as_ref()) else {
                return;
            };
            let read = match e {
                tokens::Element::Built(v) => r.item(i, v),
                tokens::Element::Raw(text) => r.raw_item(i, text),
            };
            refused = read.err();
        };
        let estimate = counter
            .estimate_raw_seeing(&parts, &mut seen)
            .map_err(|e| {
                ApiError::invalid(
                    "invalid_json",
                    format!("The request body is not valid JSON: {e}"),
                )
            })?;
        if let Some(e) = refused {
            return Err(e);
        }
        Ok(LargeBody {
            head,
            estimate,
            refs,
        })
    }

    fn head(&self) -> Head<'_> {
        let h = &self.head;
        Head {
            model: h[0].as_ref(),
            stream: h[1].as_ref(),
            stream_options: h[2].as_ref(),
            reasoning_effort: h[3].as_ref(),
            reasoning: h[4].as_ref(),
            output: [h[5].as_ref(), h[6].as_ref(), h[7].as_ref()],
            counts: [h[8].as_ref(), h[9].as_ref(), h[10].as_ref()],
        }
    }
}

/// The raw values of [`LARGE_FIELDS`] in a top-level object (the last of a repeated key, as in
/// a tree); every other member is skipped unbuilt.
pub(super) struct TopFields<'a>([Option<&'a serde_json::value::RawValue>; LARGE_FIELDS.len()]);

impl<'de> serde::Deserialize<'de> for TopFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = TopFields<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TopFields<'de>, A::Error> {
                let mut out = TopFields([None; LARGE_FIELDS.len()]);
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match LARGE_FIELDS.iter().position(|f| *f == key) {
                        Some(i) => out.0[i] = Some(map.next_value()?),
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Fields)
    }
}

/// A body read in the request (not large, not a GET) as text, checked as UTF-8 once for both
/// readings of it (plain, then the tree): read from bytes, serde checks every string and key on
/// its own, each check costing more than its few bytes. `None` when it is not UTF-8: the tree
/// then reads the bytes, and words the error.
fn inline_text(body: &[u8]) -> Option<&str> {
    std::str::from_utf8(body).ok()
}

/// The body as admission reads it: a plain chat body field by field, a large body off the
/// async workers, any other body as a tree; a GET has none.
pub(super) struct Reading<'a> {
    plain: Option<PlainBody<'a>>,
    large: Option<LargeBody>,
    json: Option<Value>,
}

impl<'a> Reading<'a> {
    /// Reads `body`, or says why it is not a JSON object.
    pub(super) async fn of(
        state: &SharedApiState,
        endpoint: Endpoint,
        body: &'a Bytes,
    ) -> Result<Reading<'a>, ApiError> {
        // A plain chat body is read for its fields without building a tree (most of admission's
        // parsing cost was allocating one); any other body, and a body that is not valid JSON,
        // is read as a tree, which also words the error. A Responses body is never plain: its
        // state fields and items are read from the tree.
        let large_body = !endpoint.is_get() && body.len() > INLINE_COUNT_MAX;
        let responses = endpoint == Endpoint::Responses;
        let text = if endpoint.is_get() || large_body {
            None
        } else {
            inline_text(body)
        };
        let plain = if responses {
            None
        } else {
            text.and_then(PlainBody::read)
        };
        // A large body is read without a tree, off the async workers.
        let large = if large_body {
            let counter = state.tokens.clone();
            let shared = body.clone();
            Some(
                tokio::task::spawn_blocking(move || LargeBody::read(&counter, &shared, responses))
                    .await
                    .map_err(|_| ApiError::ServerError)??,
            )
        } else {
            None
        };
        let json: Option<Value> = if endpoint.is_get() || plain.is_some() || large.is_some() {
            None
        } else {
            let tree = match text {
                Some(text) => serde_json::from_str::<Value>(text),
                None => serde_json::from_slice::<Value>(body),
            };
            match tree {
                Ok(v @ Value::Object(_)) => Some(v),
                Ok(_) => {
                    return Err(ApiError::invalid(
                        "invalid_json",
                        "The request body must be a JSON object.",
                    ))
                }
                Err(e) => {
                    return Err(ApiError::invalid(
                        "invalid_json",
                        format!("The request body is not valid JSON: {e}"),
                    ))
                }
            }
        };
        Ok(Reading { plain, large, json })
    }

    /// The fields admission reads, from whichever reading there is.
    pub(super) fn head(&self) -> Head<'_> {
        match (&self.plain, &self.json, &self.large) {
            (Some(p), _, _) => p.head(),
            (None, Some(j), _) => Head::of_tree(j),
            (None, None, Some(l)) => l.head(),
            (None, None, None) => Head::default(),
        }
    }

    /// The input estimate and the requested output (`output` is the head's output fields).
    pub(super) fn estimate(
        &self,
        counter: &tokens::TokenCounter,
        output: [Option<&Value>; tokens::OUTPUT_FIELDS.len()],
    ) -> (u64, Option<u64>) {
        match (&self.plain, &self.json) {
            (Some(p), _) => (
                counter.estimate_plain(p.messages.as_deref().unwrap_or_default()),
                tokens::requested_output_of(output),
            ),
            (None, Some(j)) => (counter.estimate_input(j), tokens::requested_output(j)),
            (None, None) => match &self.large {
                Some(l) => (l.estimate, tokens::requested_output_of(output)),
                None => (0, None),
            },
        }
    }

    /// What a Responses body refers to (`None` for other endpoints): read with a large body's
    /// items, else from the tree.
    pub(super) fn refs(&mut self, endpoint: Endpoint) -> Result<Option<Refs>, ApiError> {
        if endpoint != Endpoint::Responses {
            return Ok(None);
        }
        if let Some(l) = self.large.as_mut() {
            return Ok(l.refs.take());
        }
        match &self.json {
            Some(j) => Refs::of_tree(j).map(Some),
            None => Ok(Some(Refs::default())),
        }
    }

    /// The tree, when the body was read as one; the plain reading's borrow of the body ends.
    pub(super) fn into_tree(self) -> Option<Value> {
        self.json
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::tokens::TokenCounter;

    fn counter() -> &'static TokenCounter {
        static TC: OnceLock<TokenCounter> = OnceLock::new();
        TC.get_or_init(|| TokenCounter::new().expect("o200k_base loads"))
    }

    /// What admission reads from a body, by either path.
    fn reading(head: &Head<'_>) -> Vec<Option<Value>> {
        let mut v = vec![
            head.model.cloned(),
            head.stream.cloned(),
            head.stream_options.cloned(),
            head.reasoning_effort.cloned(),
            head.reasoning.cloned(),
        ];
        v.extend(head.output.iter().map(|o| o.cloned()));
        v.extend(head.counts.iter().map(|o| o.cloned()));
        v
    }

    /// Every body read without a tree gives what the tree gives: the fields the checks read,
    /// the requested output and the input estimate.
    #[test]
    fn plain_bodies_read_as_their_trees() {
        let long = "word ".repeat(20_000);
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#.to_string(),
            r#" {"messages":[{"content":"a\"b\u00e9","role":"system"},{"role":"user","content":""}],"model":"m","max_tokens":64}"#.to_string(),
            r#"{"model":null,"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7.0,"max_tokens":-1}"#.to_string(),
            r#"{"model":"","messages":[],"reasoning_effort":"high","reasoning":{"effort":"low"},"max_output_tokens":1e300,"n":2,"top_logprobs":"x","max_tool_calls":null}"#.to_string(),
            r#"{"model":5,"messages":null,"stream":"yes","temperature":0.2,"user":"u","user":"v"}"#.to_string(),
            r#"{"model":"m","messages":[["user","hello"]]}"#.to_string(),
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}}]}}"#),
            "{}".to_string(),
        ];
        for body in &bodies {
            let plain =
                PlainBody::read(body).unwrap_or_else(|| panic!("not read as plain: {body}"));
            let tree: Value = serde_json::from_str(body).expect("valid JSON");
            assert_eq!(
                reading(&plain.head()),
                reading(&Head::of_tree(&tree)),
                "{body}"
            );
            assert_eq!(
                tokens::requested_output_of(plain.head().output),
                tokens::requested_output(&tree),
                "{body}"
            );
            assert_eq!(
                counter().estimate_plain(plain.messages.as_deref().unwrap_or_default()),
                counter().estimate_input(&tree),
                "{body}"
            );
        }
    }

    /// A large body read without its tree gives what the tree gives: the fields the checks
    /// read and the input estimate, for every shape the estimator knows.
    #[test]
    fn large_bodies_read_as_their_trees() {
        let long = "word ".repeat(20_000);
        let bodies = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#.to_string(),
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}],"tools":[{"type":"function","function":{"name":"f"}}]}"#.to_string(),
            r#"{"model":"c","system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"x"}],"reasoning":{"effort":"low"}}"#.to_string(),
            r#"{"model":"r","instructions":"do","input":[{"role":"user","content":"a"},{"type":"function_call_output","output":"o"},"s",3],"max_output_tokens":9}"#.to_string(),
            r#"{"model":"r","previous_response_id":"resp_1","store":false,"background":true,"conversation":"c","n":1,"top_logprobs":2,"max_tool_calls":3,"input":[{"type":"item_reference","id":"msg_1"},{"id":"fc_1"},{"type":"reasoning","id":"rs_1","summary":[]}]}"#.to_string(),
            r#"{"model":"e","input":["a","b"],"prompt":"p","functions":{"name":"f"},"system":"s","model":"z"}"#.to_string(),
            r#"{"model":"m","messages":{"role":"user","content":"not a list"}}"#.to_string(),
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}}],"other":[1,2,{{"a":"b"}}]}}"#),
        ];
        for body in &bodies {
            let large = LargeBody::read(counter(), body.as_bytes(), true).expect("read");
            let tree: Value = serde_json::from_str(body).expect("valid JSON");
            assert_eq!(
                reading(&large.head()),
                reading(&Head::of_tree(&tree)),
                "{body}"
            );
            assert_eq!(large.estimate, counter().estimate_input(&tree), "{body}");
            assert_eq!(
                large.refs.as_ref(),
                Refs::of_tree(&tree).ok().as_ref(),
                "{body}"
            );
        }
        for bad in [
            "[1]",
            "{\"model\":",
            "\"text\"",
            "{\"model\":\"m\",\"messages\":[1,}",
        ] {
            let err = LargeBody::read(counter(), bad.as_bytes(), true)
                .err()
                .expect(bad);
            assert_eq!(err.code(), "invalid_json", "{bad}");
        }
    }

    /// Bodies of any other shape are read as trees: other message shapes, other text, repeated
    /// fields, arrays, invalid JSON.
    #[test]
    fn other_bodies_take_the_tree() {
        let bodies = [
            r#"[{"model":"m"}]"#,
            r#"["m",null]"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":"hi","name":"n"}]}"#,
            r#"{"model":"m","messages":[{"role":"user"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}"#,
            r#"{"model":"m","messages":{"role":"user","content":"hi"}}"#,
            r#"{"model":"m","system":null}"#,
            r#"{"model":"m","system":"be brief","messages":[]}"#,
            r#"{"model":"m","tools":[]}"#,
            r#"{"model":"m","functions":[]}"#,
            r#"{"model":"m","instructions":"x"}"#,
            r#"{"model":"m","input":"x"}"#,
            r#"{"model":"m","prompt":"x"}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"m""#,
            "",
        ];
        for body in bodies {
            assert!(PlainBody::read(body).is_none(), "read as plain: {body}");
        }
    }

    /// The body is checked as UTF-8 as a whole before it is read as text: a byte that is not
    /// UTF-8, in a string or a key, leaves it to the tree (which refuses it), and text that is
    /// (multi-byte characters included) reads as before.
    #[test]
    fn a_body_that_is_not_utf8_is_not_read_as_plain() {
        let good = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"héllo ✓\"}]}";
        let plain = PlainBody::read(inline_text(good.as_bytes()).expect("UTF-8")).expect("plain");
        assert_eq!(plain.messages.expect("messages")[0].content, "héllo ✓");
        for bad in [
            &b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"h\xffi\"}]}"[..],
            b"{\"model\":\"m\",\"mess\xc3ages\":[]}",
        ] {
            assert!(inline_text(bad).is_none());
            assert!(serde_json::from_slice::<Value>(bad).is_err());
        }
    }
}
