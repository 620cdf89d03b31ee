//! The Redis engine: every instance sharing one Redis sees one balance per account and one set
//! of per-minute windows. Reserve and settle are one Lua script each (one round trip each), so
//! concurrent requests on any number of instances can never together reserve more than is left.
//! An account missing from Redis (first use, expiry, Redis restart) is loaded from the database,
//! the record of truth, by a third script that only the first loader wins.

use redis::aio::ConnectionManager;
use redis::{Script, Value as RedisValue};

use super::limits::{WindowView, WINDOW_MS};
use super::{Denied, RatePlan, RateView, Reservation, Ticket, Used};
use crate::config::{QuotaConfig, Tier};
use crate::identity::Identity;
use crate::quota::tiers::{effective_tier, usage_tier};
use crate::storage::quota::{Breakdown, Lot, LotKind};
use crate::storage::Db;
use crate::util::FastHash;

/// Hot account state expires after this long unused; it reloads from the database.
const ACCOUNT_TTL_SECS: u64 = 8 * 24 * 3600;

pub struct Shared {
    conn: ConnectionManager,
    reserve: Script,
    settle: Script,
    load: Script,
    add_lot: Script,
    /// Key prefix, so tests (and several gateways) can share one Redis.
    prefix: String,
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

fn rate_key(prefix: &str, scope: &str, minute: i64) -> String {
    format!("{prefix}rl:{scope}:{minute}")
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

impl Shared {
    pub async fn connect(url: &str, prefix: &str) -> Result<Shared, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis url: {e}"))?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(|e| format!("redis connect: {e}"))?;
        Ok(Shared {
            conn,
            reserve: Script::new(RESERVE_LUA),
            settle: Script::new(SETTLE_LUA),
            load: Script::new(LOAD_LUA),
            add_lot: Script::new(include_str!("lua/add_lot.lua")),
            prefix: prefix.to_string(),
            hints: dashmap::DashMap::default(),
        })
    }

    /// One PING on the shared connection (the caller bounds the wait).
    pub async fn ping(&self) -> Result<(), String> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }

