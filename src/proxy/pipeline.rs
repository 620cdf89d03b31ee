//! The nine checks of spec §4.1, in the spec's order. Each returns the spec's error; the first
//! failure wins. What survives is an `Admitted` request ready to route.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::apikey;
use crate::config::{Config, Model};
use crate::error::ApiError;
use crate::identity::Identity;
use crate::proxy::auth::{presented_key, Presented};
use crate::proxy::route::Endpoint;
use crate::proxy::tokens;
use crate::state::SharedState;

/// Why the pipeline stopped.
pub enum Stop {
    /// Answer with this error.
    Api(ApiError),
    /// The client went away while we were reading; there is nobody to answer.
    ClientGone,
}

impl From<ApiError> for Stop {
    fn from(e: ApiError) -> Self {
        Stop::Api(e)
    }
}

/// A request that passed checks 1–8 and is about to reserve quota.
pub struct Admitted {
    pub endpoint: Endpoint,
    pub identity: Identity,
    pub body: Bytes,
    /// The body's tree when admission built one; a plain chat body has none (see [`tree`]).
    ///
    /// [`tree`]: Admitted::tree
    pub json: Option<Value>,
    /// The configured model, for model endpoints.
    pub model: Option<Arc<Model>>,
    /// The model name as the client sent it (empty for tools and model listings).
    pub model_name: String,
    pub input_estimate: u64,
    /// Output tokens to reserve: requested, else the model default, capped by the limits.
    pub output_reserve: u64,
    pub stream: bool,
    /// OpenAI chat: the client asked for the usage chunk itself.
    pub client_wants_usage: bool,
    pub reasoning_effort: Option<String>,
}

impl Admitted {
    /// The body as a JSON object: the tree admission built, else read now (only rewrites and
    /// translations need one). `None` for requests without a body.
    pub fn tree(&self) -> Option<std::borrow::Cow<'_, Value>> {
        if let Some(j) = &self.json {
            return Some(std::borrow::Cow::Borrowed(j));
        }
        if self.endpoint.is_get() {
            return None;
        }
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(v @ Value::Object(_)) => Some(std::borrow::Cow::Owned(v)),
            _ => None,
        }
    }

    /// Input tokens to reserve: the estimate, except for token counting, which is free.
    pub fn reserved_input(&self) -> u64 {
        if self.endpoint == Endpoint::CountTokens {
            0
        } else {
            self.input_estimate
        }
    }
}

/// Check 1: key validation.
pub async fn authenticate(state: &SharedState, session: &Session) -> Result<Identity, ApiError> {
    let Some(hasher) = state.key_hasher.as_ref() else {
        return Err(ApiError::KeySecretNotConfigured);
    };
    let candidate = match presented_key(session.req_header()) {
        Presented::Missing => return Err(ApiError::MissingApiKey),
        Presented::Key(k) => k,
    };
    if !apikey::looks_like_key(candidate) {
        return Err(ApiError::InvalidApiKey);
    }
    let hash = hasher.hash(candidate);
    match state.identity.lookup(&state.db, &state.rt, &hash).await {
        Ok(Some(identity)) => Ok(identity),
        Ok(None) => Err(ApiError::InvalidApiKey),
        Err(e) => {
            log::error!("key lookup failed: {e}");
            Err(ApiError::ServerError)
        }
    }
}

/// Checks 2–5: query string (`sensitive_query`: it carries a credential-like parameter),
/// route allowlist, scope, suspension.
pub fn gate(
    identity: &Identity,
    sensitive_query: bool,
    endpoint: Option<Endpoint>,
    method_ok: bool,
) -> Result<Endpoint, ApiError> {
    if sensitive_query {
        return Err(ApiError::SensitiveQueryParam);
    }
    let endpoint = endpoint.ok_or(ApiError::EndpointNotEnabled)?;
    if !method_ok {
        return Err(ApiError::MethodNotAllowed);
    }
    let scopes = &identity.key.scopes;
    if !scopes.iter().any(|s| s == "*" || s == endpoint.scope()) {
        return Err(ApiError::InsufficientScope);
    }
    if identity.user.suspended {
        return Err(ApiError::AccountSuspended);
    }
    Ok(endpoint)
}

