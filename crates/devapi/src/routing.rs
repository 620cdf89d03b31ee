//! Choosing a deployment, and keeping score of how each one is doing.
//!
//! Passive health (outlier detection, as Envoy does it): every attempt's result is scored per
//! deployment. Only failures that say the provider is unwell count — no connection, a failed
//! TLS handshake, a timeout, a 5xx (529 included), a 429, a 401 or 403 (the gateway's own
//! provider credential refused), an answer that breaks off. An answer about the request (400,
//! 404, 413, 422, refusals) counts as proof of life. After the provider's `eject_after_failures`
//! consecutive failures the deployment is ejected for `cooldown_seconds`, doubled for each
//! ejection in a row up to `max_cooldown_seconds`; a 429 or 503 with `retry-after` ejects it at
//! once for the time it names (capped the same way). Once its time is up the deployment is back
//! on probation: one more failure ejects it again, one success clears its record.
//!
//! Choice among the deployments in good standing: two are drawn by weight and the one with fewer
//! requests outstanding per unit of weight is taken (power of two choices), so a slow deployment,
//! whose requests pile up, gets less traffic, while under even load the weights stay the ratio.
//! The rest follow in weighted order, up to `routing.max_attempts` in all.
//!
//! Panic routing: when every deployment of a model is ejected, the request still goes to the one
//! whose ejection ends first. A model never goes dark without a provider being asked.
//!
//! The state is per instance, in atomics behind a map keyed by the deployment's label (so it
//! survives config reloads and is shared by models naming the same deployment).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use pingora_http::ResponseHeader;
use prometheus::IntCounter;
use rand::Rng;

use crate::error::ApiError;
use crate::upstream::{UpstreamError, Wait};
use gateway_core::config::{Deployment, Model, Provider};
use gateway_core::metrics;
use gateway_core::util::FastHash;

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

/// A failure that says the deployment, not the request, is unwell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    Connect,
    Tls,
    Timeout(Wait),
    /// 5xx other than 529.
    ServerError,
    /// 529: the provider is overloaded.
    Overloaded,
    /// 429: the provider's account is rate limited.
    RateLimited,
    /// 401 or 403: the provider refused the gateway's credential.
    Credential,
    /// The connection failed while the answer was read.
    Broken,
}

impl Failure {
    /// The metrics label (`reason` of ejections, `outcome` of attempts).
    pub fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect_error",
            Failure::Tls => "tls_error",
            Failure::Timeout(_) => "timeout",
            Failure::ServerError => "server_error",
            Failure::Overloaded => "overloaded",
            Failure::RateLimited => "rate_limited",
            Failure::Credential => "credential_refused",
            Failure::Broken => "broken_connection",
        }
    }

    /// What the client is told when this was the last failure and no answer could be passed
    /// on (the provider's own answers, 5xx and 429, are passed on instead).
    pub fn describe(self) -> &'static str {
        match self {
            Failure::Connect | Failure::Broken => "the provider could not be reached",
            Failure::Tls => "the TLS handshake with the provider failed",
            Failure::Timeout(Wait::Connect) => "the provider did not accept a connection in time",
            Failure::Timeout(_) => "the provider did not answer in time",
            Failure::Credential => "the provider refused the gateway's credential",
            Failure::ServerError | Failure::Overloaded | Failure::RateLimited => {
                "the provider failed"
            }
        }
    }

    /// `None` for a request that could not be written at all (no provider is at fault).
    pub fn of_error(e: &UpstreamError) -> Option<Failure> {
        Some(match e {
            UpstreamError::Resolve(..) | UpstreamError::Connect(_) => Failure::Connect,
            UpstreamError::Tls(..) => Failure::Tls,
            UpstreamError::Timeout(wait) => Failure::Timeout(*wait),
            UpstreamError::Io(_) => Failure::Broken,
            UpstreamError::Request(_) => return None,
        })
    }
}

/// How a provider's answer counts for its deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// About the request (400, 404, 409, 413, 422, ...): the provider is well.
    RequestError,
    Failed(Failure),
}

