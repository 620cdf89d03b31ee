//! `[[models]]`: the models clients name, and the deployments that serve them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::check::{Checker, ConfigError};
use super::file::ModelFile;
use super::providers::Provider;
use crate::domain::ProviderStyle;
use crate::pricing::{Price, Weights};

#[derive(Debug, Clone)]
pub struct Deployment {
    pub provider: Arc<Provider>,
    pub upstream_model: Arc<str>,
    pub weight: u32,
    /// `provider/upstream_model`: names the deployment in cool-downs, logs and usage events;
    /// built once here instead of on every request.
    pub label: Arc<str>,
}

impl Deployment {
    fn new(provider: Arc<Provider>, upstream_model: String, weight: u32) -> Self {
        let label = Arc::from(format!("{}/{}", provider.name, upstream_model));
        Deployment {
            provider,
            upstream_model: Arc::from(upstream_model),
            weight,
            label,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Model {
    pub id: String,
    pub deployments: Vec<Deployment>,
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    /// A request for more output than `max_output_tokens` is clamped to it rather than
    /// refused: clients that fill `max_tokens` with a large default of their own for models
    /// they do not know (`@ai-sdk/anthropic` sends 128000) still work.
    pub clamp_output_tokens: bool,
    pub default_output_tokens: u64,
    /// What its tokens cost in quota.
    pub weights: Weights,
    /// What its tokens cost the operator (`[models.price]`), when given.
    pub price: Option<Price>,
}

impl Model {
    /// The style of the model's first deployment: what the model "is" for clients.
    pub fn style(&self) -> ProviderStyle {
        self.deployments
            .first()
            .map(|d| d.provider.style)
            .unwrap_or(ProviderStyle::OpenAi)
    }
}

/// The validated `[[models]]`: in file order (for `GET /v1/models`) and by id.
pub(super) struct Models {
    pub(super) in_order: Vec<Arc<Model>>,
    pub(super) by_id: BTreeMap<String, Arc<Model>>,
}

pub(super) fn validate(
    c: &Checker,
    f: &[ModelFile],
    providers: &BTreeMap<String, Arc<Provider>>,
) -> Result<Models, ConfigError> {
    let mut models = Vec::new();
    let mut models_by_id = BTreeMap::new();
    for (i, m) in f.iter().enumerate() {
        let key = |k: &str| format!("models[{i}].{k}");
        if m.id.is_empty() {
            return Err(c.err(key("id"), "must not be empty"));
        }
        if models_by_id.contains_key(&m.id) {
            return Err(c.err(key("id"), format!("duplicate model {:?}", m.id)));
        }
        let mut deployments = Vec::new();
        match (&m.provider, m.deployments.is_empty()) {
            (Some(p), true) => {
                let provider = providers.get(p).cloned().ok_or_else(|| {
                    c.err(key("provider"), format!("no [[providers]] named {p:?}"))
                })?;
                deployments.push(Deployment::new(
                    provider,
                    m.upstream_model.clone().unwrap_or_else(|| m.id.clone()),
                    1,
                ));
            }
            (None, false) => {
                for (j, d) in m.deployments.iter().enumerate() {
                    let provider = providers.get(&d.provider).cloned().ok_or_else(|| {
                        c.err(
                            key(&format!("deployments[{j}].provider")),
                            format!("no [[providers]] named {:?}", d.provider),
                        )
                    })?;
                    let weight = d.weight.unwrap_or(1);
                    if weight == 0 {
                        return Err(c.err(
                            key(&format!("deployments[{j}].weight")),
                            "must be at least 1",
                        ));
                    }
                    deployments.push(Deployment::new(
                        provider,
                        d.upstream_model
                            .clone()
                            .or_else(|| m.upstream_model.clone())
                            .unwrap_or_else(|| m.id.clone()),
                        weight,
                    ));
                }
            }
            (Some(_), false) => {
                return Err(c.err(
                    key("provider"),
                    "set either provider or deployments, not both",
                ))
            }
            (None, true) => return Err(c.err(key("provider"), "missing (or give deployments)")),
        }
        if let (Some(ctx), Some(out)) = (m.context_window, m.max_output_tokens) {
            if out > ctx {
                return Err(c.err(key("max_output_tokens"), "must not exceed context_window"));
            }
        }
        let clamp_output_tokens = m.clamp_output_tokens.unwrap_or(false);
        if clamp_output_tokens && m.max_output_tokens.is_none() {
            return Err(c.err(
                key("clamp_output_tokens"),
                "needs max_output_tokens (the limit requests are clamped to)",
            ));
        }
        let default_output_tokens = m
            .default_output_tokens
            .or(m.max_output_tokens)
            .unwrap_or(4096);
        let weights = Weights::from_config(m.input_weight, m.output_weight, m.cached_input_weight)
            .map_err(|(k, why)| c.err(key(k), why))?;
        let price = m
            .price
            .as_ref()
            .map(Price::from_file)
            .transpose()
            .map_err(|(k, why)| c.err(key(k), why))?;
        let model = Arc::new(Model {
            id: m.id.clone(),
            deployments,
            context_window: m.context_window,
            max_output_tokens: m.max_output_tokens,
            clamp_output_tokens,
            default_output_tokens,
            weights,
            price,
        });
        models_by_id.insert(m.id.clone(), model.clone());
        models.push(model);
    }
    Ok(Models {
        in_order: models,
        by_id: models_by_id,
    })
}
