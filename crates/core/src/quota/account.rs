//! One account's hot balance: rolling-week spend, lots, and what is reserved right now. The
//! in-process engine keeps one per account behind a mutex; the Redis engine keeps the same
//! fields in Redis and runs the same arithmetic in Lua (`shared.rs`).

use std::collections::HashMap;

use crate::config::QuotaConfig;
use crate::config::TierLimits;
use crate::domain::Tier;
use crate::domain::{Breakdown, Lot, LotKind, SpendBucket};
use crate::quota::tiers::{entitlement_tier, lot_remaining, usage_tier};
use crate::quota::Denied;
use crate::storage::quota::{window_start_hour, HOUR_MS};
use crate::util::FastHash;

/// A reservation held by an account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub tokens: u64,
    pub requests: u64,
    pub at_ms: i64,
}

#[derive(Debug, Default, Clone)]
pub struct AccountState {
    pub user_id: String,
    /// Hourly spend inside the rolling week, oldest hour first.
    spend: Vec<SpendBucket>,
    /// The sum of `spend`, kept as hours are booked and dropped. A week of an account busy
    /// every hour is 168 buckets, and summing them on every request is needless work: the sum
    /// only loses the hours that left the window.
    spent: SpendBucket,
    pub lots: Vec<Lot>,
    pub reserved_tokens: u64,
    pub reserved_requests: u64,
    held: HashMap<String, Held, FastHash>,
    /// No reservation in `held` was made before this time: a lower bound, lowered by each new
    /// reservation, left as it is when one settles, made exact by each scan (`i64::MAX` until
    /// the first reservation; once the last one settles it keeps its old value, still a valid
    /// bound). `prune` looks for stale reservations only once the oldest could be
    /// stale: scanning them all on every request made each request's cost grow with the
    /// account's requests in flight (64 entries walked per request at 64 connections).
    held_since: i64,
    /// Set while one of several instances serves the account without Redis (the outage
    /// engine): the part of the balance this instance may spend, so the instances together
    /// spend at most the balance, not each all of it.
    share: Option<Share>,
}

/// This instance's part of an account's balance during a Redis outage.
#[derive(Debug, Default, Clone, Copy)]
struct Share {
    tokens: u64,
    /// `None`: no request cap.
    requests: Option<u64>,
    /// Paid since the share was fixed.
    paid_tokens: u64,
    paid_requests: u64,
}

impl AccountState {
    pub fn new(user_id: &str, mut spend: Vec<SpendBucket>, mut lots: Vec<Lot>) -> Self {
        lots.sort_by_key(|l| l.expires_at);
        spend.sort_by_key(|b| b.hour);
        let spent = spend.iter().fold(SpendBucket::default(), |mut sum, b| {
            sum.add_amounts(b);
            sum
        });
        AccountState {
            user_id: user_id.to_string(),
            spend,
            spent,
            lots,
            held_since: i64::MAX,
            ..Default::default()
        }
    }

    /// The spend of the rolling week ending at `now`: the same sums as
    /// [`window_sums`](crate::quota::tiers::window_sums) over the buckets, from the kept total
    /// less the oldest hours that have left the window since the last `prune`.
    fn window(&self, now: i64) -> SpendBucket {
        let from = window_start_hour(now);
        let mut sums = self.spent;
        for old in self.spend.iter().take_while(|b| b.hour < from) {
            sums.sub_amounts(old);
        }
        sums
    }

    /// Drops spend older than the window and releases reservations older than `timeout_ms`
    /// (their requests never settled: the process serving them died).
    pub fn prune(&mut self, now: i64, timeout_ms: i64) -> usize {
        let from = window_start_hour(now);
        let gone = self.spend.iter().take_while(|b| b.hour < from).count();
        for old in self.spend.drain(..gone) {
            self.spent.sub_amounts(&old);
        }
        if self.held.is_empty() || now.saturating_sub(self.held_since) <= timeout_ms {
            return 0;
        }
        // One pass: the stale ones, and when the oldest of the others was made.
        let mut stale = Vec::new();
        let mut oldest_kept = i64::MAX;
        for (id, h) in &self.held {
            if now - h.at_ms > timeout_ms {
                stale.push(id.clone());
            } else {
                oldest_kept = oldest_kept.min(h.at_ms);
            }
        }
        for id in &stale {
            self.release(id);
        }
        self.held_since = oldest_kept;
        stale.len()
    }

