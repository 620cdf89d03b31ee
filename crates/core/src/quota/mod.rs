//! Quota: reservation before a request is forwarded (check 9), settlement after it ends.
//!
//! Two engines keep the hot balances with the same semantics:
//! - `local`: in-process state, exact for one instance (the embedded default);
//! - `shared`: Redis with atomic Lua scripts, exact across every instance sharing it — one
//!   round trip to reserve, one to settle.
//!
//! Both start from the database (`storage::quota`), which stays the record of truth: every
//! settlement's breakdown is written there in the same transaction as its usage event.
//!
//! The Redis engine never waits on Redis longer than `storage.redis_timeout_ms`; while Redis is
//! unreachable a circuit breaker (`breaker`) stops calling it and the engine follows
//! `storage.redis_outage`: serve from an in-process engine or refuse (docs/operations.md, "Redis and database outages").

pub mod account;
mod ahead;
pub mod breaker;
mod drains;
pub mod lease;
pub mod limits;
mod loading;
pub mod local;
pub mod redis_conn;
mod renewal;
mod scripts;
pub mod shared;
pub mod tiers;
mod upkeep;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::{QuotaConfig, TierLimits};
use crate::domain::Breakdown;
use crate::domain::LimitMode;
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::storage::Db;
use crate::util::{now_ms, random_base62};
use limits::WindowView;

/// What a request consumed, as finally known, in raw tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The part of `input_tokens` read from the provider's cache.
    pub cached_input_tokens: u64,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    InsufficientQuota,
    RateLimited {
        retry_after_secs: u64,
        what: &'static str,
    },
    /// The balance store could not be reached (database or Redis down).
    Unavailable,
}

/// Per-minute windows of one scope, as seen when reserving: the developer API renders them as
/// the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateView {
    pub requests: Option<WindowView>,
    pub input_tokens: Option<WindowView>,
    pub output_tokens: Option<WindowView>,
}

/// The per-minute limits that apply to a key, and the scope whose windows they count in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatePlan {
    /// `key:<id>` for keys with their own windows, `acct:<id>` for the account pool.
    pub scope: String,
    pub rpm: u64,
    pub itpm: u64,
    pub otpm: u64,
}

impl RatePlan {
    pub fn for_key(who: &Identity, tier: &TierLimits) -> RatePlan {
        let k = &who.key;
        // Built on every request: `concat` allocates the exact size once, without `format!`'s
        // machinery and growing buffer.
        let scope = match k.limit_mode {
            LimitMode::PerKey => ["key:", k.id.as_str()].concat(),
            LimitMode::AccountPool => ["acct:", who.user.id.as_str()].concat(),
        };
        RatePlan {
            scope,
            rpm: k.custom_rpm.unwrap_or(tier.requests_per_minute),
            itpm: k.custom_input_tpm.unwrap_or(tier.input_tokens_per_minute),
            otpm: k.custom_output_tpm.unwrap_or(tier.output_tokens_per_minute),
        }
    }
}

/// What one reservation holds, enough to settle it on any engine.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub id: String,
    pub user_id: String,
    /// Quota tokens held (the estimate at the model's weights).
    pub tokens: u64,
    pub requests: u64,
    /// Raw tokens counted in the per-minute windows.
    pub input_cost: u64,
    pub output_cost: u64,
    /// The model's weights as they were at admission: the settlement charges at these, so a
    /// reload never reprices a request in flight.
    pub weights: Weights,
    pub minute: i64,
    pub plan: RatePlan,
    pub limits: TierLimits,
    pub unlimited: bool,
    /// Held by an in-process engine (the Redis engine's fallback during an outage), not Redis.
    pub in_process: bool,
    /// Admitted against this instance's lease on the account (`lease`), not reserved alone.
    pub leased: bool,
}

impl Ticket {
    /// What this ticket reserved, as the usage journal keeps it (`journal::Reserved`).
    pub fn reserved(&self) -> crate::journal::Reserved {
        crate::journal::Reserved {
            tokens: self.tokens,
            requests: self.requests,
            weekly_tokens: self.limits.weekly_tokens,
            weekly_requests: self.limits.weekly_requests,
            unlimited: self.unlimited,
        }
    }

