//! Two gateway instances on one database and one Redis: every guarantee of the shared mode
//! holds across them. Each test runs twice: on one Redis (`GATEWAY_TEST_REDIS`) and on a private
//! three-master Redis Cluster started for it (`redis-server`, `redis-cli`). Without
//! `GATEWAY_TEST_REDIS` both are skipped, as the other Redis tests are.
//!
//! - 50 parallel requests spread over both instances against an allowance for exactly 10:
//!   exactly 10 are served;
//! - a key's per-minute request limit holds across instances;
//! - a revocation or suspension made through one reaches the other;
//! - a lot granted while an account is refused on the other instance is usable there at once;
//! - after Redis loses everything, the balance it reloads equals the database's;
//! - 200 accounts, each with an allowance for a few requests, driven to exhaustion over both
//!   instances at once: none served more than its allowance, none left with more than one
//!   request stranded in a lease, one usage event per request served;
//! - a key sending requests in the second half of a minute gets the next minute's chunk ahead,
//!   and the next minute's first requests are admitted against it;
//! - leases set aside from the allowance: every request is recorded at once, and a graceful
//!   stop books what was settled within them and gives them back;
//! - a drain is published to the other instance, which then polls `q:drains` once a second in
//!   its heartbeat, not every round (one Redis: watched with `MONITOR`); a Redis user without
//!   channel rights makes them poll every round instead, and say so once;
//! - several accounts' renewals share one round trip, and its script call is made again when
//!   Redis has lost its scripts.

mod common;

use std::time::{Duration, Instant};

use common::redis_cluster::RedisCluster;
use common::*;
use gateway_core::quota::redis_conn::{Conn, Connector, RedisTarget};
use redis::AsyncCommands;
use serde_json::{json, Value};

/// Weekly allowance of exactly ten requests (tokens plentiful), no per-minute caps.
fn ten_requests() -> String {
    config::uncapped_tier("beginner", 100000000, 10)
}

/// Only lots pay and nothing is capped per minute, so a lot grant sets the balance exactly.
fn lots_only() -> String {
    config::uncapped_tier("beginner", 0, 0)
}

/// Plenty of everything; keys get their own per-minute limits.
fn roomy() -> String {
    config::uncapped_tier("beginner", 100000000, 0)
}

/// The shared store two instances use: the test Redis (under a fresh prefix) or a private
/// cluster.
enum Store {
    Single(String),
    Cluster(RedisCluster),
}

impl Store {
    /// `None` (the test is skipped, with the reason printed) without `GATEWAY_TEST_REDIS`.
    fn open(cluster: bool) -> Option<Store> {
        let Ok(url) = std::env::var("GATEWAY_TEST_REDIS") else {
            eprintln!("GATEWAY_TEST_REDIS not set: skipped");
            return None;
        };
        Some(if cluster {
            Store::Cluster(RedisCluster::start())
        } else {
            Store::Single(url)
        })
    }

    fn target(&self) -> RedisTarget {
        match self {
            Store::Single(url) => RedisTarget::Single(url.clone()),
            Store::Cluster(c) => RedisTarget::Cluster(c.urls()),
        }
    }

    async fn conn(&self) -> Conn {
        let timeout = Duration::from_secs(2);
        Connector::new(&self.target(), timeout, timeout)
            .expect("redis target")
            .connect()
            .await
            .expect("connect to the test redis")
    }
}

/// Two instances on one database sharing `store`, under one key prefix.
struct Pair {
    a: Gateway,
    b: Gateway,
    mock: Mock,
    prefix: String,
}

fn pair(store: &Store, extra: &str) -> Pair {
    let mock = Mock::start(&[]);
    let prefix = format!("mi:{}:", gateway_core::util::random_base62(10));
    let options = |database_url: Option<String>| {
        let mut o = Options {
            extra_toml: extra.to_string(),
            // Above the default: the suite shares two cores with builds, and one slow answer
            // must not send a healthy request to the outage policy.
            storage_toml: "redis_timeout_ms = 500".into(),
            database_url,
            env: vec![("GATEWAY_REDIS_PREFIX".into(), prefix.clone())],
            ..Options::default()
        };
        match store {
            Store::Single(url) => o.redis_url = Some(url.clone()),
            Store::Cluster(c) => o.storage_toml.push_str(&format!("\n{}", c.storage_toml())),
        }
        o
    };
    let a = Gateway::start(&mock, options(None));
    let mut b_options = options(Some(a.database_url.clone()));
    b_options.env = a.env.clone();
    let b = Gateway::start(&mock, b_options);
    Pair { a, b, mock, prefix }
}

fn chat() -> Value {
    json!({"model": "mock-gpt", "max_tokens": 20,
           "messages": [{"role": "user", "content": "two instances"}]})
}

/// One chat request: (status, error code or "").
/// Sends `n` requests on `key`, alternating between the two instances: each answered 200.
async fn answered_by_both(p: &Pair, key: &str, n: usize) {
    for i in 0..n {
        let gw = if i % 2 == 0 { &p.a } else { &p.b };
        assert_eq!(send(gw, key).await.0, 200, "request {i}");
    }
}