    fn release(&mut self, id: &str) -> Option<Held> {
        let h = self.held.remove(id)?;
        self.reserved_tokens = self.reserved_tokens.saturating_sub(h.tokens);
        self.reserved_requests = self.reserved_requests.saturating_sub(h.requests);
        Some(h)
    }

    /// Adds a lot granted elsewhere (idempotent).
    pub fn add_lot(&mut self, lot: Lot) {
        if !self.lots.iter().any(|l| l.id == lot.id) {
            self.lots.push(lot);
            self.lots.sort_by_key(|l| l.expires_at);
        }
    }

    /// The account's effective tier given its manual tier and cap.
    pub fn effective_tier(
        &self,
        cfg: &QuotaConfig,
        manual: Tier,
        max: Option<Tier>,
        now: i64,
    ) -> Tier {
        let s = self.window(now);
        let usage = usage_tier(cfg, s.allowance_tokens + s.lot_tokens);
        crate::quota::tiers::effective_tier(manual, usage, entitlement_tier(&self.lots, now), max)
    }

    /// What is still spendable now, after reservations: (tokens, requests or None = no cap);
    /// within this instance's share when one is set.
    pub fn available(&self, limits: &TierLimits, now: i64) -> (u64, Option<u64>) {
        let s = self.window(now);
        let tokens = limits.weekly_tokens.saturating_sub(s.allowance_tokens)
            + lot_remaining(&self.lots, LotKind::Token, now);
        let requests = (limits.weekly_requests > 0).then(|| {
            (limits.weekly_requests.saturating_sub(s.allowance_requests)
                + lot_remaining(&self.lots, LotKind::Request, now))
            .saturating_sub(self.reserved_requests)
        });
        let tokens = tokens.saturating_sub(self.reserved_tokens);
        match &self.share {
            None => (tokens, requests),
            Some(share) => (
                tokens.min(
                    share
                        .tokens
                        .saturating_sub(share.paid_tokens + self.reserved_tokens),
                ),
                requests.map(|r| {
                    r.min(share.requests.map_or(u64::MAX, |cap| {
                        cap.saturating_sub(share.paid_requests + self.reserved_requests)
                    }))
                }),
            ),
        }
    }

    /// Limits this instance to `1/instances` of what the account has left now (once: later
    /// calls keep the share first fixed). For the outage engine of one of several instances.
    pub fn limit_to_share(&mut self, limits: &TierLimits, instances: u64, now: i64) {
        if instances <= 1 || self.share.is_some() {
            return;
        }
        let (tokens, requests) = self.available(limits, now);
        self.share = Some(Share {
            tokens: (tokens + self.reserved_tokens) / instances,
            requests: requests.map(|r| (r + self.reserved_requests) / instances),
            paid_tokens: 0,
            paid_requests: 0,
        });
    }

    /// Reserves atomically (the caller holds the account's lock).
    pub fn reserve(
        &mut self,
        id: &str,
        tokens: u64,
        requests: u64,
        limits: &TierLimits,
        unlimited: bool,
        now: i64,
    ) -> Result<(), Denied> {
        if !unlimited {
            let (avail_t, avail_r) = self.available(limits, now);
            if tokens > avail_t || avail_r.is_some_and(|r| requests > r) {
                return Err(Denied::InsufficientQuota);
            }
        }
        self.reserved_tokens += tokens;
        self.reserved_requests += requests;
        self.held_since = self.held_since.min(now);
        self.held.insert(
            id.to_string(),
            Held {
                tokens,
                requests,
                at_ms: now,
            },
        );
        Ok(())
    }

