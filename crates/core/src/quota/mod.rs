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
//! `storage.redis_outage`: serve from an in-process engine or refuse (README, "Redis outages").

pub mod account;
pub mod breaker;
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

use http::{HeaderName, HeaderValue};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

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

/// Per-minute windows of one scope, as seen when reserving: feeds the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateView {
    pub requests: Option<WindowView>,
    pub input_tokens: Option<WindowView>,
    pub output_tokens: Option<WindowView>,
}

impl RateView {
    /// OpenAI-style headers (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, where
    /// tokens are input tokens) plus explicit input/output token headers, as a list (for the
    /// gateway's own answers; a relayed answer gets them through [`RateView::header_map`]).
    pub fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let mut h = Vec::with_capacity(12);
        self.each(|name, value| h.push((name.clone(), value)));
        h
    }

    /// A header map holding the headers of [`RateView::headers`], for a relayed answer (which
    /// adds the provider's headers to it). Every relayed answer carries twelve of these, and a
    /// map hashes each name it is given byte by byte.
    /// So the names are hashed once: each set of windows has a template map, built on first
    /// use, that is cloned (names and hashes copied, not computed) and given this view's
    /// values in place, in the order [`RateView::each`] yields them for that set.
    pub fn header_map(&self) -> http::HeaderMap {
        static TEMPLATES: [OnceLock<http::HeaderMap>; 8] = [const { OnceLock::new() }; 8];
        let set = usize::from(self.requests.is_some())
            | usize::from(self.input_tokens.is_some()) << 1
            | usize::from(self.output_tokens.is_some()) << 2;
        let template = TEMPLATES[set].get_or_init(|| {
            // Room for the provider's headers too: a clone keeps the index table's size, so
            // adding them does not rebuild it.
            // Empty values: a template never holds a request's numbers.
            let mut map = http::HeaderMap::with_capacity(32);
            self.each(|name, _| {
                map.append(name.clone(), HeaderValue::from_static(""));
            });
            map
        });
        let mut map = template.clone();
        let mut slots = map.values_mut();
        self.each(|_, value| {
            if let Some(slot) = slots.next() {
                *slot = value;
            }
        });
        map
    }

    /// Calls `f` with each header. The limit and remaining numbers are written into one
    /// buffer that every value is a slice of: two allocations per answer instead of one per
    /// number, plus one more for each value shared by two headers. `tokens` and
    /// `input-tokens` describe the same window: its values are rendered once and shared.
    fn each(&self, mut f: impl FnMut(&'static HeaderName, HeaderValue)) {
        let windows = [self.requests, self.input_tokens, self.output_tokens];
        let mut text = Vec::with_capacity(6 * 20);
        let mut spans = [(0usize, 0usize, 0usize); 3];
        for (window, span) in windows.iter().zip(spans.iter_mut()) {
            if let Some(v) = window {
                let start = text.len();
                text.extend_from_slice(itoa::Buffer::new().format(v.limit).as_bytes());
                let mid = text.len();
                text.extend_from_slice(itoa::Buffer::new().format(v.remaining).as_bytes());
                *span = (start, mid, text.len());
            }
        }
        let text = bytes::Bytes::from(text);
        // Digits only: a slice is always a valid header value.
        let value = |from: usize, to: usize| HeaderValue::from_maybe_shared(text.slice(from..to));
        let names = [
            &RATE_HEADERS[0..1],
            &RATE_HEADERS[1..3],
            &RATE_HEADERS[3..4],
        ];
        for ((window, (start, mid, end)), names) in windows.iter().zip(spans).zip(names) {
            let Some(v) = window else { continue };
            let (Ok(limit), Ok(remaining)) = (value(start, mid), value(mid, end)) else {
                continue;
            };
            let reset = reset_value(v.reset_secs);
            for [limit_name, remaining_name, reset_name] in names {
                f(limit_name, limit.clone());
                f(remaining_name, remaining.clone());
                f(reset_name, reset.clone());
            }
        }
    }
}

/// `x-ratelimit-reset-*` values of a per-minute window (`0s` to `60s`), never allocated.
const RESET_VALUES: [&str; 61] = [
    "0s", "1s", "2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s", "10s", "11s", "12s", "13s", "14s",
    "15s", "16s", "17s", "18s", "19s", "20s", "21s", "22s", "23s", "24s", "25s", "26s", "27s",
    "28s", "29s", "30s", "31s", "32s", "33s", "34s", "35s", "36s", "37s", "38s", "39s", "40s",
    "41s", "42s", "43s", "44s", "45s", "46s", "47s", "48s", "49s", "50s", "51s", "52s", "53s",
    "54s", "55s", "56s", "57s", "58s", "59s", "60s",
];

