//! The in-process engine: exact for a single instance. Each account's balance sits behind its
//! own mutex (loaded from the database on first use); per-minute windows sit in one map entry
//! per scope, locked together with the account so check-and-charge is one atomic step.
//!
//! As the gateway's engine (no Redis) it also rebuilds an account's windows when it loads the
//! account: the current and previous minute's admissions of its keys, from their usage events.
//! A restart or a graceful upgrade then carries the windows over instead of opening them anew,
//! so neither is a way around a per-minute limit. (As the Redis engine's outage engine it does
//! not: during an outage each instance counts only its own share, see `set_share`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::account::AccountState;
use super::limits::{check, view, WINDOW_MS};
use super::{Denied, RatePlan, RateView, Reservation, Ticket, Used};
use crate::config::QuotaConfig;
use crate::domain::{Breakdown, LimitMode, Lot};
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::storage::quota::MinuteAdmissions;
use crate::storage::Db;
use crate::util::FastHash;

/// Requests, input tokens, output tokens.
const DIMS: usize = 3;

#[derive(Debug, Default, Clone, Copy)]
struct Windows {
    minute: i64,
    prev: [u64; DIMS],
    curr: [u64; DIMS],
}

impl Windows {
    /// Moves the windows forward to `minute`.
    fn roll(&mut self, minute: i64) {
        if minute == self.minute {
            return;
        }
        self.prev = if minute == self.minute + 1 {
            self.curr
        } else {
            [0; DIMS]
        };
        self.curr = [0; DIMS];
        self.minute = minute;
    }
}

type Cell = Arc<OnceCell<Mutex<AccountState>>>;

pub struct Local {
    accounts: DashMap<String, Cell, FastHash>,
    windows: DashMap<String, Windows, FastHash>,
    /// How long a request waits for an account's balance to load (`storage.database_timeout_ms`).
    deadline: Duration,
    /// The instances sharing the accounts (1 for the embedded engine). As the Redis engine's
    /// outage engine, this instance admits `1/share` of each per-minute limit and of each
    /// balance, so the instances together stay within one, not one each.
    share: AtomicU64,
    /// Rebuild an account's windows from its usage events when it is loaded.
    inherit_windows: bool,
}

impl Local {
    /// The Redis engine's outage engine: windows start empty.
    pub fn new(deadline: Duration) -> Self {
        Local {
            accounts: DashMap::default(),
            windows: DashMap::default(),
            deadline,
            share: AtomicU64::new(1),
            inherit_windows: false,
        }
    }

    /// The gateway's engine without Redis: an account's windows are rebuilt from its recent
    /// usage events when it is first used (see the module doc).
    pub fn in_process(deadline: Duration) -> Self {
        Local {
            inherit_windows: true,
            ..Local::new(deadline)
        }
    }

    /// Of how many instances this one is (at least 1).
    pub fn share(&self) -> u64 {
        self.share.load(Ordering::Relaxed).max(1)
    }

    /// Sets the number of instances the limits and balances are shared among (the Redis
    /// engine's registry of live instances).
    pub fn set_share(&self, instances: u64) {
        self.share.store(instances.max(1), Ordering::Relaxed);
    }

    async fn account(&self, db: &Db, user_id: &str, now: i64) -> Result<Cell, Denied> {
        // Looked up before `entry`, which needs an owned key: no allocation once loaded.
        let known = self.accounts.get(user_id).map(|c| c.clone());
        let cell = match known {
            Some(cell) => cell,
            None => self
                .accounts
                .entry(user_id.to_string())
                .or_insert_with(|| Arc::new(OnceCell::new()))
                .clone(),
        };
        cell.get_or_try_init(|| {
            crate::storage::within(self.deadline, async {
                let spend = db.quota().spend(user_id, now).await?;
                let lots = db.quota().lots(user_id, now).await?;
                if self.inherit_windows {
                    let minute = now.div_euclid(WINDOW_MS);
                    let recent = db
                        .quota()
                        .admissions_since(user_id, (minute - 1) * WINDOW_MS)
                        .await?;
                    self.inherit(user_id, &recent, minute);
                }
                Ok(Mutex::new(AccountState::new(user_id, spend, lots)))
            })
        })
        .await
        .map_err(|e| {
            log::error!("loading quota for {user_id}: {e}");
            Denied::Unavailable
        })?;
        Ok(cell)
    }

