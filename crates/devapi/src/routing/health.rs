//! Passive health (outlier detection, as Envoy does it): every attempt's result is scored per
//! deployment. Only failures that say the provider is unwell count — no connection, a failed
//! TLS handshake, a timeout, a 5xx (529 included), a 429, a 401 or 403 (the gateway's own
//! provider credential refused), an answer that breaks off. An answer about the request (400,
//! 404, 413, 422, refusals) counts as proof of life. After the provider's `eject_after_failures`
//! consecutive failures the deployment is ejected for `cooldown_seconds`, doubled for each
//! ejection in a row up to `max_cooldown_seconds`; a 429 or 503 with `retry-after` ejects it at
//! once for the time it names (capped the same way). Once its time is up the deployment is back
//! on probation: one more failure ejects it again, one success clears its record.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use prometheus::IntCounter;

use super::{Failure, Routing, Target, Verdict};
use gateway_core::metrics;

/// Milliseconds on the process's monotonic clock, from 1 (0 marks "never ejected").
pub(super) fn clock_ms() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    EPOCH.elapsed().as_millis() as u64 + 1
}

/// One deployment's record, shared by every request of this instance.
#[derive(Debug)]
pub struct Health {
    pub(super) label: Arc<str>,
    /// Requests sent and not yet finished.
    pub(super) outstanding: AtomicU32,
    /// Consecutive failures since the last success or ejection.
    pub(super) failures: AtomicU32,
    /// Ejections since the last success: the backoff exponent, and nonzero means "on
    /// probation" (one failure ejects again).
    pub(super) ejections: AtomicU32,
    /// End of the current (or last) ejection on [`clock_ms`]; 0 when cleared by a success.
    pub(super) ejected_until: AtomicU64,
    /// The hot series, resolved once (a labelled lookup hashes the labels on every use).
    pub(super) ok_attempts: IntCounter,
}

impl Health {
    pub(super) fn new(label: Arc<str>) -> Health {
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
    pub(super) fn ejected_until(&self, now: &mut Option<u64>) -> Option<u64> {
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

impl Routing {
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