    /// The quota tokens `used` costs at this request's weights: what settlement pays and the
    /// usage event records.
    pub fn charge(&self, used: Used) -> u64 {
        self.weights.charge(
            used.input_tokens,
            used.cached_input_tokens,
            used.output_tokens,
        )
    }
}

impl crate::journal::Payer for Engine {
    fn pay_interrupted(
        &self,
        user_id: &str,
        event_id: &str,
        reserved: crate::journal::Reserved,
        created_at: i64,
    ) -> impl std::future::Future<Output = Breakdown> + Send {
        Engine::pay_interrupted(self, user_id, event_id, reserved, created_at)
    }
}

/// Receives a settlement's breakdown once it is paid.
pub type OnPaid = Box<dyn FnOnce(Breakdown) + Send>;

/// A settlement [`Engine::settle_now`] could not make without waiting: settle the ticket with
/// [`Engine::settle`] on a task, then hand the breakdown to `on_paid`.
pub struct Later {
    pub ticket: Box<Ticket>,
    pub on_paid: OnPaid,
}

/// A granted reservation. Settle it exactly once with `Engine::settle`; `InFlight` guarantees
/// that on every exit path.
#[derive(Debug)]
pub struct Reservation {
    pub ticket: Ticket,
    pub rate: RateView,
}

pub enum Backend {
    Local(local::Local),
    Shared(Box<shared::Shared>),
}

pub struct Engine {
    backend: Backend,
    db: Db,
    instance: String,
    seq: AtomicU64,
    /// Keys refused a reservation lately, until when (ms): lets [`Engine::precheck`] refuse
    /// without a round trip to Redis.
    refused: dashmap::DashMap<String, (i64, Denied), crate::util::FastHash>,
}

/// How long a key refused for want of quota is refused by [`Engine::precheck`] without asking
/// the engine again (a purchase shows within this).
const REFUSED_QUOTA_MS: i64 = 2_000;
/// Keys remembered as refused at most; beyond, the memory is cleared.
const REFUSED_MAX: usize = 100_000;

pub type Quota = Arc<Engine>;

