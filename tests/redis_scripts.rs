//! The Redis quota scripts driven directly, with the clock as an argument: the rolling week's
//! running sums as hours leave it, stale reservations released whatever the request's outcome
//! (and by the sweep), retried settlements paid once, accounts written by the previous key
//! layout, and leases (a quarter of what is left at most, taken back by a drain). Runs when
//! `GATEWAY_TEST_REDIS` is set (CI's Postgres + Redis run); the gateway-level quota tests
//! (tests/quota.rs, tests/multi_instance.rs) run these scripts too.

use gateway_core::quota::shared::{account_keys, LEASE_LUA, LOAD_LUA, RESERVE_LUA, SETTLE_LUA};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script, Value};

const HOUR: i64 = 3_600_000;
/// An hour well inside the Unix era, so `hour - 170` is still positive.
const H: i64 = 490_000;
const NO_TIMEOUT: i64 = 1_000_000_000;

struct Account {
    conn: MultiplexedConnection,
    keys: [String; 5],
    rate: [String; 3],
    /// The standing grants on the windows (`lease::Grant`).
    grants: String,
}

/// What a reserve call answered.
#[derive(Debug, PartialEq)]
enum Reply {
    /// Reserved; the account's weekly total (allowance + lot tokens in the window).
    Ok {
        weekly_tokens: i64,
    },
    Quota,
    Load,
    Other(String),
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

impl Account {
    /// A fresh account's keys, or `None` (the test is skipped) without `GATEWAY_TEST_REDIS`.
    async fn new() -> Option<Account> {
        let Ok(url) = std::env::var("GATEWAY_TEST_REDIS") else {
            eprintln!("GATEWAY_TEST_REDIS not set: skipped");
            return None;
        };
        let client = redis::Client::open(url).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis connect");
        let prefix = format!("test:{}:", gateway_core::util::random_base62(12));
        let user = "usr_scripts";
        Some(Account {
            conn,
            keys: account_keys(&prefix, user),
            rate: [1, 2, 3]
                .map(|m| gateway_core::quota::shared::rate_key(&prefix, user, "acct:a", m)),
            grants: gateway_core::quota::shared::grant_key(&prefix, user, "acct:a"),
        })
    }

    async fn load(&mut self, buckets: &[(i64, &str)]) {
        let script = Script::new(LOAD_LUA);
        let mut inv = script.prepare_invoke();
        for k in &self.keys {
            inv.key(k);
        }
        inv.arg(3600).arg(buckets.len());
        for (hour, v) in buckets {
            inv.arg(*hour).arg(*v);
        }
        let loaded: i64 = inv.invoke_async(&mut self.conn).await.unwrap();
        assert_eq!(loaded, 1);
    }

    /// Reserves `tokens` (and one request) against a weekly allowance of `weekly` tokens, with
    /// no per-minute caps.
    async fn reserve(
        &mut self,
        now: i64,
        id: &str,
        tokens: i64,
        weekly: i64,
        timeout: i64,
    ) -> Reply {
        let script = Script::new(RESERVE_LUA);
        let mut inv = script.prepare_invoke();
        for k in self.keys.iter().chain(&self.rate) {
            inv.key(k);
        }
        inv.key(&self.grants);
        inv.arg(now)
            .arg(id)
            .arg(tokens)
            .arg(1)
            .arg(weekly)
            .arg(0)
            .arg("0")
            .arg(timeout)
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(tokens)
            .arg(0)
            .arg(3600);
        let reply: Vec<Value> = inv.invoke_async(&mut self.conn).await.unwrap();
        match text(&reply[0]).as_str() {
            "ok" => Reply::Ok {
                weekly_tokens: text(&reply[1]).parse().unwrap(),
            },
            "quota" => Reply::Quota,
            "load" => Reply::Load,
            other => Reply::Other(other.to_string()),
        }
    }

    /// Settles `id` for `tokens` against a weekly allowance of `weekly` tokens; returns the
    /// tokens booked on the allowance.
    async fn settle(&mut self, now: i64, id: &str, tokens: i64, weekly: i64) -> i64 {
        let script = Script::new(SETTLE_LUA);
        let mut inv = script.prepare_invoke();
        for k in &self.keys {
            inv.key(k);
        }
        inv.key(&self.rate[1]);
        inv.arg(now)
            .arg(id)
            .arg(tokens)
            .arg(1)
            .arg(weekly)
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(3600);
        let reply: Vec<Value> = inv.invoke_async(&mut self.conn).await.unwrap();
        assert_eq!(text(&reply[0]), "ok", "{reply:?}");
        text(&reply[1]).parse().unwrap()
    }

    /// Gives the account a token lot of `tokens` expiring at `expires` (ms).
    async fn add_lot(&mut self, id: &str, tokens: i64, expires: i64) {
        let _: () = self
            .conn
            .hset(&self.keys[3], id, format!("t,{tokens},{expires},-1"))
            .await
            .unwrap();
    }

    async fn meta(&mut self, field: &str) -> Option<i64> {
        let v: Option<i64> = self.conn.hget(&self.keys[0], field).await.unwrap();
        v
    }

    /// Whether the account keeps a spend bucket for `hour`: in the buckets hash, or as the
    /// current hour's bucket in the meta hash (`bh`).
    async fn has_bucket(&mut self, hour: i64) -> bool {
        let in_hash: bool = self.conn.hexists(&self.keys[2], hour).await.unwrap();
        in_hash || self.meta("bh").await == Some(hour)
    }

    /// Open reservations: (entries in the hash, entries in the start-time index).
    async fn open(&mut self) -> (i64, i64) {
        let held: i64 = self.conn.hlen(&self.keys[1]).await.unwrap();
        let indexed: i64 = self.conn.zcard(&self.keys[4]).await.unwrap();
        (held, indexed)
    }