impl Verdict {
    pub fn of_status(status: u16) -> Verdict {
        match status {
            401 | 403 => Verdict::Failed(Failure::Credential),
            429 => Verdict::Failed(Failure::RateLimited),
            529 => Verdict::Failed(Failure::Overloaded),
            500..=599 => Verdict::Failed(Failure::ServerError),
            400..=499 => Verdict::RequestError,
            _ => Verdict::Ok,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::RequestError => "request_error",
            Verdict::Failed(f) => f.label(),
        }
    }
}

/// The wait a 429 or 503 asks for: `retry-after-ms` (OpenAI) or `retry-after` in seconds.
/// A date or anything unreadable is no ask (the failure then counts like any other).
pub fn retry_after(status: u16, header: &ResponseHeader) -> Option<Duration> {
    if status != 429 && status != 503 {
        return None;
    }
    let number = |name: &str| -> Option<f64> {
        let v: f64 = header
            .headers
            .get(name)?
            .to_str()
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (v.is_finite() && v > 0.0).then_some(v)
    };
    number("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| number("retry-after"))
        .map(|secs| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// Milliseconds on the process's monotonic clock, from 1 (0 marks "never ejected").
fn clock_ms() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    EPOCH.elapsed().as_millis() as u64 + 1
}

/// One deployment's record, shared by every request of this instance.
#[derive(Debug)]
pub struct Health {
    label: Arc<str>,
    /// Requests sent and not yet finished.
    outstanding: AtomicU32,
    /// Consecutive failures since the last success or ejection.
    failures: AtomicU32,
    /// Ejections since the last success: the backoff exponent, and nonzero means "on
    /// probation" (one failure ejects again).
    ejections: AtomicU32,
    /// End of the current (or last) ejection on [`clock_ms`]; 0 when cleared by a success.
    ejected_until: AtomicU64,
    /// The hot series, resolved once (a labelled lookup hashes the labels on every use).
    ok_attempts: IntCounter,
}

impl Health {
    fn new(label: Arc<str>) -> Health {
        metrics::DEPLOYMENT_HEALTHY
            .with_label_values(&[&*label])
            .set(1);
        let ok_attempts = metrics::UPSTREAM_ATTEMPTS.with_label_values(&[&*label, "ok"]);
        Health {
            label,
            outstanding: AtomicU32::new(0),
            failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            ok_attempts,
        }
    }

    /// When its current ejection ends, or `None` when it is not ejected. The clock is read
    /// only when some ejection was ever recorded, and at most once per `now`.
    fn ejected_until(&self, now: &mut Option<u64>) -> Option<u64> {
        let until = self.ejected_until.load(Relaxed);
        if until == 0 {
            return None;
        }
        let now = *now.get_or_insert_with(clock_ms);
        (until > now).then_some(until)
    }

    /// Counts a request as outstanding until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Outstanding {
        self.outstanding.fetch_add(1, Relaxed);
        Outstanding(self.clone())
    }
}

/// A request in flight to a deployment (see [`Health::begin`]).
pub struct Outstanding(Arc<Health>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Relaxed);
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
                        .filter_map(|d| d.provider.api_key_env.as_deref())
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

    /// Counts an attempt by how its answer began.
    pub fn attempted(&self, target: &Target, verdict: Verdict) {
        match verdict {
            Verdict::Ok => target.health.ok_attempts.inc(),
            v => metrics::UPSTREAM_ATTEMPTS
                .with_label_values(&[target.label(), v.label()])
                .inc(),
        }
    }

    /// Scores a failure of `target`; `wait` is the provider's `retry-after`, if it gave one.
    pub fn failed(&self, target: &Target, failure: Failure, wait: Option<Duration>, request: &str) {
        let h = &target.health;
        let p = &target.provider;
        let now = clock_ms();
        let until = h.ejected_until.load(Relaxed);
        let ejected = until > now;
        if let Some(wait) = wait {
            let wait = wait.min(p.max_cooldown);
            let end = now + wait.as_millis() as u64;
            if ejected {
                h.ejected_until.fetch_max(end, Relaxed);
            } else {
                let why = format!("the provider asked to wait ({})", failure.label());
                eject(h, until, end, wait, "retry_after", &why, request);
            }
            return;
        }
        if ejected {
            // Sent before the ejection or as the last resort: the ejection already says it.
            return;
        }
        let failures = h.failures.fetch_add(1, Relaxed) + 1;
        let in_a_row = h.ejections.load(Relaxed);
        if failures < p.eject_after_failures && in_a_row == 0 {
            return;
        }
        let wait = p
            .cooldown
            .saturating_mul(1 << in_a_row.min(16))
            .min(p.max_cooldown);
        let why = if in_a_row == 0 {
            format!(
                "{failures} consecutive failures, the last {}",
                failure.label()
            )
        } else {
            format!(
                "failed again after ejection {in_a_row} ({})",
                failure.label()
            )
        };
        eject(
            h,
            until,
            now + wait.as_millis() as u64,
            wait,
            failure.label(),
            &why,
            request,
        );
    }

    /// Scores a success of `target`: clears its failures and, after an ejection, its record.
    pub fn succeeded(&self, target: &Target, request: &str) {
        let h = &target.health;
        // Loads first: the common case writes nothing (the line stays shared across cores).
        if h.failures.load(Relaxed) != 0 {
            h.failures.store(0, Relaxed);
        }
        if h.ejections.load(Relaxed) != 0 && h.ejections.swap(0, Relaxed) != 0 {
            h.ejected_until.store(0, Relaxed);
            metrics::DEPLOYMENT_HEALTHY
                .with_label_values(&[target.label()])
                .set(1);
            log::info!(
                "deployment {} recovered: request {request} succeeded",
                target.label()
            );
        }
    }
}

