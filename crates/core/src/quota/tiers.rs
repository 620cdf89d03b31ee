//! Tiers: which tier an account is on and what that gives it (spec §2.3, CONTRACT "Quota
//! model"). Pure functions over stored facts, shared by the hot engines and the profile API.
//!
//! Effective tier = the highest of the manual tier (admin), the usage tier (rolling-week token
//! usage against `quota.usage_thresholds`) and the entitlement tier (the highest tier among the
//! account's active purchased lots), capped by the account's `maxTier` when set.

use serde_json::{json, Value};

use crate::config::{QuotaConfig, TierLimits};

use crate::domain::Tier;
use crate::domain::{Lot, LotKind, SpendBucket};
use crate::storage::quota::window_start_hour;
use crate::storage::UserRecord;
use crate::util::iso;

/// The tier reached by `weekly_tokens` of usage.
pub fn usage_tier(cfg: &QuotaConfig, weekly_tokens: u64) -> Tier {
    cfg.usage_thresholds
        .iter()
        .filter(|(_, threshold)| weekly_tokens >= *threshold)
        .map(|(t, _)| *t)
        .max()
        .unwrap_or(Tier::Beginner)
}

/// The highest tier among lots still active (not expired, not used up).
pub fn entitlement_tier(lots: &[Lot], now: i64) -> Option<Tier> {
    running_tier(
        lots.iter().map(|l| (l.remaining, l.expires_at, l.tier)),
        now,
    )
}

/// `entitlement_tier`'s rule on lots given as (remaining, expires at, tier), as a renewal reads
/// them from Redis without the rest of their record.
pub fn running_tier(
    lots: impl IntoIterator<Item = (u64, i64, Option<Tier>)>,
    now: i64,
) -> Option<Tier> {
    lots.into_iter()
        .filter(|(remaining, expires_at, _)| *expires_at > now && *remaining > 0)
        .filter_map(|(_, _, tier)| tier)
        .max()
}

pub fn effective_tier(
    manual: Tier,
    usage: Tier,
    entitlement: Option<Tier>,
    max: Option<Tier>,
) -> Tier {
    let best = manual.max(usage).max(entitlement.unwrap_or(Tier::Beginner));
    match max {
        Some(cap) => best.min(cap),
        None => best,
    }
}

/// Everything the profile shows about an account's quota, computed at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaStatus {
    pub effective: Tier,
    pub manual: Tier,
    pub usage: Tier,
    pub entitlement: Option<Tier>,
    pub max: Option<Tier>,
    pub unlimited: bool,
    pub suspended: bool,
    pub limits: TierLimits,
    /// All tokens spent in the rolling week (allowance and lots).
    pub weekly_tokens_used: u64,
    pub weekly_requests_used: u64,
    pub allowance_tokens_spent: u64,
    pub allowance_requests_spent: u64,
    pub lot_tokens_remaining: u64,
    pub lot_requests_remaining: u64,
    pub computed_at: i64,
}

/// Sums the buckets inside the rolling week ending at `now`.
pub fn window_sums(spend: &[SpendBucket], now: i64) -> SpendBucket {
    let from = window_start_hour(now);
    spend
        .iter()
        .filter(|b| b.hour >= from)
        .fold(SpendBucket::default(), |mut acc, b| {
            acc.add_amounts(b);
            acc
        })
}

pub fn lot_remaining(lots: &[Lot], kind: LotKind, now: i64) -> u64 {
    lots.iter()
        .filter(|l| l.kind == kind && l.expires_at > now)
        .map(|l| l.remaining)
        .sum()
}

pub fn status(
    cfg: &QuotaConfig,
    user: &UserRecord,
    spend: &[SpendBucket],
    lots: &[Lot],
    now: i64,
) -> QuotaStatus {
    let sums = window_sums(spend, now);
    let weekly_tokens_used = sums.allowance_tokens + sums.lot_tokens;
    let usage = usage_tier(cfg, weekly_tokens_used);
    let entitlement = entitlement_tier(lots, now);
    let effective = effective_tier(user.manual_tier, usage, entitlement, user.max_tier);
    QuotaStatus {
        effective,
        manual: user.manual_tier,
        usage,
        entitlement,
        max: user.max_tier,
        unlimited: user.unlimited,
        suspended: user.suspended,
        limits: *cfg.limits(effective),
        weekly_tokens_used,
        weekly_requests_used: sums.allowance_requests + sums.lot_requests,
        allowance_tokens_spent: sums.allowance_tokens,
        allowance_requests_spent: sums.allowance_requests,
        lot_tokens_remaining: lot_remaining(lots, LotKind::Token, now),
        lot_requests_remaining: lot_remaining(lots, LotKind::Request, now),
        computed_at: now,
    }
}