    /// Seconds until key `k` (index into `keys`) expires: -2 missing, -1 never.
    async fn ttl(&mut self, k: usize) -> i64 {
        self.conn.ttl(&self.keys[k]).await.unwrap()
    }

    /// The test scope's windows of the previous, this and the next minute.
    fn windows(&self, minute: i64) -> [String; 3] {
        let prefix = self.keys[0].strip_suffix("q:{usr_scripts}").unwrap();
        [minute - 1, minute, minute + 1]
            .map(|m| gateway_core::quota::shared::rate_key(prefix, "usr_scripts", "acct:a", m))
    }

    async fn cleanup(mut self) {
        let mut all: Vec<String> = self.keys.to_vec();
        all.extend(self.rate.iter().cloned());
        all.push(self.grants.clone());
        let _: i64 = self.conn.del(all).await.unwrap();
    }
}

#[tokio::test]
async fn the_week_slides_hour_by_hour() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let now = H * HOUR + 1_000;
    a.load(&[
        (H - 170, "1000,1,0,0"),
        (H - 167, "100,1,50,0"),
        (H - 1, "10,1,0,0"),
    ])
    .await;
    // The window is hours H-167 ..= H: allowance 110 plus lot tokens 50.
    let r = a.reserve(now, "r1", 5, 1_000_000, NO_TIMEOUT).await;
    assert_eq!(r, Reply::Ok { weekly_tokens: 160 });
    assert!(
        !a.has_bucket(H - 170).await,
        "a bucket outside the week is dropped"
    );
    assert_eq!(a.meta("so").await, Some(H - 167));
    assert_eq!(a.meta("sa").await, Some(110));

    // An hour later the oldest bucket has left the week.
    let later = now + HOUR;
    let r = a.reserve(later, "r2", 5, 1_000_000, NO_TIMEOUT).await;
    assert_eq!(r, Reply::Ok { weekly_tokens: 10 });
    assert!(!a.has_bucket(H - 167).await);
    assert_eq!(a.meta("so").await, Some(H - 1));

    // Settling books into the current hour's bucket and into the sums.
    assert_eq!(a.settle(later, "r1", 7, 1_000_000).await, 7);
    assert_eq!(a.settle(later, "r2", 3, 1_000_000).await, 3);
    assert_eq!(
        a.open().await,
        (0, 0),
        "settled reservations are gone from both"
    );
    assert!(a.has_bucket(H + 1).await);
    let r = a.reserve(later, "r3", 5, 1_000_000, NO_TIMEOUT).await;
    assert_eq!(r, Reply::Ok { weekly_tokens: 20 });
    // Meta, reservations, buckets and the start-time index all expire with the account.
    for k in [0, 1, 2, 4] {
        let ttl = a.ttl(k).await;
        assert!(ttl > 0 && ttl <= 3600, "key {k}: ttl {ttl}");
    }

    // A week after the last spend nothing is left in the window, and no oldest hour either.
    let r = a
        .reserve(later + 168 * HOUR, "r4", 5, 1_000_000, NO_TIMEOUT)
        .await;
    assert_eq!(r, Reply::Ok { weekly_tokens: 0 });
    assert_eq!(a.meta("so").await, None);
    assert_eq!(a.meta("sa").await, Some(0));
    a.cleanup().await;
}

#[tokio::test]
async fn the_allowance_is_checked_against_the_sums() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let now = H * HOUR;
    a.load(&[(H - 1, "150,1,0,0")]).await;
    assert_eq!(
        a.reserve(now, "big", 51, 200, NO_TIMEOUT).await,
        Reply::Quota
    );
    assert_eq!(
        a.reserve(now, "fits", 50, 200, NO_TIMEOUT).await,
        Reply::Ok { weekly_tokens: 150 }
    );
    assert_eq!(
        a.reserve(now, "more", 1, 200, NO_TIMEOUT).await,
        Reply::Quota
    );
    assert_eq!(a.settle(now, "fits", 20, 200).await, 20);
    // 170 spent, nothing held: 30 left.
    assert_eq!(
        a.reserve(now, "r31", 31, 200, NO_TIMEOUT).await,
        Reply::Quota
    );
    assert_eq!(
        a.reserve(now, "r30", 30, 200, NO_TIMEOUT).await,
        Reply::Ok { weekly_tokens: 170 }
    );
    a.cleanup().await;
}

#[tokio::test]
async fn a_refused_request_still_releases_stale_reservations() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let t0 = H * HOUR;
    a.load(&[]).await;
    // A request reserves 80 of 100 and its instance dies: nothing ever settles it.
    assert_eq!(
        a.reserve(t0, "lost", 80, 100, 1_000).await,
        Reply::Ok { weekly_tokens: 0 }
    );
    assert_eq!(a.meta("rt").await, Some(80));
    // Past the timeout a request too large for the whole allowance is refused, and the lost
    // reservation is released all the same.
    assert_eq!(
        a.reserve(t0 + 2_000, "huge", 101, 100, 1_000).await,
        Reply::Quota
    );
    assert_eq!(a.meta("rt").await, Some(0));
    assert_eq!(a.open().await, (0, 0));
    assert_eq!(
        a.reserve(t0 + 2_000, "all", 100, 100, 1_000).await,
        Reply::Ok { weekly_tokens: 0 }
    );
    a.cleanup().await;
}

