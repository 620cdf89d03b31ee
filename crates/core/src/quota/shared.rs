//! The Redis engine: every instance sharing one Redis sees one balance per account and one set
//! of per-minute windows. Reserve and settle are one Lua script each (one round trip each), so
//! concurrent requests on any number of instances can never together reserve more than is left.
//! An account missing from Redis (first use, expiry, Redis restart) is loaded from the database,
//! the record of truth, by a third script that only the first loader wins.
//!
//! Redis failures degrade, never hang: every call has a deadline (`storage.redis_timeout_ms`,
//! the wait for a connection included), and a circuit breaker stops calling a Redis that is
//! gone. While it is open the engine follows `storage.redis_outage`: reserve and settle in the
//! in-process engine (`local`, loaded from the database) or refuse (`quota_unavailable`). The
//! keeper task (`Engine::run_redis_keeper`) probes with a fresh connection every
//! `PROBE_EVERY`; once one answers, every account served in process is reloaded from the
//! database into Redis (`reload.lua`) and the breaker closes. The same task sweeps reservations
//! whose instance died (`sweep.lua`), whatever their accounts do.

use std::collections::HashMap;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script, Value as RedisValue};

use super::breaker::Breaker;
use super::limits::{WindowView, WINDOW_MS};
use super::local::Local;
use super::{Denied, RatePlan, RateView, Reservation, Ticket, Used};
use crate::config::{QuotaConfig, RedisOutage};
use crate::domain::Tier;
use crate::domain::{Breakdown, Lot, LotKind};
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::quota::tiers::{effective_tier, usage_tier};
use crate::storage::Db;
use crate::util::{now_ms, FastHash};

/// Hot account state expires after this long unused; it reloads from the database.
const ACCOUNT_TTL_SECS: u64 = 8 * 24 * 3600;

/// How often the keeper probes a Redis the breaker has given up on: the connection is back
/// within this (plus a connect and the reconciliation) of Redis answering again.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The least time a probe gives a fresh connection to open (a loopback connect takes well
/// under a millisecond; a remote Redis may need more than one call's deadline).
const MIN_CONNECT: Duration = Duration::from_millis(250);

/// Accounts the sweep visits per pass (each is one script call).
const SWEEP_BATCH: usize = 100;

/// How the Redis engine behaves when Redis or the database is slow or gone.
#[derive(Clone)]
pub struct Settings {
    /// Deadline of one Redis call.
    pub timeout: Duration,
    pub outage: RedisOutage,
    /// Deadline of the database reads a request waits for (balance loads).
    pub db_timeout: Duration,
    /// Usage writer: reconciliation waits (briefly) for it to write what was settled before.
    pub usage: Option<crate::usage::UsageSink>,
}

/// Why a call to Redis gave no answer.
#[derive(Debug)]
struct Unreachable(String);

/// What a settle script call did.
enum Settled {
    Paid(Breakdown),
    /// The account is not in Redis: load it, then call again.
    Load,
    /// Asked to pay only a held reservation, and none was: an earlier attempt paid it.
    Gone,
}

/// Why an account could not be loaded.
enum LoadError {
    Db(String),
    Redis(Unreachable),
}

pub struct Shared {
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    /// Replaced by a fresh connection when a probe succeeds.
    conn: ArcSwap<ConnectionManager>,
    settings: Settings,
    breaker: Breaker,
    /// The outage policy's in-process engine; emptied once Redis has its accounts back.
    fallback: Local,
    /// Redis reservations settled while Redis was unreachable, by account: released when it is
    /// back (their usage was paid in process).
    orphans: Mutex<HashMap<String, Vec<String>>>,
    reserve: Script,
    settle: Script,
    load: Script,
    reload: Script,
    add_lot: Script,
    sweep: Script,
    /// Key prefix, so tests (and several gateways) can share one Redis.
    prefix: String,
    /// The sorted set of accounts holding reservations (`sweep.lua`).
    due_key: String,
    /// Last seen (weekly token usage, highest lot tier) per account: the tier hint.
    hints: dashmap::DashMap<String, (u64, Option<Tier>), FastHash>,
}

