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
use redis::{Script, Value as RedisValue};

use super::breaker::Breaker;
use super::lease::{Leases, DRAIN_TRIES, DRAIN_WAIT};
use super::limits::WINDOW_MS;
use super::local::Local;
use super::redis_conn::{Conn, Connector, RedisTarget};
use super::scripts::{
    as_i64, as_string, breakdown, connection_lost, on_allowance, views, ACCOUNT_TTL_SECS,
};
use super::{Denied, RatePlan, RateView, Reservation, Ticket, Used};
use crate::config::{QuotaConfig, RedisOutage};
use crate::domain::Breakdown;
use crate::domain::Tier;
use crate::identity::Identity;
use crate::pricing::Weights;
use crate::quota::tiers::{effective_tier, usage_tier};
use crate::storage::Db;
use crate::util::FastHash;

pub use super::scripts::{
    account_keys, grant_key, rate_key, LEASE_LUA, LOAD_LUA, RELOAD_LUA, RESERVE_LUA, SETTLE_LUA,
    SWEEP_LUA,
};

/// How often the keeper probes a Redis the breaker has given up on: the connection is back
/// within this (plus a connect and the reconciliation) of Redis answering again.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The least time a probe gives a fresh connection to open (a loopback connect takes well
/// under a millisecond; a remote Redis may need more than one call's deadline).
pub(super) const MIN_CONNECT: Duration = Duration::from_millis(250);

/// Accounts the sweep visits per pass (one script call on one Redis, one each on a cluster).
pub(super) const SWEEP_BATCH: usize = 100;

/// How long past its deadline a call is still waited for while the breaker stays closed. A
/// Redis that is gone opens the breaker well within it once several calls have missed
/// (`breaker::MISS_SPAN_MS`), which ends every such wait.
const LATE_WAIT: Duration = Duration::from_secs(1);
/// How often a late call's wait looks whether the breaker opened meanwhile.
const LATE_STEP: Duration = Duration::from_millis(10);

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
pub(super) struct Unreachable(pub(super) String);

/// What a settle script call did.
enum Settled {
    Paid(Breakdown),
    /// The account is not in Redis: load it, then call again.
    Load,
    /// Asked to pay only a held reservation, and none was: an earlier attempt paid it.
    Gone,
}

/// Why an account could not be loaded.
pub(super) enum LoadError {
    Db(String),
    Redis(Unreachable),
}

pub struct Shared {
    pub(super) connector: Connector,
    /// Replaced by a fresh connection when a probe succeeds.
    pub(super) conn: ArcSwap<Conn>,
    pub(super) settings: Settings,
    pub(super) breaker: Breaker,
    /// The outage policy's in-process engine; emptied once Redis has its accounts back.
    pub(super) fallback: Local,
    /// Redis reservations settled while Redis was unreachable, by account: released when it is
    /// back (their usage was paid in process).
    pub(super) orphans: Mutex<HashMap<String, Vec<String>>>,
    pub(super) reserve: Script,
    pub(super) settle: Script,
    pub(super) load: Script,
    pub(super) reload: Script,
    pub(super) add_lot: Script,
    pub(super) sweep: Script,
    pub(super) lease: Script,
    pub(super) lease_batch: Script,
    /// This instance's leases on the accounts it serves (`lease`).
    pub(super) leases: Leases,
    /// Key prefix, so tests (and several gateways) can share one Redis.
    pub(super) prefix: String,
    /// The sorted set of accounts holding reservations (`sweep.lua`).
    pub(super) due_key: String,
    /// The accounts the last heartbeat found due, swept by the next one (one Redis).
    pub(super) sweep_next: Mutex<Vec<String>>,
    /// The sorted set of accounts drained lately, by when (`lease`), and the channel their
    /// notices go out on (`drains`).
    pub(super) drains_key: String,
    /// Drains heard from other instances.
    pub(super) drains: super::drains::DrainNotices,
    /// The sorted set of live instances (by last sign of life): how many share the accounts,
    /// which sets the outage engine's share (`Local::set_share`).
    pub(super) instances_key: String,
    /// This instance's name there and in its leases.
    pub(super) instance: String,
    /// Last seen (weekly token usage, highest lot tier) per account: the tier hint.
    pub(super) hints: dashmap::DashMap<String, (u64, Option<Tier>), FastHash>,
}

