//! Answers the gateway gives itself: model listings and retrievals, and local token counts.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::route::Endpoint;
use gateway_core::config::{Config, Model};
use gateway_core::domain::ProviderStyle;
use gateway_core::identity::Identity;

/// The endpoints a model can serve, given its provider style. Chat completions, Responses and
/// messages are offered in both styles: the gateway translates between them.
pub fn endpoints_for(style: ProviderStyle) -> Vec<Endpoint> {
    match style {
        ProviderStyle::OpenAi => vec![
            Endpoint::ChatCompletions,
            Endpoint::Responses,
            Endpoint::Messages,
            Endpoint::CountTokens,
            Endpoint::Embeddings,
            Endpoint::Images,
            Endpoint::Speech,
        ],
        ProviderStyle::Anthropic => vec![
            Endpoint::Messages,
            Endpoint::CountTokens,
            Endpoint::ChatCompletions,
            Endpoint::Responses,
        ],
    }
}

fn visible<'a>(cfg: &'a Config, who: &'a Identity) -> impl Iterator<Item = &'a Arc<Model>> {
    let allow = &who.key.model_allowlist;
    cfg.models
        .iter()
        .filter(move |m| allow.is_empty() || allow.iter().any(|a| a == &m.id))
}

/// The model `id` names, if this key may see it (a key with a model allowlist sees only those
/// models, as in the list).
pub fn visible_model<'a>(cfg: &'a Config, who: &Identity, id: &str) -> Option<&'a Arc<Model>> {
    let allow = &who.key.model_allowlist;
    cfg.models_by_id
        .get(id)
        .filter(|_| allow.is_empty() || allow.iter().any(|a| a == id))
}

/// A model in OpenAI's shape.
fn openai_model(m: &Model) -> Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": 0,
        "owned_by": m.deployments.first().map(|d| d.provider.name.as_str()).unwrap_or(""),
    })
}

/// A model in Anthropic's shape. The gateway knows no release date: `created_at` is the epoch,
/// as Anthropic documents for an unknown one.
fn anthropic_model(m: &Model) -> Value {
    json!({
        "type": "model",
        "id": m.id,
        "display_name": m.id,
        "created_at": "1970-01-01T00:00:00Z",
        "lifecycle": "active",
        "max_input_tokens": m.context_window,
        "max_tokens": m.max_output_tokens,
    })
}

/// `GET /v1/models`: the OpenAI list shape, only models this key may use.
pub fn models(cfg: &Config, who: &Identity) -> Value {
    let data: Vec<Value> = visible(cfg, who).map(|m| openai_model(m)).collect();
    json!({ "object": "list", "data": data })
}

/// `GET /v1/models/{id}` (OpenAI's shape) and `GET /alt/v1/models/{id}` (Anthropic's, when
/// `style_b`): `None` when the key may not see a model of that id.
pub fn model(cfg: &Config, who: &Identity, id: &str, style_b: bool) -> Option<Value> {
    let m = visible_model(cfg, who, id)?;
    Some(if style_b {
        anthropic_model(m)
    } else {
        openai_model(m)
    })
}

/// What one token of each kind of the model costs in quota tokens, so a client sees a model's
/// price before calling it.
pub fn weights_json(m: &Model) -> Value {
    let (input, output, cached_input) = m.weights.as_f64();
    json!({ "input": input, "output": output, "cached_input": cached_input })
}

/// `GET /v1/model/info`: per model, what a client needs to size requests and what its tokens
/// cost in quota.
pub fn model_info(cfg: &Config, who: &Identity) -> Value {
    let data: Vec<Value> = visible(cfg, who)
        .map(|m| {
            let style = m.style();
            json!({
                "id": m.id,
                "object": "model_info",
                "provider_style": style.as_str(),
                "context_window": m.context_window,
                "max_output_tokens": m.max_output_tokens,
                "default_output_tokens": m.default_output_tokens,
                "quota_weights": weights_json(m),
                "endpoints": endpoints_for(style).iter().map(|e| e.path()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "object": "list", "data": data })
}