    /// Releases reservation `id` and pays `tokens`/`requests`: weekly allowance first, then lots
    /// soonest-expiring first; what nothing covers is booked on the allowance (an overdraft the
    /// next reservations see). Returns the breakdown for the database.
    pub fn settle(
        &mut self,
        id: &str,
        tokens: u64,
        requests: u64,
        limits: &TierLimits,
        now: i64,
    ) -> Breakdown {
        self.release(id);
        let s = self.window(now);
        let mut b = Breakdown {
            user_id: self.user_id.clone(),
            at_ms: now,
            ..Default::default()
        };
        let (allow_t, lots_t) = self.take(
            LotKind::Token,
            tokens,
            limits.weekly_tokens.saturating_sub(s.allowance_tokens),
            now,
        );
        let request_room = if limits.weekly_requests > 0 {
            limits.weekly_requests.saturating_sub(s.allowance_requests)
        } else {
            u64::MAX
        };
        let (allow_r, lots_r) = self.take(LotKind::Request, requests, request_room, now);
        b.allowance_tokens = allow_t;
        b.allowance_requests = allow_r;
        b.lots = lots_t.into_iter().chain(lots_r).collect();
        self.book(&b);
        b
    }

    /// Splits `amount` between the allowance room and lots of `kind`.
    fn take(
        &self,
        kind: LotKind,
        amount: u64,
        room: u64,
        now: i64,
    ) -> (u64, Vec<(String, LotKind, u64)>) {
        let from_allowance = amount.min(room);
        let mut rest = amount - from_allowance;
        let mut from_lots = Vec::new();
        for lot in self
            .lots
            .iter()
            .filter(|l| l.kind == kind && l.expires_at > now && l.remaining > 0)
        {
            if rest == 0 {
                break;
            }
            let n = rest.min(lot.remaining);
            from_lots.push((lot.id.clone(), kind, n));
            rest -= n;
        }
        (from_allowance + rest, from_lots)
    }