#[tokio::test]
async fn an_account_in_the_previous_layout_is_carried_over() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let t0 = H * HOUR;
    // What the earlier scripts left: totals and reservations, no sums, no start-time index.
    let _: () = a
        .conn
        .hset_multiple(&a.keys[0], &[("loaded", 1), ("rt", 80), ("rr", 1)])
        .await
        .unwrap();
    let _: () = a
        .conn
        .hset(&a.keys[1], "old", format!("80,1,{t0}"))
        .await
        .unwrap();
    let _: () = a.conn.hset(&a.keys[2], H - 1, "30,1,0,0").await.unwrap();

    // The old reservation is found by its start time and released: 100 - 30 spent = 70 left.
    assert_eq!(
        a.reserve(t0 + 2_000, "r71", 71, 100, 1_000).await,
        Reply::Quota
    );
    assert_eq!(a.open().await, (0, 0));
    assert_eq!(
        a.reserve(t0 + 2_000, "r70", 70, 100, 1_000).await,
        Reply::Ok { weekly_tokens: 30 }
    );
    assert_eq!(a.meta("v").await, Some(2));
    assert_eq!(a.meta("sa").await, Some(30));
    assert_eq!(a.meta("rt").await, Some(70));
    a.cleanup().await;
}

#[tokio::test]
async fn an_account_not_in_redis_asks_to_be_loaded() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    assert_eq!(a.reserve(H * HOUR, "r", 1, 100, 1_000).await, Reply::Load);
    a.cleanup().await;
}

/// Settles `id` only if it is still held (a retry after a lost answer); the reply's status.
async fn settle_if_held(a: &mut Account, now: i64, id: &str, tokens: i64, weekly: i64) -> String {
    let script = Script::new(SETTLE_LUA);
    let mut inv = script.prepare_invoke();
    for k in &a.keys {
        inv.key(k);
    }
    inv.key(&a.rate[1]);
    inv.arg(now)
        .arg(id)
        .arg(tokens)
        .arg(1)
        .arg(weekly)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(3600)
        .arg(1);
    let reply: Vec<Value> = inv.invoke_async(&mut a.conn).await.unwrap();
    text(&reply[0])
}

#[tokio::test]
async fn a_retried_settlement_never_pays_twice() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let now = H * HOUR + 1_000;
    a.load(&[]).await;
    assert_eq!(
        a.reserve(now, "r1", 100, 1000, NO_TIMEOUT).await,
        Reply::Ok { weekly_tokens: 0 }
    );
    // The first attempt ran (its answer was lost); the retry finds nothing held.
    assert_eq!(a.settle(now + 1, "r1", 40, 1000).await, 40);
    assert_eq!(
        settle_if_held(&mut a, now + 2, "r1", 40, 1000).await,
        "gone"
    );
    assert_eq!(a.meta("sa").await, Some(40), "paid once");
    // A retry of an attempt that never ran pays.
    assert_eq!(
        a.reserve(now + 3, "r2", 100, 1000, NO_TIMEOUT).await,
        Reply::Ok { weekly_tokens: 40 }
    );
    assert_eq!(settle_if_held(&mut a, now + 4, "r2", 10, 1000).await, "ok");
    assert_eq!(a.meta("sa").await, Some(50));
    assert_eq!(a.open().await, (0, 0));
    a.cleanup().await;
}

#[tokio::test]
async fn the_sweep_releases_only_stale_reservations_and_keeps_the_set_exact() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let due = format!("{}:due", a.keys[0]);
    let user = "usr_scripts";
    let now = H * HOUR + 1_000;
    a.load(&[]).await;
    // Reservations at now and now + 5 s; the reserve script (given the set) enters the account.
    for (at, id) in [(now, "old"), (now + 5_000, "new")] {
        reserve_in_set(&mut a, &due, user, at, id).await;
    }
    let score: Option<f64> = a.conn.zscore(&due, user).await.unwrap();
    assert_eq!(score, Some(now as f64), "scored by the oldest reservation");

    assert_eq!(
        sweep(&mut a, &due, user, now + 9_000).await,
        0,
        "nothing is stale yet"
    );
    assert_eq!(
        sweep(&mut a, &due, user, now + 12_000).await,
        1,
        "the old one is"
    );
    assert_eq!(a.open().await, (1, 1));
    assert_eq!(a.meta("rr").await, Some(1));
    assert_eq!(a.meta("rt").await, Some(10));
    let score: Option<f64> = a.conn.zscore(&due, user).await.unwrap();
    assert_eq!(
        score,
        Some((now + 5_000) as f64),
        "rescored to the one left"
    );
    // Without the set (a cluster's call), the script only reports the oldest start time.
    assert_eq!(
        sweep_call(&mut a, None, user, now + 14_000).await,
        (0, now + 5_000)
    );
    assert_eq!(sweep(&mut a, &due, user, now + 16_000).await, 1);
    assert_eq!(a.meta("rr").await, Some(0));
    let score: Option<f64> = a.conn.zscore(&due, user).await.unwrap();
    assert_eq!(score, None, "holding nothing, the account leaves the set");
    let _: i64 = a.conn.del(&due).await.unwrap();
    a.cleanup().await;
}