/// [`answered_by_both`], half a second between requests: a rate of about two a second.
async fn answered_by_both_spaced(p: &Pair, key: &str, n: usize) {
    for i in 0..n {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let gw = if i % 2 == 0 { &p.a } else { &p.b };
        assert_eq!(send(gw, key).await.0, 200, "request {i}");
    }
}

async fn send(gw: &Gateway, key: &str) -> (u16, String) {
    send_to(gw.url("/v1/chat/completions"), key).await
}

/// [`send`] to the chat completions URL `url`.
async fn send_to(url: String, key: &str) -> (u16, String) {
    let r = client()
        .post(url)
        .bearer_auth(key)
        .json(&chat())
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("an answer");
    api::status_and_code(r).await
}

/// Sends until `gw` answers `want`; panics after `limit`. Returns how long it took.
async fn until_status(gw: &Gateway, key: &str, want: u16, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (status, code) = send(gw, key).await;
        if status == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "still {status} {code} after {limit:?}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn exactly_ten_of_fifty(store: Store) {
    let p = pair(&store, &ten_requests());
    let key = p.a.user_with_key("ten@example.com", &[]);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let url = if i % 2 == 0 { p.a.url("") } else { p.b.url("") };
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            send_to(format!("{url}/v1/chat/completions"), &key).await
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("request task"));
    }
    assert_eq!(api::served_and_refused(&results), (10, 40), "{results:?}");
    assert_eq!(p.mock.served().await, 10);
    let events = p.a.wait_usage(10).await;
    assert_eq!(events.len(), 10, "{events:?}");
    // Both instances served some (the requests alternate): the limit held across them.
    let after = send(&p.b, &key).await;
    assert_eq!(after, (429, "insufficient_quota".to_string()));
}

async fn per_key_limit_across_instances(store: Store) {
    let p = pair(&store, &roomy());
    let key = p.a.user_with_key("rpm@example.com", &["--rpm", "8"]);
    inside_one_minute(Duration::from_secs(20)).await;
    let mut statuses = Vec::new();
    for i in 0..20 {
        let gw = if i % 2 == 0 { &p.a } else { &p.b };
        statuses.push(send(gw, &key).await);
    }
    let ok = statuses.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(ok, 8, "{statuses:?}");
    assert!(
        statuses[8..]
            .iter()
            .all(|(s, c)| *s == 429 && c == "rate_limit_exceeded"),
        "{statuses:?}"
    );
    assert_eq!(p.mock.served().await, 8);
}

async fn revocation_and_suspension_across_instances(store: Store) {
    let p = pair(&store, &roomy());
    let key = p.a.user_with_key("revoke@example.com", &[]);
    assert_eq!(send(&p.b, &key).await.0, 200);
    let keys =
        p.a.admin_json(&["key", "list", "--email", "revoke@example.com"]);
    let id = keys[0]["id"]
        .as_str()
        .or(keys["keys"][0]["id"].as_str())
        .unwrap_or_else(|| panic!("key id in {keys}"))
        .to_string();
    p.a.admin_json(&["key", "revoke", "--id", &id]);
    until_status(&p.b, &key, 401, Duration::from_secs(3)).await;
    assert_eq!(send(&p.a, &key).await.0, 401);

    let key = p.b.user_with_key("suspend@example.com", &[]);
    assert_eq!(send(&p.a, &key).await.0, 200);
    assert_eq!(send(&p.b, &key).await.0, 200);
    p.b.admin_json(&["user", "suspend", "--email", "suspend@example.com"]);
    until_status(&p.a, &key, 403, Duration::from_secs(3)).await;
    until_status(&p.b, &key, 403, Duration::from_secs(3)).await;
}

async fn lot_usable_on_the_other_instance(store: Store) {
    let p = pair(&store, &lots_only());
    let key = p.a.user_with_key("lot@example.com", &[]);
    assert_eq!(
        send(&p.b, &key).await,
        (429, "insufficient_quota".to_string())
    );
    assert_eq!(
        send(&p.a, &key).await,
        (429, "insufficient_quota".to_string())
    );
    lots::grant_tokens(&p.a, "lot@example.com", 100_000);
    // The lot feed polls every 250 ms; a key refused for want of quota is refused without
    // asking Redis for two seconds after its last refusal.
    let waited = until_status(&p.b, &key, 200, Duration::from_secs(4)).await;
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    assert_eq!(send(&p.a, &key).await.0, 200);
}

/// The lot's remaining tokens as Redis holds them (`None`: the account is not in Redis).
async fn redis_lot(store: &Store, prefix: &str, user_id: &str, lot_id: &str) -> Option<u64> {
    let mut c = store.conn().await;
    let v: Option<String> = c
        .hget(format!("{prefix}q:{{{user_id}}}:lots"), lot_id)
        .await
        .expect("hget");
    v.and_then(|s| s.split(',').nth(1).and_then(|n| n.parse().ok()))
}