impl Engine {
    pub fn new(backend: Backend, db: Db) -> Quota {
        Arc::new(Engine {
            backend,
            db,
            instance: random_base62(8),
            seq: AtomicU64::new(0),
            refused: Default::default(),
        })
    }

    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Shared(_))
    }

    /// Whether the shared store (Redis) answers a PING; always fine in-process. For `/ready`.
    pub async fn ping(&self) -> Result<(), String> {
        match &self.backend {
            Backend::Local(_) => Ok(()),
            Backend::Shared(s) => s.ping().await,
        }
    }

    /// Check 9: reserves 1 request plus `input + output` tokens at the model's `weights` in
    /// quota tokens, after the per-minute limits (which count the raw tokens). The refusal
    /// carries the rate-limit view for the 429's headers.
    pub async fn reserve(
        &self,
        cfg: &QuotaConfig,
        who: &Identity,
        input: u64,
        output: u64,
        weights: Weights,
    ) -> Result<Reservation, (Denied, RateView)> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let id = [self.instance.as_str(), "-", itoa::Buffer::new().format(seq)].concat();
        let now = now_ms();
        let result = match &self.backend {
            Backend::Local(l) => {
                l.reserve(&self.db, cfg, who, id, input, output, weights, now)
                    .await
            }
            Backend::Shared(s) => {
                s.reserve(&self.db, cfg, who, id, input, output, weights, now)
                    .await
            }
        };
        if let Err((denied, _)) = &result {
            let until = match denied {
                Denied::InsufficientQuota => Some(now + REFUSED_QUOTA_MS),
                Denied::RateLimited {
                    retry_after_secs,
                    what: "requests",
                } => Some(now + *retry_after_secs as i64 * 1000),
                _ => None,
            };
            if let Some(until) = until {
                if self.refused.len() >= REFUSED_MAX {
                    self.refused.clear();
                }
                self.refused
                    .insert(who.key.id.clone(), (until, denied.clone()));
            }
        }
        result
    }

    /// Before a large body is read and parsed: refuses a key that cannot be admitted whatever
    /// the body holds (no request left in its per-minute window, no quota left), so a key with
    /// nothing left cannot make the gateway read and parse megabytes. The in-process engine
    /// checks exactly; the Redis engine refuses a key refused on this instance within the last
    /// moments (its reservation is one round trip that this would double).
    ///
    /// `tokens`: the request will reserve tokens (token counting reserves none: a key out of
    /// tokens may still count).
    pub async fn precheck(
        &self,
        cfg: &QuotaConfig,
        who: &Identity,
        tokens: bool,
    ) -> Result<(), Denied> {
        let now = now_ms();
        if let Some((until, denied)) = self.refused.get(&who.key.id).map(|r| r.clone()) {
            if until > now && (tokens || denied != Denied::InsufficientQuota) {
                return Err(match denied {
                    Denied::RateLimited { what, .. } => Denied::RateLimited {
                        retry_after_secs: ((until - now) as u64).div_ceil(1000).max(1),
                        what,
                    },
                    other => other,
                });
            }
            self.refused.remove_if(&who.key.id, |_, (u, _)| *u <= now);
        }
        match &self.backend {
            Backend::Local(l) => l
                .precheck(&self.db, cfg, who, tokens, now)
                .await
                .map_err(|(d, _)| d),
            Backend::Shared(_) => Ok(()),
        }
    }

    /// Settles without waiting where the engine can: in process at once, or into this
    /// instance's lease on the account (`on_paid` runs when the lease's next renewal has paid
    /// it, within `lease::FLUSH_EVERY`), so the request path never waits for Redis or spawns a
    /// task per request. Otherwise both come back in [`Later`].
    pub fn settle_now<F>(&self, ticket: Ticket, used: Used, on_paid: F) -> Result<(), Later>
    where
        F: FnOnce(Breakdown) + Send + 'static,
    {
        match &self.backend {
            Backend::Local(l) => {
                on_paid(l.settle(&ticket, used, now_ms()));
                Ok(())
            }
            Backend::Shared(s) if ticket.leased => {
                s.settle_into_lease(ticket, used, Box::new(on_paid))
            }
            Backend::Shared(_) => Err(Later {
                ticket: Box::new(ticket),
                on_paid: Box::new(on_paid),
            }),
        }
    }

    /// Settles: releases the reservation and pays the real usage. Exactly once per ticket.
    pub async fn settle(&self, ticket: &Ticket, used: Used) -> Breakdown {
        match &self.backend {
            Backend::Local(l) => l.settle(ticket, used, now_ms()),
            Backend::Shared(s) => s.settle(&self.db, ticket, used, now_ms()).await,
        }
    }

    /// Pays what a request admitted by a process that died before settling it had reserved
    /// (the usage journal's replay): from the account's real balance, through this engine so
    /// the hot balance (in process or in Redis) and the database agree.
    pub async fn pay_interrupted(
        &self,
        user_id: &str,
        event_id: &str,
        r: crate::journal::Reserved,
        created_at: i64,
    ) -> Breakdown {
        // A ticket for no held reservation, whose usage costs exactly what was reserved and
        // moves no per-minute window (used equals cost).
        let ticket = Ticket {
            id: ["replay-", event_id].concat(),
            user_id: user_id.to_owned(),
            tokens: r.tokens,
            requests: r.requests,
            input_cost: r.tokens,
            output_cost: 0,
            weights: Weights::default(),
            minute: created_at.div_euclid(limits::WINDOW_MS),
            plan: RatePlan {
                scope: ["acct:", user_id].concat(),
                rpm: 0,
                itpm: 0,
                otpm: 0,
            },
            limits: TierLimits {
                weekly_tokens: r.weekly_tokens,
                weekly_requests: r.weekly_requests,
                ..TierLimits::default()
            },
            unlimited: r.unlimited,
            // Settled where the engine keeps the balance, with no Redis reservation to release.
            in_process: true,
            leased: false,
        };
        let used = Used {
            input_tokens: r.tokens,
            output_tokens: 0,
            cached_input_tokens: 0,
        };
        let now = now_ms();
        match &self.backend {
            Backend::Local(l) => l.settle_loading(&self.db, &ticket, used, now).await,
            Backend::Shared(s) => s.settle(&self.db, &ticket, used, now).await,
        }
    }

    /// Keeps hot balances in step with lots granted elsewhere and reaps reservations whose
    /// request never settled. Runs until the process ends. With Redis, a second task watches
    /// the connection (probes while the breaker is open) and sweeps stale reservations.
    pub async fn run_maintenance(self: Arc<Self>, timeout: std::time::Duration) {
        if self.is_shared() {
            tokio::spawn(self.clone().run_redis_keeper(timeout));
        }
        let mut cursor = now_ms();
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            let started = now_ms();
            match self.db.quota().lots_created_since(cursor - 5_000).await {
                Ok(lots) => {
                    let mut all_added = true;
                    for lot in lots {
                        match &self.backend {
                            Backend::Local(l) => l.add_lot(lot),
                            Backend::Shared(s) => all_added &= s.add_lot(lot).await,
                        }
                    }
                    // A lot Redis missed is offered again next time (adding is idempotent).
                    if all_added {
                        cursor = started;
                    }
                }
                Err(e) => log::warn!("quota lot feed: {e}"),
            }
            if n.is_multiple_of(4) {
                match &self.backend {
                    Backend::Local(l) => l.reap(now_ms(), timeout.as_millis() as i64),
                    Backend::Shared(_) => {} // swept by run_redis_keeper
                }
            }
        }
    }

    /// Redis's own upkeep, apart from the database feed so a slow database cannot delay it:
    /// every `PROBE_EVERY` while the breaker is open, a fresh connection is tried (and, once
    /// one answers, what was served in process is reconciled and the breaker closes); every
    /// second while it is closed, reservations found older than `timeout` are released (on one
    /// Redis, by the next second's heartbeat).
    async fn run_redis_keeper(self: Arc<Self>, timeout: std::time::Duration) {
        let Backend::Shared(s) = &self.backend else {
            return;
        };
        tokio::spawn(self.clone().run_lease_renewals(timeout));
        tokio::spawn(self.clone().run_drain_listener());
        let mut tick = tokio::time::interval(shared::PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = 0;
        loop {
            tick.tick().await;
            if s.is_down() {
                s.recover(&self.db).await;
            } else if now_ms() - last_sweep >= 1_000 {
                last_sweep = now_ms();
                s.heartbeat(last_sweep, timeout.as_millis() as i64).await;
            }
        }
    }
}