    /// Applies a breakdown to the hot state.
    fn book(&mut self, b: &Breakdown) {
        let hour = b.at_ms / HOUR_MS;
        // The current hour is the last bucket, or a new one after it; an earlier hour (a
        // clock step back) goes in its place, so the buckets stay in order.
        let idx = match self.spend.iter().rposition(|x| x.hour <= hour) {
            Some(i) if self.spend[i].hour == hour => i,
            found => {
                let at = found.map_or(0, |i| i + 1);
                self.spend.insert(
                    at,
                    SpendBucket {
                        hour,
                        ..Default::default()
                    },
                );
                at
            }
        };
        let mut booked = SpendBucket {
            allowance_tokens: b.allowance_tokens,
            allowance_requests: b.allowance_requests,
            ..Default::default()
        };
        for (_, kind, n) in &b.lots {
            match kind {
                LotKind::Token => booked.lot_tokens += n,
                LotKind::Request => booked.lot_requests += n,
            }
        }
        self.spend[idx].add_amounts(&booked);
        self.spent.add_amounts(&booked);
        if let Some(share) = &mut self.share {
            share.paid_tokens += booked.allowance_tokens + booked.lot_tokens;
            share.paid_requests += booked.allowance_requests + booked.lot_requests;
        }
        for (id, _, n) in &b.lots {
            if let Some(l) = self.lots.iter_mut().find(|l| &l.id == id) {
                l.remaining = l.remaining.saturating_sub(*n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(weekly_tokens: u64, weekly_requests: u64) -> TierLimits {
        TierLimits {
            weekly_tokens,
            weekly_requests,
            ..Default::default()
        }
    }

    fn lot(id: &str, kind: LotKind, remaining: u64, expires_at: i64) -> Lot {
        Lot {
            id: id.into(),
            user_id: "u".into(),
            kind,
            amount: remaining,
            remaining,
            tier: None,
            source: "t".into(),
            created_at: 0,
            expires_at,
        }
    }

    #[test]
    fn reservations_never_exceed_what_is_left() {
        let mut a = AccountState::new("u", vec![], vec![]);
        let l = limits(100, 0);
        for i in 0..4 {
            assert!(a.reserve(&format!("r{i}"), 25, 1, &l, false, 0).is_ok());
        }
        assert_eq!(
            a.reserve("r5", 1, 1, &l, false, 0),
            Err(Denied::InsufficientQuota)
        );
        a.settle("r0", 10, 1, &l, 0);
        assert!(a.reserve("r6", 15, 1, &l, false, 0).is_ok());
        assert_eq!(
            a.reserve("r7", 1, 1, &l, false, 0),
            Err(Denied::InsufficientQuota)
        );
    }

    #[test]
    fn allowance_first_then_soonest_lot() {
        let mut a = AccountState::new(
            "u",
            vec![],
            vec![
                lot("late", LotKind::Token, 100, 10_000_000),
                lot("soon", LotKind::Token, 30, 5_000_000),
            ],
        );
        let l = limits(50, 0);
        a.reserve("r", 120, 1, &l, false, 0).unwrap();
        let b = a.settle("r", 120, 1, &l, 0);
        assert_eq!(b.allowance_tokens, 50);
        assert_eq!(
            b.lots,
            vec![
                ("soon".into(), LotKind::Token, 30),
                ("late".into(), LotKind::Token, 40)
            ]
        );
        assert_eq!(a.available(&l, 0).0, 60);
        // Expired lots are not spendable.
        assert_eq!(a.available(&l, 10_000_001).0, 0);
    }

    #[test]
    fn request_meter_and_overdraft() {
        let mut a = AccountState::new("u", vec![], vec![lot("rq", LotKind::Request, 1, 1_000)]);
        let l = limits(10, 2);
        assert!(a.reserve("a", 0, 1, &l, false, 0).is_ok());
        assert!(a.reserve("b", 0, 1, &l, false, 0).is_ok());
        assert!(a.reserve("c", 0, 1, &l, false, 0).is_ok());
        assert_eq!(
            a.reserve("d", 0, 1, &l, false, 0),
            Err(Denied::InsufficientQuota)
        );
        // Settling more tokens than exist books the overdraft on the allowance.
        let b = a.settle("a", 15, 1, &l, 0);
        assert_eq!(b.allowance_tokens, 15);
        assert_eq!(a.available(&l, 0).0, 0);
        assert!(
            a.reserve("e", 0, 1, &l, true, 0).is_ok(),
            "unlimited skips the meters"
        );
    }

    #[test]
    fn a_share_limits_what_one_of_several_instances_spends() {
        let l = limits(1000, 10);
        let mut a = AccountState::new(
            "u",
            vec![],
            vec![lot("t", LotKind::Token, 200, 9e12 as i64)],
        );
        a.limit_to_share(&l, 4, 0);
        // A quarter of 1,200 tokens and of 10 requests.
        assert_eq!(a.available(&l, 0), (300, Some(2)));
        a.reserve("r1", 250, 1, &l, false, 0)
            .expect("within the share");
        assert_eq!(
            a.reserve("r2", 100, 1, &l, false, 0),
            Err(Denied::InsufficientQuota)
        );
        a.settle("r1", 200, 1, &l, 0);
        assert_eq!(a.available(&l, 0), (100, Some(1)));
        a.reserve("r3", 100, 1, &l, false, 0)
            .expect("the rest of the share");
        a.settle("r3", 100, 1, &l, 0);
        assert_eq!(a.available(&l, 0), (0, Some(0)));
        // Fixed once: asking again does not grant a fresh share.
        a.limit_to_share(&l, 4, 0);
        assert_eq!(a.available(&l, 0), (0, Some(0)));
    }

    #[test]
    fn stale_reservations_are_reaped() {
        let mut a = AccountState::new("u", vec![], vec![]);
        let l = limits(10, 0);
        a.reserve("old", 10, 1, &l, false, 0).unwrap();
        assert_eq!(
            a.reserve("x", 1, 1, &l, false, 500),
            Err(Denied::InsufficientQuota)
        );
        assert_eq!(a.prune(2_000, 1_000), 1);
        assert!(a.reserve("x", 10, 1, &l, false, 2_000).is_ok());
    }

    /// `prune` skips its scan while no reservation can be stale yet; it must still release
    /// exactly what a scan of every reservation would, whatever the order of reservations,
    /// settlements and prunes, with the clock stepping back now and then.
    #[test]
    fn prune_releases_what_a_full_scan_would() {
        let l = limits(u64::MAX / 4, 0);
        let mut a = AccountState::new("u", vec![], vec![]);
        // The model: every open reservation and when it was made.
        let mut open: Vec<(String, i64)> = Vec::new();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let timeout = 1_000;
        let mut now: i64 = 10_000;
        let mut released = 0;
        for step in 0..20_000 {
            now += match next(50) {
                0 => -(next(2_000) as i64),
                1..=4 => next(3_000) as i64,
                _ => next(40) as i64,
            };
            match next(10) {
                0..=4 => {
                    let id = format!("r{step}");
                    a.reserve(&id, 1, 1, &l, false, now).unwrap();
                    open.push((id, now));
                }
                5..=6 if !open.is_empty() => {
                    let (id, _) = open.swap_remove(next(open.len() as u64) as usize);
                    a.settle(&id, 1, 1, &l, now);
                }
                _ => {
                    let expected = open.iter().filter(|(_, at)| now - at > timeout).count();
                    open.retain(|(_, at)| now - at <= timeout);
                    assert_eq!(a.prune(now, timeout), expected, "step {step} at {now}");
                    released += expected;
                }
            }
            assert_eq!(a.held.len(), open.len(), "step {step}");
            assert!(
                open.iter().all(|(id, _)| a.held.contains_key(id)),
                "step {step}"
            );
            assert_eq!(a.reserved_requests, open.len() as u64, "step {step}");
        }
        assert!(
            released > 100,
            "the run released {released} stale reservations"
        );
    }

    /// The kept total against the sum over the buckets, through bookings at every hour of a
    /// week and beyond (one clock step back included), prunes and reads at later times.
    #[test]
    fn window_totals_equal_the_sum_of_the_buckets() {
        use crate::quota::tiers::window_sums;
        let t0 = 1_000 * HOUR_MS;
        let loaded = vec![
            SpendBucket {
                hour: 1_000 - 3,
                allowance_tokens: 7,
                lot_requests: 1,
                ..Default::default()
            },
            SpendBucket {
                hour: 1_000 - 200,
                allowance_tokens: 5,
                ..Default::default()
            },
            SpendBucket {
                hour: 1_000 - 100,
                lot_tokens: 11,
                ..Default::default()
            },
        ];
        let mut a = AccountState::new(
            "u",
            loaded,
            vec![lot("l1", LotKind::Token, 1 << 40, i64::MAX)],
        );
        let check = |a: &AccountState, now: i64| {
            assert_eq!(a.window(now), window_sums(&a.spend, now), "at {now}");
            assert!(a.spend.windows(2).all(|w| w[0].hour < w[1].hour));
        };
        check(&a, t0);
        // A simple generator: the same sequence on every run.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let mut now = t0;
        for step in 0..3_000 {
            // Mostly forward by minutes; now and then a jump of hours or days, once back.
            now += match next(100) {
                0..=89 => next(20 * 60_000) as i64,
                90..=98 => next(30 * HOUR_MS as u64) as i64,
                _ if step == 1_500 => -5 * HOUR_MS,
                _ => 0,
            };
            let b = Breakdown {
                user_id: "u".into(),
                at_ms: now,
                allowance_tokens: next(50),
                allowance_requests: next(2),
                lots: if next(3) == 0 {
                    vec![("l1".into(), LotKind::Token, next(40))]
                } else {
                    vec![]
                },
            };
            a.book(&b);
            check(&a, now);
            check(&a, now + next(10 * 24) as i64 * HOUR_MS);
            if next(4) == 0 {
                a.prune(now, 60_000);
                check(&a, now);
                assert!(a.spend.iter().all(|b| b.hour >= window_start_hour(now)));
            }
        }
    }
}