impl Shared {
    /// Connects once (a gateway configured for Redis does not start without it) with a
    /// connection whose every call and reconnect attempt is bounded by `settings.timeout`.
    pub async fn connect(
        target: &RedisTarget,
        prefix: &str,
        settings: Settings,
    ) -> Result<Shared, String> {
        // The client's own deadline is the longest a call is waited for (`guarded`).
        let connector = Connector::new(
            target,
            settings.timeout + LATE_WAIT,
            settings.timeout.max(MIN_CONNECT),
        )?;
        let conn = connector
            .connect()
            .await
            .map_err(|e| format!("redis connect: {e}"))?;
        let instance = crate::util::random_base62(8);
        Ok(Shared {
            connector,
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
            lease: Script::new(LEASE_LUA),
            lease_batch: Script::new(super::scripts::LEASE_BATCH_LUA),
            leases: Leases::new(&instance),
            prefix: prefix.to_string(),
            due_key: format!("{prefix}q:due"),
            sweep_next: Mutex::new(Vec::new()),
            drains_key: format!("{prefix}q:drains"),
            drains: Default::default(),
            instances_key: format!("{prefix}instances"),
            instance,
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

    pub(super) fn conn(&self) -> Conn {
        (**self.conn.load()).clone()
    }

    /// Awaits one Redis call and tells the breaker how it went. A call past its deadline
    /// (`storage.redis_timeout_ms`) counts as a miss but is still waited for, up to
    /// `LATE_WAIT` more and while the breaker stays closed: on a busy host the late answer is
    /// the right one (giving up on it sent the request to the outage policy, which admits
    /// apart from Redis), and a Redis that is really gone opens the breaker, which ends the
    /// wait.
    pub(super) async fn guarded<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Unreachable> {
        let mut call = std::pin::pin!(call);
        let answer = match tokio::time::timeout(self.settings.timeout, &mut call).await {
            Ok(answer) => Some(answer),
            Err(_) => {
                self.failed(what, false, "missed its deadline");
                self.late_answer(&mut call).await
            }
        };
        let failure = match answer {
            Some(Ok(v)) => {
                self.breaker.success();
                return Ok(v);
            }
            Some(Err(e)) => {
                let lost = connection_lost(&e);
                (format!("redis {what}: {e}"), lost)
            }
            None => (
                format!(
                    "redis {what}: no answer within {:?}",
                    self.settings.timeout + LATE_WAIT
                ),
                false,
            ),
        };
        self.failed(what, failure.1, &failure.0);
        Err(Unreachable(failure.0))
    }

    /// Sends `pipe` (plain commands and script calls, on one Redis) in one round trip and
    /// returns each command's reply. A script Redis lost (a restart, a `SCRIPT FLUSH`) fails
    /// only its own call, which `script_reply` then makes again alone, without sending the rest
    /// twice; any other error reply fails the whole round trip and counts against the breaker,
    /// as a failed call does (a Redis answering only errors, loading or read-only, is as good
    /// as gone). On a cluster the client fails the whole call on any error reply, NOSCRIPT
    /// included. A round trip costs Redis far more than the commands in it, so work that falls
    /// due together goes out together.
    pub(super) async fn round_trip(
        &self,
        what: &str,
        pipe: &redis::Pipeline,
    ) -> Result<Vec<RedisValue>, Unreachable> {
        use redis::aio::ConnectionLike;
        let n = pipe.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.conn();
        let call = async {
            let replies = conn.req_packed_commands(pipe, 0, n).await?;
            let failed = replies.iter().find_map(|r| match r {
                RedisValue::ServerError(e) if e.code() != "NOSCRIPT" => Some(e.clone()),
                _ => None,
            });
            match failed {
                Some(e) => Err(redis::RedisError::from(e)),
                None => Ok(replies),
            }
        };
        let replies = self.guarded(what, call).await?;
        if replies.len() != n {
            return Err(Unreachable(format!(
                "redis {what}: {} replies for {n} commands",
                replies.len()
            )));
        }
        Ok(replies)
    }

    /// A script call's reply from `round_trip`; when Redis had lost the script, the call
    /// (`invocation`, loading it) is made again on its own.
    pub(super) async fn script_reply<T: redis::FromRedisValue>(
        &self,
        what: &str,
        reply: RedisValue,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, Unreachable> {
        let reply = match reply {
            RedisValue::ServerError(e) if e.code() == "NOSCRIPT" => {
                let mut conn = self.conn();
                return self.guarded(what, invocation.invoke_async(&mut conn)).await;
            }
            RedisValue::ServerError(e) => Err(redis::RedisError::from(e)),
            reply => T::from_redis_value(&reply),
        };
        reply.map_err(|e| Unreachable(format!("redis {what}: {e}")))
    }

    /// Waits for a call past its deadline, for at most `LATE_WAIT` and only while the breaker
    /// stays closed. `None`: no answer.
    async fn late_answer<T>(
        &self,
        call: &mut std::pin::Pin<&mut impl std::future::Future<Output = redis::RedisResult<T>>>,
    ) -> Option<redis::RedisResult<T>> {
        let until = tokio::time::Instant::now() + LATE_WAIT;
        while !self.breaker.is_open() {
            let now = tokio::time::Instant::now();
            if now >= until {
                return None;
            }
            let step = (until - now).min(LATE_STEP);
            if let Ok(answer) = tokio::time::timeout(step, call.as_mut()).await {
                return Some(answer);
            }
        }
        None
    }

    /// Tells the breaker a call failed; says so once when that opens it.
    fn failed(&self, what: &str, connection_lost: bool, why: &str) {
        if self.breaker.failure(connection_lost, crate::util::now_ms()) {
            // The outage engine starts from the database's balances, not from whatever it
            // kept since the last outage.
            self.fallback.clear();
            log::error!(
                "redis {what}: {why}; Redis is considered down: {} until it answers again",
                match self.settings.outage {
                    RedisOutage::Local => format!(
                        "serving with in-process limits and quota, this instance's share (1/{}) \
                         of each",
                        self.fallback.share()
                    ),
                    RedisOutage::Refuse =>
                        "refusing developer requests (quota_unavailable)".to_string(),
                }
            );
        }
    }

    pub(super) fn tier_for(&self, cfg: &QuotaConfig, who: &Identity) -> Tier {
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
        let leased = if self.breaker.is_open() {
            None
        } else {
            self.reserve_leased(db, cfg, who, &id, input, output, weights)
                .await
        };
        let id = match leased {
            Some(Ok(reservation)) => return Ok(reservation),
            Some(Err(Unreachable(e))) => {
                log::warn!("{e}");
                id
            }
            None if self.breaker.is_open() => id,
            // Boxed, as the fallback below: the script path's state is large and taken by an
            // account's first request or a drained one, while inline every request's future
            // would carry (and move) room for it.
            None => {
                match Box::pin(self.reserve_in_redis(db, cfg, who, id, input, output, weights, now))
                    .await
                {
                    Ok(answer) => return answer,
                    Err((id, Unreachable(e))) => {
                        log::warn!("{e}");
                        id
                    }
                }
            }
        };
        match self.settings.outage {
            RedisOutage::Refuse => Err((Denied::Unavailable, RateView::default())),
            RedisOutage::Local => {
                Box::pin(
                    self.fallback
                        .reserve(db, cfg, who, id, input, output, weights, now),
                )
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
        let mut now = now;
        let (mut loads, mut drains) = (0, 0);
        while loads < 2 {
            let tier = self.tier_for(cfg, who);
            let limits = *cfg.limits(tier);
            let plan = RatePlan::for_key(who, &limits);
            let minute = now.div_euclid(WINDOW_MS);
            let k = account_keys(&self.prefix, user_id);
            let mut inv = self.reserve.prepare_invoke();
            for key in &k {
                inv.key(key);
            }
            // The next minute's window too: the chunks leases took ahead count in this minute.
            inv.key(rate_key(&self.prefix, user_id, &plan.scope, minute - 1))
                .key(rate_key(&self.prefix, user_id, &plan.scope, minute))
                .key(rate_key(&self.prefix, user_id, &plan.scope, minute + 1))
                .key(grant_key(&self.prefix, user_id, &plan.scope));
            if !self.connector.is_cluster() {
                // On a cluster the set lives in another slot: joined below, in its own call.
                inv.key(&self.due_key);
            }
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
            let mut status = reply.first().and_then(as_string).unwrap_or_default();
            if let Some(refusal) = status.strip_prefix("drain-") {
                // Leases on other instances hold what is missing: they give it back within
                // a renewal (the account is drained now), so wait and ask again.
                if drains < DRAIN_TRIES {
                    if drains == 0 {
                        self.signal_drain(user_id, now).await;
                    }
                    drains += 1;
                    tokio::time::sleep(DRAIN_WAIT).await;
                    now = crate::util::now_ms();
                    continue;
                }
                status = refusal.to_string();
            }
            match status.as_str() {
                "load" => {
                    loads += 1;
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
                    let top = reply.get(2).and_then(as_i64).and_then(Tier::from_index);
                    self.hints.insert(user_id.clone(), (weekly, top));
                    if self.connector.is_cluster() && reply.get(12).and_then(as_i64) == Some(1) {
                        self.join_sweep(user_id, now).await;
                    }
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
                            leased: false,
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
        if t.leased {
            return self.settle_leased(db, t, used).await;
        }
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
        inv.key(rate_key(&self.prefix, &t.user_id, &t.plan.scope, t.minute));
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
            Some("ok") => Ok(Settled::Paid(breakdown(&reply, 1, t, now))),
            other => {
                log::error!("redis settle: unexpected reply {other:?}");
                Ok(Settled::Paid(on_allowance(t, used, now)))
            }
        }
    }
}
