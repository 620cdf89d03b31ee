//! Leases: admission without a Redis round trip in the common case.
//!
//! Each instance holds, per account it serves, a lease: a reservation in Redis (id
//! `L:<instance>`) carved atomically out of the account's balance, plus a chunk of each
//! per-minute window the account's keys count in. Requests are admitted and settled here
//! against it; every `FLUSH_EVERY` one `lease.lua` call per busy account pays what was settled
//! (each settlement gets its own breakdown, allowance first then lots, as `settle.lua` gives),
//! gives back what is not needed and carves the next share. Accounts are renewed concurrently,
//! so on one Redis the calls of a round share one write on the connection.
//!
//! Exactness:
//! - the lease is a reservation, so what all instances admit never exceeds the balance;
//! - a lease takes at most 1/`SHARE` of what is left beyond every other reservation and lease;
//!   once that share is smaller than one request, or a window has less than `SHARE` chunks left,
//!   the account is drained: for a while no instance keeps or takes a share, each request is
//!   reserved exactly on its own (`reserve.lua`), and a reservation refused while leases still
//!   hold unused shares waits for them to come back (`DRAIN_WAIT`) before it is refused, so the
//!   last tokens are neither overspent nor stranded;
//! - a window chunk is counted in the window before any of it is used, so a per-minute limit
//!   counts at least what was admitted; output tokens are corrected to the real amount when the
//!   settlement is paid (within `FLUSH_EVERY`, as one instance corrects at settlement).
//!
//! The lease size follows the account's request rate on this instance: enough for `HORIZON_MS`
//! of its traffic, doubled each time it runs out between renewals.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value as RedisValue;
use tokio::sync::{oneshot, Notify};

use super::limits::{WindowView, WINDOW_MS};
use super::scripts::{account_keys, as_i64, as_string, breakdown, on_allowance, rate_key};
use super::shared::{LoadError, Shared, Unreachable, ACCOUNT_TTL_SECS};
use super::{RatePlan, RateView, Reservation, Ticket, Used};
use crate::config::{QuotaConfig, TierLimits};
use crate::domain::{Breakdown, Tier};
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::storage::Db;
use crate::util::{now_ms, FastHash};

/// How often busy accounts' settlements are paid and their leases renewed.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// A lease is renewed at least this often (ms), so a drain reaches it within this.
const RENEW_MS: i64 = 250;
/// A lease unused this long (ms) is given back.
const IDLE_MS: i64 = 3_000;
/// After a drain, how long (ms) this instance reserves the account's requests exactly before
/// it asks for a lease again.
const EXACT_MS: i64 = 1_000;
/// A lease takes at most 1/SHARE of what is left.
pub const SHARE: u64 = 4;
/// A lease covers this much (ms) of the account's traffic on this instance.
const HORIZON_MS: f64 = 500.0;
/// The most requests one lease covers.
const MAX_REQUESTS: f64 = 100_000.0;
/// How long a request waits for a renewal in progress before it is reserved exactly.
const WAIT_FOR_RENEWAL: Duration = Duration::from_millis(500);
/// How long a reservation refused while leases hold unused shares waits before asking again,
/// and how often it asks.
pub const DRAIN_WAIT: Duration = Duration::from_millis(RENEW_MS as u64 + 20);
pub const DRAIN_TRIES: usize = 3;

/// Requests, input tokens, output tokens.
type Dims = [u64; 3];

/// This instance's share of one scope's per-minute windows.
#[derive(Debug, Clone, Default)]
struct Chunk {
    minute: i64,
    caps: Dims,
    granted: Dims,
    used: Dims,
    /// The window's sliding count when the chunk was granted, the chunk not included.
    counted: Dims,
    last_used: i64,
}

struct Pending {
    ticket: Ticket,
    used: Used,
    done: oneshot::Sender<Breakdown>,
}