/// Redis forgets everything this pair keeps there: `FLUSHALL` on the private cluster, the
/// pair's keys on the shared test Redis (other tests use it at the same time).
async fn lose_redis_state(store: &Store, prefix: &str) {
    match store {
        Store::Cluster(c) => c.flush_all(),
        Store::Single(_) => {
            let mut c = store.conn().await;
            let keys: Vec<String> = c.keys(format!("{prefix}*")).await.expect("keys");
            if !keys.is_empty() {
                let _: i64 = c.del(keys).await.expect("del");
            }
        }
    }
}

async fn reconciled_after_redis_loses_its_state(store: Store) {
    let p = pair(&store, &lots_only());
    let email = "reload@example.com";
    let (user_id, key) = p.a.user_and_key(email);
    let lot_id = lots::lot_id(&lots::grant_tokens_and_wait(&p.a, email, 100_000).await);
    answered_by_both(&p, &key, 6).await;
    p.a.wait_usage(6).await;
    // The instances admitted against leases: reservations named after them.
    let mut c = store.conn().await;
    let held: Vec<String> = c
        .hkeys(format!("{}q:{{{user_id}}}:res", p.prefix))
        .await
        .expect("hkeys");
    assert!(held.iter().any(|id| id.starts_with("L:")), "{held:?}");
    let before = lots::lots_remaining(&p.a, &user_id).await;
    assert!(before < 100_000, "usage was paid from the lot: {before}");

    // (A lease renewal may load the account again at once: nothing to assert in between.)
    lose_redis_state(&store, &p.prefix).await;
    // Both instances go on serving: the account is reloaded from the database.
    assert_eq!(send(&p.b, &key).await.0, 200);
    assert_eq!(send(&p.a, &key).await.0, 200);
    p.a.wait_usage(8).await;
    // Redis and the database agree once the settlements are written.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let in_db = lots::lots_remaining(&p.a, &user_id).await;
        let in_redis = redis_lot(&store, &p.prefix, &user_id, &lot_id).await;
        if in_redis == Some(in_db) && in_db < before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "redis {in_redis:?} vs database {in_db} (before the loss {before})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each of `ACCOUNTS` accounts may make `EACH` requests a week.
const ACCOUNTS: usize = 200;
const EACH: usize = 4;

async fn many_accounts_exhausted_over_two_instances(store: Store) {
    let p = pair(
        &store,
        &config::uncapped_tier("beginner", 100000000, EACH as u64),
    );
    let keys: Vec<String> = (0..ACCOUNTS)
        .map(|i| p.a.user_with_key(&format!("many{i}@example.com"), &[]))
        .collect();
    // Every account sends twice its allowance, over both instances, all accounts at once
    // (at most 64 requests in flight).
    let urls = [
        p.a.url("/v1/chat/completions"),
        p.b.url("/v1/chat/completions"),
    ];
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::new();
    for round in 0..2 * EACH {
        for (i, key) in keys.iter().enumerate() {
            let (url, key, limit) = (urls[(i + round) % 2].clone(), key.clone(), limit.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = limit.acquire_owned().await.expect("permit");
                (i, send_to(url, &key).await)
            }));
        }
    }
    let mut served = vec![0usize; ACCOUNTS];
    for t in tasks {
        let (i, (status, code)) = t.await.expect("request task");
        match status {
            200 => served[i] += 1,
            429 => assert_eq!(code, "insufficient_quota"),
            other => panic!("account {i}: {other} {code}"),
        }
    }
    let over: Vec<_> = served
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > EACH)
        .collect();
    assert!(over.is_empty(), "overspent: {over:?}");
    let stranded: Vec<_> = served
        .iter()
        .enumerate()
        .filter(|(_, n)| **n + 1 < EACH)
        .collect();
    assert!(
        stranded.is_empty(),
        "more than one request stranded: {stranded:?}"
    );
    let total: usize = served.iter().sum();
    assert_eq!(p.mock.served().await, total as u64);
    let events = p.a.wait_usage(total).await;
    let ids: std::collections::HashSet<&str> =
        events.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(
        (events.len(), ids.len()),
        (total, total),
        "one event per request"
    );
}