fn reset_value(secs: u64) -> HeaderValue {
    match RESET_VALUES.get(secs as usize) {
        Some(v) => HeaderValue::from_static(v),
        None => {
            let mut s = itoa::Buffer::new().format(secs).to_string();
            s.push('s');
            HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("0s"))
        }
    }
}

/// `x-ratelimit-{limit,remaining,reset}-*` for requests, tokens (input), input and output tokens.
/// Built at compile time: `HeaderName::from_static` called at run time validates every byte of
/// its name, twelve names on every response.
static RATE_HEADERS: [[HeaderName; 3]; 4] = [
    [
        HeaderName::from_static("x-ratelimit-limit-requests"),
        HeaderName::from_static("x-ratelimit-remaining-requests"),
        HeaderName::from_static("x-ratelimit-reset-requests"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-tokens"),
        HeaderName::from_static("x-ratelimit-reset-tokens"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-input-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-input-tokens"),
        HeaderName::from_static("x-ratelimit-reset-input-tokens"),
    ],
    [
        HeaderName::from_static("x-ratelimit-limit-output-tokens"),
        HeaderName::from_static("x-ratelimit-remaining-output-tokens"),
        HeaderName::from_static("x-ratelimit-reset-output-tokens"),
    ],
];

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
    /// second while it is closed, reservations older than `timeout` are released.
    async fn run_redis_keeper(self: Arc<Self>, timeout: std::time::Duration) {
        let Backend::Shared(s) = &self.backend else {
            return;
        };
        tokio::spawn(self.clone().run_lease_renewals(timeout));
        let mut tick = tokio::time::interval(shared::PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = 0;
        loop {
            tick.tick().await;
            if s.is_down() {
                s.recover(&self.db).await;
            } else if now_ms() - last_sweep >= 1_000 {
                last_sweep = now_ms();
                s.sweep(last_sweep, timeout.as_millis() as i64).await;
            }
        }
    }
}

impl Engine {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn window(limit: u64, remaining: u64, reset_secs: u64) -> Option<WindowView> {
        Some(WindowView {
            limit,
            remaining,
            reset_secs,
        })
    }

    #[test]
    fn rate_headers_carry_each_windows_numbers() {
        let view = RateView {
            requests: window(60, 59, 12),
            input_tokens: window(100_000, 98_765, 7),
            output_tokens: window(u64::MAX, 0, 75),
        };
        let list: Vec<(String, String)> = view
            .headers()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect();
        let expected = [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "12s"),
            ("x-ratelimit-limit-tokens", "100000"),
            ("x-ratelimit-remaining-tokens", "98765"),
            ("x-ratelimit-reset-tokens", "7s"),
            ("x-ratelimit-limit-input-tokens", "100000"),
            ("x-ratelimit-remaining-input-tokens", "98765"),
            ("x-ratelimit-reset-input-tokens", "7s"),
            ("x-ratelimit-limit-output-tokens", "18446744073709551615"),
            ("x-ratelimit-remaining-output-tokens", "0"),
            ("x-ratelimit-reset-output-tokens", "75s"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(list, expected);

        // The map form holds the same headers.
        let map = view.header_map();
        assert_eq!(map.len(), 12);
        for (name, value) in &expected {
            assert_eq!(map[name.as_str()], value.as_str(), "{name}");
        }
    }

    #[test]
    fn header_maps_from_templates_hold_each_views_own_values() {
        // Every set of windows, each seen twice with different numbers: the second map must
        // hold its own values, not the ones the template was built from.
        for set in 0..8u64 {
            for round in 0..2u64 {
                let w = |bit: u64, base: u64| {
                    (set >> bit & 1 == 1)
                        .then(|| window(base + round, base / 2 + round, bit * 10 + round))
                        .flatten()
                };
                let view = RateView {
                    requests: w(0, 100),
                    input_tokens: w(1, 2_000),
                    output_tokens: w(2, 30_000),
                };
                let from_map: Vec<(HeaderName, HeaderValue)> = view
                    .header_map()
                    .iter()
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect();
                assert_eq!(from_map, view.headers(), "set {set} round {round}");
            }
        }
    }

    #[test]
    fn windows_without_limits_add_no_headers() {
        let view = RateView {
            requests: None,
            input_tokens: None,
            output_tokens: window(5, 4, 1),
        };
        let names: Vec<String> = view.headers().iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            names,
            [
                "x-ratelimit-limit-output-tokens",
                "x-ratelimit-remaining-output-tokens",
                "x-ratelimit-reset-output-tokens"
            ]
        );
        assert!(RateView::default().headers().is_empty());
    }
}