#[tokio::test]
async fn one_sweep_call_sweeps_many_accounts_each_on_its_own_keys() {
    let (Some(mut a), Some(mut b), Some(c)) = (
        Account::new().await,
        Account::new().await,
        Account::new().await,
    ) else {
        return;
    };
    let due = format!("{}:due", a.keys[0]);
    let now = H * HOUR + 1_000;
    a.load(&[]).await;
    b.load(&[]).await;
    // a: one reservation stale at the sweep, one not; b: one not yet stale; c: no longer in
    // Redis (its hash expired) but still in the set with a stale start time.
    reserve_in_set(&mut a, &due, "usr_a", now, "old").await;
    reserve_in_set(&mut a, &due, "usr_a", now + 5_000, "new").await;
    reserve_in_set(&mut b, &due, "usr_b", now + 2_000, "only").await;
    let _: i64 = a.conn.zadd(&c.keys[4], "gone", now).await.unwrap();
    let _: i64 = a.conn.zadd(&due, "usr_c", now).await.unwrap();

    let script = Script::new(gateway_core::quota::shared::SWEEP_LUA);
    let mut inv = script.prepare_invoke();
    for acc in [&a, &b, &c] {
        inv.key(&acc.keys[0]).key(&acc.keys[1]).key(&acc.keys[4]);
    }
    inv.key(&due);
    inv.arg(now + 11_000)
        .arg(10_000)
        .arg("usr_a")
        .arg("usr_b")
        .arg("usr_c");
    let swept: Vec<i64> = inv.invoke_async(&mut a.conn).await.unwrap();
    assert_eq!(
        swept,
        vec![1, now + 5_000, 0, now + 2_000, 0, -1],
        "per account: released, oldest left"
    );
    assert_eq!(a.open().await, (1, 1), "a keeps its fresh reservation only");
    assert_eq!(a.meta("rr").await, Some(1));
    assert_eq!(b.open().await, (1, 1), "b's reservation is not stale");
    assert_eq!(b.meta("rr").await, Some(1));
    for (user, score) in [
        ("usr_a", Some(now + 5_000)),
        ("usr_b", Some(now + 2_000)),
        ("usr_c", None),
    ] {
        let got: Option<f64> = a.conn.zscore(&due, user).await.unwrap();
        assert_eq!(got, score.map(|s| s as f64), "{user}'s place in the set");
    }
    let _: i64 = a.conn.del(&due).await.unwrap();
    let _: i64 = a.conn.del(&c.keys[4]).await.unwrap();
    a.cleanup().await;
    b.cleanup().await;
}

/// One reservation of 10 tokens and one request at `at` (reserve.lua, given the sweep's set).
async fn reserve_in_set(a: &mut Account, due: &str, user: &str, at: i64, id: &str) {
    let script = Script::new(RESERVE_LUA);
    let mut inv = script.prepare_invoke();
    for k in a.keys.iter().chain(&a.rate) {
        inv.key(k);
    }
    inv.key(&a.grants);
    inv.key(due);
    inv.arg(at).arg(id).arg(10).arg(1).arg(1000).arg(0).arg("0");
    inv.arg(NO_TIMEOUT)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(10)
        .arg(0)
        .arg(3600)
        .arg(user);
    let reply: Vec<Value> = inv.invoke_async(&mut a.conn).await.unwrap();
    assert_eq!(text(&reply[0]), "ok");
}

/// One sweep.lua call over the test account (10 s reservation timeout); how many it released.
async fn sweep(a: &mut Account, due: &str, user: &str, at: i64) -> i64 {
    let (released, _oldest) = sweep_call(a, Some(due), user, at).await;
    released
}

/// One sweep.lua call, with the sweep's set among its keys or (as on a Redis Cluster) without:
/// (released, start of the oldest reservation left or -1).
async fn sweep_call(a: &mut Account, due: Option<&str>, user: &str, at: i64) -> (i64, i64) {
    let script = Script::new(gateway_core::quota::shared::SWEEP_LUA);
    let mut inv = script.prepare_invoke();
    inv.key(&a.keys[0]).key(&a.keys[1]).key(&a.keys[4]);
    if let Some(due) = due {
        inv.key(due);
    }
    inv.arg(at).arg(10_000).arg(user);
    inv.invoke_async(&mut a.conn).await.unwrap()
}

/// One lease.lua call with no per-minute windows: (in-flight, unused, asked) tokens, one
/// request asked for, and the settlements' token amounts (one request each, paid as one sum).
/// Returns the reply.
async fn lease(
    a: &mut Account,
    now: i64,
    kept: (i64, i64),
    ask: i64,
    settled: &[i64],
) -> Vec<Value> {
    lease_flagged(a, now, kept, ask, settled, 0).await
}

/// `lease` with lease.lua's flags (1: push the lease's start time back, 2: read the lots).
async fn lease_flagged(
    a: &mut Account,
    now: i64,
    kept: (i64, i64),
    ask: i64,
    settled: &[i64],
    flags: i64,
) -> Vec<Value> {
    lease_call(LEASE_LUA, a, now, kept, ask, (settled, &[]), flags).await
}

/// `lease` for an instance whose lease was set aside: `aside` tokens settled within it (one
/// request each), already recorded as paid by the allowance.
async fn lease_aside(
    a: &mut Account,
    now: i64,
    kept: (i64, i64),
    ask: i64,
    aside: &[i64],
) -> Vec<Value> {
    lease_call(LEASE_LUA, a, now, kept, ask, (&[], aside), 0).await
}

/// lease.lua's whole body, without pay.lua's light path in front: what the light path must
/// leave the same.
const WHOLE_LEASE_LUA: &str = concat!(
    include_str!("../crates/core/src/quota/lua/account.lua"),
    include_str!("../crates/core/src/quota/lua/lease.lua")
);

/// pay.lua's light path alone: `{'whole'}` where it would leave the call to lease.lua's whole
/// body, so a test comparing it with the whole body also proves the light path took the call.
const LIGHT_ONLY_LUA: &str = concat!(
    include_str!("../crates/core/src/quota/lua/account.lua"),
    include_str!("../crates/core/src/quota/lua/pay.lua"),
    "local paid = pay_only(KEYS, 0, ARGV, 0)\nif paid then return paid end\nreturn {'whole'}\n"
);

/// One lease.lua call (`source`: as the gateway runs it, `LEASE_LUA`) with no per-minute
/// windows: `settled` = (settlements to split, those settled within a set-aside share).
async fn lease_call(
    source: &str,
    a: &mut Account,
    now: i64,
    kept: (i64, i64),
    ask: i64,
    settled: (&[i64], &[i64]),
    flags: i64,
) -> Vec<Value> {
    let script = Script::new(source);
    let mut inv = script.prepare_invoke();
    for k in &a.keys {
        inv.key(k);
    }
    inv.arg(now).arg("L:test").arg(1000).arg(0).arg("0");
    inv.arg(NO_TIMEOUT).arg(3600).arg(4);
    inv.arg(kept.0).arg(0).arg(kept.1).arg(0);
    inv.arg(ask).arg(i64::from(ask > 0)).arg(10);
    let (split, aside) = settled;
    inv.arg(split.iter().sum::<i64>()).arg(split.len());
    // No window corrections, no scopes.
    inv.arg(0).arg(0).arg(flags);
    inv.arg(aside.iter().sum::<i64>()).arg(aside.len());
    inv.invoke_async(&mut a.conn).await.unwrap()
}