/// Reads the whole request body, answering `Expect: 100-continue` first and refusing bodies
/// over `limit` (413) as soon as that is known.
pub async fn read_body(session: &mut Session, limit: u64) -> Result<Bytes, Stop> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let ds = session.as_downstream_mut();
    if declared.is_some_and(|n| n > limit) {
        // The body will not be read: the connection cannot be reused.
        ds.set_keepalive(None);
        return Err(Stop::Api(ApiError::PayloadTooLarge));
    }
    let expects_continue = ds
        .req_header()
        .headers
        .get(http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue && ds.write_continue_response().await.is_err() {
        return Err(Stop::ClientGone);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(limit) as usize);
    loop {
        match ds.read_request_body().await {
            Ok(Some(chunk)) => {
                if (buf.len() + chunk.len()) as u64 > limit {
                    ds.set_keepalive(None);
                    return Err(Stop::Api(ApiError::PayloadTooLarge));
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(_) => return Err(Stop::ClientGone),
        }
    }
    Ok(buf.freeze())
}

/// Bodies up to this size are counted on the async worker, and may be read as plain chat
/// bodies; larger ones are read as a tree and counted off the async workers.
const INLINE_COUNT_MAX: usize = 256 * 1024;

/// The fields admission reads, borrowed from a tree or from a [`PlainBody`]. `Some(Null)` is a
/// field present with `null`, as a tree lookup gives it.
#[derive(Default)]
struct Head<'a> {
    model: Option<&'a Value>,
    stream: Option<&'a Value>,
    stream_options: Option<&'a Value>,
    reasoning_effort: Option<&'a Value>,
    reasoning: Option<&'a Value>,
    /// The values of [`tokens::OUTPUT_FIELDS`].
    output: [Option<&'a Value>; tokens::OUTPUT_FIELDS.len()],
}

impl<'a> Head<'a> {
    fn of_tree(j: &'a Value) -> Self {
        Head {
            model: j.get("model"),
            stream: j.get("stream"),
            stream_options: j.get("stream_options"),
            reasoning_effort: j.get("reasoning_effort"),
            reasoning: j.get("reasoning"),
            output: tokens::OUTPUT_FIELDS.map(|k| j.get(k)),
        }
    }
}

/// A chat body whose only text is `messages` of plain `{role, content}` strings: the shape of
/// most chat traffic, read field by field with the text borrowed. Reading fails (and the body
/// is read as a tree) on anything else: another message shape, one of the other text-carrying
/// fields (present at all, `null` included), a repeated field, invalid JSON.
#[derive(serde::Deserialize)]
struct PlainBody<'a> {
    #[serde(default, deserialize_with = "crate::util::present")]
    model: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    stream: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    stream_options: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    reasoning_effort: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    reasoning: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    max_tokens: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    max_completion_tokens: Option<Value>,
    #[serde(default, deserialize_with = "crate::util::present")]
    max_output_tokens: Option<Value>,
    /// `null` counts nothing, as in a tree.
    #[serde(default, borrow)]
    messages: Option<Vec<tokens::PlainMessage<'a>>>,
    #[serde(default, deserialize_with = "crate::util::present")]
    system: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "crate::util::present")]
    tools: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "crate::util::present")]
    functions: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "crate::util::present")]
    instructions: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "crate::util::present")]
    input: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "crate::util::present")]
    prompt: Option<IgnoredAny>,
}

impl<'a> PlainBody<'a> {
    fn read(body: &'a [u8]) -> Option<Self> {
        // Only an object: serde would also read a struct from an array, by position.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        let plain: PlainBody = serde_json::from_slice(body).ok()?;
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
        }
    }
}

