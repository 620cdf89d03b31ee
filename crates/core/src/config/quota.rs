//! `[quota]`: tiers, their allowances and per-minute limits, and reservations.

use std::time::Duration;

use super::check::{Checker, ConfigError};
use super::file::QuotaFile;
use crate::domain::Tier;

/// Allowances and default per-minute limits of one tier. `0` means "no cap" for the weekly
/// request allowance and for per-minute limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierLimits {
    pub weekly_tokens: u64,
    pub weekly_requests: u64,
    pub requests_per_minute: u64,
    pub input_tokens_per_minute: u64,
    pub output_tokens_per_minute: u64,
}

#[derive(Debug, Clone)]
pub struct QuotaConfig {
    pub default_tier: Tier,
    /// Indexed by `Tier::index()`.
    pub tiers: [TierLimits; 4],
    /// Rolling-week token usage at which each tier is reached, ascending.
    pub usage_thresholds: Vec<(Tier, u64)>,
    pub reservation_timeout: Duration,
}

impl QuotaConfig {
    pub fn limits(&self, tier: Tier) -> &TierLimits {
        &self.tiers[tier.index()]
    }

    /// Whether any tier caps weekly requests. Without one the request meter is never drawn,
    /// so request lots would buy nothing: they are not sold, and granting one warns.
    pub fn meters_requests(&self) -> bool {
        self.tiers.iter().any(|t| t.weekly_requests > 0)
    }
}

fn parse_tier(c: &Checker, key: &str, value: &str) -> Result<Tier, ConfigError> {
    Tier::parse(value).ok_or_else(|| {
        c.err(
            key,
            format!("unknown tier {value:?} (beginner, steady, persistent, tryharder)"),
        )
    })
}

fn default_tier_limits(tier: Tier) -> TierLimits {
    match tier {
        Tier::Beginner => TierLimits {
            weekly_tokens: 1_000_000,
            weekly_requests: 0,
            requests_per_minute: 60,
            input_tokens_per_minute: 200_000,
            output_tokens_per_minute: 50_000,
        },
        Tier::Steady => TierLimits {
            weekly_tokens: 10_000_000,
            weekly_requests: 0,
            requests_per_minute: 120,
            input_tokens_per_minute: 400_000,
            output_tokens_per_minute: 100_000,
        },
        Tier::Persistent => TierLimits {
            weekly_tokens: 50_000_000,
            weekly_requests: 0,
            requests_per_minute: 300,
            input_tokens_per_minute: 1_000_000,
            output_tokens_per_minute: 250_000,
        },
        Tier::Tryharder => TierLimits {
            weekly_tokens: 200_000_000,
            weekly_requests: 0,
            requests_per_minute: 600,
            input_tokens_per_minute: 2_000_000,
            output_tokens_per_minute: 500_000,
        },
    }
}

pub(super) fn validate(c: &Checker, f: QuotaFile) -> Result<QuotaConfig, ConfigError> {
    let default_tier = parse_tier(
        c,
        "quota.default_tier",
        f.default_tier.as_deref().unwrap_or("beginner"),
    )?;
    let mut tiers = Tier::ALL.map(default_tier_limits);
    for (name, t) in &f.tiers {
        let tier = parse_tier(c, &format!("quota.tiers.{name}"), name)?;
        let d = default_tier_limits(tier);
        tiers[tier.index()] = TierLimits {
            weekly_tokens: t.weekly_tokens.unwrap_or(d.weekly_tokens),
            weekly_requests: t.weekly_requests.unwrap_or(0),
            requests_per_minute: t.requests_per_minute.unwrap_or(d.requests_per_minute),
            input_tokens_per_minute: t
                .input_tokens_per_minute
                .unwrap_or(d.input_tokens_per_minute),
            output_tokens_per_minute: t
                .output_tokens_per_minute
                .unwrap_or(d.output_tokens_per_minute),
        };
    }
    let mut usage_thresholds = Vec::new();
    for (name, v) in &f.usage_thresholds {
        let tier = parse_tier(c, &format!("quota.usage_thresholds.{name}"), name)?;
        usage_thresholds.push((tier, *v));
    }
    if usage_thresholds.is_empty() {
        usage_thresholds = vec![
            (Tier::Steady, 5_000_000),
            (Tier::Persistent, 25_000_000),
            (Tier::Tryharder, 100_000_000),
        ];
    }
    usage_thresholds.sort();
    Ok(QuotaConfig {
        default_tier,
        tiers,
        usage_thresholds,
        reservation_timeout: Duration::from_secs(
            f.reservation_timeout_seconds.unwrap_or(900).max(5),
        ),
    })
}