/// Takes `h` out of the rotation until `end`, unless another request just did (only the one
/// whose compare-and-swap wins logs and counts it).
fn eject(
    h: &Health,
    seen_until: u64,
    end: u64,
    wait: Duration,
    reason: &'static str,
    why: &str,
    request: &str,
) {
    if h.ejected_until
        .compare_exchange(seen_until, end, Relaxed, Relaxed)
        .is_err()
    {
        return;
    }
    let in_a_row = h.ejections.fetch_add(1, Relaxed) + 1;
    h.failures.store(0, Relaxed);
    metrics::DEPLOYMENT_HEALTHY
        .with_label_values(&[&*h.label])
        .set(0);
    metrics::DEPLOYMENT_EJECTIONS
        .with_label_values(&[&*h.label, reason])
        .inc();
    log::warn!(
        "deployment {} ejected for {:.1} s: {why} (ejection {in_a_row} in a row); request {request}",
        h.label,
        wait.as_secs_f64()
    );
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
fn two_choices(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn health(outstanding: u32) -> Arc<Health> {
        let h = Arc::new(Health::new(Arc::from("test/p2c")));
        h.outstanding.store(outstanding, Relaxed);
        h
    }

    fn provider(name: &str, key_env: Option<&str>) -> Arc<Provider> {
        Arc::new(Provider {
            name: name.into(),
            style: gateway_core::domain::ProviderStyle::OpenAi,
            tls: false,
            host: "127.0.0.1".into(),
            port: 9,
            base_path: String::new(),
            host_header: "127.0.0.1:9".into(),
            api_key: None,
            api_key_env: key_env.map(str::to_string),
            connect_timeout: Duration::from_secs(1),
            first_byte_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            eject_after_failures: 3,
            cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(4),
            ca: None,
            serves_responses: true,
        })
    }

    fn model(id: &str, providers: &[Arc<Provider>]) -> Model {
        Model {
            id: id.into(),
            deployments: providers
                .iter()
                .map(|p| Deployment {
                    provider: p.clone(),
                    upstream_model: Arc::from(id),
                    weight: 1,
                    label: Arc::from(format!("{}/{id}", p.name)),
                })
                .collect(),
            context_window: None,
            max_output_tokens: None,
            default_output_tokens: 1,
            weights: Default::default(),
            price: None,
        }
    }

    /// Milliseconds left of the target's ejection (0 when not ejected).
    fn ejected_for(t: &Target) -> u64 {
        t.health
            .ejected_until
            .load(Relaxed)
            .saturating_sub(clock_ms())
    }

    /// Lets the target's ejection run out without waiting.
    fn expire(t: &Target) {
        if t.health.ejected_until.load(Relaxed) != 0 {
            t.health.ejected_until.store(1, Relaxed);
        }
    }

    #[test]
    fn ejection_backs_off_doubling_to_the_cap_and_a_success_clears_it() {
        let routing = Routing::new();
        let m = model("unit-backoff", &[provider("unit-a", None)]);
        let t = routing.plan(&m, |_| true, 3).unwrap().remove(0);
        routing.failed(&t, Failure::ServerError, None, "r1");
        routing.failed(&t, Failure::Timeout(Wait::FirstByte), None, "r2");
        assert_eq!(ejected_for(&t), 0, "two failures eject nothing");
        routing.failed(&t, Failure::Connect, None, "r3");
        let left = ejected_for(&t);
        assert!((900..=1000).contains(&left), "first ejection 1 s: {left}");
        // While ejected, failures (panic-routed requests) do not extend it.
        routing.failed(&t, Failure::Connect, None, "r4");
        assert!(ejected_for(&t) <= 1000);
        // On probation one failure is enough; each ejection in a row doubles, up to the cap.
        for expected in [2000, 4000, 4000] {
            expire(&t);
            routing.failed(&t, Failure::ServerError, None, "r");
            let left = ejected_for(&t);
            assert!(
                (expected - 100..=expected).contains(&left),
                "{expected}: {left}"
            );
        }
        // A success (a panic-routed request) ends the ejection and clears the record.
        routing.succeeded(&t, "ok");
        assert_eq!(t.health.ejected_until.load(Relaxed), 0);
        assert_eq!(t.health.ejections.load(Relaxed), 0);
        routing.failed(&t, Failure::ServerError, None, "r");
        assert_eq!(
            ejected_for(&t),
            0,
            "back to three failures before an ejection"
        );
    }

    #[test]
    fn retry_after_ejects_at_once_capped_by_max_cooldown() {
        let routing = Routing::new();
        let m = model("unit-retry", &[provider("unit-b", None)]);
        let t = routing.plan(&m, |_| true, 3).unwrap().remove(0);
        routing.failed(
            &t,
            Failure::RateLimited,
            Some(Duration::from_millis(1500)),
            "r",
        );
        let left = ejected_for(&t);
        assert!((1400..=1500).contains(&left), "{left}");
        routing.failed(&t, Failure::RateLimited, Some(Duration::from_secs(60)), "r");
        let left = ejected_for(&t);
        assert!((3900..=4000).contains(&left), "capped at 4 s: {left}");
    }

    #[test]
    fn all_ejected_still_plans_the_one_that_recovers_first() {
        let routing = Routing::new();
        let (a, b, c) = (
            provider("unit-c", None),
            provider("unit-d", None),
            provider("unit-e", None),
        );
        let m = model("unit-panic", &[a, b, c]);
        let all = routing.plan(&m, |_| true, 3).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(routing.plan(&m, |_| true, 2).unwrap().len(), 2, "bounded");
        let waits = [3000, 1000, 2000];
        for t in &all {
            let wait = waits[m
                .deployments
                .iter()
                .position(|d| d.label == t.label)
                .unwrap()];
            routing.failed(
                t,
                Failure::Overloaded,
                Some(Duration::from_millis(wait)),
                "r",
            );
        }
        let plan = routing.plan(&m, |_| true, 3).unwrap();
        assert_eq!(plan.len(), 1, "one attempt while all are ejected");
        assert_eq!(plan[0].label(), "unit-d/unit-panic");
    }

    #[test]
    fn deployments_without_their_credential_are_never_planned() {
        let routing = Routing::new();
        let keyless = provider("unit-f", Some("UNIT_TEST_UNSET_KEY"));
        let m = model("unit-keys", &[keyless.clone(), provider("unit-g", None)]);
        for _ in 0..20 {
            let plan = routing.plan(&m, |_| true, 3).unwrap();
            assert_eq!(plan.len(), 1);
            assert_eq!(plan[0].label(), "unit-g/unit-keys");
        }
        let only = model("unit-keys-only", &[keyless]);
        let e = routing.plan(&only, |_| true, 3).unwrap_err();
        assert_eq!(e.code(), "routing_unavailable");
        assert!(e.message().contains("credential"), "{}", e.message());
        let e = routing.plan(&m, |_| false, 3).unwrap_err();
        assert!(e.message().contains("serves"), "{}", e.message());
    }

    #[test]
    fn statuses_are_judged_by_what_they_say_about_the_provider() {
        for s in [200, 201, 204, 304] {
            assert_eq!(Verdict::of_status(s), Verdict::Ok, "{s}");
        }
        for s in [400, 404, 409, 413, 422] {
            assert_eq!(Verdict::of_status(s), Verdict::RequestError, "{s}");
        }
        for s in [401, 403] {
            assert_eq!(Verdict::of_status(s), Verdict::Failed(Failure::Credential));
        }
        assert_eq!(
            Verdict::of_status(429),
            Verdict::Failed(Failure::RateLimited)
        );
        assert_eq!(
            Verdict::of_status(529),
            Verdict::Failed(Failure::Overloaded)
        );
        for s in [500, 502, 503, 504] {
            assert_eq!(
                Verdict::of_status(s),
                Verdict::Failed(Failure::ServerError),
                "{s}"
            );
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds_only_on_429_and_503() {
        let with = |name: &str, value: &str| {
            let mut h = ResponseHeader::build(429, None).unwrap();
            h.insert_header(name.to_string(), value).unwrap();
            h
        };
        assert_eq!(
            retry_after(429, &with("retry-after", "2")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(503, &with("retry-after-ms", "1500")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(retry_after(500, &with("retry-after", "2")), None);
        assert_eq!(retry_after(429, &with("retry-after", "0")), None);
        assert_eq!(
            retry_after(429, &with("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(retry_after(429, &with("retry-after", "-3")), None);
    }

    #[test]
    fn two_choices_keeps_the_weight_ratio_without_load_and_avoids_a_loaded_one() {
        let mut rng = rand::rng();
        let weights = [3u64, 1];
        let weight = |e: &(usize, Arc<Health>)| weights[e.0];
        let idle = [(0, health(0)), (1, health(0))];
        let n = 20_000;
        let firsts = (0..n)
            .filter(|_| two_choices(&idle, weight, &mut rng) == 0)
            .count();
        let share = firsts as f64 / n as f64;
        assert!((0.72..0.78).contains(&share), "3:1 gives ~0.75: {share}");
        // In proportion to the weights (6 vs 2 outstanding): still the ratio.
        let even = [(0, health(6)), (1, health(2))];
        let firsts = (0..n)
            .filter(|_| two_choices(&even, weight, &mut rng) == 0)
            .count();
        let share = firsts as f64 / n as f64;
        assert!(
            (0.72..0.78).contains(&share),
            "even load keeps 3:1: {share}"
        );
        // The heavier one piles up requests beyond its weight: it loses every comparison.
        let piled = [(0, health(9)), (1, health(1))];
        assert!((0..1000).all(|_| two_choices(&piled, weight, &mut rng) == 1));
        // Among three, the piled-up one is taken only when it is not drawn against another.
        let weights3 = [1u64, 1, 1];
        let three = [(0, health(5)), (1, health(0)), (2, health(0))];
        assert!((0..1000).all(|_| two_choices(&three, |e| weights3[e.0], &mut rng) != 0));
    }
}
