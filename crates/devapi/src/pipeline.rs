//! The nine checks of spec §4.1, in the spec's order. Each returns the spec's error; the first
//! failure wins. What survives is an `Admitted` request ready to route.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::auth::{presented_key, Presented};
use crate::conn_limits::Phase;
use crate::error::ApiError;
use crate::route::Endpoint;
use crate::state::SharedApiState;
use crate::tokens;
use gateway_core::apikey;
use gateway_core::config::{Config, Model};
use gateway_core::identity::Identity;

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
    /// The model's quota weights as this request found them (every token counts 1 for
    /// requests without a model: tools, listings).
    pub fn weights(&self) -> gateway_core::pricing::Weights {
        self.model.as_ref().map(|m| m.weights).unwrap_or_default()
    }

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

    /// [`tree`](Self::tree) for a body that must be rewritten or translated, or the 400 that
    /// says why there is none. Admission reads a plain chat body without building a tree and
    /// skips fields it does not need at any depth, while a tree refuses nesting past serde's
    /// 128 levels: such a body is refused here, not forwarded unrewritten or answered 500.
    pub fn tree_for_rewrite(&self) -> Result<std::borrow::Cow<'_, Value>, ApiError> {
        if let Some(tree) = self.tree() {
            return Ok(tree);
        }
        let why = match serde_json::from_slice::<Value>(&self.body) {
            Err(e) => format!("The request body is not valid JSON: {e}"),
            Ok(_) => "The request body must be a JSON object.".to_string(),
        };
        Err(ApiError::invalid("invalid_json", why))
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
pub async fn authenticate(state: &SharedApiState, session: &Session) -> Result<Identity, ApiError> {
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

/// Request-body bytes held by the developer API's requests in flight, over all of them.
static BODY_BYTES_IN_FLIGHT: AtomicU64 = AtomicU64::new(0);

/// A request's share of `server.limits.max_body_bytes_in_flight`, given back when dropped
/// (with the request, after its body was forwarded).
pub struct BodyPermit(u64);

impl BodyPermit {
    pub fn none() -> BodyPermit {
        BodyPermit(0)
    }

    /// Takes `n` more bytes of the budget, or false (and nothing taken) when it is spent.
    fn grow(&mut self, n: u64, budget: u64) -> bool {
        if n == 0 {
            return true;
        }
        let before = BODY_BYTES_IN_FLIGHT.fetch_add(n, Ordering::AcqRel);
        if before.saturating_add(n) > budget {
            BODY_BYTES_IN_FLIGHT.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        self.0 += n;
        true
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        if self.0 > 0 {
            BODY_BYTES_IN_FLIGHT.fetch_sub(self.0, Ordering::AcqRel);
        }
    }
}

/// The body length the client declared, if any.
pub fn declared_length(session: &Session) -> Option<u64> {
    session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// Whether the body is parsed as a large one: declared over [`INLINE_COUNT_MAX`], or of a
/// length not declared (chunked). Such a body is only read once the key could be admitted at
/// all (`Engine::precheck`).
pub fn large_body(session: &Session) -> bool {
    declared_length(session).is_none_or(|n| n > INLINE_COUNT_MAX as u64)
}

/// Reads the whole request body, answering `Expect: 100-continue` first and refusing bodies
/// over `limit` (413) as soon as that is known, and bodies that would take the bytes in
/// flight over `budget` (503 `server_busy`): a declared length is taken from the budget before
/// anything is read, a chunked body as it arrives.
pub async fn read_body(
    session: &mut Session,
    limit: u64,
    budget: u64,
) -> Result<(Bytes, BodyPermit), Stop> {
    let declared = declared_length(session);
    let ds = session.as_downstream_mut();
    if declared.is_some_and(|n| n > limit) {
        // The body will not be read: the connection cannot be reused.
        ds.set_keepalive(None);
        return Err(Stop::Api(ApiError::PayloadTooLarge));
    }
    let mut permit = BodyPermit::none();
    if !permit.grow(declared.unwrap_or(0), budget) {
        ds.set_keepalive(None);
        return Err(Stop::Api(ApiError::ServerBusy));
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
    if let Some(stream) = ds.stream() {
        crate::affinity::set_phase(stream, Phase::Body);
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(0).min(limit) as usize);
    loop {
        match ds.read_request_body().await {
            Ok(Some(chunk)) => {
                if (buf.len() + chunk.len()) as u64 > limit {
                    ds.set_keepalive(None);
                    return Err(Stop::Api(ApiError::PayloadTooLarge));
                }
                if declared.is_none() && !permit.grow(chunk.len() as u64, budget) {
                    ds.set_keepalive(None);
                    return Err(Stop::Api(ApiError::ServerBusy));
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(_) => return Err(Stop::ClientGone),
        }
    }
    if let Some(stream) = ds.stream() {
        crate::affinity::set_phase(stream, Phase::Serving);
    }
    Ok((buf.freeze(), permit))
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

/// The top-level fields admission reads, in [`Head`]'s order then the text parts'.
const LARGE_FIELDS: [&str; 15] = [
    "model",
    "stream",
    "stream_options",
    "reasoning_effort",
    "reasoning",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "messages",
    "system",
    "tools",
    "functions",
    "instructions",
    "input",
    "prompt",
];
/// Where the text parts start in [`LARGE_FIELDS`].
const LARGE_TEXT_AT: usize = 8;

/// A head field of a large body is built as a value only up to this size (a string of any
/// size is fine: it costs its length); larger, the body is refused.
const HEAD_FIELD_MAX: usize = 64 * 1024;

/// What admission reads from a body over [`INLINE_COUNT_MAX`], without building its tree: the
/// top-level object is walked with every value borrowed raw, the head fields are built, and
/// the input is estimated one array element at a time ([`tokens::TokenCounter::estimate_raw`]).
/// Memory stays near the body's own size: a parsed tree of many tiny messages costs many
/// times it.
struct LargeBody {
    head: [Option<Value>; LARGE_TEXT_AT],
    estimate: u64,
}

impl LargeBody {
    fn read(counter: &tokens::TokenCounter, body: &[u8]) -> Result<LargeBody, ApiError> {
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
        let estimate = counter.estimate_raw(&parts).map_err(|e| {
            ApiError::invalid(
                "invalid_json",
                format!("The request body is not valid JSON: {e}"),
            )
        })?;
        Ok(LargeBody { head, estimate })
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
        }
    }
}

/// The raw values of [`LARGE_FIELDS`] in a top-level object (the last of a repeated key, as in
/// a tree); every other member is skipped unbuilt.
struct TopFields<'a>([Option<&'a serde_json::value::RawValue>; LARGE_FIELDS.len()]);

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

/// Parses the JSON body and runs checks 6–8 (model allowlist, per-key token limits, model
/// limits). Token estimation of large bodies runs off the async workers.
pub async fn admit(
    state: &SharedApiState,
    cfg: &Config,
    endpoint: Endpoint,
    identity: Identity,
    body: Bytes,
) -> Result<Admitted, ApiError> {
    // A plain chat body is read for its fields without building a tree (most of admission's
    // parsing cost was allocating one); any other body, and a body that is not valid JSON, is
    // read as a tree, which also words the error.
    let large_body = !endpoint.is_get() && body.len() > INLINE_COUNT_MAX;
    let plain = if endpoint.is_get() || large_body {
        None
    } else {
        PlainBody::read(&body)
    };
    // A large body is read without a tree, off the async workers.
    let large = if large_body {
        let counter = state.tokens.clone();
        let shared = body.clone();
        Some(
            tokio::task::spawn_blocking(move || LargeBody::read(&counter, &shared))
                .await
                .map_err(|_| ApiError::ServerError)??,
        )
    } else {
        None
    };
    let json: Option<Value> = if endpoint.is_get() || plain.is_some() || large.is_some() {
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
    let head = match (&plain, &json, &large) {
        (Some(p), _, _) => p.head(),
        (None, Some(j), _) => Head::of_tree(j),
        (None, None, Some(l)) => l.head(),
        (None, None, None) => Head::default(),
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
        (None, Some(j)) => (state.tokens.estimate_input(j), tokens::requested_output(j)),
        (None, None) => match &large {
            Some(l) => (l.estimate, tokens::requested_output_of(head.output)),
            None => (0, None),
        },
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
            r#"{"model":"e","input":["a","b"],"prompt":"p","functions":{"name":"f"},"system":"s","model":"z"}"#.to_string(),
            r#"{"model":"m","messages":{"role":"user","content":"not a list"}}"#.to_string(),
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}}],"other":[1,2,{{"a":"b"}}]}}"#),
        ];
        for body in &bodies {
            let large = LargeBody::read(counter(), body.as_bytes()).expect("read");
            let tree: Value = serde_json::from_str(body).expect("valid JSON");
            assert_eq!(
                reading(&large.head()),
                reading(&Head::of_tree(&tree)),
                "{body}"
            );
            assert_eq!(large.estimate, counter().estimate_input(&tree), "{body}");
        }
        for bad in [
            "[1]",
            "{\"model\":",
            "\"text\"",
            "{\"model\":\"m\",\"messages\":[1,}",
        ] {
            let err = LargeBody::read(counter(), bad.as_bytes()).err().expect(bad);
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
            assert!(
                PlainBody::read(body.as_bytes()).is_none(),
                "read as plain: {body}"
            );
        }
    }
}