#[derive(Default)]
struct Slot {
    /// Tokens and requests the lease holds in Redis.
    held: [u64; 2],
    /// Held by admitted requests not settled yet.
    inflight: [u64; 2],
    /// Settled here, paid at the next renewal; `pending_cost` is what they held.
    pending: Vec<Pending>,
    pending_cost: [u64; 2],
    chunks: HashMap<String, Chunk>,
    exact_until: i64,
    renewing: bool,
    limits: TierLimits,
    unlimited: bool,
    /// What the next renewal must at least make room for (a request that did not fit).
    need: Dims,
    admitted: u64,
    rate_per_s: f64,
    avg_in: f64,
    avg_out: f64,
    /// Average quota tokens reserved per request (the raw averages at the models' weights):
    /// sizes the lease's tokens, while `avg_in`/`avg_out` size the per-minute windows' chunks.
    avg_tokens: f64,
    want: f64,
    last_renewal: i64,
    last_used: i64,
}

impl Slot {
    fn free(&self) -> [u64; 2] {
        [0, 1].map(|i| self.held[i].saturating_sub(self.inflight[i] + self.pending_cost[i]))
    }

    /// Whether the periodic renewal has something to do for this account.
    fn due(&self, now: i64) -> bool {
        let idle = now - self.last_used > IDLE_MS && self.inflight == [0, 0];
        !self.pending.is_empty()
            || (idle && now - self.last_renewal >= RENEW_MS)
            || (self.held != [0, 0] && now - self.last_renewal >= RENEW_MS)
            || self
                .chunks
                .values()
                .any(|c| c.granted != [0; 3] && now - self.last_renewal >= RENEW_MS)
    }
}

#[derive(Default)]
struct Cell {
    slot: Mutex<Slot>,
    renewed: Notify,
}

/// What admission against the lease decided.
enum Admit {
    Granted(Box<Reservation>),
    /// Reserve this request on its own.
    Exact,
    /// The lease is too small: renew it, then try again.
    Renew,
    /// A renewal is under way: wait for it.
    Wait(Arc<Cell>),
}

/// This instance's leases, by account.
pub struct Leases {
    id: String,
    cells: dashmap::DashMap<String, Arc<Cell>, FastHash>,
}

/// The arguments of one `lease.lua` call and what to do with its answer.
struct Call {
    keys: Vec<String>,
    args: Vec<String>,
    pending: Vec<Pending>,
    /// Tokens and requests the lease keeps for admitted requests plus the unused part kept.
    kept: [u64; 2],
    scopes: Vec<String>,
    idle: bool,
}