async fn set_aside_leases_are_booked_and_given_back_on_stop(store: Store) {
    let mut p = pair(&store, &roomy());
    let (user_id, key) = p.a.user_and_key("aside@example.com");
    answered_by_both(&p, &key, 12).await;
    // Every request is recorded without waiting for Redis to hear of it.
    let events = p.a.wait_usage(12).await;
    assert_eq!(events.len(), 12);
    let charged: i64 = events
        .iter()
        .map(|e| e["quota_charged"].as_i64().expect("quota_charged"))
        .sum();
    let meta = format!("{}q:{{{user_id}}}", p.prefix);
    let mut c = store.conn().await;
    let leases: Vec<String> = c.hvals(format!("{meta}:res")).await.expect("hvals");
    assert!(
        leases.iter().any(|v| v.ends_with(",1")),
        "a lease set aside from the allowance: {leases:?}"
    );
    let aside: Option<i64> = c.hget(&meta, "xa").await.expect("hget");
    assert!(aside.unwrap_or(0) > 0, "{aside:?}");
    // A graceful stop books what was settled within the shares and gives them back.
    assert!(p.a.terminate());
    assert!(p.b.terminate());
    let m: std::collections::HashMap<String, String> = c.hgetall(&meta).await.expect("hgetall");
    for field in ["xa", "xr", "rt", "rr", "ft", "fr"] {
        assert_eq!(
            m.get(field).map(String::as_str),
            Some("0"),
            "{field}: {m:?}"
        );
    }
    assert_eq!(m.get("sa"), Some(&charged.to_string()), "{m:?}");
    let held: Vec<String> = c.hkeys(format!("{meta}:res")).await.expect("hkeys");
    assert!(held.is_empty(), "{held:?}");
}

/// Several accounts' leases are renewed in one round trip (their script call among plain
/// commands): when Redis has lost its scripts, the call is made again on its own, so a graceful
/// stop still books every account's set-aside settlements and gives its lease back.
async fn a_rounds_script_call_survives_redis_losing_its_scripts(store: Store) {
    let Store::Single(_) = &store else {
        // A cluster renews each account in a call of its own (`Script::invoke` reloads).
        return;
    };
    let mut p = pair(&store, &roomy());
    let mut accounts = Vec::new();
    for i in 0..3 {
        let (user_id, key) = p.a.user_and_key(&format!("flushed{i}@example.com"));
        for _ in 0..3 {
            assert_eq!(send(&p.a, &key).await.0, 200);
        }
        accounts.push(user_id);
    }
    let events = p.a.wait_usage(9).await;
    let mut c = store.conn().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .expect("SCRIPT FLUSH");
    assert!(p.a.terminate());
    assert!(p.b.terminate());
    for user_id in &accounts {
        let charged: i64 = events
            .iter()
            .filter(|e| e["user_id"].as_str() == Some(user_id.as_str()))
            .map(|e| e["quota_charged"].as_i64().expect("quota_charged"))
            .sum();
        assert!(charged > 0, "{events:?}");
        let meta = format!("{}q:{{{user_id}}}", p.prefix);
        let m: std::collections::HashMap<String, String> = c.hgetall(&meta).await.expect("hgetall");
        assert_eq!(m.get("sa"), Some(&charged.to_string()), "{m:?}");
        assert_eq!(m.get("xa").map(String::as_str), Some("0"), "{m:?}");
        let held: Vec<String> = c.hkeys(format!("{meta}:res")).await.expect("hkeys");
        assert!(held.is_empty(), "{held:?}");
    }
}

/// How many of the commands Redis runs during `span` have a `MONITOR` line `wanted`.
async fn monitored(url: &str, wanted: impl Fn(&str) -> bool, span: Duration) -> usize {
    monitored_up_to(url, wanted, span, usize::MAX).await
}

/// [`monitored`], returning as soon as `enough` lines were `wanted`.
async fn monitored_up_to(
    url: &str,
    wanted: impl Fn(&str) -> bool,
    span: Duration,
    enough: usize,
) -> usize {
    use futures::StreamExt;
    let client = redis::Client::open(url).expect("redis url");
    let monitor = client.get_async_monitor().await.expect("monitor");
    let mut lines = monitor.into_on_message::<String>();
    let until = tokio::time::Instant::now() + span;
    let mut n = 0;
    while n < enough {
        let Ok(Some(line)) = tokio::time::timeout_at(until, lines.next()).await else {
            break;
        };
        n += usize::from(wanted(&line));
    }
    n
}

/// Gives both instances of `p` a lease on a new account with plenty left (its second request
/// on each takes it), then counts the polls of `q:drains` that Redis (`url`) runs in `secs`.
async fn drain_polls_with_leases(url: &str, p: &Pair, email: &str, secs: u64) -> usize {
    let key = p.a.user_with_key(email, &[]);
    for gw in [&p.a, &p.b, &p.a, &p.b] {
        assert_eq!(send(gw, &key).await.0, 200);
    }
    let poll = format!("\"ZRANGEBYSCORE\" \"{}q:drains\"", p.prefix);
    monitored(url, |l| l.contains(&poll), Duration::from_secs(secs)).await
}