/// The account's keys, in the order the scripts take them: meta, reservations, spend buckets,
/// lots, reservation start times. One hash tag, so a Redis Cluster keeps them on one node.
pub fn account_keys(prefix: &str, user_id: &str) -> [String; 5] {
    [
        format!("{prefix}q:{{{user_id}}}"),
        format!("{prefix}q:{{{user_id}}}:res"),
        format!("{prefix}q:{{{user_id}}}:sp"),
        format!("{prefix}q:{{{user_id}}}:lots"),
        format!("{prefix}q:{{{user_id}}}:rat"),
    ]
}

/// The scripts' sources; reserve and settle share account.lua (the meta hash, the week's sums,
/// releasing a reservation).
pub const RESERVE_LUA: &str = concat!(
    include_str!("lua/account.lua"),
    include_str!("lua/reserve.lua")
);
pub const SETTLE_LUA: &str = concat!(
    include_str!("lua/account.lua"),
    include_str!("lua/settle.lua")
);
pub const LOAD_LUA: &str = include_str!("lua/load.lua");
pub const RELOAD_LUA: &str = include_str!("lua/reload.lua");
pub const SWEEP_LUA: &str = concat!(
    include_str!("lua/account.lua"),
    include_str!("lua/sweep.lua")
);

fn rate_key(prefix: &str, scope: &str, minute: i64) -> String {
    format!("{prefix}rl:{scope}:{minute}")
}

/// The balance arguments `load.lua` and `reload.lua` share: each hourly spend bucket, then each
/// lot with something left.
fn push_balance(
    inv: &mut redis::ScriptInvocation<'_>,
    spend: &[crate::domain::SpendBucket],
    lots: &[Lot],
) {
    for b in spend {
        inv.arg(b.hour).arg(format!(
            "{},{},{},{}",
            b.allowance_tokens, b.allowance_requests, b.lot_tokens, b.lot_requests
        ));
    }
    for l in lots.iter().filter(|l| l.remaining > 0) {
        inv.arg(&l.id).arg(lot_value(l));
    }
}

fn lot_value(l: &Lot) -> String {
    let kind = match l.kind {
        LotKind::Token => "t",
        LotKind::Request => "r",
    };
    let tier = l.tier.map(|t| t.index() as i64).unwrap_or(-1);
    format!("{kind},{},{},{tier}", l.remaining, l.expires_at)
}