impl Leases {
    pub fn new(instance: &str) -> Leases {
        Leases {
            id: format!("L:{instance}"),
            cells: Default::default(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        plan: &RatePlan,
        limits: &TierLimits,
        who: &Identity,
        id: &str,
        input: u64,
        output: u64,
        weights: Weights,
        now: i64,
    ) -> Admit {
        let user_id = &who.user.id;
        let cell = match self.cells.get(user_id) {
            Some(c) => c.clone(),
            None => self.cells.entry(user_id.clone()).or_default().clone(),
        };
        let mut guard = cell.slot.lock();
        if guard.renewing {
            drop(guard);
            return Admit::Wait(cell);
        }
        let s = &mut *guard;
        s.last_used = now;
        s.limits = *limits;
        s.unlimited = who.user.unlimited;
        if s.exact_until > now {
            return Admit::Exact;
        }
        let tokens = weights.estimate(input, output);
        let caps = [plan.rpm, plan.itpm, plan.otpm];
        let costs = [1, input, output];
        let minute = now.div_euclid(WINDOW_MS);
        let free = s.free();
        let quota_fits = free[0] >= tokens && free[1] >= 1;
        let windowed = caps != [0; 3];
        let window_fits = !windowed
            || s.chunks.get(&plan.scope).is_some_and(|c| {
                c.minute == minute
                    && (0..3).all(|d| caps[d] == 0 || c.used[d] + costs[d] <= c.granted[d])
            });
        if !(quota_fits && window_fits) {
            s.need = [
                tokens.max(s.need[0]),
                input.max(s.need[1]),
                output.max(s.need[2]),
            ];
            if windowed {
                let chunk = s.chunks.entry(plan.scope.clone()).or_default();
                chunk.caps = caps;
                chunk.last_used = now;
            }
            return Admit::Renew;
        }
        s.inflight[0] += tokens;
        s.inflight[1] += 1;
        s.admitted += 1;
        if s.avg_in == 0.0 && s.avg_out == 0.0 && s.avg_tokens == 0.0 {
            (s.avg_in, s.avg_out, s.avg_tokens) = (input as f64, output as f64, tokens as f64);
        } else {
            s.avg_in += (input as f64 - s.avg_in) / 16.0;
            s.avg_out += (output as f64 - s.avg_out) / 16.0;
            s.avg_tokens += (tokens as f64 - s.avg_tokens) / 16.0;
        }
        let mut rate = RateView::default();
        if let Some(c) = s.chunks.get_mut(&plan.scope).filter(|_| windowed) {
            c.last_used = now;
            for (used, cost) in c.used.iter_mut().zip(costs) {
                *used += cost;
            }
            let reset_secs = ((WINDOW_MS - now.rem_euclid(WINDOW_MS)) as u64).div_ceil(1000);
            let view = |d: usize| {
                (caps[d] > 0).then(|| WindowView {
                    limit: caps[d],
                    remaining: caps[d].saturating_sub(c.counted[d] + c.used[d]),
                    reset_secs,
                })
            };
            rate = RateView {
                requests: view(0),
                input_tokens: view(1),
                output_tokens: view(2),
            };
        }
        Admit::Granted(Box::new(Reservation {
            ticket: Ticket {
                id: id.to_string(),
                user_id: user_id.clone(),
                tokens,
                requests: 1,
                input_cost: input,
                output_cost: output,
                weights,
                minute,
                plan: plan.clone(),
                limits: *limits,
                unlimited: who.user.unlimited,
                in_process: false,
                leased: true,
            },
            rate,
        }))
    }

    /// Moves a settled request from the lease's admitted ones to those the next renewal pays;
    /// the breakdown arrives once it is paid.
    fn settle(&self, t: &Ticket, used: Used) -> Option<oneshot::Receiver<Breakdown>> {
        let cell = self.cells.get(&t.user_id)?.clone();
        let (tx, rx) = oneshot::channel();
        let mut s = cell.slot.lock();
        s.inflight[0] = s.inflight[0].saturating_sub(t.tokens);
        s.inflight[1] = s.inflight[1].saturating_sub(t.requests);
        s.pending_cost[0] += t.tokens;
        s.pending_cost[1] += t.requests;
        s.pending.push(Pending {
            ticket: t.clone(),
            used,
            done: tx,
        });
        Some(rx)
    }

    /// Prepares one renewal of `user_id`'s lease; `None` when one is under way or there is no
    /// lease. Admission waits until `finish` (the lease changes size in between).
    fn begin(&self, prefix: &str, user_id: &str, timeout_ms: i64, now: i64) -> Option<Call> {
        let cell = self.cells.get(user_id)?.clone();
        let mut guard = cell.slot.lock();
        let s = &mut *guard;
        if s.renewing {
            return None;
        }
        s.renewing = true;
        let pending = std::mem::take(&mut s.pending);
        let paid = std::mem::take(&mut s.pending_cost);
        s.held = [0, 1].map(|i| s.held[i].saturating_sub(paid[i]));

        let elapsed = (now - s.last_renewal).max(1) as f64;
        let observed = s.admitted as f64 * 1000.0 / elapsed;
        s.rate_per_s = if s.last_renewal == 0 {
            observed
        } else {
            0.7 * s.rate_per_s + 0.3 * observed
        };
        s.admitted = 0;
        let idle = now - s.last_used > IDLE_MS && s.inflight == [0, 0];
        let exact = s.exact_until > now || idle;
        let urgent = s.need != [0; 3];
        let mut want = (s.rate_per_s * HORIZON_MS / 1000.0).max(2.0);
        if urgent {
            want = want.max(s.want * 2.0);
        }
        s.want = want.min(MAX_REQUESTS);
        let want_requests = s.want.ceil() as u64;
        let avg = [s.avg_in.max(1.0), s.avg_out.max(0.0)];
        let avg_tokens = s.avg_tokens.max(1.0);
        let want_tokens = ((s.want * avg_tokens).ceil() as u64).max(s.need[0]);
        let free = if idle { [0, 0] } else { s.free() };
        let ask = if exact {
            [0, 0]
        } else {
            [
                want_tokens.saturating_sub(free[0]),
                want_requests.saturating_sub(free[1]),
            ]
        };
        let least = s.need[0].max(avg_tokens as u64).max(1);

        let minute = now.div_euclid(WINDOW_MS);
        let mut keys: Vec<String> = account_keys(prefix, user_id).to_vec();
        let mut index = |key: String| -> usize {
            match keys[5..].iter().position(|k| *k == key) {
                Some(i) => i + 1,
                None => {
                    keys.push(key);
                    keys.len() - 5
                }
            }
        };
        let mut args: Vec<String> = Vec::with_capacity(20 + pending.len() * 5);
        let mut items: Vec<String> = Vec::with_capacity(pending.len() * 5);
        for p in &pending {
            let t = &p.ticket;
            let w = if t.plan.itpm > 0 || t.plan.otpm > 0 {
                index(rate_key(prefix, user_id, &t.plan.scope, t.minute))
            } else {
                0
            };
            items.extend([
                t.charge(p.used).to_string(),
                t.requests.to_string(),
                w.to_string(),
                (p.used.input_tokens as i64 - t.input_cost as i64).to_string(),
                (p.used.output_tokens as i64 - t.output_cost as i64).to_string(),
            ]);
        }
        s.chunks
            .retain(|_, c| now - c.last_used <= IDLE_MS || c.granted != [0; 3]);
        let mut scopes = Vec::new();
        let mut scope_args: Vec<String> = Vec::new();
        let need = s.need;
        for (scope, c) in s.chunks.iter_mut() {
            let back = if c.minute == minute {
                index(rate_key(prefix, user_id, scope, minute))
            } else if c.minute == minute - 1 {
                index(rate_key(prefix, user_id, scope, minute - 1))
            } else {
                0
            };
            let prev = index(rate_key(prefix, user_id, scope, minute - 1));
            let curr = index(rate_key(prefix, user_id, scope, minute));
            let chunk_idle = now - c.last_used > IDLE_MS;
            let asked: Dims = if exact || chunk_idle {
                [0; 3]
            } else {
                [
                    want_requests,
                    ((s.want * avg[0]).ceil() as u64).max(need[1]).max(1),
                    ((s.want * avg[1]).ceil() as u64).max(need[2]),
                ]
            };
            scope_args.extend([prev, curr].map(|i| i.to_string()));
            scope_args.extend(c.caps.map(|v| v.to_string()));
            scope_args.push(back.to_string());
            for d in 0..3 {
                scope_args.push(c.granted[d].saturating_sub(c.used[d]).to_string());
            }
            scope_args.extend(c.granted.map(|v| v.to_string()));
            for (cap, asked) in c.caps.iter().zip(asked) {
                scope_args.push(if *cap > 0 { asked } else { 0 }.to_string());
            }
            *c = Chunk {
                minute,
                caps: c.caps,
                last_used: c.last_used,
                ..Chunk::default()
            };
            scopes.push(scope.clone());
        }
        s.need = [0; 3];
        args.extend([
            now.to_string(),
            self.id.clone(),
            s.limits.weekly_tokens.to_string(),
            s.limits.weekly_requests.to_string(),
            if s.unlimited { "1" } else { "0" }.to_string(),
            timeout_ms.to_string(),
            ACCOUNT_TTL_SECS.to_string(),
            SHARE.to_string(),
            s.inflight[0].to_string(),
            s.inflight[1].to_string(),
            free[0].to_string(),
            free[1].to_string(),
            ask[0].to_string(),
            ask[1].to_string(),
            least.to_string(),
            pending.len().to_string(),
            scopes.len().to_string(),
        ]);
        args.extend(items);
        args.extend(scope_args);
        Some(Call {
            kept: [s.inflight[0] + free[0], s.inflight[1] + free[1]],
            keys,
            args,
            pending,
            scopes,
            idle,
        })
    }

    /// Applies a renewal's answer: `granted` on top of what was kept (or, in `exact` mode,
    /// only what admitted requests hold), the scopes' new chunks, and lets admission go on.
    fn finish(&self, user_id: &str, call: &Call, answer: Option<&Renewed>, now: i64) {
        let Some(cell) = self.cells.get(user_id).map(|c| c.clone()) else {
            return;
        };
        let mut guard = cell.slot.lock();
        let s = &mut *guard;
        // Admission was paused: what is admitted now was admitted before the call, and some
        // of it may have settled since (still held, as pending).
        let holding = [0, 1].map(|i| s.inflight[i] + s.pending_cost[i]);
        match answer {
            Some(r) if r.exact => {
                s.held = holding;
                s.exact_until = now + EXACT_MS;
            }
            Some(r) => s.held = [call.kept[0] + r.granted[0], call.kept[1] + r.granted[1]],
            None => {
                s.held = holding;
                s.exact_until = now + EXACT_MS;
                s.chunks.clear();
            }
        }
        if let Some(r) = answer {
            for (scope, (granted, counted)) in call.scopes.iter().zip(&r.chunks) {
                if let Some(c) = s.chunks.get_mut(scope) {
                    c.granted = *granted;
                    c.counted = *counted;
                }
            }
        }
        s.last_renewal = now;
        s.renewing = false;
        let gone = call.idle && s.held == [0, 0] && s.pending.is_empty() && s.chunks.is_empty();
        drop(guard);
        cell.renewed.notify_waiters();
        if gone {
            self.cells.remove_if(user_id, |_, c| {
                let s = c.slot.lock();
                !s.renewing && s.held == [0, 0] && s.inflight == [0, 0] && s.pending.is_empty()
            });
        }
    }

    fn due(&self, now: i64) -> Vec<String> {
        self.cells
            .iter()
            .filter(|e| e.value().slot.lock().due(now))
            .map(|e| e.key().clone())
            .collect()
    }
}

/// A renewal's answer.
struct Renewed {
    exact: bool,
    granted: [u64; 2],
    weekly: u64,
    top: Option<Tier>,
    first: bool,
    breakdowns: Vec<RedisValue>,
    chunks: Vec<(Dims, Dims)>,
}

fn parse(reply: &[RedisValue]) -> Option<Renewed> {
    let num = |i: usize| reply.get(i).and_then(as_i64).unwrap_or(0).max(0) as u64;
    let array = |i: usize| match reply.get(i) {
        Some(RedisValue::Array(a)) => a.clone(),
        _ => vec![],
    };
    let mode = reply.first().and_then(as_string)?;
    let chunks = array(7)
        .iter()
        .map(|v| {
            let RedisValue::Array(a) = v else {
                return ([0; 3], [0; 3]);
            };
            let n = |i: usize| a.get(i).and_then(as_i64).unwrap_or(0).max(0) as u64;
            ([n(0), n(1), n(2)], [n(3), n(4), n(5)])
        })
        .collect();
    Some(Renewed {
        exact: mode == "exact",
        granted: [num(1), num(2)],
        weekly: num(3),
        top: reply
            .get(4)
            .and_then(as_i64)
            .and_then(|t| usize::try_from(t).ok())
            .and_then(|t| Tier::ALL.get(t).copied()),
        first: num(5) == 1,
        breakdowns: array(6),
        chunks,
    })
}

impl Shared {
    /// Admission against this instance's lease on the account. `None`: reserve the request on
    /// its own (`reserve.lua`): the account is new here, drained, or its lease could not grow.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn reserve_leased(
        &self,
        db: &Db,
        cfg: &QuotaConfig,
        who: &Identity,
        id: &str,
        input: u64,
        output: u64,
        weights: Weights,
    ) -> Option<Result<Reservation, Unreachable>> {
        if !self.hints.contains_key(&who.user.id) {
            // First sight on this instance: the exact path loads the account and its tier.
            return None;
        }
        let limits = *cfg.limits(self.tier_for(cfg, who));
        let plan = RatePlan::for_key(who, &limits);
        for _ in 0..3 {
            match self
                .leases
                .admit(&plan, &limits, who, id, input, output, weights, now_ms())
            {
                Admit::Granted(r) => return Some(Ok(*r)),
                Admit::Exact => return None,
                Admit::Wait(cell) => {
                    let mut renewed = pin!(cell.renewed.notified());
                    renewed.as_mut().enable();
                    if cell.slot.lock().renewing {
                        let _ = tokio::time::timeout(WAIT_FOR_RENEWAL, renewed).await;
                    }
                }
                Admit::Renew => {
                    let timeout_ms = cfg.reservation_timeout.as_millis() as i64;
                    if let Err(e) = self.renew(db, &who.user.id, timeout_ms).await {
                        return Some(Err(e));
                    }
                }
            }
        }
        None
    }

    /// Settles a request admitted against a lease: paid with the lease's next renewal.
    pub(super) async fn settle_leased(&self, db: &Db, t: &Ticket, used: Used) -> Breakdown {
        let now = now_ms();
        let Some(rx) = self.leases.settle(t, used) else {
            // No lease here any more (cannot happen while the request is admitted): pay in
            // process so the record still adds up.
            return self.fallback.settle_loading(db, t, used, now).await;
        };
        match rx.await {
            Ok(b) => b,
            Err(_) => on_allowance(t, used, now),
        }
    }

    /// Renews every lease with something to do; run every `FLUSH_EVERY` by the keeper.
    pub async fn renew_leases(&self, db: &Db, timeout_ms: i64) {
        let due = self.leases.due(now_ms());
        futures::future::join_all(due.iter().map(|u| async move {
            if let Err(Unreachable(e)) = self.renew(db, u, timeout_ms).await {
                log::warn!("{e}; lease of {u}");
            }
        }))
        .await;
    }

    /// One `lease.lua` call for one account (see the module's doc). When Redis does not
    /// answer, what was settled is paid in process (reconciled when Redis is back) and the
    /// account's requests are reserved on their own for a while.
    async fn renew(&self, db: &Db, user_id: &str, timeout_ms: i64) -> Result<(), Unreachable> {
        let now = now_ms();
        let Some(mut call) = self.leases.begin(&self.prefix, user_id, timeout_ms, now) else {
            return Ok(());
        };
        let mut outcome = Err(Unreachable("redis is down".into()));
        if !self.breaker.is_open() {
            outcome = self.call_lease(db, user_id, &call).await;
        }
        match outcome {
            Ok(r) => {
                // A settlement the answer has no breakdown for is booked on the allowance
                // (its sender dropped): the answer always has one each.
                for (p, b) in std::mem::take(&mut call.pending)
                    .into_iter()
                    .zip(&r.breakdowns)
                {
                    let items = match b {
                        RedisValue::Array(a) => a.as_slice(),
                        _ => &[],
                    };
                    let _ = p.done.send(breakdown(items, 0, &p.ticket, now));
                }
                self.hints.insert(user_id.to_string(), (r.weekly, r.top));
                if r.first {
                    self.join_sweep(user_id, now).await;
                }
                self.leases.finish(user_id, &call, Some(&r), now_ms());
                Ok(())
            }
            Err(e) => {
                let pending = std::mem::take(&mut call.pending);
                self.leases.finish(user_id, &call, None, now_ms());
                self.orphans
                    .lock()
                    .entry(user_id.to_string())
                    .or_default()
                    .push(self.leases.id.clone());
                for p in pending {
                    let b = self
                        .fallback
                        .settle_loading(db, &p.ticket, p.used, now)
                        .await;
                    let _ = p.done.send(b);
                }
                Err(e)
            }
        }
    }

    async fn call_lease(
        &self,
        db: &Db,
        user_id: &str,
        call: &Call,
    ) -> Result<Renewed, Unreachable> {
        for _attempt in 0..2 {
            let mut inv = self.lease.prepare_invoke();
            for k in &call.keys {
                inv.key(k);
            }
            for a in &call.args {
                inv.arg(a);
            }
            let mut conn = self.conn();
            let reply: Vec<RedisValue> = self.guarded("lease", inv.invoke_async(&mut conn)).await?;
            if reply.first().and_then(as_string).as_deref() == Some("load") {
                match self.load_account(db, user_id, now_ms()).await {
                    Ok(()) => continue,
                    Err(LoadError::Redis(e)) => return Err(e),
                    Err(LoadError::Db(e)) => return Err(Unreachable(format!("quota load: {e}"))),
                }
            }
            return parse(&reply)
                .ok_or_else(|| Unreachable(format!("redis lease: unexpected reply {reply:?}")));
        }
        Err(Unreachable("redis lease: account not loaded".into()))
    }
}
