//! Choosing a deployment: weighted balancing across a model's deployments, skipping the ones
//! cooling down after a failure.

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use rand::Rng;

use crate::config::{Deployment, Model, Provider};
use crate::util::FastHash;

/// One place a request can be sent.
#[derive(Clone, Debug)]
pub struct Target {
    pub provider: Arc<Provider>,
    /// The model name sent upstream (after `upstream_model` renames); `None` for tools.
    pub upstream_model: Option<Arc<str>>,
    /// Identifies the deployment for cool-downs and logs: `provider/model`, or the provider's
    /// name for tools.
    pub label: Arc<str>,
}

impl Target {
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// Cool-down bookkeeping, shared by all requests of this instance.
#[derive(Default)]
pub struct Routing {
    cooling_until: DashMap<Arc<str>, Instant, FastHash>,
}

impl Routing {
    pub fn new() -> Self {
        Self::default()
    }

    fn is_cooling(&self, label: &str) -> bool {
        // Copy out first: removing while a `get` guard is alive would deadlock the shard.
        let until = self.cooling_until.get(label).map(|u| *u);
        match until {
            Some(until) if until > Instant::now() => true,
            Some(_) => {
                self.cooling_until.remove(label);
                false
            }
            None => false,
        }
    }

    /// Marks a deployment as failing for its provider's cool-down time.
    pub fn cool_down(&self, target: &Target) {
        let until = Instant::now() + target.provider.cooldown;
        self.cooling_until.insert(target.label.clone(), until);
    }

    /// The deployments to try, in order: a weighted random permutation of those not cooling.
    pub fn plan(&self, model: &Model) -> Vec<Target> {
        let mut pool: Vec<&Deployment> = model
            .deployments
            .iter()
            .filter(|d| !self.is_cooling(&d.label))
            .collect();
        let mut order = Vec::with_capacity(pool.len());
        let mut rng = rand::rng();
        while !pool.is_empty() {
            let total: u64 = pool.iter().map(|d| d.weight as u64).sum();
            let mut pick = rng.random_range(0..total.max(1));
            let mut idx = 0;
            for (i, d) in pool.iter().enumerate() {
                if pick < d.weight as u64 {
                    idx = i;
                    break;
                }
                pick -= d.weight as u64;
            }
            let d = pool.swap_remove(idx);
            order.push(Target {
                provider: d.provider.clone(),
                upstream_model: Some(d.upstream_model.clone()),
                label: d.label.clone(),
            });
        }
        order
    }

    /// A tool endpoint has one provider; it is skipped while cooling like any deployment.
    pub fn plan_tool(&self, provider: &Arc<Provider>) -> Vec<Target> {
        let t = Target {
            provider: provider.clone(),
            upstream_model: None,
            label: Arc::from(provider.name.as_str()),
        };
        if self.is_cooling(t.label()) {
            vec![]
        } else {
            vec![t]
        }
    }
}
