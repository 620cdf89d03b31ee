//! Choosing a deployment, and keeping score of how each one is doing.
//!
//! Three concerns, one file each: what an attempt's answer says about its deployment
//! ([`verdict`]), each deployment's record and ejections ([`health`]), and the order in which a
//! request tries the deployments ([`plan`]). [`Routing`] holds the records and is what the
//! request path talks to.
//!
//! The state is per instance, in atomics behind a map keyed by the deployment's label (so it
//! survives config reloads and is shared by models naming the same deployment).

use std::sync::Arc;

use dashmap::DashMap;
use gateway_core::config::Provider;
use gateway_core::util::FastHash;

mod health;
mod plan;
#[cfg(test)]
mod tests;
mod verdict;

pub use health::{Health, Outstanding};
pub use verdict::{retry_after, Failure, Verdict};

/// One place a request can be sent.
#[derive(Clone, Debug)]
pub struct Target {
    pub provider: Arc<Provider>,
    /// The model name sent upstream (after `upstream_model` renames); `None` for tools.
    pub upstream_model: Option<Arc<str>>,
    /// Identifies the deployment for health, metrics and logs: `provider/model`, or the
    /// provider's name for tools.
    pub label: Arc<str>,
    pub health: Arc<Health>,
}

impl Target {
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// Deployment health of this instance.
#[derive(Default)]
pub struct Routing {
    health: DashMap<Arc<str>, Arc<Health>, FastHash>,
}

impl Routing {
    pub fn new() -> Self {
        Self::default()
    }

    /// The record of `label`, made on first use.
    fn health(&self, label: &str) -> Arc<Health> {
        if let Some(h) = self.health.get(label) {
            return h.clone();
        }
        let label: Arc<str> = Arc::from(label);
        self.health
            .entry(label.clone())
            .or_insert_with(|| Arc::new(Health::new(label)))
            .clone()
    }

    /// Makes a record for every configured deployment, so the healthy gauge shows each one
    /// before its first request.
    pub fn register(&self, cfg: &gateway_core::config::Config) {
        for m in &cfg.models {
            for d in &m.deployments {
                self.health(&d.label);
            }
        }
        for p in [&cfg.tools.search, &cfg.tools.web_fetch]
            .into_iter()
            .flatten()
        {
            self.health(&p.name);
        }
    }
}