#[tokio::test]
async fn a_lease_takes_a_quarter_at_most_and_a_drain_takes_it_back() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let now = H * HOUR + 1_000;
    a.load(&[]).await;
    // 1000 tokens a week, nothing spent: a lease asking 400 gets a quarter of what is left.
    let r = lease(&mut a, now, (0, 0), 400, &[]).await;
    assert_eq!((text(&r[0]), text(&r[1])), ("lease".into(), "250".into()));
    // The allowance alone covers it: set aside, not reserved.
    assert_eq!(text(&r[8]), "1");
    assert_eq!(
        (a.meta("xa").await, a.meta("rt").await),
        (Some(250), Some(0))
    );
    assert_eq!(a.meta("ft").await, Some(250), "held unused");
    // A request needing more than is left beside the lease is not refused outright: the
    // lease holds what it needs, so the account is drained and the caller asked to wait.
    assert_eq!(
        a.reserve(now + 1, "big", 800, 1000, NO_TIMEOUT).await,
        Reply::Other("drain-quota".into())
    );
    assert!(a.meta("dr").await.unwrap_or(0) > now);
    // The lease's next renewal pays its settlement (40 tokens, on the allowance) and, the
    // account being drained, keeps nothing.
    let r = lease(&mut a, now + 100, (0, 210), 0, &[40]).await;
    assert_eq!(text(&r[0]), "exact");
    let Value::Array(paid) = &r[6] else {
        panic!("settlements: {r:?}")
    };
    assert_eq!(
        paid.iter().map(text).collect::<Vec<_>>(),
        ["40", "1", "0", "0"],
        "paid from the allowance's room, nothing uncovered, no lots"
    );
    assert_eq!((a.meta("rt").await, a.meta("ft").await), (Some(0), Some(0)));
    assert_eq!(a.meta("xa").await, Some(0));
    assert_eq!(a.open().await, (0, 0), "the lease is gone");
    // Now the request fits: 1000 - 40 spent.
    assert!(matches!(
        a.reserve(now + 200, "big", 800, 1000, NO_TIMEOUT).await,
        Reply::Ok { .. }
    ));
    a.cleanup().await;
}

#[tokio::test]
async fn a_lease_pays_its_settlements_as_one_sum_allowance_then_lots_then_the_rest() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let now = H * HOUR + 1_000;
    a.load(&[]).await;
    let expires = now + HOUR;
    a.add_lot("lot_a", 50, expires).await;
    // 1,100 tokens settled against 1,000 of allowance and a 50-token lot: the allowance's
    // room, then the lot, then 50 that nothing covers (booked on the allowance all the same).
    let r = lease(&mut a, now, (0, 0), 0, &[900, 200]).await;
    let Value::Array(paid) = &r[6] else {
        panic!("settlements: {r:?}")
    };
    assert_eq!(
        paid.iter().map(text).collect::<Vec<_>>(),
        ["1000", "2", "50", "0", "lot_a", "t", "50"]
    );
    assert_eq!(text(&r[3]), "1100", "the week's total counts all of it");
    let lot: String = a.conn.hget(&a.keys[3], "lot_a").await.unwrap();
    assert_eq!(lot, format!("t,0,{expires},-1"), "the lot is spent");
    assert_eq!(a.meta("sa").await, Some(1050));
    assert_eq!(a.meta("sl").await, Some(50));
    a.cleanup().await;
}