    /// Seeds the windows of `user_id`'s scopes with `recent` admissions (the current and the
    /// previous minute's), for scopes this process has no window of yet: a window it already
    /// counts in holds its own admissions, which the database may not have yet.
    fn inherit(&self, user_id: &str, recent: &[MinuteAdmissions], minute: i64) {
        let mut seeded: std::collections::HashMap<String, Windows> = Default::default();
        for a in recent {
            let scope = match a.limit_mode {
                LimitMode::PerKey => ["key:", a.key_id.as_str()].concat(),
                LimitMode::AccountPool => ["acct:", user_id].concat(),
            };
            let w = seeded.entry(scope).or_insert(Windows {
                minute,
                ..Windows::default()
            });
            // A clock a little ahead on another host counts in the current minute.
            let slot = if a.minute >= minute {
                &mut w.curr
            } else if a.minute == minute - 1 {
                &mut w.prev
            } else {
                continue;
            };
            for (d, n) in [a.requests, a.input_tokens, a.output_tokens]
                .into_iter()
                .enumerate()
            {
                slot[d] = slot[d].saturating_add(n);
            }
        }
        for (scope, w) in seeded {
            self.windows.entry(scope).or_insert(w);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn reserve(
        &self,
        db: &Db,
        cfg: &QuotaConfig,
        who: &Identity,
        id: String,
        input: u64,
        output: u64,
        weights: Weights,
        now: i64,
    ) -> Result<Reservation, (Denied, RateView)> {
        let cell = self
            .account(db, &who.user.id, now)
            .await
            .map_err(|d| (d, RateView::default()))?;
        let Some(account) = cell.get() else {
            return Err((Denied::Unavailable, RateView::default()));
        };
        let mut acct = account.lock();
        acct.prune(now, cfg.reservation_timeout.as_millis() as i64);
        let tier = acct.effective_tier(cfg, who.user.manual_tier, who.user.max_tier, now);
        let limits = *cfg.limits(tier);
        let plan = RatePlan::for_key(who, &limits);
        let share = self.share();
        acct.limit_to_share(&limits, share, now);
        let minute = now.div_euclid(WINDOW_MS);
        let mut w = match self.windows.get_mut(&plan.scope) {
            Some(w) => w,
            None => self.windows.entry(plan.scope.clone()).or_default(),
        };
        w.roll(minute);
        let caps = [plan.rpm, plan.itpm, plan.otpm].map(|cap| cap.div_ceil(share));
        let costs = [1, input, output];
        let names = ["requests", "input tokens", "output tokens"];
        let view_now = |w: &Windows| rate_view(&caps, w, now);
        for d in 0..DIMS {
            if let Err(wait) = check(caps[d], w.prev[d], w.curr[d], costs[d], now) {
                return Err((
                    Denied::RateLimited {
                        retry_after_secs: wait,
                        what: names[d],
                    },
                    view_now(&w),
                ));
            }
        }
        let tokens = weights.estimate(input, output);
        if let Err(d) = acct.reserve(&id, tokens, 1, &limits, who.user.unlimited, now) {
            return Err((d, view_now(&w)));
        }
        for (slot, cost) in w.curr.iter_mut().zip(costs) {
            *slot += cost;
        }
        let rate = view_now(&w);
        Ok(Reservation {
            ticket: Ticket {
                id,
                user_id: who.user.id.clone(),
                tokens,
                requests: 1,
                input_cost: input,
                output_cost: output,
                weights,
                minute,
                plan,
                limits,
                unlimited: who.user.unlimited,
                in_process: true,
                leased: false,
            },
            rate,
        })
    }

    /// Whether a request of this key could be admitted at all: its per-minute request window
    /// has room for one more, its token windows are not over their limits, and (when `tokens`:
    /// the request will reserve some) the account has tokens left. Reads only; loads the
    /// account like a reservation would.
    pub async fn precheck(
        &self,
        db: &Db,
        cfg: &QuotaConfig,
        who: &Identity,
        tokens: bool,
        now: i64,
    ) -> Result<(), (Denied, RateView)> {
        let cell = self
            .account(db, &who.user.id, now)
            .await
            .map_err(|d| (d, RateView::default()))?;
        let Some(account) = cell.get() else {
            return Err((Denied::Unavailable, RateView::default()));
        };
        let acct = account.lock();
        let tier = acct.effective_tier(cfg, who.user.manual_tier, who.user.max_tier, now);
        let limits = *cfg.limits(tier);
        let plan = RatePlan::for_key(who, &limits);
        let caps = [plan.rpm, plan.itpm, plan.otpm];
        let names = ["requests", "input tokens", "output tokens"];
        if let Some(w) = self.windows.get(&plan.scope) {
            let mut w = *w;
            w.roll(now.div_euclid(WINDOW_MS));
            for d in 0..DIMS {
                let cost = u64::from(d == 0);
                if let Err(wait) = check(caps[d], w.prev[d], w.curr[d], cost, now) {
                    return Err((
                        Denied::RateLimited {
                            retry_after_secs: wait,
                            what: names[d],
                        },
                        rate_view(&caps, &w, now),
                    ));
                }
            }
        }
        if !who.user.unlimited {
            let (tokens_left, requests_left) = acct.available(&limits, now);
            if (tokens && tokens_left == 0) || requests_left == Some(0) {
                return Err((Denied::InsufficientQuota, RateView::default()));
            }
        }
        Ok(())
    }

    /// Settles a ticket this engine may not hold (a Redis reservation settled while Redis is
    /// unreachable, or one of ours after `clear`): loads the account first, so the usage is
    /// paid from its real balance, and pays on the balance it loaded, even if the account is
    /// forgotten meanwhile (the Redis engine forgets an account after each such settlement, and
    /// two settling at once must both pay). Without the database the whole usage goes on the
    /// allowance, so the record still adds up.
    pub async fn settle_loading(&self, db: &Db, t: &Ticket, used: Used, now: i64) -> Breakdown {
        let cell = match self.account(db, &t.user_id, now).await {
            Ok(cell) => cell,
            Err(d) => {
                log::error!("settling {} without its balance ({d:?})", t.id);
                return Breakdown {
                    user_id: t.user_id.clone(),
                    at_ms: now,
                    allowance_tokens: t.charge(used),
                    allowance_requests: t.requests,
                    lots: vec![],
                };
            }
        };
        self.settle_on(&cell, t, used, now)
    }

    /// The accounts this engine has loaded.
    pub fn account_ids(&self) -> Vec<String> {
        self.accounts.iter().map(|e| e.key().clone()).collect()
    }

    /// Forgets one account's balance: its next use reloads it from the database.
    pub fn forget(&self, user_id: &str) {
        self.accounts.remove(user_id);
    }

    /// Forgets every balance and window: the next use reloads from the database.
    pub fn clear(&self) {
        self.accounts.clear();
        self.windows.clear();
    }

    pub fn settle(&self, t: &Ticket, used: Used, now: i64) -> Breakdown {
        match self.accounts.get(&t.user_id).map(|c| c.clone()) {
            Some(cell) => self.settle_on(&cell, t, used, now),
            None => {
                self.correct_windows(t, used);
                Breakdown::default()
            }
        }
    }

    /// Pays `t` on the account balance in `cell` and corrects its per-minute windows.
    fn settle_on(&self, cell: &Cell, t: &Ticket, used: Used, now: i64) -> Breakdown {
        let breakdown = match cell.get() {
            Some(m) => m
                .lock()
                .settle(&t.id, t.charge(used), t.requests, &t.limits, now),
            None => Breakdown::default(),
        };
        self.correct_windows(t, used);
        breakdown
    }

    fn correct_windows(&self, t: &Ticket, used: Used) {
        if let Some(mut w) = self.windows.get_mut(&t.plan.scope) {
            correct(&mut w, t, used);
        }
    }

    pub fn add_lot(&self, lot: Lot) {
        if let Some(cell) = self.accounts.get(&lot.user_id) {
            if let Some(m) = cell.get() {
                m.lock().add_lot(lot);
            }
        }
    }

    /// Releases reservations whose requests never settled.
    pub fn reap(&self, now: i64, timeout_ms: i64) {
        for entry in self.accounts.iter() {
            if let Some(m) = entry.value().get() {
                let n = m.lock().prune(now, timeout_ms);
                if n > 0 {
                    log::warn!("released {n} stale reservation(s) of {}", entry.key());
                }
            }
        }
    }
}

fn rate_view(caps: &[u64; DIMS], w: &Windows, now: i64) -> RateView {
    let v = |d: usize| (caps[d] > 0).then(|| view(caps[d], w.prev[d], w.curr[d], now));
    RateView {
        requests: v(0),
        input_tokens: v(1),
        output_tokens: v(2),
    }
}

/// Replaces the admission-time token costs with the real ones in whichever window was charged.
fn correct(w: &mut Windows, t: &Ticket, used: Used) {
    let slot = if w.minute == t.minute {
        &mut w.curr
    } else if w.minute == t.minute + 1 {
        &mut w.prev
    } else {
        return;
    };
    for (d, (charged, actual)) in [
        (1, (t.input_cost, used.input_tokens)),
        (2, (t.output_cost, used.output_tokens)),
    ] {
        slot[d] = slot[d].saturating_sub(charged).saturating_add(actual);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TierLimits;
    use crate::quota::RatePlan;

    fn ticket(id: &str) -> Ticket {
        Ticket {
            id: id.into(),
            user_id: "usr_1".into(),
            tokens: 100,
            requests: 1,
            input_cost: 10,
            output_cost: 90,
            weights: Weights::default(),
            minute: 0,
            plan: RatePlan {
                scope: "acct:usr_1".into(),
                rpm: 0,
                itpm: 0,
                otpm: 0,
            },
            limits: TierLimits {
                weekly_tokens: 1_000,
                ..TierLimits::default()
            },
            unlimited: false,
            in_process: true,
            leased: false,
        }
    }

    /// The Redis engine settles a fallback ticket with `settle_loading` and then forgets the
    /// account; another settlement of the same account that loaded it just before must still
    /// pay (it used to find the account gone and record nothing paid).
    #[tokio::test]
    async fn a_settlement_pays_on_the_balance_it_loaded_even_if_forgotten_meanwhile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::connect(&format!("sqlite://{}/q.db", dir.path().display()))
            .await
            .expect("db");
        let local = Local::new(Duration::from_secs(5));
        let used = Used {
            input_tokens: 10,
            output_tokens: 30,
            cached_input_tokens: 0,
        };
        let cell = local.account(&db, "usr_1", 0).await.expect("loaded");
        local.forget("usr_1");
        let paid = local.settle_on(&cell, &ticket("t1"), used, 0);
        assert_eq!((paid.allowance_tokens, paid.allowance_requests), (40, 1));
        // And through the public path: loaded, forgotten by a concurrent settlement, paid.
        let paid = local.settle_loading(&db, &ticket("t2"), used, 0).await;
        assert_eq!((paid.allowance_tokens, paid.allowance_requests), (40, 1));
    }
}