impl Engine {
    /// Gives every lease this instance holds back to Redis, booking what was settled within
    /// them, so a stopped instance leaves no share held until the sweep. The last step of a
    /// graceful stop, once nothing is in flight.
    pub async fn give_back_leases(&self, timeout: std::time::Duration) {
        let Backend::Shared(s) = &self.backend else {
            return;
        };
        s.leases.close();
        // A renewal under way when the stop began is waited for, and given back at the next
        // round; two seconds at most.
        for _ in 0..20 {
            s.renew_leases(&self.db, timeout.as_millis() as i64).await;
            if s.is_down() || !s.leases.holding() {
                break;
            }
            tokio::time::sleep(lease::FLUSH_EVERY).await;
        }
    }

    /// Listens for other instances' drains (`drains`) until the process ends.
    async fn run_drain_listener(self: Arc<Self>) {
        if let Backend::Shared(s) = &self.backend {
            s.listen_for_drains().await;
        }
    }

    /// Pays what was settled against this instance's leases and renews them, every
    /// `lease::FLUSH_EVERY`, apart from the keeper so a slow probe cannot delay settlements.
    async fn run_lease_renewals(self: Arc<Self>, timeout: std::time::Duration) {
        let Backend::Shared(s) = &self.backend else {
            return;
        };
        let mut tick = tokio::time::interval(lease::FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            s.renew_leases(&self.db, timeout.as_millis() as i64).await;
        }
    }
}
