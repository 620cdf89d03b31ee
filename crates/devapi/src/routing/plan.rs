//! Choice among the deployments in good standing: two are drawn by weight and the one with fewer
//! requests outstanding per unit of weight is taken (power of two choices), so a slow deployment,
//! whose requests pile up, gets less traffic, while under even load the weights stay the ratio.
//! The rest follow in weighted order, up to `routing.max_attempts` in all.
//!
//! Panic routing: when every deployment of a model is ejected, the request still goes to the one
//! whose ejection ends first. A model never goes dark without a provider being asked.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use rand::Rng;

use super::{Health, Routing, Target};
use crate::error::ApiError;
use gateway_core::config::{Deployment, Model, Provider};
use gateway_core::domain::ProviderStyle;

impl Routing {
    /// The deployments of `model` to try, in order, among those `serves` accepts: the choice of
    /// two among those in good standing first, then the rest by weight, `max_attempts` at most;
    /// or, when all are ejected, the one whose ejection ends first. Deployments whose provider's
    /// credential variable is unset are never tried.
    pub fn plan(
        &self,
        model: &Model,
        serves: impl Fn(&Deployment) -> bool,
        max_attempts: usize,
    ) -> Result<Vec<Target>, ApiError> {
        let target = |i: usize, health: Arc<Health>| {
            let d: &Deployment = &model.deployments[i];
            Target {
                provider: d.provider.clone(),
                upstream_model: Some(d.upstream_model.clone()),
                label: d.label.clone(),
                health,
            }
        };
        let mut now = None;
        let mut good: Vec<(usize, Arc<Health>)> = Vec::with_capacity(model.deployments.len());
        let mut soonest: Option<(usize, Arc<Health>, u64)> = None;
        let mut served = false;
        for (i, d) in model.deployments.iter().enumerate() {
            if !serves(d) {
                continue;
            }
            served = true;
            if d.provider.lacks_credential() {
                continue;
            }
            let h = self.health(&d.label);
            match h.ejected_until(&mut now) {
                None => good.push((i, h)),
                Some(until) => {
                    if soonest.as_ref().is_none_or(|s| until < s.2) {
                        soonest = Some((i, h, until));
                    }
                }
            }
        }
        if good.is_empty() {
            return match soonest {
                Some((i, h, _)) => {
                    log::debug!(
                        "model {}: every deployment is ejected; trying {} (its ejection ends first)",
                        model.id,
                        h.label
                    );
                    Ok(vec![target(i, h)])
                }
                None if served => {
                    let mut missing: Vec<&str> = model
                        .deployments
                        .iter()
                        .filter(|d| serves(d))
                        .filter_map(|d| match d.provider.style {
                            ProviderStyle::Bedrock => Some("AWS_ACCESS_KEY_ID"),
                            _ => d.provider.api_key_env.as_deref(),
                        })
                        .collect();
                    missing.sort_unstable();
                    missing.dedup();
                    log::warn!(
                        "model {}: no deployment can be tried: its providers' credential \
                         variables are not set ({})",
                        model.id,
                        missing.join(", ")
                    );
                    Err(ApiError::RouteFailed(format!(
                        "no provider of model {:?} has a credential configured",
                        model.id
                    )))
                }
                None => {
                    log::warn!("model {}: no deployment serves this endpoint", model.id);
                    Err(ApiError::RouteFailed(format!(
                        "no provider of model {:?} serves this endpoint",
                        model.id
                    )))
                }
            };
        }
        let weight = |e: &(usize, Arc<Health>)| u64::from(model.deployments[e.0].weight);
        let mut rng = rand::rng();
        let mut order = Vec::with_capacity(good.len().min(max_attempts));
        let first = two_choices(&good, weight, &mut rng);
        let (i, h) = good.swap_remove(first);
        order.push(target(i, h));
        while order.len() < max_attempts && !good.is_empty() {
            let next = weighted_pick(&good, weight, &mut rng);
            let (i, h) = good.swap_remove(next);
            order.push(target(i, h));
        }
        Ok(order)
    }

    /// A tool endpoint has one provider: tried even while ejected (there is nothing else), never
    /// without its credential.
    pub fn plan_tool(&self, provider: &Arc<Provider>) -> Result<Vec<Target>, ApiError> {
        if provider.lacks_credential() {
            log::warn!(
                "tool provider {}: {} is not set; not tried",
                provider.name,
                provider.api_key_env.as_deref().unwrap_or("")
            );
            return Err(ApiError::RouteFailed(
                "the tool's provider has no credential configured".into(),
            ));
        }
        let health = self.health(&provider.name);
        Ok(vec![Target {
            provider: provider.clone(),
            upstream_model: None,
            label: health.label.clone(),
            health,
        }])
    }
}

/// An index drawn with probability proportional to its weight.
fn weighted_pick<T>(pool: &[T], weight: impl Fn(&T) -> u64, rng: &mut impl Rng) -> usize {
    let total: u64 = pool.iter().map(&weight).sum();
    let mut pick = rng.random_range(0..total.max(1));
    for (i, e) in pool.iter().enumerate() {
        let w = weight(e);
        if pick < w {
            return i;
        }
        pick -= w;
    }
    pool.len() - 1
}

/// Power of two choices: two different deployments drawn by weight, the one with fewer
/// outstanding requests per unit of weight wins, a tie goes to the first draw. With no load
/// difference the first draw decides alone, so the weights stay the ratio; a deployment whose
/// requests pile up (it answers slowly) loses the comparisons it is drawn into.
pub(super) fn two_choices(
    pool: &[(usize, Arc<Health>)],
    weight: impl Fn(&(usize, Arc<Health>)) -> u64,
    rng: &mut impl Rng,
) -> usize {
    if pool.len() == 1 {
        return 0;
    }
    let a = weighted_pick(pool, &weight, rng);
    // The second draw among the others: the first's weight left out.
    let others = |e: &(usize, Arc<Health>)| {
        if std::ptr::eq(e, &pool[a]) {
            0
        } else {
            weight(e)
        }
    };
    let b = weighted_pick(pool, others, rng);
    let load = |i: usize| u64::from(pool[i].1.outstanding.load(Relaxed));
    // load_b / w_b < load_a / w_a, without division.
    if b != a && load(b) * weight(&pool[a]) < load(a) * weight(&pool[b]) {
        b
    } else {
        a
    }
}