    /// Copies an account's balance from the database into Redis (first loader wins).
    async fn load_account(&self, db: &Db, user_id: &str, now: i64) -> Result<(), String> {
        let spend = db
            .quota()
            .spend(user_id, now)
            .await
            .map_err(|e| e.to_string())?;
        let lots = db
            .quota()
            .lots(user_id, now)
            .await
            .map_err(|e| e.to_string())?;
        let weekly: u64 = spend
            .iter()
            .map(|b| b.allowance_tokens + b.lot_tokens)
            .sum();
        let top = crate::quota::tiers::entitlement_tier(&lots, now);
        self.hints.insert(user_id.to_string(), (weekly, top));
        let k = account_keys(&self.prefix, user_id);
        let mut inv = self.load.prepare_invoke();
        for key in &k {
            inv.key(key);
        }
        inv.arg(ACCOUNT_TTL_SECS).arg(spend.len());
        for b in &spend {
            inv.arg(b.hour).arg(format!(
                "{},{},{},{}",
                b.allowance_tokens, b.allowance_requests, b.lot_tokens, b.lot_requests
            ));
        }
        for l in lots.iter().filter(|l| l.remaining > 0) {
            inv.arg(&l.id).arg(lot_value(l));
        }
        let mut conn = self.conn.clone();
        inv.invoke_async::<i64>(&mut conn)
            .await
            .map_err(|e| format!("redis load: {e}"))?;
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

    #[allow(clippy::too_many_arguments)]
    pub async fn reserve(
        &self,
        db: &Db,
        cfg: &QuotaConfig,
        who: &Identity,
        id: String,
        input: u64,
        output: u64,
        now: i64,
    ) -> Result<Reservation, (Denied, RateView)> {
        let user_id = &who.user.id;
        if !self.hints.contains_key(user_id) {
            // First sight on this instance: the tier hint comes with the load.
            self.load_account(db, user_id, now).await.map_err(|e| {
                log::error!("quota load for {user_id}: {e}");
                (Denied::Unavailable, RateView::default())
            })?;
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
                .key(rate_key(&self.prefix, &plan.scope, minute));
            inv.arg(now)
                .arg(&id)
                .arg(input + output)
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
                .arg(ACCOUNT_TTL_SECS);
            let mut conn = self.conn.clone();
            let reply: Vec<RedisValue> = inv.invoke_async(&mut conn).await.map_err(|e| {
                log::error!("redis reserve: {e}");
                (Denied::Unavailable, RateView::default())
            })?;
            let status = reply.first().and_then(as_string).unwrap_or_default();
            match status.as_str() {
                "load" => {
                    self.load_account(db, user_id, now).await.map_err(|e| {
                        log::error!("quota load for {user_id}: {e}");
                        (Denied::Unavailable, RateView::default())
                    })?;
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
                    return Err((
                        Denied::RateLimited {
                            retry_after_secs: wait,
                            what,
                        },
                        views(&reply, 3),
                    ));
                }
                "quota" => return Err((Denied::InsufficientQuota, views(&reply, 1))),
                "ok" => {
                    let weekly = reply.get(1).and_then(as_i64).unwrap_or(0).max(0) as u64;
                    let top = reply
                        .get(2)
                        .and_then(as_i64)
                        .and_then(|t| usize::try_from(t).ok())
                        .and_then(|t| Tier::ALL.get(t).copied());
                    self.hints.insert(user_id.clone(), (weekly, top));
                    return Ok(Reservation {
                        ticket: Ticket {
                            id,
                            user_id: user_id.clone(),
                            tokens: input + output,
                            requests: 1,
                            input_cost: input,
                            output_cost: output,
                            minute,
                            plan,
                            limits,
                            unlimited: who.user.unlimited,
                        },
                        rate: views(&reply, 3),
                    });
                }
                other => {
                    log::error!("redis reserve: unexpected reply {other:?}");
                    return Err((Denied::Unavailable, RateView::default()));
                }
            }
        }
        Err((Denied::Unavailable, RateView::default()))
    }

    /// Settles in Redis, retrying through a Redis restart; if Redis stays unreachable the whole
    /// usage is booked on the allowance so the database record still adds up.
    pub async fn settle(&self, db: &Db, t: &Ticket, used: Used, now: i64) -> Breakdown {
        let tokens = used.input_tokens + used.output_tokens;
        let mut delay = std::time::Duration::from_millis(50);
        for _attempt in 0..8 {
            match self.try_settle(t, used, now).await {
                Ok(Some(b)) => return b,
                Ok(None) => {
                    if let Err(e) = self.load_account(db, &t.user_id, now).await {
                        log::warn!("quota reload for settle: {e}");
                    }
                    continue;
                }
                Err(e) => {
                    log::warn!("redis settle failed, retrying: {e}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(2));
                }
            }
        }
        log::error!("redis unreachable: booking {} on the allowance", t.id);
        Breakdown {
            user_id: t.user_id.clone(),
            at_ms: now,
            allowance_tokens: tokens,
            allowance_requests: t.requests,
            lots: vec![],
        }
    }

    async fn try_settle(
        &self,
        t: &Ticket,
        used: Used,
        now: i64,
    ) -> Result<Option<Breakdown>, String> {
        let k = account_keys(&self.prefix, &t.user_id);
        let mut inv = self.settle.prepare_invoke();
        for key in &k {
            inv.key(key);
        }
        inv.key(rate_key(&self.prefix, &t.plan.scope, t.minute));
        inv.arg(now)
            .arg(&t.id)
            .arg(used.input_tokens + used.output_tokens)
            .arg(t.requests)
            .arg(t.limits.weekly_tokens)
            .arg(t.limits.weekly_requests)
            .arg(used.input_tokens as i64 - t.input_cost as i64)
            .arg(used.output_tokens as i64 - t.output_cost as i64)
            .arg(ACCOUNT_TTL_SECS);
        let mut conn = self.conn.clone();
        let reply: Vec<RedisValue> = inv
            .invoke_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        match reply.first().and_then(as_string).as_deref() {
            Some("load") => Ok(None),
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
                Ok(Some(b))
            }
            other => Err(format!("unexpected settle reply {other:?}")),
        }
    }

    pub async fn add_lot(&self, lot: Lot) {
        let k = account_keys(&self.prefix, &lot.user_id);
        let mut conn = self.conn.clone();
        let r: Result<i64, _> = self
            .add_lot
            .key(&k[0])
            .key(&k[3])
            .arg(&lot.id)
            .arg(lot_value(&lot))
            .arg(ACCOUNT_TTL_SECS)
            .invoke_async(&mut conn)
            .await;
        if let Err(e) = r {
            log::warn!("redis add lot: {e}");
        }
    }
}