#[tokio::test]
async fn a_pay_only_renewal_leaves_what_the_whole_script_would() {
    // Two accounts in the same state; the last renewal pays, tops the share up (ask 100) or
    // not (ask 0), and pushes the lease's start time back and reads the lots (flags 1, 2) or
    // not. On `light` it runs pay.lua's light path alone (which must take the call); on
    // `whole`, lease.lua's whole body. Reply, balance, sums, bucket, lease, its start time,
    // lots: the same. `later`: the last renewal comes in the same hour, or in the next one,
    // where its payment first moves the last hour's bucket into the buckets hash and the keys'
    // expiry is pushed back (the hourly chores pay.lua does too), with nothing paid or not.
    let same = 200;
    let next_hour = HOUR + 200;
    for (ask, flags, later, pays) in [
        (0, 0, same, true),
        (100, 0, same, true),
        (0, 1, same, true),
        (100, 3, same, true),
        (0, 2, same, true),
        (0, 0, next_hour, true),
        (100, 1, next_hour, true),
        (0, 1, next_hour, false),
    ] {
        let (Some(mut light), Some(mut whole)) = (Account::new().await, Account::new().await)
        else {
            return;
        };
        let now = H * HOUR + 1_000;
        let mut replies = Vec::new();
        for (a, last) in [(&mut light, LIGHT_ONLY_LUA), (&mut whole, WHOLE_LEASE_LUA)] {
            a.load(&[]).await;
            // A tier-2 lot still running, a tier-3 one expired by the last renewal.
            for (id, expires, tier) in [("lot_on", now + HOUR, 2), ("lot_gone", now + 150, 3)] {
                let value = format!("t,50,{expires},{tier}");
                let _: () = a.conn.hset(&a.keys[3], id, value).await.unwrap();
            }
            lease(a, now, (0, 0), 400, &[]).await;
            // The first payment opens the hour's bucket (lease.lua's whole body).
            lease(a, now + 100, (0, 200), 0, &[40]).await;
            let settled = if pays { &[25, 15][..] } else { &[][..] };
            let reply =
                lease_call(last, a, now + later, (10, 150), ask, (settled, &[]), flags).await;
            replies.push(reply);
        }
        let case = format!("ask {ask}, flags {flags}, {later} ms later, paying {pays}");
        assert_eq!(replies[0], replies[1], "{case}");
        assert_eq!(text(&replies[0][1]), ask.to_string(), "the share granted");
        let tier = if flags >= 2 { "2" } else { "-2" };
        assert_eq!(text(&replies[0][4]), tier, "the lots' tier hint, {case}");
        let Value::Array(paid) = &replies[0][6] else {
            panic!("settlements: {:?}", replies[0])
        };
        let (paid_t, paid_r) = if pays { (40, 2) } else { (0, 0) };
        assert_eq!(
            paid.iter().map(text).collect::<Vec<_>>(),
            [
                paid_t.to_string(),
                paid_r.to_string(),
                "0".into(),
                "0".into()
            ],
            "{case}"
        );
        type Hash = std::collections::BTreeMap<String, String>;
        type Starts = Vec<(String, i64)>;
        let mut state = Vec::new();
        for a in [&mut light, &mut whole] {
            let meta: Hash = a.conn.hgetall(&a.keys[0]).await.unwrap();
            let lease: Option<String> = a.conn.hget(&a.keys[1], "L:test").await.unwrap();
            let buckets: Hash = a.conn.hgetall(&a.keys[2]).await.unwrap();
            let lots: Hash = a.conn.hgetall(&a.keys[3]).await.unwrap();
            let starts: Starts = a.conn.zrange_withscores(&a.keys[4], 0, -1).await.unwrap();
            // Whether each key expires (the hourly push gives every one the account's TTL).
            let mut expiring = Vec::new();
            for k in &a.keys {
                let ttl: i64 = a.conn.ttl(k).await.unwrap();
                expiring.push(ttl > 0);
            }
            state.push((meta, lease, buckets, lots, starts, expiring));
        }
        assert_eq!(state[0], state[1], "{case}");
        let (meta, lease, buckets, lots, starts, _) = &state[0];
        assert_eq!(
            meta.get("sa").map(String::as_str),
            Some((40 + paid_t).to_string().as_str()),
            "{case}"
        );
        let hour = (now + later) / HOUR;
        if later == next_hour && pays {
            // The first hour's bucket (the 40 paid before) moved to the hash, this hour's in
            // the meta hash.
            assert_eq!(
                buckets.get(&(hour - 1).to_string()).map(String::as_str),
                Some("40,1,0,0"),
                "{case}"
            );
            assert_eq!(meta.get("bh"), Some(&hour.to_string()), "{case}");
            assert_eq!(
                meta.get("bv").map(String::as_str),
                Some("40,2,0,0"),
                "{case}"
            );
        } else {
            assert!(buckets.is_empty(), "{case}");
        }
        if later == next_hour {
            assert_eq!(meta.get("x"), Some(&(now + later).to_string()), "{case}");
        }
        let kept = 160 + ask;
        assert_eq!(
            meta.get("xa").map(String::as_str),
            Some(kept.to_string().as_str()),
            "in flight, unused and granted kept, set aside from the allowance"
        );
        assert_eq!(meta.get("rt").map(String::as_str), Some("0"));
        let requests = i64::from(ask > 0);
        assert_eq!(
            lease.as_deref(),
            Some(
                format!(
                    "{kept},{requests},{},{},{requests},1",
                    now + later,
                    150 + ask
                )
                .as_str()
            )
        );
        let started = if flags % 2 == 1 { now + later } else { now };
        assert_eq!(starts, &[("L:test".to_string(), started)], "{case}");
        assert_eq!(
            lots.contains_key("lot_gone"),
            flags < 2,
            "an expired lot is dropped when the lots are read, {case}"
        );
        light.cleanup().await;
        whole.cleanup().await;
    }
}

#[tokio::test]
async fn a_set_aside_share_is_out_of_every_other_requests_reach() {
    let Some(mut a) = Account::new().await else {
        return;
    };
    let now = H * HOUR + 1_000;
    a.load(&[]).await;
    let expires = now + HOUR;
    a.add_lot("lot_a", 100, expires).await;
    // 1,000 tokens of allowance: a lease takes 250 of it (a quarter of 1,000 + the lot's 100,
    // capped at what it asked), set aside.
    let r = lease(&mut a, now, (0, 0), 250, &[]).await;
    assert_eq!((text(&r[1]), text(&r[8])), ("250".into(), "1".into()));
    // Another request reserves 800: 750 of allowance beside the share, and the lot.
    assert!(matches!(
        a.reserve(now + 1, "r1", 800, 1000, NO_TIMEOUT).await,
        Reply::Ok { .. }
    ));
    // It settles all 800: the allowance pays what the share left (750), the lot the rest, so
    // the share's 250 stays the allowance's even though they settle first.
    assert_eq!(a.settle(now + 2, "r1", 800, 1000).await, 750);
    let lot: String = a.conn.hget(&a.keys[3], "lot_a").await.unwrap();
    assert_eq!(lot, format!("t,50,{expires},-1"));
    // The lease settled 220 within its share (recorded as allowance when settled). Its renewal
    // books them, keeps its 30 unused and asks for 100 more: the allowance has only those 30
    // left, so the lots count (a quarter of the lot's 50) and what it keeps can no longer be
    // set aside: it becomes an ordinary reservation.
    let r = lease_aside(&mut a, now + 100, (0, 30), 100, &[120, 100]).await;
    assert_eq!((text(&r[0]), text(&r[1])), ("lease".into(), "12".into()));
    assert_eq!(text(&r[8]), "0", "reserved, not set aside");
    let Value::Array(paid) = &r[6] else {
        panic!("settlements: {r:?}")
    };
    assert_eq!(
        paid.iter().map(text).collect::<Vec<_>>(),
        ["0", "0", "0", "0"],
        "nothing to split: the set-aside settlements are booked as they were recorded"
    );
    assert_eq!(
        a.meta("sa").await,
        Some(970),
        "750 + 220: never past the 1,000"
    );
    assert_eq!(
        (a.meta("xa").await, a.meta("rt").await),
        (Some(0), Some(42))
    );
    assert_eq!((a.meta("xr").await, a.meta("rr").await), (Some(0), Some(1)));
    let entry: String = a.conn.hget(&a.keys[1], "L:test").await.unwrap();
    assert_eq!(entry, format!("42,1,{},42,1", now + 100));
    // Given back: nothing held, nothing set aside.
    let r = lease_aside(&mut a, now + 200, (0, 0), 0, &[]).await;
    assert_eq!(text(&r[0]), "lease");
    assert_eq!((a.meta("xa").await, a.meta("rt").await), (Some(0), Some(0)));
    assert_eq!(a.open().await, (0, 0));
    a.cleanup().await;
}

