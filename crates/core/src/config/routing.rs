//! `[routing]`: how far one request fails over.

use std::time::Duration;

use super::check::{Checker, ConfigError};
use super::file::RoutingFile;

/// `[routing]`: the bound on one request's failover.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    /// Deployments tried per request, the first included.
    pub max_attempts: usize,
    /// No further deployment is tried once this long has passed since the first attempt began.
    pub failover_deadline: Duration,
}

pub(super) fn validate(c: &Checker, f: RoutingFile) -> Result<RoutingConfig, ConfigError> {
    let max_attempts = f.max_attempts.unwrap_or(3);
    if !(1..=10).contains(&max_attempts) {
        return Err(c.err("routing.max_attempts", "must be between 1 and 10"));
    }
    let failover_deadline_ms = f.failover_deadline_ms.unwrap_or(30_000);
    if !(1..=3_600_000).contains(&failover_deadline_ms) {
        return Err(c.err(
            "routing.failover_deadline_ms",
            "must be between 1 and 3600000 (one hour)",
        ));
    }
    Ok(RoutingConfig {
        max_attempts: max_attempts as usize,
        failover_deadline: Duration::from_millis(failover_deadline_ms),
    })
}