/// Parses the JSON body and runs checks 6–8 (model allowlist, per-key token limits, model
/// limits). Token estimation of large bodies runs off the async workers.
pub async fn admit(
    state: &SharedState,
    cfg: &Config,
    endpoint: Endpoint,
    identity: Identity,
    body: Bytes,
) -> Result<Admitted, ApiError> {
    // A plain chat body is read for its fields without building a tree (most of admission's
    // parsing cost was allocating one); any other body, and a body that is not valid JSON, is
    // read as a tree, which also words the error.
    let plain = if endpoint.is_get() || body.len() > INLINE_COUNT_MAX {
        None
    } else {
        PlainBody::read(&body)
    };
    let json: Option<Value> = if endpoint.is_get() || plain.is_some() {
        None
    } else {
        match serde_json::from_slice::<Value>(&body) {
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
    let head = match (&plain, &json) {
        (Some(p), _) => p.head(),
        (None, Some(j)) => Head::of_tree(j),
        (None, None) => Head::default(),
    };
    let model_name = match head.model {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) | None if endpoint.needs_model() => {
            return Err(ApiError::invalid(
                "missing_model",
                "The request body must include a `model` string.",
            ))
        }
        Some(_) if endpoint.needs_model() => {
            return Err(ApiError::invalid(
                "invalid_model",
                "`model` must be a string.",
            ))
        }
        _ => String::new(),
    };
    let stream = matches!(head.stream, Some(Value::Bool(true)));
    let client_wants_usage = head
        .stream_options
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let reasoning_effort = head
        .reasoning_effort
        .and_then(Value::as_str)
        .or_else(|| {
            head.reasoning
                .and_then(|r| r.get("effort"))
                .and_then(Value::as_str)
        })
        .map(str::to_string);

    // Check 6: model allowlist.
    let key = &identity.key;
    if endpoint.needs_model()
        && !key.model_allowlist.is_empty()
        && !key.model_allowlist.iter().any(|m| m == &model_name)
    {
        return Err(ApiError::ModelNotAllowed(model_name));
    }
    let model = if endpoint.needs_model() {
        Some(
            cfg.models_by_id
                .get(&model_name)
                .cloned()
                .ok_or_else(|| ApiError::UnknownModel(model_name.clone()))?,
        )
    } else {
        None
    };

    let (input_estimate, requested_output) = match (&plain, &json) {
        (Some(p), _) => (
            state
                .tokens
                .estimate_plain(p.messages.as_deref().unwrap_or_default()),
            tokens::requested_output_of(head.output),
        ),
        (None, Some(j)) => {
            let requested = tokens::requested_output(j);
            let estimate = if body.len() > INLINE_COUNT_MAX {
                let counter = state.tokens.clone();
                let j = j.clone();
                tokio::task::spawn_blocking(move || counter.estimate_input(&j))
                    .await
                    .map_err(|_| ApiError::ServerError)?
            } else {
                state.tokens.estimate_input(j)
            };
            (estimate, requested)
        }
        (None, None) => (0, None),
    };
    // The plain reading borrows the body, which the admitted request takes below.
    drop(plain);

    // Check 7: per-key maximums.
    if let Some(limit) = key.max_input_tokens {
        if input_estimate > limit {
            return Err(ApiError::MaxInputTokensExceeded {
                estimated: input_estimate,
                limit,
            });
        }
    }
    if let (Some(limit), Some(requested)) = (key.max_output_tokens, requested_output) {
        if requested > limit {
            return Err(ApiError::MaxOutputTokensExceeded { requested, limit });
        }
    }

    // Check 8: model metadata.
    let mut output_reserve = 0;
    if let Some(m) = &model {
        if endpoint.generates() {
            if let (Some(limit), Some(requested)) = (m.max_output_tokens, requested_output) {
                if requested > limit {
                    return Err(ApiError::MaxOutputTokensExceeded { requested, limit });
                }
            }
            output_reserve = requested_output.unwrap_or(m.default_output_tokens);
            if let Some(limit) = key.max_output_tokens {
                output_reserve = output_reserve.min(limit);
            }
            // A default (not requested) output never fails the context check: reserve only
            // what can still fit.
            if let (None, Some(ctx)) = (requested_output, m.context_window) {
                output_reserve = output_reserve.min(ctx.saturating_sub(input_estimate));
            }
        }
        if let Some(ctx) = m.context_window {
            if input_estimate > ctx {
                return Err(ApiError::MaxInputTokensExceeded {
                    estimated: input_estimate,
                    limit: ctx,
                });
            }
            if endpoint.generates() && input_estimate + output_reserve > ctx {
                return Err(ApiError::ContextWindowExceeded {
                    total: input_estimate + output_reserve,
                    limit: ctx,
                });
            }
        }
    }

    Ok(Admitted {
        endpoint,
        identity,
        body,
        json,
        model,
        model_name,
        input_estimate,
        output_reserve,
        stream,
        client_wants_usage,
        reasoning_effort,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use super::*;
    use crate::proxy::tokens::TokenCounter;

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
            r#"{"model":"","messages":[],"reasoning_effort":"high","reasoning":{"effort":"low"},"max_output_tokens":1e300}"#.to_string(),
            r#"{"model":5,"messages":null,"stream":"yes","temperature":0.2,"user":"u","user":"v"}"#.to_string(),
            r#"{"model":"m","messages":[["user","hello"]]}"#.to_string(),
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}}]}}"#),
            "{}".to_string(),
        ];
        for body in &bodies {
            let plain = PlainBody::read(body.as_bytes())
                .unwrap_or_else(|| panic!("not read as plain: {body}"));
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
            assert!(
                PlainBody::read(body.as_bytes()).is_none(),
                "read as plain: {body}"
            );
        }
    }
}
