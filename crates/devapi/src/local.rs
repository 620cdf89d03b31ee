//! Answers the gateway gives itself: model listings and local token counts.

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

fn visible<'a>(
    cfg: &'a Config,
    who: &'a Identity,
) -> impl Iterator<Item = &'a std::sync::Arc<Model>> {
    let allow = &who.key.model_allowlist;
    cfg.models
        .iter()
        .filter(move |m| allow.is_empty() || allow.iter().any(|a| a == &m.id))
}

/// `GET /v1/models`: the OpenAI list shape, only models this key may use.
pub fn models(cfg: &Config, who: &Identity) -> Value {
    let data: Vec<Value> = visible(cfg, who)
        .map(|m| {
            json!({
                "id": m.id,
                "object": "model",
                "created": 0,
                "owned_by": m.deployments.first().map(|d| d.provider.name.as_str()).unwrap_or(""),
            })
        })
        .collect();
    json!({ "object": "list", "data": data })
}

/// `GET /v1/model/info`: per model, what a client needs to size requests.
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
                "endpoints": endpoints_for(style).iter().map(|e| e.path()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "object": "list", "data": data })
}