impl QuotaStatus {
    /// Tokens still spendable: the rest of the weekly allowance plus active lots.
    pub fn tokens_remaining(&self) -> u64 {
        self.limits
            .weekly_tokens
            .saturating_sub(self.allowance_tokens_spent)
            + self.lot_tokens_remaining
    }

    /// The spec §2.3 quota object (plus the balances a panel needs).
    pub fn to_json(&self, cfg: &QuotaConfig) -> Value {
        let thresholds: Vec<Value> = cfg
            .usage_thresholds
            .iter()
            .map(|(t, v)| json!({ "tier": t.as_str(), "weeklyTokens": v }))
            .collect();
        json!({
            "effectiveTier": self.effective.as_str(),
            "manualTier": self.manual.as_str(),
            "usageTier": self.usage.as_str(),
            "entitlementTier": self.entitlement.map(|t| t.as_str()),
            "maxTier": self.max.map(|t| t.as_str()),
            "unlimited": self.unlimited,
            "suspended": self.suspended,
            "weeklyTokens": self.limits.weekly_tokens,
            "weeklyRequests": self.limits.weekly_requests,
            "weeklyTokensUsed": self.weekly_tokens_used,
            "weeklyRequestsUsed": self.weekly_requests_used,
            "tokensRemaining": self.tokens_remaining(),
            "allowanceTokensRemaining": self.limits.weekly_tokens.saturating_sub(self.allowance_tokens_spent),
            "allowanceRequestsRemaining": self.limits.weekly_requests.saturating_sub(self.allowance_requests_spent),
            "lotTokensRemaining": self.lot_tokens_remaining,
            "lotRequestsRemaining": self.lot_requests_remaining,
            "requestsPerMinute": self.limits.requests_per_minute,
            "inputTokensPerMinute": self.limits.input_tokens_per_minute,
            "outputTokensPerMinute": self.limits.output_tokens_per_minute,
            "computedAt": iso(self.computed_at),
            "thresholds": thresholds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::quota::HOUR_MS;
    use std::path::Path;

    fn cfg() -> QuotaConfig {
        crate::config::Config::from_str(Path::new("t.toml"), "")
            .expect("cfg")
            .quota
    }

    fn lot(tier: Option<Tier>, remaining: u64, expires_at: i64) -> Lot {
        Lot {
            id: "lot_x".into(),
            user_id: "u".into(),
            kind: LotKind::Token,
            amount: 100,
            remaining,
            tier,
            source: "t".into(),
            created_at: 0,
            expires_at,
        }
    }

    #[test]
    fn effective_is_highest_capped() {
        use Tier::*;
        assert_eq!(effective_tier(Beginner, Steady, None, None), Steady);
        assert_eq!(
            effective_tier(Beginner, Beginner, Some(Tryharder), None),
            Tryharder
        );
        assert_eq!(
            effective_tier(Persistent, Beginner, Some(Tryharder), Some(Steady)),
            Steady
        );
        assert_eq!(
            effective_tier(Persistent, Beginner, None, Some(Tryharder)),
            Persistent
        );
    }

    #[test]
    fn usage_thresholds() {
        let c = cfg();
        assert_eq!(usage_tier(&c, 0), Tier::Beginner);
        assert_eq!(usage_tier(&c, 5_000_000), Tier::Steady);
        assert_eq!(usage_tier(&c, 99_999_999), Tier::Persistent);
        assert_eq!(usage_tier(&c, 100_000_000), Tier::Tryharder);
    }

    #[test]
    fn entitlement_ignores_expired_and_used_lots() {
        let lots = [
            lot(Some(Tier::Tryharder), 0, 100),
            lot(Some(Tier::Persistent), 5, 50),
            lot(Some(Tier::Steady), 5, 200),
        ];
        assert_eq!(entitlement_tier(&lots, 60), Some(Tier::Steady));
        assert_eq!(entitlement_tier(&lots, 10), Some(Tier::Persistent));
        assert_eq!(entitlement_tier(&lots, 300), None);
    }

    #[test]
    fn rolling_window_drops_old_hours() {
        let now = 1000 * HOUR_MS;
        let spend = [
            SpendBucket {
                hour: 1000 - 168,
                allowance_tokens: 7,
                ..Default::default()
            },
            SpendBucket {
                hour: 1000 - 167,
                allowance_tokens: 3,
                ..Default::default()
            },
            SpendBucket {
                hour: 1000,
                lot_tokens: 2,
                ..Default::default()
            },
        ];
        let s = window_sums(&spend, now);
        assert_eq!(s.allowance_tokens, 3);
        assert_eq!(s.lot_tokens, 2);
    }
}