async fn drains_published_and_polled_slowly(store: Store) {
    let Store::Single(url) = &store else {
        // MONITOR sees one node; the cluster's drains are covered by the other tests.
        return;
    };
    let leased = pair(&store, &roomy());
    let polls = drain_polls_with_leases(url, &leased, "leased@example.com", 3).await;
    // Two instances listening: one poll a second each, in the heartbeat (every round would
    // be 60).
    assert!(
        (1..=16).contains(&polls),
        "{polls} polls of q:drains in 3 s"
    );
    // An account with ten requests a week is drained at once: the drain is published, and
    // exactly its allowance is served over both instances.
    let p = pair(&store, &ten_requests());
    let key = p.a.user_with_key("notice@example.com", &[]);
    let watch = tokio::spawn({
        let (url, publish) = (url.clone(), format!("\"PUBLISH\" \"{}q:drains\"", p.prefix));
        async move { monitored(&url, |l| l.contains(&publish), Duration::from_secs(8)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut served = 0;
    for i in 0..20 {
        let gw = if i % 2 == 0 { &p.a } else { &p.b };
        match send(gw, &key).await {
            (200, _) => served += 1,
            (status, code) => assert_eq!((status, code.as_str()), (429, "insufficient_quota")),
        }
    }
    assert_eq!(served, 10);
    assert!(
        watch.await.expect("monitor task") >= 1,
        "no drain published"
    );
}

/// A held lease's start time is pushed back with a plain `ZADD XX`, not a script call, so the
/// sweep keeps it, and what it settled within its share is still booked within about one
/// reservation timeout, with no top-up and no stop. The timeout is 6 s here (a push every 2 s).
async fn start_time_pushed_back_with_plain_commands(store: Store) {
    let Store::Single(url) = &store else {
        // MONITOR sees one node; on a cluster every renewal is a script call.
        return;
    };
    let p = pair(
        &store,
        &format!("\n[quota]\nreservation_timeout_seconds = 6\n{}", roomy()),
    );
    let (user_id, key) = p.a.user_and_key("pushed@example.com");
    for _ in 0..4 {
        assert_eq!(send(&p.a, &key).await.0, 200);
    }
    let events = p.a.wait_usage(4).await;
    let charged: i64 = events
        .iter()
        .map(|e| e["quota_charged"].as_i64().expect("quota_charged"))
        .sum();
    let meta = format!("{}q:{{{user_id}}}", p.prefix);
    let push = format!("\"ZADD\" \"{meta}:rat\" \"XX\"");
    let pushes = monitored(url, |l| l.contains(&push), Duration::from_secs(9)).await;
    assert!(
        pushes >= 2,
        "{pushes} plain pushes of the lease's start time in 9 s"
    );
    // Past the timeout since the requests: the sweep left the lease held, and the set-aside
    // settlements were booked.
    let mut c = store.conn().await;
    let held: Vec<String> = c.hkeys(format!("{meta}:res")).await.expect("hkeys");
    assert!(held.iter().any(|id| id.starts_with("L:")), "{held:?}");
    // Booked at the first push a whole timeout after the lease was taken (about 6 s in); a
    // loaded machine may run that round late.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let spent: Option<i64> = c.hget(&meta, "sa").await.expect("hget");
        if spent == Some(charged) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "not booked without a top-up or a stop: sa {spent:?}, charged {charged}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Redis user without channel rights: the instances cannot hear drains, say so once, and poll
/// `q:drains` every round instead.
async fn drains_polled_every_round_without_pub_sub(store: Store) {
    let Store::Single(url) = &store else {
        // The cluster's nodes would each need the user.
        return;
    };
    let user = format!("gw-nochannels-{}", gateway_core::util::random_base62(8));
    let mut admin = store.conn().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            &user,
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
        ])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let restricted = Store::Single(url.replacen("redis://", &format!("redis://{user}:pw@"), 1));
    let p = pair(&restricted, &roomy());
    let polls = drain_polls_with_leases(url, &p, "deaf@example.com", 2).await;
    let _: () = redis::cmd("ACL")
        .arg(&["DELUSER", &user])
        .query_async(&mut admin)
        .await
        .expect("ACL DELUSER");
    // Two instances, a round every 100 ms each: about 40.
    assert!(polls >= 20, "{polls} polls of q:drains in 2 s");
    for gw in [&p.a, &p.b] {
        let said = gw.log().matches("drain notices:").count();
        assert_eq!(said, 1, "{}", gw.log());
    }
}

/// The per-minute window counts of a key's scope (per key or pooled on the account) in `minute`:
/// requests counted, and requests counted for leases' chunks (`L`), the leases' standing grants
/// covering the minute included in both (they count in every minute they cover).
async fn window(store: &Store, p: &Pair, user_id: &str, key_id: &str, minute: i64) -> (i64, i64) {
    let mut c = store.conn().await;
    let (mut r, mut l) = (0, 0);
    for scope in [format!("key:{key_id}"), format!("acct:{user_id}")] {
        let w = gateway_core::quota::shared::rate_key(&p.prefix, user_id, &scope, minute);
        let (wr, wl): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
            .arg(&w)
            .arg("r")
            .arg("L")
            .query_async(&mut c)
            .await
            .expect("hmget");
        let granted = granted_requests(&mut c, p, user_id, &scope, minute).await;
        r += wr.unwrap_or(0) + granted;
        l += wl.unwrap_or(0) + granted;
    }
    (r, l)
}

/// The requests the leases' standing grants on `scope` grant in `minute` (each field of the
/// grants hash "from,to,r,i,o", covering [from, to)).
async fn granted_requests(c: &mut Conn, p: &Pair, user_id: &str, scope: &str, minute: i64) -> i64 {
    let key = gateway_core::quota::shared::grant_key(&p.prefix, user_id, scope);
    let values: Vec<String> = redis::cmd("HVALS")
        .arg(&key)
        .query_async(c)
        .await
        .expect("hvals");
    values
        .iter()
        .map(|v| {
            let n: Vec<i64> = v.split(',').map(|x| x.parse().expect("grant")).collect();
            if n[0] <= minute && minute < n[1] {
                n[2]
            } else {
                0
            }
        })
        .sum()
}

/// A user with one key of `rpm` requests a minute: (user id, secret, key id).
fn user_with_key(p: &Pair, email: &str, rpm: &str) -> (String, String, String) {
    let user = p.a.admin_json(&["user", "create", "--email", email]);
    let user_id = user["id"].as_str().expect("user id").to_string();
    let created =
        p.a.admin_json(&["key", "create", "--email", email, "--rpm", rpm]);
    let key = created["secret"].as_str().expect("secret").to_string();
    let key_id = created["id"].as_str().expect("key id").to_string();
    (user_id, key, key_id)
}

/// Waits until 32 to 45 s into a minute (its second half, with time to spare before the next)
/// and returns that minute.
async fn second_half_of_a_minute() -> i64 {
    let into = gateway_core::util::now_ms().rem_euclid(60_000);
    let wait = if into < 32_000 {
        32_000 - into
    } else if into < 45_000 {
        0
    } else {
        92_000 - into
    };
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    gateway_core::util::now_ms().div_euclid(60_000)
}

async fn next_minutes_chunk_taken_ahead(store: Store) {
    let p = pair(&store, &roomy());
    let (user_id, key, key_id) = user_with_key(&p, "ahead@example.com", "600");
    let minute = second_half_of_a_minute().await;
    // Each instance: a first request reserved on its own, then leases and chunks.
    answered_by_both(&p, &key, 6).await;
    let (r, l) = window(&store, &p, &user_id, &key_id, minute + 1).await;
    assert!(
        l > 0 && r == l,
        "the next minute's chunks, ahead: r {r} L {l}"
    );
    // The next minute: its first requests are admitted against those chunks, without taking
    // another (the window counts no more than before).
    let into = gateway_core::util::now_ms().rem_euclid(60_000);
    tokio::time::sleep(Duration::from_millis((60_100 - into) as u64)).await;
    assert_eq!(gateway_core::util::now_ms().div_euclid(60_000), minute + 1);
    answered_by_both(&p, &key, 4).await;
    assert_eq!(
        window(&store, &p, &user_id, &key_id, minute + 1).await,
        (r, l)
    );
    assert_eq!(p.mock.served().await, 10);
}

/// Standing grants hold a key's per-minute cap across instances: both instances are granted
/// the next minutes of a key far below its cap (on one Redis; chunks on a cluster), then both
/// are flooded in one minute: no more are admitted than the cap allows, and the grants give
/// way to chunks and exact reservations as the window fills.
async fn grants_hold_the_cap_across_instances(store: Store) {
    use futures::StreamExt;
    let p = pair(&store, &roomy());
    let (user_id, key, key_id) = user_with_key(&p, "grants@example.com", "6000");
    // Leases and chunks in one minute, used again in the next, whose second half asks for the
    // minutes ahead (the first leases' calls ask for the next minute's chunk with the script).
    let minute = second_half_of_a_minute().await;
    // Spaced out: each lease sizes what it asks ahead from the rate it saw, and requests sent
    // back to back at whatever speed this build serves them can make that rate high enough
    // that the ask is not far below the cap (a chunk instead of a grant).
    answered_by_both_spaced(&p, &key, 6).await;
    until_into(minute + 1, 5_000).await;
    answered_by_both_spaced(&p, &key, 4).await;
    // The second half's first clock round (one a second) asks for the minutes ahead: on one
    // Redis, its grant is waited for up to 50 s into the minute.
    until_into(minute + 1, 30_000).await;
    if matches!(store, Store::Single(_)) {
        let mut c = store.conn().await;
        let scope = format!("key:{key_id}");
        let asked = (minute + 1) * 60_000 + 50_000;
        let granted = loop {
            let granted = granted_requests(&mut c, &p, &user_id, &scope, minute + 2).await;
            if granted > 0 || !poll_again(asked).await {
                break granted;
            }
        };
        assert!(granted > 0, "no grant covers the minute after");
    }
    until_into(minute + 2, 300).await;
    let statuses: Vec<u16> = futures::stream::iter(0..7_000)
        .map(|i| {
            let gw = if i % 2 == 0 { &p.a } else { &p.b };
            let key = key.clone();
            async move { send(gw, &key).await.0 }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let now = gateway_core::util::now_ms();
    assert_eq!(
        now.div_euclid(60_000),
        minute + 2,
        "the flood outlasted its minute"
    );
    let ok = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(ok + refused, statuses.len(), "{statuses:?}");
    // The previous minute's 4 count in part; the rest is the cap's, less what the windows
    // still hold of chunks and grants given back late.
    assert!(
        ok <= 6_000,
        "{ok} admitted in one minute of a 6,000-a-minute key"
    );
    assert!(ok >= 3_000, "only {ok} admitted");
    assert_eq!(p.mock.served().await, 10 + ok as u64);
}

/// Waits 50 ms before the next poll of a value the gateway writes on a timer; `false`, at
/// once, when `deadline_ms` (Unix ms) has passed.
async fn poll_again(deadline_ms: i64) -> bool {
    if gateway_core::util::now_ms() >= deadline_ms {
        return false;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    true
}

/// Sleeps until `at_ms` into `minute` (minutes since the epoch), if that is still to come.
async fn until_into(minute: i64, at_ms: i64) {
    let target = minute * 60_000 + at_ms;
    let now = gateway_core::util::now_ms();
    if target > now {
        tokio::time::sleep(Duration::from_millis((target - now) as u64)).await;
    }
}

/// An account that sends nothing for one minute keeps its chunk ahead for the minute after
/// (taken in the idle minute's second half), so its next request does not wait for a script.
/// The cap is roomy: the lease sizes that chunk from the rate of the opening burst, and two
/// instances' chunks for the idle minute and the next must stay within half of it wherever in
/// the second half the asks fall (`next_minutes_chunk_refused_past_half_the_cap` tests that
/// rule).
async fn next_minutes_chunk_kept_over_a_skipped_minute(store: Store) {
    let p = pair(&store, &roomy());
    let (user_id, key, key_id) = user_with_key(&p, "skip@example.com", "60000");
    // Requests in a minute's second half: chunks, and the next minute's ahead.
    let minute = second_half_of_a_minute().await;
    answered_by_both(&p, &key, 6).await;
    let (_, l) = window(&store, &p, &user_id, &key_id, minute + 1).await;
    assert!(l > 0, "the next minute's chunks, ahead");
    // Nothing in minute + 1; late in it, minute + 2's chunks are there.
    until_into(minute + 1, 50_000).await;
    let (r2, l2) = window(&store, &p, &user_id, &key_id, minute + 2).await;
    assert!(
        l2 > 0 && r2 == l2,
        "chunks for the minute after the skipped one: r {r2} L {l2}"
    );
    // Its requests are admitted against them: the window counts no more.
    until_into(minute + 2, 100).await;
    answered_by_both(&p, &key, 4).await;
    assert_eq!(
        window(&store, &p, &user_id, &key_id, minute + 2).await,
        (r2, l2)
    );
    assert_eq!(p.mock.served().await, 10);
}

/// The next minutes' capacity of a key far below its cap (as its lease last saw), asked for in
/// the periodic round, is a standing grant written with plain commands on one Redis (a chunk
/// the script takes on a cluster), cut back when the minute's count turns out past half the
/// cap: the window is left as it was.
async fn next_minutes_chunk_refused_past_half_the_cap(store: Store) {
    let p = pair(&store, &roomy());
    let email = "ahead-full@example.com";
    let user = p.a.admin_json(&["user", "create", "--email", email]);
    let user_id = user["id"].as_str().expect("user id").to_string();
    let mut keys = Vec::new();
    for _ in 0..2 {
        let created =
            p.a.admin_json(&["key", "create", "--email", email, "--rpm", "100000"]);
        keys.push((
            created["secret"].as_str().expect("secret").to_string(),
            created["id"].as_str().expect("key id").to_string(),
        ));
    }
    // Early in a minute: the chunks are taken now, the next minute's asked for by the round
    // in the second half.
    let into = gateway_core::util::now_ms().rem_euclid(60_000);
    let wait = if (1_000..15_000).contains(&into) {
        0
    } else {
        61_000 - into
    };
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    let minute = gateway_core::util::now_ms().div_euclid(60_000);
    let window = |i: usize, m: i64| {
        gateway_core::quota::shared::rate_key(&p.prefix, &user_id, &format!("key:{}", keys[i].1), m)
    };
    for (secret, _) in &keys {
        for _ in 0..3 {
            assert_eq!(send(&p.a, secret).await.0, 200);
        }
    }
    let into = gateway_core::util::now_ms().rem_euclid(60_000);
    assert!(
        into < 18_000,
        "the requests took until {into} ms into the minute"
    );
    // Since the chunks were taken (as far below the cap as the lease last saw), the first
    // key's next window has come to count 60,000 of its 100,000: this minute's count too.
    let mut c = store.conn().await;
    let _: () = redis::cmd("HSET")
        .arg(window(0, minute + 1))
        .arg("r")
        .arg(60_000)
        .query_async(&mut c)
        .await
        .expect("hset");
    // On one Redis, `MONITOR` tells the plain commands (a client's) from the script's
    // (`[0 lua]`) from 29 s into the minute until the first plain write of the other key's
    // grants, or 50 s.
    let grants = |i: usize| {
        gateway_core::quota::shared::grant_key(&p.prefix, &user_id, &format!("key:{}", keys[i].1))
    };
    let plain = match &store {
        Store::Single(url) => {
            let next = format!("\"HSET\" \"{}\"", grants(1));
            let url = url.clone();
            Some(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((29_000 - into) as u64)).await;
                let plain = |l: &str| l.contains(&next) && !l.contains("lua]");
                monitored_up_to(&url, plain, Duration::from_millis(21_000), 1).await
            }))
        }
        Store::Cluster(_) => None,
    };
    let counts = |key: String| {
        let mut c = c.clone();
        async move {
            let v: (Option<i64>, Option<i64>) = redis::pipe()
                .cmd("HGET")
                .arg(&key)
                .arg("r")
                .cmd("HGET")
                .arg(&key)
                .arg("L")
                .query_async(&mut c)
                .await
                .expect("hget");
            (v.0.unwrap_or(0), v.1.unwrap_or(0))
        }
    };
    let scope = |i: usize| format!("key:{}", keys[i].1);
    let mut gc = c.clone();
    // The second half's first clock round (one a second) asks for both keys' next minutes:
    // waited for, up to 50 s into the minute, by what it leaves for the other key (a grant
    // on one Redis; on a cluster the script takes the next minute's chunk, in its window).
    let asked = minute * 60_000 + 50_000;
    let other = loop {
        let granted = granted_requests(&mut gc, &p, &user_id, &scope(1), minute + 1).await;
        let window = counts(window(1, minute + 1)).await;
        let done = if plain.is_some() {
            granted > 0
        } else {
            window.0 > 0
        };
        if done || !poll_again(asked).await {
            break (granted, window);
        }
    };
    let (granted, (r, l)) = other;
    if plain.is_some() {
        assert!(granted > 0, "the other key's grant covers the next minute");
        assert_eq!((r, l), (0, 0), "a grant is not counted in the window");
    } else {
        assert!(r > 0 && r == l, "the other key's chunk, ahead: r {r} L {l}");
    }
    // The first key's ask, refused in the same round, is cut back by the pipeline that
    // follows the round's: waited for up to 5 s.
    let cut_by = gateway_core::util::now_ms() + 5_000;
    let granted = loop {
        let granted = granted_requests(&mut gc, &p, &user_id, &scope(0), minute + 1).await;
        if granted == 0 || !poll_again(cut_by).await {
            break granted;
        }
    };
    assert_eq!(granted, 0, "refused, and cut back to the minutes in use");
    let (r, l) = counts(window(0, minute + 1)).await;
    assert_eq!((r, l), (60_000, 0), "the window as it was");
    if let Some(plain) = plain {
        let n = plain.await.expect("monitor task");
        assert!(
            n >= 1,
            "{n} plain HSETs of the other key's grants: the script took its chunk"
        );
    }
}

/// One test per store: `<name>` on one Redis, `<name>_on_a_cluster` on a Redis Cluster.
macro_rules! on_both_stores {
    ($($name:ident => $body:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                if let Some(store) = Store::open(false) {
                    $body(store).await;
                }
            }
        )*
        mod on_a_cluster {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(store) = Store::open(true) {
                        $body(store).await;
                    }
                }
            )*
        }
    };
}

