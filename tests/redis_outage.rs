//! Redis outages through the real server: a private `redis-server` is killed and restarted
//! under a running gateway. Every request must be answered within its deadline under each
//! `storage.redis_outage` policy, Redis must be used again within about a second of coming
//! back, and what was served meanwhile must be reconciled from the database. Also: the sweep
//! that frees reservations of a killed instance without any request from their account.
//! Runs on SQLite, or on Postgres with `GATEWAY_TEST_DATABASE=postgres`.

mod common;

use std::time::{Duration, Instant};

use common::private_redis::PrivateRedis;
use common::*;
use redis::AsyncCommands;
use serde_json::{json, Value};

/// Far above anything the gateway needs when healthy, far below the hangs this guards against.
const ANSWER_DEADLINE: Duration = Duration::from_millis(1500);

struct Setup {
    redis: PrivateRedis,
    gw: Gateway,
    _mock: Mock,
    prefix: String,
    key: String,
    user_id: String,
    lot_id: String,
}

async fn setup(policy: &str, lot: u64, mock_args: &[&str]) -> Setup {
    let redis = PrivateRedis::start();
    let mock = Mock::start(mock_args);
    let prefix = format!("t:{}:", gateway_core::util::random_base62(8));
    let gw = Gateway::start(
        &mock,
        Options {
            // Only lots pay and nothing is capped per minute: a lot grant sets the balance.
            extra_toml: config::lots_only(),
            redis_url: Some(redis.url()),
            // Above the default (50 ms): the suite shares two cores with builds, and one slow
            // answer must not send a healthy request to the outage policy here.
            storage_toml: format!("redis_outage = \"{policy}\"\nredis_timeout_ms = 200"),
            env: vec![("GATEWAY_REDIS_PREFIX".into(), prefix.clone())],
            ..Options::default()
        },
    );
    let email = "outage@example.com";
    let (user_id, key) = gw.user_and_key(email);
    let lot_id = lots::lot_id(&lots::grant_tokens(&gw, email, lot));
    Setup {
        redis,
        gw,
        _mock: mock,
        prefix,
        key,
        user_id,
        lot_id,
    }
}

