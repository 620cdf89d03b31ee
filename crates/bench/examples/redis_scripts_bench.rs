//! Redis server time of the quota scripts against the shape of an account: how many hourly
//! spend buckets it has in the rolling week (up to 168) and how many reservations are open.
//! Reads `usec_per_call` of `evalsha` from `INFO commandstats`, so it counts the scripts' time
//! inside Redis only (no round trip), averaged over reserve and settle.
//!
//! Run: `cargo run --release --example redis_scripts_bench [N]` (Redis at 127.0.0.1:6379, or
//! `REDIS_URL`). It resets Redis's command statistics.

use gateway_core::quota::shared::{account_keys, LOAD_LUA, RESERVE_LUA, SETTLE_LUA};
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
    let rate = [format!("{prefix}rl:a"), format!("{prefix}rl:b")];
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
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("resetstat");
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
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("info");
    let mut all: Vec<String> = keys.to_vec();
    all.extend(rate);
    let _: i64 = conn.del(all).await.expect("cleanup");
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
}