on_both_stores! {
    fifty_parallel_requests_over_two_instances_against_an_allowance_for_ten => exactly_ten_of_fifty,
    a_keys_requests_per_minute_hold_across_instances => per_key_limit_across_instances,
    many_accounts_driven_to_exhaustion_over_two_instances => many_accounts_exhausted_over_two_instances,
    revocation_and_suspension_reach_the_other_instance => revocation_and_suspension_across_instances,
    a_lot_granted_is_usable_on_the_other_instance_at_once => lot_usable_on_the_other_instance,
    redis_is_reconciled_with_the_database_after_losing_its_state => reconciled_after_redis_loses_its_state,
    set_aside_leases_are_recorded_at_once_and_booked_on_a_graceful_stop => set_aside_leases_are_booked_and_given_back_on_stop,
    the_next_minutes_chunk_is_taken_ahead_in_the_second_half_of_a_minute => next_minutes_chunk_taken_ahead,
    a_next_minutes_chunk_past_half_the_cap_is_given_back => next_minutes_chunk_refused_past_half_the_cap,
    a_skipped_minute_keeps_the_next_minutes_chunk_ahead => next_minutes_chunk_kept_over_a_skipped_minute,
    standing_grants_hold_a_keys_cap_across_instances => grants_hold_the_cap_across_instances,
    a_drain_is_published_and_drains_are_polled_once_a_second => drains_published_and_polled_slowly,
    without_pub_sub_drains_are_polled_every_round => drains_polled_every_round_without_pub_sub,
    a_leases_start_time_is_pushed_back_with_plain_commands => start_time_pushed_back_with_plain_commands,
    a_rounds_script_call_is_made_again_when_redis_lost_its_scripts => a_rounds_script_call_survives_redis_losing_its_scripts,
}