/// One lease.lua call whose only work is one scope's per-minute windows (requests capped at
/// `rpm`, tokens uncapped): windows `w[0]`, `w[1]`, `w[2]` are the previous, current and next
/// minute's. Asks for `asked` requests for this minute and `ahead` for the next, and gives
/// back `ahead_back` of the next minute's chunk. Returns the scope's answer.
async fn lease_window(
    a: &mut Account,
    w: &[String; 3],
    now: i64,
    rpm: i64,
    asked: i64,
    ahead: i64,
    ahead_back: i64,
) -> Vec<i64> {
    let script = Script::new(LEASE_LUA);
    let mut inv = one_scope_lease(&script, a, w, now);
    // The scope: windows 1 (previous), 2 (current); caps; nothing given back this minute.
    inv.arg(1).arg(2).arg(rpm).arg(0).arg(0);
    inv.arg(0).arg(0).arg(0).arg(0).arg(0).arg(0).arg(0);
    inv.arg(asked).arg(0).arg(0);
    inv.arg(i64::from(asked > 0)).arg(0).arg(0);
    // The next minute: window 3, given back, asked for.
    inv.arg(3)
        .arg(ahead_back)
        .arg(0)
        .arg(0)
        .arg(ahead)
        .arg(0)
        .arg(0);
    // The grants (window 4); no grant of this instance ends.
    inv.arg(4).arg(0).arg("");
    let reply: Vec<Value> = inv.invoke_async(&mut a.conn).await.unwrap();
    assert_eq!(text(&reply[0]), "lease", "{reply:?}");
    let Value::Array(scopes) = &reply[7] else {
        panic!("scopes: {reply:?}")
    };
    let Value::Array(scope) = &scopes[0] else {
        panic!("scope: {reply:?}")
    };
    scope.iter().map(|v| text(v).parse().unwrap()).collect()
}

/// One request (no tokens) reserved on its own at `rpm` requests a minute, the windows `w` the
/// previous, this and the next minute's; what reserve.lua answered (`ok`, `rate`, ...).
async fn reserve_rpm(a: &mut Account, w: &[String; 3], now: i64, id: &str, rpm: i64) -> String {
    let script = Script::new(RESERVE_LUA);
    let mut inv = script.prepare_invoke();
    for k in a.keys.iter().chain(w) {
        inv.key(k);
    }
    inv.key(&a.grants);
    inv.arg(now)
        .arg(id)
        .arg(0)
        .arg(1)
        .arg(1_000_000)
        .arg(0)
        .arg("0");
    inv.arg(NO_TIMEOUT)
        .arg(rpm)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(3600);
    let reply: Vec<Value> = inv.invoke_async(&mut a.conn).await.unwrap();
    text(&reply[0])
}

#[tokio::test]
async fn a_next_minutes_chunk_is_counted_in_its_window_which_this_minutes_count_adds() {
    let Some((mut a, w, _, now)) = forty_seconds_into_a_minute().await else {
        return;
    };
    // 10 requests for this minute and 20 for the next, of 100 a minute: both granted; the next
    // minute's chunk counts in its own window only.
    let r = lease_window(&mut a, &w, now, 100, 10, 20, 0).await;
    assert_eq!(r, vec![10, 0, 0, 0, 0, 0, 20, 0, 0, 0, 0, 0]);
    assert_eq!(count(&a, w[1].clone(), "r").await, 10);
    assert_eq!(
        count(&a, w[1].clone(), "L").await,
        10,
        "this minute's own chunk"
    );
    assert_eq!(count(&a, w[2].clone(), "r").await, 20);
    assert_eq!(count(&a, w[2].clone(), "L").await, 20);
    // This minute's count adds the next window: 30 of 100. Another 40 ahead would take it past
    // half the cap: nothing granted.
    let r = lease_window(&mut a, &w, now + 1, 100, 0, 40, 0).await;
    assert_eq!(r[3], 30, "this minute's count, the next window's included");
    assert_eq!(r[6..9], [0, 0, 0]);
    assert_eq!(r[9], 20, "the next window's count");
    assert_eq!(count(&a, w[2].clone(), "r").await, 20);
    assert_eq!(count(&a, w[1].clone(), "r").await, 10);
    // A request reserved on its own this minute counts the chunk taken ahead too: with 30 a
    // minute it is refused (leases hold chunks that may come back: the account drains), with
    // 31 admitted.
    assert_eq!(
        reserve_rpm(&mut a, &w, now + 2, "r30", 30).await,
        "drain-rate"
    );
    assert_eq!(reserve_rpm(&mut a, &w, now + 3, "r31", 31).await, "ok");
    assert_eq!(count(&a, w[1].clone(), "r").await, 11);
    // Given back (the lease went idle before its minute came, the drain over): off the next
    // window, which is the only one that counted it.
    lease_window(&mut a, &w, now + 2_100, 100, 0, 0, 20).await;
    assert_eq!(count(&a, w[2].clone(), "r").await, 0);
    assert_eq!(count(&a, w[2].clone(), "L").await, 0);
    assert_eq!(count(&a, w[1].clone(), "r").await, 11);
    let _: () = a.conn.del(&w).await.unwrap();
    a.cleanup().await;
}

