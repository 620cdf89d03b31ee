//! The nine checks of spec §4.1, in the spec's order. Each returns the spec's error; the first
//! failure wins. What survives is an `Admitted` request ready to route.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pingora_proxy::Session;
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

/// Parses the JSON body and runs checks 6–8 (model allowlist, per-key token limits, model
/// limits). Token estimation of large bodies runs off the async workers.
pub async fn admit(
    state: &SharedState,
    cfg: &Config,
    endpoint: Endpoint,
    identity: Identity,
    body: Bytes,
) -> Result<Admitted, ApiError> {
    let json: Option<Value> = if endpoint.is_get() {
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
    let field = |name: &str| json.as_ref().and_then(|j| j.get(name));
    let model_name = match field("model") {
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
    let stream = matches!(field("stream"), Some(Value::Bool(true)));
    let client_wants_usage = field("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let reasoning_effort = field("reasoning_effort")
        .and_then(Value::as_str)
        .or_else(|| {
            field("reasoning")
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

    let (input_estimate, requested_output) = match &json {
        Some(j) => {
            let requested = tokens::requested_output(j);
            let estimate = if body.len() > 256 * 1024 {
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
        None => (0, None),
    };

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
