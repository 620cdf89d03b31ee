//! Answers the gateway gives itself: model listings and retrievals, and local token counts.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::route::Endpoint;
use gateway_core::config::{Config, Model};
use gateway_core::domain::{ProviderStyle, Wire};
use gateway_core::identity::Identity;

/// The endpoints a model can serve, given its provider style. Chat completions, Responses and
/// messages are offered in every style: the gateway translates between them. Embeddings,
/// images and speech need an OpenAI-protocol provider; token counting is answered by an
/// Anthropic provider itself, and counted locally for the others.
pub fn endpoints_for(style: ProviderStyle) -> Vec<Endpoint> {
    match style.wire() {
        Wire::OpenAi => vec![
            Endpoint::ChatCompletions,
            Endpoint::Responses,
            Endpoint::Messages,
            Endpoint::CountTokens,
            Endpoint::Embeddings,
            Endpoint::Images,
            Endpoint::Speech,
        ],
        Wire::Anthropic => vec![
            Endpoint::Messages,
            Endpoint::CountTokens,
            Endpoint::ChatCompletions,
            Endpoint::Responses,
        ],
        Wire::Gemini => vec![
            Endpoint::ChatCompletions,
            Endpoint::Responses,
            Endpoint::Messages,
            Endpoint::CountTokens,
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

/// `GET /v1/models` (OpenAI's list shape) and `GET /alt/v1/models` (Anthropic's, a page of it
/// as `query` asks: see [`anthropic_page`]): only models this key may use, in config order.
pub fn models(
    cfg: &Config,
    who: &Identity,
    style_b: bool,
    query: Option<&str>,
) -> Result<Value, ApiError> {
    if !style_b {
        let data: Vec<Value> = visible(cfg, who).map(|m| openai_model(m)).collect();
        return Ok(json!({ "object": "list", "data": data }));
    }
    let all: Vec<&Arc<Model>> = visible(cfg, who).collect();
    let (page, has_more) = anthropic_page(&all, &Paging::of(query)?);
    Ok(json!({
        "data": page.iter().map(|m| anthropic_model(m)).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": page.first().map(|m| m.id.as_str()),
        "last_id": page.last().map(|m| m.id.as_str()),
    }))
}

/// Anthropic's list parameters: `limit` (1 to 1000, default 20) and one of `after_id` and
/// `before_id`.
#[derive(Debug, Default, PartialEq)]
struct Paging {
    limit: usize,
    after_id: Option<String>,
    before_id: Option<String>,
}

impl Paging {
    const DEFAULT_LIMIT: usize = 20;
    const MAX_LIMIT: usize = 1000;

    /// The parameters of a query string; other parameters are ignored, a bad `limit` or both
    /// cursors at once are 400 `invalid_request`.
    fn of(query: Option<&str>) -> Result<Paging, ApiError> {
        let mut p = Paging {
            limit: Self::DEFAULT_LIMIT,
            ..Paging::default()
        };
        for pair in query.unwrap_or("").split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = || {
                percent_encoding::percent_decode_str(&value.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            match name {
                "limit" => {
                    p.limit = value()
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=Self::MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "invalid_request",
                                "`limit` must be an integer from 1 to 1000.",
                            )
                        })?;
                }
                "after_id" => p.after_id = Some(value()),
                "before_id" => p.before_id = Some(value()),
                _ => {}
            }
        }
        if p.after_id.is_some() && p.before_id.is_some() {
            return Err(ApiError::invalid(
                "invalid_request",
                "Send at most one of `after_id` and `before_id`.",
            ));
        }
        Ok(p)
    }
}

/// The page `paging` asks for, and whether more lie beyond it in the direction of paging
/// (after its last model, or before its first when paging back with `before_id`). A cursor
/// naming no model the key sees (one removed since the last page) gives an empty page.
fn anthropic_page<'a, T>(all: &'a [T], paging: &Paging) -> (&'a [T], bool)
where
    T: AsRef<Model>,
{
    let position = |id: &str| all.iter().position(|m| m.as_ref().id == id);
    if let Some(before) = &paging.before_id {
        let Some(end) = position(before) else {
            return (&[], false);
        };
        let start = end.saturating_sub(paging.limit);
        return (&all[start..end], start > 0);
    }
    let start = match &paging.after_id {
        Some(after) => match position(after) {
            Some(i) => i + 1,
            None => return (&[], false),
        },
        None => 0,
    };
    let end = start.saturating_add(paging.limit).min(all.len());
    (&all[start..end], end < all.len())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(page: &[&str]) -> Vec<String> {
        page.iter().map(|s| s.to_string()).collect()
    }

    struct M(Model);

    impl AsRef<Model> for M {
        fn as_ref(&self) -> &Model {
            &self.0
        }
    }

    fn model(id: &str) -> M {
        M(Model {
            id: id.into(),
            deployments: vec![],
            context_window: None,
            max_output_tokens: None,
            clamp_output_tokens: false,
            default_output_tokens: 1,
            weights: Default::default(),
            price: None,
        })
    }

    fn page(all: &[M], query: &str) -> Result<(Vec<String>, bool), ApiError> {
        let paging = Paging::of(Some(query))?;
        let (p, more) = anthropic_page(all, &paging);
        Ok((p.iter().map(|m| m.0.id.clone()).collect(), more))
    }

    #[test]
    fn anthropic_pages() {
        let all: Vec<M> = ["a", "b", "c", "d", "e"].into_iter().map(model).collect();
        assert_eq!(page(&all, ""), Ok((ids(&["a", "b", "c", "d", "e"]), false)));
        assert_eq!(page(&all, "limit=2"), Ok((ids(&["a", "b"]), true)));
        assert_eq!(
            page(&all, "limit=2&after_id=b"),
            Ok((ids(&["c", "d"]), true))
        );
        assert_eq!(page(&all, "limit=2&after_id=d"), Ok((ids(&["e"]), false)));
        assert_eq!(page(&all, "after_id=e"), Ok((ids(&[]), false)));
        assert_eq!(
            page(&all, "limit=2&before_id=e"),
            Ok((ids(&["c", "d"]), true))
        );
        assert_eq!(
            page(&all, "limit=2&before_id=c"),
            Ok((ids(&["a", "b"]), false))
        );
        assert_eq!(page(&all, "before_id=a"), Ok((ids(&[]), false)));
        assert_eq!(page(&all, "after_id=zz"), Ok((ids(&[]), false)));
        assert_eq!(
            page(&all, "limit=1000&x=1"),
            Ok((ids(&["a", "b", "c", "d", "e"]), false))
        );
        for bad in [
            "limit=0",
            "limit=1001",
            "limit=x",
            "limit=",
            "after_id=a&before_id=b",
        ] {
            assert_eq!(
                page(&all, bad).map_err(|e| e.code()),
                Err("invalid_request"),
                "{bad}"
            );
        }
    }

    #[test]
    fn cursors_are_percent_decoded() {
        let all: Vec<M> = ["openai/gpt-4o", "llama3:8b"]
            .into_iter()
            .map(model)
            .collect();
        assert_eq!(
            page(&all, "after_id=openai%2Fgpt-4o"),
            Ok((ids(&["llama3:8b"]), false))
        );
    }
}