fn chat(max_tokens: u64) -> Value {
    json!({"model": "mock-gpt", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": "outage"}]})
}

/// Sends one request and returns (status, body, how long the answer took).
async fn timed(gw: &Gateway, key: &str, path: &str, body: &Value) -> (u16, Value, Duration) {
    let started = Instant::now();
    let r = client()
        .post(gw.url(path))
        .bearer_auth(key)
        .json(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("an answer, not a hang");
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body: Value = r.json().await.unwrap_or(Value::Null);
    if let Some(ra) = retry_after {
        body["__retry_after"] = json!(ra);
    }
    (status, body, started.elapsed())
}

async fn estimate(gw: &Gateway, key: &str) -> u64 {
    let (status, v, _) = timed(gw, key, "/v1/messages/count_tokens", &chat(1)).await;
    assert_eq!(status, 200, "{v}");
    v["input_tokens"].as_u64().expect("input_tokens")
}

/// The lot's remaining tokens as Redis holds them (`None`: the account is not in Redis).
async fn redis_lot_remaining(s: &Setup) -> Option<u64> {
    let mut c = s.redis.conn().await;
    let v: Option<String> = c
        .hget(format!("{}q:{{{}}}:lots", s.prefix, s.user_id), &s.lot_id)
        .await
        .ok()?;
    v.and_then(|v| v.split(',').nth(1).and_then(|n| n.parse().ok()))
}

/// Polls until `f` holds; returns how long that took, or panics after `limit`.
async fn within<F, Fut>(limit: Duration, what: &str, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < limit {
        if f().await {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what}: not within {limit:?}");
}

#[tokio::test]
async fn redis_down_serves_from_process_quota_then_reconciles() {
    let lot = 4000;
    let mut s = setup("local", lot, &[]).await;
    let est = estimate(&s.gw, &s.key).await;

    // Healthy: served through Redis, which now holds the account.
    let (status, v, _) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
    assert_eq!(status, 200, "{v}");
    s.gw.wait_usage(2).await;
    assert_eq!(
        redis_lot_remaining(&s).await,
        Some(lots::lots_remaining(&s.gw, &s.user_id).await)
    );

    // Redis dies. Every request is answered at once, from the in-process engine.
    s.redis.kill();
    for i in 0..6 {
        let (status, v, took) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
        assert_eq!(status, 200, "request {i} while Redis is down: {v}");
        assert!(took < ANSWER_DEADLINE, "request {i} took {took:?}");
    }
    // Parallel ones too.
    let answers = futures_join(&s.gw, &s.key, 8).await;
    for (status, took) in answers {
        assert_eq!(status, 200);
        assert!(took < ANSWER_DEADLINE, "a parallel request took {took:?}");
    }
    let served = 2 + 6 + 8; // the estimate and the first chat, then the outage's
    s.gw.wait_usage(served).await;

    // The in-process engine enforces the real balance: a reservation one token over what the
    // database says is left is refused, one that fits exactly is served.
    let left = lots::lots_remaining(&s.gw, &s.user_id).await;
    assert!(
        left < lot - 14,
        "outage usage was paid from the lot: {left}"
    );
    let (status, v, took) =
        timed(&s.gw, &s.key, "/v1/chat/completions", &chat(left - est + 1)).await;
    assert_eq!(status, 429, "one token over the balance: {v}");
    assert_eq!(v["error"]["code"], "insufficient_quota");
    assert!(took < ANSWER_DEADLINE);

    // Redis comes back empty. Within about a second the gateway reconnects and reloads the
    // account from the database, without any request.
    s.redis.restart();
    let back = within(
        Duration::from_secs(3),
        "account reconciled into Redis",
        || async { redis_lot_remaining(&s).await == Some(left) },
    )
    .await;
    assert!(
        back < Duration::from_millis(1500),
        "reconciled after {back:?}"
    );

    // Requests use Redis again: the settlement is paid from the lot Redis holds.
    let (status, v, _) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
    assert_eq!(status, 200, "{v}");
    s.gw.wait_usage(served + 1).await;
    let after = lots::lots_remaining(&s.gw, &s.user_id).await;
    assert!(after < left);
    assert_eq!(redis_lot_remaining(&s).await, Some(after));
}

#[tokio::test]
async fn a_frozen_redis_costs_requests_only_their_deadline() {
    let s = setup("local", 100_000, &[]).await;
    let (status, v, _) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
    assert_eq!(status, 200, "{v}");

    // Redis stops answering without closing anything: only the calls' deadlines notice.
    s.redis.freeze(true);
    for i in 0..6 {
        let (status, v, took) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
        assert_eq!(status, 200, "request {i} while Redis is frozen: {v}");
        assert!(took < ANSWER_DEADLINE, "request {i} took {took:?}");
    }
    s.gw.wait_usage(7).await;
    let left = lots::lots_remaining(&s.gw, &s.user_id).await;

    // It answers again: the account is reconciled (Redis kept its stale copy) within ~1 s.
    s.redis.freeze(false);
    let back = within(
        Duration::from_secs(3),
        "account reconciled into Redis",
        || async { redis_lot_remaining(&s).await == Some(left) },
    )
    .await;
    assert!(
        back < Duration::from_millis(1500),
        "reconciled after {back:?}"
    );
    let (status, v, _) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
    assert_eq!(status, 200, "{v}");
    s.gw.wait_usage(8).await;
    assert_eq!(
        redis_lot_remaining(&s).await,
        Some(lots::lots_remaining(&s.gw, &s.user_id).await)
    );
}

/// `n` requests at once; (status, time to answer) of each.
async fn futures_join(gw: &Gateway, key: &str, n: usize) -> Vec<(u16, Duration)> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let url = gw.url("/v1/chat/completions");
        let key = key.to_string();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let r = client()
                .post(url)
                .bearer_auth(key)
                .json(&chat(50))
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .expect("an answer, not a hang");
            (r.status().as_u16(), started.elapsed())
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

#[tokio::test]
async fn redis_down_refuses_with_503_then_recovers_within_a_second() {
    let mut s = setup("refuse", 100_000, &[]).await;
    let (status, v, _) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
    assert_eq!(status, 200, "{v}");

    s.redis.kill();
    for i in 0..5 {
        let (status, v, took) = timed(&s.gw, &s.key, "/v1/chat/completions", &chat(50)).await;
        assert_eq!(status, 503, "request {i}: {v}");
        assert!(took < ANSWER_DEADLINE, "request {i} took {took:?}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            v,
            json!({"error": {"message": message, "type": "server_error",
                             "code": "quota_unavailable"}, "__retry_after": "1"}),
        );
        assert!(!message.is_empty());
    }
    // The Anthropic-style surface answers in its own shape.
    let messages = json!({"model": "claude-mock", "max_tokens": 50,
                          "messages": [{"role": "user", "content": "outage"}]});
    let (status, v, took) = timed(&s.gw, &s.key, "/v1/messages", &messages).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "quota_unavailable");
    assert!(took < ANSWER_DEADLINE);
    let served = s.gw.wait_usage(1).await.len();
    assert_eq!(served, 1, "refused requests record nothing");

    s.redis.restart();
    let gw = &s.gw;
    let key = s.key.clone();
    let back = within(Duration::from_secs(3), "requests served again", || {
        let key = key.clone();
        async move {
            let (status, _, took) = timed(gw, &key, "/v1/chat/completions", &chat(50)).await;
            assert!(took < ANSWER_DEADLINE, "took {took:?}");
            status == 200
        }
    })
    .await;
    assert!(
        back < Duration::from_millis(1500),
        "served again after {back:?}"
    );
    // Through Redis: the account was loaded into it again.
    let events = s.gw.wait_usage(2).await;
    assert_eq!(
        redis_lot_remaining(&s).await,
        Some(lots::lots_remaining(&s.gw, &s.user_id).await),
        "events {events:?}\nlog {}",
        s.gw.log()
    );
}

#[tokio::test]
async fn a_killed_instances_reservation_is_swept_without_a_request() {
    let mut s = setup(
        "local",
        100_000,
        &["--chunks", "40", "--chunk-delay-ms", "100"],
    )
    .await;
    let held = format!("{}q:{{{}}}:res", s.prefix, s.user_id);
    let meta = format!("{}q:{{{}}}", s.prefix, s.user_id);
    let mut body = chat(1000);
    body["stream"] = json!(true);
    let mut r = client()
        .post(s.gw.url("/v1/chat/completions"))
        .bearer_auth(&s.key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.chunk().await.unwrap();

    // The instance dies mid-stream: its reservation stays in Redis.
    s.gw.kill();
    drop(r);
    let mut c = s.redis.conn().await;
    let open: u64 = c.hlen(&held).await.unwrap();
    assert_eq!(open, 1, "the dead instance's reservation is held");
    let killed_at = Instant::now();
    // Redis forgets its scripts (as a restart would): the sweep's call, which rides the
    // heartbeat's round trip, loads its script again.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut c)
        .await
        .unwrap();

    // Another instance (the same config, started afresh) sweeps it once it is older than the
    // reservation timeout (5 s), with no request from the account at all.
    s.gw.spawn();
    let swept = within(Duration::from_secs(12), "stale reservation swept", || {
        let mut c = c.clone();
        let held = held.clone();
        async move { c.hlen::<_, u64>(&held).await.unwrap_or(1) == 0 }
    })
    .await;
    assert!(
        killed_at.elapsed() >= Duration::from_secs(4),
        "released before its timeout ({swept:?})"
    );
    let rr: Option<u64> = c.hget(&meta, "rr").await.unwrap();
    assert_eq!(rr, Some(0), "the held requests were given back");
    let due: Option<f64> = c
        .zscore(format!("{}q:due", s.prefix), &s.user_id)
        .await
        .unwrap();
    assert_eq!(
        due, None,
        "an account holding nothing leaves the sweep's set"
    );
    // The one request the dead instance had admitted is recorded from its usage journal as
    // interrupted; nothing else was requested.
    let events = s.gw.usage_events().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["settlement"], "counted:interrupted", "{events:?}");
}
