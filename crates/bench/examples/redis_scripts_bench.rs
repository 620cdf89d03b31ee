//! Redis server time of the quota scripts against the shape of an account: how many hourly
//! spend buckets it has in the rolling week (up to 168) and how many reservations are open.
//! Reads `usec_per_call` of `evalsha` from `INFO commandstats`, so it counts the scripts' time
//! inside Redis only (no round trip), averaged over reserve and settle. Then the two lease
//! renewals a steady account sends (`lease_time`): paying a set-aside share's settlements, and
//! that plus the next minute's window chunk.
//!
//! Run: `cargo run --release --example redis_scripts_bench [N]` (Redis at 127.0.0.1:6379, or
//! `REDIS_URL`). It resets Redis's command statistics.

use gateway_core::quota::shared::{
    account_keys, grant_key, rate_key, LEASE_LUA, LOAD_LUA, RESERVE_LUA, SETTLE_LUA,
};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script, Value};

const HOUR: i64 = 3_600_000;

async fn server_time(
    conn: &mut MultiplexedConnection,
    buckets: usize,
    held: usize,
    n: usize,
) -> f64 {
    let prefix = format!("bench:{}:", gateway_core::util::random_base62(8));
    let keys = account_keys(&prefix, "usr_bench");
    // The previous, this and the next minute's windows, and the grants on them.
    let rate = [
        format!("{prefix}rl:a"),
        format!("{prefix}rl:b"),
        format!("{prefix}rl:c"),
        format!("{prefix}rl:g"),
    ];
    let now = gateway_core::util::now_ms();
    let (reserve, settle, load) = (
        Script::new(RESERVE_LUA),
        Script::new(SETTLE_LUA),
        Script::new(LOAD_LUA),
    );

    let mut inv = load.prepare_invoke();
    for k in &keys {
        inv.key(k);
    }
    inv.arg(3600).arg(buckets);
    for b in 0..buckets as i64 {
        inv.arg(now / HOUR - b).arg("100,1,0,0");
    }
    let _: i64 = inv.invoke_async(conn).await.expect("load");

    let reserve_one = |id: String| {
        let mut inv = reserve.prepare_invoke();
        for k in keys.iter().chain(&rate) {
            inv.key(k);
        }
        inv.arg(now)
            .arg(id)
            .arg(10)
            .arg(1)
            .arg(1_000_000_000_000i64);
        inv.arg(0).arg("0").arg(600_000).arg(0).arg(0).arg(0);
        inv.arg(10).arg(0).arg(3600);
        inv
    };
    for i in 0..held {
        let _: Vec<Value> = reserve_one(format!("held{i}"))
            .invoke_async(conn)
            .await
            .expect("reserve");
    }
    reset_stats(conn).await;
    for i in 0..n {
        let id = format!("r{i}");
        let _: Vec<Value> = reserve_one(id.clone())
            .invoke_async(conn)
            .await
            .expect("reserve");
        let mut inv = settle.prepare_invoke();
        for k in &keys {
            inv.key(k);
        }
        inv.key(&rate[1]);
        inv.arg(now)
            .arg(id)
            .arg(10)
            .arg(1)
            .arg(1_000_000_000_000i64);
        inv.arg(0).arg(0).arg(0).arg(3600);
        let _: Vec<Value> = inv.invoke_async(conn).await.expect("settle");
    }
    let us = evalsha_usec(conn).await;
    let mut all: Vec<String> = keys.to_vec();
    all.extend(rate);
    let _: i64 = conn.del(all).await.expect("cleanup");
    us
}