fn as_i64(v: &RedisValue) -> Option<i64> {
    match v {
        RedisValue::Int(n) => Some(*n),
        RedisValue::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        RedisValue::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_string(v: &RedisValue) -> Option<String> {
    match v {
        RedisValue::BulkString(b) => String::from_utf8(b.clone()).ok(),
        RedisValue::SimpleString(s) => Some(s.clone()),
        RedisValue::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Reads the three (limit, remaining, reset) triples starting at `at`.
fn views(items: &[RedisValue], at: usize) -> RateView {
    let get = |d: usize| -> Option<WindowView> {
        let limit = as_i64(items.get(at + d * 3)?)?;
        if limit <= 0 {
            return None;
        }
        Some(WindowView {
            limit: limit as u64,
            remaining: as_i64(items.get(at + d * 3 + 1)?)?.max(0) as u64,
            reset_secs: as_i64(items.get(at + d * 3 + 2)?)?.max(0) as u64,
        })
    };
    RateView {
        requests: get(0),
        input_tokens: get(1),
        output_tokens: get(2),
    }
}

/// Whether a Redis error means the connection itself is gone (opens the breaker at once).
fn connection_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
}

/// The whole usage booked on the allowance: what a settlement records when no balance can be
/// read, so the database record still adds up.
fn on_allowance(t: &Ticket, used: Used, now: i64) -> Breakdown {
    Breakdown {
        user_id: t.user_id.clone(),
        at_ms: now,
        allowance_tokens: t.charge(used),
        allowance_requests: t.requests,
        lots: vec![],
    }
}

impl Shared {
    /// Connects once (a gateway configured for Redis does not start without it) with a
    /// connection whose every call and reconnect attempt is bounded by `settings.timeout`.
    pub async fn connect(url: &str, prefix: &str, settings: Settings) -> Result<Shared, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
        // One attempt per reconnect: the manager's own backoff (seconds, growing) would keep
        // every caller waiting on it; the breaker and the keeper's probes pace retries instead.
        let manager_config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_response_timeout(settings.timeout)
            .set_connection_timeout(settings.timeout.max(MIN_CONNECT));
        let conn = ConnectionManager::new_with_config(client.clone(), manager_config.clone())
            .await
            .map_err(|e| format!("redis connect: {e}"))?;
        Ok(Shared {
            client,
            manager_config,
            conn: ArcSwap::from_pointee(conn),
            fallback: Local::new(settings.db_timeout),
            settings,
            breaker: Breaker::default(),
            orphans: Mutex::new(HashMap::new()),
            reserve: Script::new(RESERVE_LUA),
            settle: Script::new(SETTLE_LUA),
            load: Script::new(LOAD_LUA),
            reload: Script::new(RELOAD_LUA),
            add_lot: Script::new(include_str!("lua/add_lot.lua")),
            sweep: Script::new(SWEEP_LUA),
            prefix: prefix.to_string(),
            due_key: format!("{prefix}q:due"),
            hints: dashmap::DashMap::default(),
        })
    }

    /// One PING on the current connection (the caller bounds the wait): fails while Redis is
    /// unreachable, whatever the breaker says.
    pub async fn ping(&self) -> Result<(), String> {
        let mut conn = self.conn();
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }

    /// True while the breaker is open (Redis is not being called).
    pub fn is_down(&self) -> bool {
        self.breaker.is_open()
    }

    fn conn(&self) -> ConnectionManager {
        (**self.conn.load()).clone()
    }

    /// Awaits one Redis call under the deadline and tells the breaker how it went.
    async fn guarded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Unreachable> {
        let failure = match tokio::time::timeout(self.settings.timeout, call).await {
            Ok(Ok(v)) => {
                self.breaker.success();
                return Ok(v);
            }
            Ok(Err(e)) => {
                let lost = connection_lost(&e);
                (format!("redis {what}: {e}"), lost)
            }
            Err(_) => (
                format!("redis {what}: no answer within {:?}", self.settings.timeout),
                false,
            ),
        };
        if self.breaker.failure(failure.1) {
            // The outage engine starts from the database's balances, not from whatever it
            // kept since the last outage.
            self.fallback.clear();
            log::error!(
                "{}; Redis is considered down: {} until it answers again",
                failure.0,
                match self.settings.outage {
                    RedisOutage::Local => "serving with in-process limits and quota",
                    RedisOutage::Refuse => "refusing developer requests (quota_unavailable)",
                }
            );
        }
        Err(Unreachable(failure.0))
    }

    /// Reads an account's balance from the database (under the request path's deadline).
    async fn read_balance(
        &self,
        db: &Db,
        user_id: &str,
        now: i64,
    ) -> Result<(Vec<crate::domain::SpendBucket>, Vec<Lot>), String> {
        crate::storage::within(self.settings.db_timeout, async {
            let spend = db.quota().spend(user_id, now).await?;
            let lots = db.quota().lots(user_id, now).await?;
            Ok((spend, lots))
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Remembers the tier hint a balance gives.
    fn hint_from(
        &self,
        user_id: &str,
        spend: &[crate::domain::SpendBucket],
        lots: &[Lot],
        now: i64,
    ) {
        let weekly: u64 = spend
            .iter()
            .map(|b| b.allowance_tokens + b.lot_tokens)
            .sum();
        let top = crate::quota::tiers::entitlement_tier(lots, now);
        self.hints.insert(user_id.to_string(), (weekly, top));
    }

    /// Copies an account's balance from the database into Redis (first loader wins).
    async fn load_account(&self, db: &Db, user_id: &str, now: i64) -> Result<(), LoadError> {
        let (spend, lots) = self
            .read_balance(db, user_id, now)
            .await
            .map_err(LoadError::Db)?;
        self.hint_from(user_id, &spend, &lots, now);
        let k = account_keys(&self.prefix, user_id);
        let mut inv = self.load.prepare_invoke();
        for key in &k {
            inv.key(key);
        }
        inv.arg(ACCOUNT_TTL_SECS).arg(spend.len());
        push_balance(&mut inv, &spend, &lots);
        let mut conn = self.conn();
        self.guarded("load", inv.invoke_async::<i64>(&mut conn))
            .await
            .map_err(LoadError::Redis)?;
        Ok(())
    }

    /// Overwrites an account in Redis with the database's balance, keeping the reservations
    /// other instances hold except `released`.
    async fn reload_account(
        &self,
        db: &Db,
        user_id: &str,
        released: &[String],
        now: i64,
    ) -> Result<(), LoadError> {
        let (spend, lots) = self
            .read_balance(db, user_id, now)
            .await
            .map_err(LoadError::Db)?;
        self.hint_from(user_id, &spend, &lots, now);
        let k = account_keys(&self.prefix, user_id);
        let mut inv = self.reload.prepare_invoke();
        for key in &k {
            inv.key(key);
        }
        inv.arg(ACCOUNT_TTL_SECS)
            .arg(spend.len())
            .arg(released.len());
        for id in released {
            inv.arg(id);
        }
        push_balance(&mut inv, &spend, &lots);
        let mut conn = self.conn();
        self.guarded("reload", inv.invoke_async::<i64>(&mut conn))
            .await
            .map_err(LoadError::Redis)?;
        Ok(())
    }

    fn tier_for(&self, cfg: &QuotaConfig, who: &Identity) -> Tier {
        let (weekly, top) = self
            .hints
            .get(&who.user.id)
            .map(|h| *h)
            .unwrap_or((0, None));
        effective_tier(
            who.user.manual_tier,
            usage_tier(cfg, weekly),
            top,
            who.user.max_tier,
        )
    }

    /// Check 9 through Redis; while Redis is unreachable, through the outage policy.
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
        let id = if self.breaker.is_open() {
            id
        } else {
            match self
                .reserve_in_redis(db, cfg, who, id, input, output, weights, now)
                .await
            {
                Ok(answer) => return answer,
                Err((id, Unreachable(e))) => {
                    log::warn!("{e}");
                    id
                }
            }
        };
        match self.settings.outage {
            RedisOutage::Refuse => Err((Denied::Unavailable, RateView::default())),
            RedisOutage::Local => {
                self.fallback
                    .reserve(db, cfg, who, id, input, output, weights, now)
                    .await
            }
        }
    }

    /// The Redis reservation. `Err` gives the id back when Redis did not answer.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    async fn reserve_in_redis(
        &self,
        db: &Db,
        cfg: &QuotaConfig,
        who: &Identity,
        id: String,
        input: u64,
        output: u64,
        weights: Weights,
        now: i64,
    ) -> Result<Result<Reservation, (Denied, RateView)>, (String, Unreachable)> {
        let user_id = &who.user.id;
        let tokens = weights.estimate(input, output);
        let unavailable = Ok(Err((Denied::Unavailable, RateView::default())));
        if !self.hints.contains_key(user_id) {
            // First sight on this instance: the tier hint comes with the load.
            match self.load_account(db, user_id, now).await {
                Ok(()) => {}
                Err(LoadError::Redis(e)) => return Err((id, e)),
                Err(LoadError::Db(e)) => {
                    log::error!("quota load for {user_id}: {e}");
                    return unavailable;
                }
            }
        }
        for _attempt in 0..2 {
            let tier = self.tier_for(cfg, who);
            let limits = *cfg.limits(tier);
            let plan = RatePlan::for_key(who, &limits);
            let minute = now.div_euclid(WINDOW_MS);
            let k = account_keys(&self.prefix, user_id);
            let mut inv = self.reserve.prepare_invoke();
            for key in &k {
                inv.key(key);
            }
            inv.key(rate_key(&self.prefix, &plan.scope, minute - 1))
                .key(rate_key(&self.prefix, &plan.scope, minute))
                .key(&self.due_key);
            inv.arg(now)
                .arg(&id)
                .arg(tokens)
                .arg(1)
                .arg(limits.weekly_tokens)
                .arg(limits.weekly_requests)
                .arg(if who.user.unlimited { "1" } else { "0" })
                .arg(cfg.reservation_timeout.as_millis() as u64)
                .arg(plan.rpm)
                .arg(plan.itpm)
                .arg(plan.otpm)
                .arg(input)
                .arg(output)
                .arg(ACCOUNT_TTL_SECS)
                .arg(user_id);
            let mut conn = self.conn();
            let reply: Vec<RedisValue> =
                match self.guarded("reserve", inv.invoke_async(&mut conn)).await {
                    Ok(r) => r,
                    Err(e) => return Err((id, e)),
                };
            let status = reply.first().and_then(as_string).unwrap_or_default();
            match status.as_str() {
                "load" => {
                    match self.load_account(db, user_id, now).await {
                        Ok(()) => {}
                        Err(LoadError::Redis(e)) => return Err((id, e)),
                        Err(LoadError::Db(e)) => {
                            log::error!("quota load for {user_id}: {e}");
                            return unavailable;
                        }
                    }
                    continue;
                }
                "rate" => {
                    let dim = reply.get(1).and_then(as_i64).unwrap_or(1);
                    let wait = reply.get(2).and_then(as_i64).unwrap_or(1).max(1) as u64;
                    let what = match dim {
                        1 => "requests",
                        2 => "input tokens",
                        _ => "output tokens",
                    };
                    return Ok(Err((
                        Denied::RateLimited {
                            retry_after_secs: wait,
                            what,
                        },
                        views(&reply, 3),
                    )));
                }
                "quota" => return Ok(Err((Denied::InsufficientQuota, views(&reply, 1)))),
                "ok" => {
                    let weekly = reply.get(1).and_then(as_i64).unwrap_or(0).max(0) as u64;
                    let top = reply
                        .get(2)
                        .and_then(as_i64)
                        .and_then(|t| usize::try_from(t).ok())
                        .and_then(|t| Tier::ALL.get(t).copied());
                    self.hints.insert(user_id.clone(), (weekly, top));
                    return Ok(Ok(Reservation {
                        ticket: Ticket {
                            id,
                            user_id: user_id.clone(),
                            tokens,
                            requests: 1,
                            input_cost: input,
                            output_cost: output,
                            weights,
                            minute,
                            plan,
                            limits,
                            unlimited: who.user.unlimited,
                            in_process: false,
                        },
                        rate: views(&reply, 3),
                    }));
                }
                other => {
                    log::error!("redis reserve: unexpected reply {other:?}");
                    return unavailable;
                }
            }
        }
        unavailable
    }

    /// Settles in Redis (a few tries while the breaker stays closed); otherwise in process,
    /// from the account's real balance, and the Redis reservation is released when Redis is
    /// back. Never waits on Redis longer than a few deadlines.
    ///
    /// A call that missed its deadline may still have run: a retry asks Redis to pay only if
    /// the reservation is still held, so it is never paid twice (`Gone`: it was; the usage
    /// event then takes its breakdown from the in-process engine).
    pub async fn settle(&self, db: &Db, t: &Ticket, used: Used, now: i64) -> Breakdown {
        let mut delay = Duration::from_millis(20);
        let mut only_if_held = false;
        let mut failures_left = 3;
        let mut loads_left = 1;
        let mut paid_by_a_lost_answer = false;
        while !self.breaker.is_open() {
            match self.try_settle(t, used, now, only_if_held).await {
                Ok(Settled::Paid(b)) => {
                    if t.in_process {
                        // Its in-process copy still holds the reservation: drop it.
                        self.fallback.forget(&t.user_id);
                    }
                    return b;
                }
                Ok(Settled::Load) if loads_left > 0 => {
                    loads_left -= 1;
                    if let Err(LoadError::Redis(Unreachable(e)) | LoadError::Db(e)) =
                        self.load_account(db, &t.user_id, now).await
                    {
                        log::warn!("quota reload for settle: {e}");
                    }
                    // Loading drops every reservation: this one is no longer held.
                    only_if_held = false;
                }
                Ok(Settled::Load) => break,
                Ok(Settled::Gone) => {
                    paid_by_a_lost_answer = true;
                    break;
                }
                Err(Unreachable(e)) => {
                    log::warn!("{e}; settle of {}", t.id);
                    failures_left -= 1;
                    // A ticket held in process has no reservation in Redis to tell whether
                    // that call paid: no second try, which could pay twice (a payment Redis
                    // missed is at most this request's usage, and an outage's reconciliation
                    // replaces it from the database).
                    if t.in_process || failures_left == 0 {
                        break;
                    }
                    only_if_held = true;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        if !t.in_process && !paid_by_a_lost_answer {
            self.orphans
                .lock()
                .entry(t.user_id.clone())
                .or_default()
                .push(t.id.clone());
        }
        let b = self.fallback.settle_loading(db, t, used, now).await;
        if !self.breaker.is_open() {
            // Redis is in use: a copy kept here would go stale before the next outage.
            self.fallback.forget(&t.user_id);
        }
        b
    }

    async fn try_settle(
        &self,
        t: &Ticket,
        used: Used,
        now: i64,
        only_if_held: bool,
    ) -> Result<Settled, Unreachable> {
        let k = account_keys(&self.prefix, &t.user_id);
        let mut inv = self.settle.prepare_invoke();
        for key in &k {
            inv.key(key);
        }
        inv.key(rate_key(&self.prefix, &t.plan.scope, t.minute));
        inv.arg(now)
            .arg(&t.id)
            .arg(t.charge(used))
            .arg(t.requests)
            .arg(t.limits.weekly_tokens)
            .arg(t.limits.weekly_requests)
            .arg(used.input_tokens as i64 - t.input_cost as i64)
            .arg(used.output_tokens as i64 - t.output_cost as i64)
            .arg(ACCOUNT_TTL_SECS);
        if only_if_held {
            inv.arg(1);
        }
        let mut conn = self.conn();
        let reply: Vec<RedisValue> = self.guarded("settle", inv.invoke_async(&mut conn)).await?;
        match reply.first().and_then(as_string).as_deref() {
            Some("load") => Ok(Settled::Load),
            Some("gone") => Ok(Settled::Gone),
            Some("ok") => {
                let mut b = Breakdown {
                    user_id: t.user_id.clone(),
                    at_ms: now,
                    allowance_tokens: reply.get(1).and_then(as_i64).unwrap_or(0).max(0) as u64,
                    allowance_requests: reply.get(2).and_then(as_i64).unwrap_or(0).max(0) as u64,
                    lots: vec![],
                };
                let mut i = 3;
                while i + 2 < reply.len() {
                    let id = as_string(&reply[i]).unwrap_or_default();
                    let kind = if as_string(&reply[i + 1]).as_deref() == Some("r") {
                        LotKind::Request
                    } else {
                        LotKind::Token
                    };
                    let n = as_i64(&reply[i + 2]).unwrap_or(0).max(0) as u64;
                    b.lots.push((id, kind, n));
                    i += 3;
                }
                Ok(Settled::Paid(b))
            }
            other => {
                log::error!("redis settle: unexpected reply {other:?}");
                Ok(Settled::Paid(on_allowance(t, used, now)))
            }
        }
    }

    /// Adds a lot granted elsewhere to the account, if Redis (or the outage engine) holds it.
    /// False when Redis did not answer: the feed offers the lot again.
    pub async fn add_lot(&self, lot: Lot) -> bool {
        self.fallback.add_lot(lot.clone());
        if self.breaker.is_open() {
            return false;
        }
        let k = account_keys(&self.prefix, &lot.user_id);
        let mut conn = self.conn();
        let mut inv = self.add_lot.prepare_invoke();
        inv.key(&k[0])
            .key(&k[3])
            .arg(&lot.id)
            .arg(lot_value(&lot))
            .arg(ACCOUNT_TTL_SECS);
        match self
            .guarded("add lot", inv.invoke_async::<i64>(&mut conn))
            .await
        {
            Ok(_) => true,
            Err(Unreachable(e)) => {
                log::warn!("{e}");
                false
            }
        }
    }

    /// Releases reservations older than `timeout_ms` on every account that holds one, so a
    /// reservation whose instance died is freed whether or not its account sends anything.
    pub async fn sweep(&self, now: i64, timeout_ms: i64) {
        let mut conn = self.conn();
        let due: Vec<String> = match self
            .guarded(
                "sweep",
                redis::cmd("ZRANGEBYSCORE")
                    .arg(&self.due_key)
                    .arg("-inf")
                    .arg(format!("({}", now - timeout_ms))
                    .arg("LIMIT")
                    .arg(0)
                    .arg(SWEEP_BATCH)
                    .query_async(&mut conn),
            )
            .await
        {
            Ok(d) => d,
            Err(Unreachable(e)) => {
                log::warn!("{e}");
                return;
            }
        };
        for user_id in due {
            let k = account_keys(&self.prefix, &user_id);
            let mut inv = self.sweep.prepare_invoke();
            inv.key(&k[0])
                .key(&k[1])
                .key(&k[4])
                .key(&self.due_key)
                .arg(now)
                .arg(timeout_ms)
                .arg(&user_id);
            match self
                .guarded("sweep", inv.invoke_async::<i64>(&mut conn))
                .await
            {
                Ok(0) => {}
                Ok(n) => log::warn!("released {n} stale reservation(s) of {user_id}"),
                Err(Unreachable(e)) => {
                    log::warn!("{e}");
                    return;
                }
            }
        }
    }

    /// One probe of a Redis the breaker gave up on. When a fresh connection answers, it
    /// replaces the old one and every account served in process is reloaded from the database
    /// into Redis; then the breaker closes. Anything failing leaves it open for the next probe.
    pub async fn recover(&self, db: &Db) {
        let connect =
            ConnectionManager::new_with_config(self.client.clone(), self.manager_config.clone());
        let Ok(Ok(mut fresh)) =
            tokio::time::timeout(self.settings.timeout.max(MIN_CONNECT), connect).await
        else {
            return;
        };
        let ping_cmd = redis::cmd("PING");
        let ping = ping_cmd.query_async::<String>(&mut fresh);
        if !matches!(
            tokio::time::timeout(self.settings.timeout.max(MIN_CONNECT), ping).await,
            Ok(Ok(_))
        ) {
            return;
        }
        self.conn.store(std::sync::Arc::new(fresh));
        // What was settled in process must be in the database before it is read back: wait
        // (briefly) for the usage writer to write what was queued until now.
        if let Some(usage) = &self.settings.usage {
            let queued = usage.queued();
            let until = tokio::time::Instant::now() + Duration::from_secs(1);
            while usage.written() < queued && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let orphans = std::mem::take(&mut *self.orphans.lock());
        let mut accounts: Vec<String> = self.fallback.account_ids();
        for user_id in orphans.keys() {
            if !accounts.contains(user_id) {
                accounts.push(user_id.clone());
            }
        }
        let now = now_ms();
        let mut failed = false;
        for user_id in &accounts {
            let released = orphans.get(user_id).map(Vec::as_slice).unwrap_or(&[]);
            if let Err(LoadError::Redis(Unreachable(e)) | LoadError::Db(e)) =
                self.reload_account(db, user_id, released, now).await
            {
                log::warn!("reconciling {user_id} into Redis: {e}");
                failed = true;
                break;
            }
        }
        if failed {
            // Try again with the next probe; the releases are kept for it.
            let mut kept = self.orphans.lock();
            for (user_id, ids) in orphans {
                kept.entry(user_id).or_default().extend(ids);
            }
            self.breaker.failure(true);
            return;
        }
        self.fallback.clear();
        self.breaker.close();
        log::warn!(
            "Redis answers again: {} account(s) reconciled from the database",
            accounts.len()
        );
    }
}
