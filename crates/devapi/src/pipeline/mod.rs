//! The nine checks of spec §4.1, in the spec's order. Each returns the spec's error; the first
//! failure wins. What survives is an `Admitted` request ready to route. How a body is read for
//! checks 6–8 is in `reading`.

mod numbers;
mod reading;

pub use numbers::type_name;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::Session;
use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::auth::{presented_key, Presented};
use crate::conn_limits::Phase;
use crate::error::ApiError;
use crate::items::Refs;
use crate::route::Endpoint;
use crate::state::SharedApiState;
use gateway_core::apikey;
use gateway_core::config::{Config, Model};
use gateway_core::identity::Identity;
use gateway_core::storage::KeyRecord;
use reading::{Head, Reading, INLINE_COUNT_MAX};

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
    /// The model's `max_output_tokens` when the request asked for more and the model clamps
    /// (`clamp_output_tokens`): the body is sent with this instead of what it asked for.
    pub output_clamp: Option<u64>,
    /// The output the client asked for, if it named a ceiling.
    pub requested_output: Option<u64>,
    /// What a Responses request refers to of earlier answers, and whether its own answer is
    /// kept (`None` for other endpoints).
    pub refs: Option<Refs>,
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

    /// The model's quota weights as this request found them (every token counts 1 for
    /// requests without a model: tools, listings).
    pub fn weights(&self) -> gateway_core::pricing::Weights {
        self.model.as_ref().map(|m| m.weights).unwrap_or_default()
    }

    /// Replaces the body with `tree` (references resolved into the items they name) and
    /// re-runs the limit checks for its `extra_input` more estimated tokens: checks 7 and 8
    /// hold for the request as it will be sent.
    pub fn rewrite(&mut self, tree: Value, extra_input: u64) -> Result<(), ApiError> {
        let bytes = serde_json::to_vec(&tree).map_err(|_| ApiError::ServerError)?;
        self.body = Bytes::from(bytes);
        self.json = Some(tree);
        self.input_estimate = self.input_estimate.saturating_add(extra_input);
        check_key_limits(
            &self.identity.key,
            self.input_estimate,
            self.requested_output,
        )?;
        if let Some(m) = &self.model {
            (self.output_reserve, self.output_clamp) = check_model_limits(
                m,
                &self.identity.key,
                self.endpoint,
                self.input_estimate,
                self.requested_output,
            )?;
        }
        Ok(())
    }

    /// Whether the answer may be kept for later references: a Responses request without
    /// `store: false`.
    pub fn keeps_answer(&self) -> bool {
        self.refs.as_ref().is_some_and(|r| r.store)
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
pub async fn authenticate(
    state: &SharedApiState,
    session: &Session,
    memo: &mut crate::auth::KeyMemo,
) -> Result<Identity, ApiError> {
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
    let hash = memo.hash(hasher, candidate);
    match state.identity.lookup(&state.db, &state.rt, hash).await {
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
    let ds = session;
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

/// Parses the JSON body and runs checks 6–8 (model allowlist, per-key token limits, model
/// limits). Token estimation of large bodies runs off the async workers.
pub async fn admit(
    state: &SharedApiState,
    cfg: &Config,
    endpoint: Endpoint,
    identity: Identity,
    body: Bytes,
) -> Result<Admitted, ApiError> {
    let mut reading = Reading::of(state, endpoint, &body).await?;
    let refs = reading.refs(endpoint)?;
    let head = reading.head();
    let model_name = model_name(&head, endpoint)?;
    numbers::check(head.numbers())?;
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

    let key = &identity.key;
    check_model_allowed(key, endpoint, &model_name)?;
    let model = configured_model(cfg, endpoint, &model_name)?;
    let (input_estimate, requested_output) = reading.estimate(&state.tokens, head.output);
    // The plain reading borrows the body, which the admitted request takes below.
    let json = reading.into_tree();
    check_key_limits(key, input_estimate, requested_output)?;
    let (output_reserve, output_clamp) = match &model {
        Some(m) => check_model_limits(m, key, endpoint, input_estimate, requested_output)?,
        None => (0, None),
    };

    Ok(Admitted {
        endpoint,
        identity,
        body,
        json,
        model,
        model_name,
        input_estimate,
        output_reserve,
        output_clamp,
        requested_output,
        refs,
        stream,
        client_wants_usage,
        reasoning_effort,
    })
}

/// The `model` string; a model endpoint must name one.
fn model_name(head: &Head<'_>, endpoint: Endpoint) -> Result<String, ApiError> {
    Ok(match head.model {
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
    })
}

/// Check 6: model allowlist.
fn check_model_allowed(
    key: &KeyRecord,
    endpoint: Endpoint,
    model_name: &str,
) -> Result<(), ApiError> {
    if endpoint.needs_model()
        && !key.model_allowlist.is_empty()
        && !key.model_allowlist.iter().any(|m| m == model_name)
    {
        return Err(ApiError::ModelNotAllowed(model_name.to_string()));
    }
    Ok(())
}

/// The configured model a model endpoint names (`None` for the others).
fn configured_model(
    cfg: &Config,
    endpoint: Endpoint,
    model_name: &str,
) -> Result<Option<Arc<Model>>, ApiError> {
    if !endpoint.needs_model() {
        return Ok(None);
    }
    cfg.models_by_id
        .get(model_name)
        .cloned()
        .map(Some)
        .ok_or_else(|| ApiError::UnknownModel(model_name.to_string()))
}

/// Check 7: per-key maximums.
fn check_key_limits(
    key: &KeyRecord,
    input_estimate: u64,
    requested_output: Option<u64>,
) -> Result<(), ApiError> {
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
    Ok(())
}

/// Check 8: model metadata. Returns the output tokens to reserve, and the limit the request's
/// output is clamped to when it asked for more of a model that clamps (the key's own limit,
/// check 7, has refused it already if it asked for more than that).
fn check_model_limits(
    m: &Model,
    key: &KeyRecord,
    endpoint: Endpoint,
    input_estimate: u64,
    mut requested_output: Option<u64>,
) -> Result<(u64, Option<u64>), ApiError> {
    let mut output_reserve = 0;
    let mut clamp = None;
    if endpoint.generates() {
        if let (Some(limit), Some(requested)) = (m.max_output_tokens, requested_output) {
            if requested > limit {
                if !m.clamp_output_tokens {
                    return Err(ApiError::MaxOutputTokensExceeded { requested, limit });
                }
                requested_output = Some(limit);
                clamp = Some(limit);
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
    Ok((output_reserve, clamp))
}