/// A lease.lua call of the test lease ("L:test") with one scope on the windows `w` and the
/// grants: its keys and fixed arguments (nothing held, asked for or settled), the scope's to
/// follow.
fn one_scope_lease<'s>(
    script: &'s Script,
    a: &Account,
    w: &[String; 3],
    now: i64,
) -> redis::ScriptInvocation<'s> {
    let mut inv = script.prepare_invoke();
    for k in a.keys.iter().chain(w) {
        inv.key(k);
    }
    inv.key(&a.grants);
    inv.arg(now).arg("L:test").arg(1_000_000).arg(0).arg("0");
    inv.arg(NO_TIMEOUT).arg(3600).arg(4);
    inv.arg(0).arg(0).arg(0).arg(0);
    inv.arg(0).arg(0).arg(10);
    inv.arg(0).arg(0).arg(0).arg(1).arg(0).arg(0).arg(0);
    inv
}

/// One lease.lua call whose only work is ending this instance's standing grant on the test
/// scope: the field put back to `kept` ('' deletes it).
async fn end_grant(a: &mut Account, w: &[String; 3], now: i64, kept: &str) {
    let script = Script::new(LEASE_LUA);
    let mut inv = one_scope_lease(&script, a, w, now);
    // The scope: windows 1 and 2, 100 a minute, nothing given back or asked for, no next
    // minute's window.
    inv.arg(1).arg(2).arg(100).arg(0).arg(0);
    for _ in 0..13 {
        inv.arg(0);
    }
    inv.arg(0);
    for _ in 0..6 {
        inv.arg(0);
    }
    inv.arg(4).arg(1).arg(kept);
    let reply: Vec<Value> = inv.invoke_async(&mut a.conn).await.unwrap();
    assert_eq!(text(&reply[0]), "lease", "{reply:?}");
}

#[tokio::test]
async fn standing_grants_count_in_every_minute_they_cover_until_they_end() {
    let Some((mut a, w, minute, now)) = forty_seconds_into_a_minute().await else {
        return;
    };
    // Another instance's grant of 20 requests a minute from this minute to the one after the
    // next, and this instance's of 5 from the previous minute to this one (it ends here).
    let grants = a.grants.clone();
    let _: () = a
        .conn
        .hset(
            &grants,
            "L:other",
            format!("{minute},{},20,0,0", minute + 2),
        )
        .await
        .unwrap();
    let _: () = a
        .conn
        .hset(
            &grants,
            "L:test",
            format!("{},{},5,0,0", minute - 1, minute + 1),
        )
        .await
        .unwrap();
    // This minute's count, 40 s in: a third of the previous minute's 5 (1), this minute's 25,
    // the next minute's 20.
    let r = lease_window(&mut a, &w, now, 100, 1, 0, 0).await;
    assert_eq!(r[3], 46, "this minute's count, the grants included");
    assert_eq!(count(&a, w[1].clone(), "r").await, 1);
    // This instance's grant ends, cut back to the minutes up to this one (whose use it keeps
    // counting): the counts stay.
    let kept = format!("{},{},5,0,0", minute - 1, minute + 1);
    end_grant(&mut a, &w, now + 3, &kept).await;
    assert_eq!(count(&a, w[1].clone(), "r").await, 1);
    let field: Option<String> = a.conn.hget(&grants, "L:test").await.unwrap();
    assert_eq!(field, Some(kept));
    let _: () = a
        .conn
        .hset(&grants, "L:test", format!("{},{minute},5,0,0", minute - 1))
        .await
        .unwrap();
    // Cut back to the previous minute: 1 + (1 + 20) + 20; the next minute's chunk of 1 fits
    // within half the cap.
    let r = lease_window(&mut a, &w, now + 4, 100, 0, 1, 0).await;
    assert_eq!(r[3], 42);
    assert_eq!(r[6], 1);
    // Ended with nothing left to cover: the field goes.
    end_grant(&mut a, &w, now + 5, "").await;
    let gone: Option<String> = a.conn.hget(&grants, "L:test").await.unwrap();
    assert_eq!(gone, None);
    // A request reserved on its own counts the other instance's grant: 1 + 20 this minute and
    // 1 + 20 the next: refused at 42 a minute (the grant may come back: the account drains),
    // admitted at 43.
    assert_eq!(
        reserve_rpm(&mut a, &w, now + 6, "r42", 42).await,
        "drain-rate"
    );
    assert_eq!(reserve_rpm(&mut a, &w, now + 7, "r43", 43).await, "ok");
    let _: () = a.conn.del(&w).await.unwrap();
    a.cleanup().await;
}

/// A window's `field` (0 when unset).
async fn count(a: &Account, key: String, field: &'static str) -> i64 {
    let mut conn = a.conn.clone();
    let v: Option<i64> = conn.hget(key, field).await.unwrap();
    v.unwrap_or(0)
}

/// The test account, loaded, 40 s into a minute of hour `H`: the account, the previous, this
/// and the next minute's windows, the minute, the time.
async fn forty_seconds_into_a_minute() -> Option<(Account, [String; 3], i64, i64)> {
    let mut a = Account::new().await?;
    let minute = H * 60 + 7;
    a.load(&[]).await;
    let w = a.windows(minute);
    Some((a, w, minute, minute * 60_000 + 40_000))
}