/// Server time of one lease renewal (`lease.lua` with pay.lua's light path first), µs per
/// call: an account whose set-aside share pays a few settlements each call, with the next
/// minute's window chunk asked for (`ahead`) or not, and each call an hour after the last
/// (`hourly`: it moves the last hour's spend bucket and pushes the keys' expiry back, as an
/// account's first renewal of an hour does) or not. Caps too large to refuse, as in
/// `scripts/bench --redis --accounts`.
async fn lease_time(conn: &mut MultiplexedConnection, ahead: bool, hourly: bool, n: usize) -> f64 {
    let prefix = format!("bench:{}:", gateway_core::util::random_base62(8));
    let keys = account_keys(&prefix, "usr_bench");
    let now = gateway_core::util::now_ms();
    let minute = now / 60_000;
    let mut windows: Vec<String> = [minute - 1, minute, minute + 1]
        .map(|m| rate_key(&prefix, "usr_bench", "acct:usr_bench", m))
        .to_vec();
    windows.push(grant_key(&prefix, "usr_bench", "acct:usr_bench"));
    let load = Script::new(LOAD_LUA);
    let mut inv = load.prepare_invoke();
    for k in &keys {
        inv.key(k);
    }
    inv.arg(3600).arg(0);
    let _: i64 = inv.invoke_async(conn).await.expect("load");
    let lease = Script::new(LEASE_LUA);
    // (unused share kept, share asked for, set-aside settlements, next minute's chunk asked)
    let call = |at: i64, free: [i64; 2], ask: [i64; 2], aside: [i64; 2], chunk: bool| {
        let mut inv = lease.prepare_invoke();
        for k in keys.iter().chain(&windows) {
            inv.key(k);
        }
        inv.arg(at)
            .arg("L:bench")
            .arg(1_000_000_000_000i64)
            .arg(0)
            .arg("0");
        inv.arg(900_000).arg(3600).arg(4);
        inv.arg(0).arg(0).arg(free[0]).arg(free[1]);
        inv.arg(ask[0]).arg(ask[1]).arg(79);
        inv.arg(0).arg(0);
        inv.arg(0).arg(i64::from(chunk)).arg(0);
        inv.arg(aside[0]).arg(aside[1]);
        if chunk {
            // Windows 1 (previous) and 2 (this minute), caps, nothing of this minute's given
            // back or asked for; the next minute's window 3, its chunk asked for.
            inv.arg(1).arg(2);
            inv.arg(100_000_000)
                .arg(1_000_000_000_000i64)
                .arg(1_000_000_000_000i64);
            for _ in 0..10 {
                inv.arg(0);
            }
            inv.arg(1).arg(15).arg(64);
            inv.arg(3).arg(0).arg(0).arg(0).arg(32).arg(960).arg(4096);
            // The grants (window 4); no grant ends.
            inv.arg(4).arg(0).arg("");
        }
        inv
    };
    // The share, taken once: set aside from an allowance far larger than it.
    let _: Vec<Value> = call(now, [0, 0], [10_112, 128], [0, 0], false)
        .invoke_async(conn)
        .await
        .expect("lease");
    // The first payment opens the hour's spend bucket.
    let _: Vec<Value> = call(now, [9_769, 121], [0, 0], [343, 7], false)
        .invoke_async(conn)
        .await
        .expect("lease");
    reset_stats(conn).await;
    // An hour apart, within the week (its sums are rebuilt once the oldest bucket leaves it).
    let n = if hourly { n.min(160) } else { n };
    for i in 1..=n as i64 {
        let at = if hourly { now + i * HOUR } else { now };
        let _: Vec<Value> = call(at, [9_769, 121], [0, 0], [343, 7], ahead)
            .invoke_async(conn)
            .await
            .expect("lease");
    }
    let us = evalsha_usec(conn).await;
    let mut all: Vec<String> = keys.to_vec();
    all.extend(windows);
    let _: i64 = conn.del(all).await.expect("cleanup");
    us
}

/// Starts Redis's command statistics afresh, so `evalsha_usec` counts only what follows.
async fn reset_stats(conn: &mut MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("resetstat");
}

/// `usec_per_call` of `evalsha` since the last `reset_stats`.
async fn evalsha_usec(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("info");
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("usec_per_call=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3000);
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connect");
    println!("| spend buckets | open reservations | evalsha µs per call (server) |");
    println!("|---:|---:|---:|");
    for (buckets, held) in [(1, 0), (1, 16), (1, 64), (168, 0), (168, 16)] {
        let us = server_time(&mut conn, buckets, held, n).await;
        println!("| {buckets} | {held} | {us:.1} |");
    }
    println!();
    println!("| lease renewal | evalsha µs per call (server) |");
    println!("|---|---:|");
    for (what, ahead, hourly) in [
        ("set-aside settlements paid", false, false),
        ("the same, the first of an hour", false, true),
        ("the same and the next minute's chunk", true, false),
    ] {
        let us = lease_time(&mut conn, ahead, hourly, n).await;
        println!("| {what} | {us:.1} |");
    }
}
