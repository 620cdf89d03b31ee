//! The Redis engine's scripts and keys: where an account's state lives, the Lua sources, and
//! reading their replies. Every key of an account carries its id as the hash tag, so a Redis
//! Cluster keeps them on one node and one script may touch them all.

use redis::{RedisError, Value as RedisValue};

use super::limits::WindowView;
use super::{RateView, Ticket, Used};
use crate::domain::{Breakdown, Lot, LotKind};

/// Hot account state expires after this long unused; it reloads from the database.
pub(super) const ACCOUNT_TTL_SECS: u64 = 8 * 24 * 3600;

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
pub const LEASE_LUA: &str = concat!(
    include_str!("lua/account.lua"),
    include_str!("lua/pay.lua"),
    "local paid = pay_only(KEYS, 0, ARGV, 0)\nif paid then return paid end\n",
    include_str!("lua/lease.lua")
);
/// lease.lua's body as a function over one account's slice of the keys and arguments, called
/// once per account (`lease_batch.lua`): one script call renews many accounts on one Redis.
/// Both try pay.lua's light path first.
pub const LEASE_BATCH_LUA: &str = concat!(
    include_str!("lua/account.lua"),
    include_str!("lua/pay.lua"),
    "local function renew_one(KEYS, ARGV)\n",
    include_str!("lua/lease.lua"),
    "\nend\n",
    include_str!("lua/lease_batch.lua")
);
pub const SWEEP_LUA: &str = concat!(
    include_str!("lua/account.lua"),
    include_str!("lua/sweep.lua")
);

/// A per-minute window's key. Tagged with the account that owns the scope (a key's windows
/// with its account's), so one script can touch the window and the account on a cluster.
pub fn rate_key(prefix: &str, user_id: &str, scope: &str, minute: i64) -> String {
    format!("{prefix}q:{{{user_id}}}:rl:{scope}:{minute}")
}

/// The standing grants on `scope`'s per-minute windows (`lease::Grant`): a hash, one field per
/// instance, in the account's slot.
pub fn grant_key(prefix: &str, user_id: &str, scope: &str) -> String {
    format!("{prefix}q:{{{user_id}}}:rl:{scope}:g")
}

/// The balance arguments `load.lua` and `reload.lua` share: each hourly spend bucket, then each
/// lot with something left.
pub(super) fn push_balance(
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

pub(super) fn lot_value(l: &Lot) -> String {
    let kind = match l.kind {
        LotKind::Token => "t",
        LotKind::Request => "r",
    };
    let tier = l.tier.map(|t| t.index() as i64).unwrap_or(-1);
    format!("{kind},{},{},{tier}", l.remaining, l.expires_at)
}

pub(super) fn as_i64(v: &RedisValue) -> Option<i64> {
    match v {
        RedisValue::Int(n) => Some(*n),
        RedisValue::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        RedisValue::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(super) fn as_string(v: &RedisValue) -> Option<String> {
    match v {
        RedisValue::BulkString(b) => String::from_utf8(b.clone()).ok(),
        RedisValue::SimpleString(s) => Some(s.clone()),
        RedisValue::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Reads the three (limit, remaining, reset) triples starting at `at`.
pub(super) fn views(items: &[RedisValue], at: usize) -> RateView {
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
pub(super) fn connection_lost(e: &RedisError) -> bool {
    // The client's own response deadline is a late answer, not a lost connection.
    !e.is_timeout() && e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
}

/// The whole usage booked on the allowance: what a settlement records when no balance can be
/// read, so the database record still adds up.
pub(super) fn on_allowance(t: &Ticket, used: Used, now: i64) -> Breakdown {
    Breakdown {
        user_id: t.user_id.clone(),
        at_ms: now,
        allowance_tokens: t.charge(used),
        allowance_requests: t.requests,
        lots: vec![],
    }
}

/// The breakdown a settlement script returns from index `at`: allowance tokens, allowance
/// requests, then (lot id, kind, amount) triples.
pub(super) fn breakdown(items: &[RedisValue], at: usize, t: &Ticket, now: i64) -> Breakdown {
    let mut b = Breakdown {
        user_id: t.user_id.clone(),
        at_ms: now,
        allowance_tokens: items.get(at).and_then(as_i64).unwrap_or(0).max(0) as u64,
        allowance_requests: items.get(at + 1).and_then(as_i64).unwrap_or(0).max(0) as u64,
        lots: vec![],
    };
    let mut i = at + 2;
    while i + 2 < items.len() {
        let id = as_string(&items[i]).unwrap_or_default();
        let kind = if as_string(&items[i + 1]).as_deref() == Some("r") {
            LotKind::Request
        } else {
            LotKind::Token
        };
        let n = as_i64(&items[i + 2]).unwrap_or(0).max(0) as u64;
        b.lots.push((id, kind, n));
        i += 3;
    }
    b
}
