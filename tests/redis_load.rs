//! Shared limits under load and during an outage, two instances on one database and one Redis:
//!
//! - Redis answering every call late (as a saturated host does): the breaker stays closed, the
//!   late answers are used, and a key's per-minute limit holds exactly across the instances;
//! - Redis gone: each instance admits only its share of each per-minute limit and of each
//!   balance (the instances know how many they are), so together they stay within one limit
//!   and one balance, not one each.
//!
//! A private `redis-server` per test (or a delaying relay in front of one): runs everywhere.

mod common;

use std::time::{Duration, Instant};

use common::private_redis::PrivateRedis;
use common::slow_relay::SlowRelay;
use common::*;
use serde_json::json;

struct Pair {
    a: Gateway,
    b: Gateway,
    mock: Mock,
}

/// Two instances on one database, both on `redis_url`, under one key prefix.
fn pair(redis_url: &str, extra_toml: &str) -> Pair {
    let mock = Mock::start(&[]);
    let options = |database_url: Option<String>, env: Vec<(String, String)>| Options {
        extra_toml: extra_toml.to_string(),
        redis_url: Some(redis_url.to_string()),
        database_url,
        env,
        ..Options::default()
    };
    let prefix = format!("load:{}:", gateway_core::util::random_base62(8));
    let a = Gateway::start(
        &mock,
        options(None, vec![("GATEWAY_REDIS_PREFIX".into(), prefix)]),
    );
    let b = Gateway::start(&mock, options(Some(a.database_url.clone()), a.env.clone()));
    Pair { a, b, mock }
}

/// `clients` clients send requests for `duration`, alternating between the instances; returns
/// how many were served.
async fn flood(p: &Pair, key: &str, clients: usize, duration: Duration) -> usize {
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let urls = [
            p.a.url("/v1/chat/completions"),
            p.b.url("/v1/chat/completions"),
        ];
        let key = key.to_string();
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut served = 0;
            let mut n = i;
            while Instant::now() < until {
                let r = c
                    .post(&urls[n % 2])
                    .bearer_auth(&key)
                    .json(&json!({"model": "mock-gpt", "max_tokens": 20,
                                  "messages": [{"role": "user", "content": "flood"}]}))
                    .timeout(Duration::from_secs(30))
                    .send()
                    .await
                    .expect("an answer");
                let status = r.status().as_u16();
                let _ = r.bytes().await;
                assert!(status == 200 || status == 429, "status {status}");
                served += usize::from(status == 200);
                n += 1;
            }
            served
        }));
    }
    let mut served = 0;
    for t in tasks {
        served += t.await.expect("client task");
    }
    served
}

fn breaker_opened(gw: &Gateway) -> bool {
    gw.log().contains("considered down")
}

/// Every call to Redis answered 80 ms after it was made, above the 50 ms deadline: the answers
/// are late, not lost. The breaker must stay closed and the limit hold across both instances.
#[tokio::test]
async fn late_answers_under_load_keep_a_limit_across_two_instances() {
    let redis = PrivateRedis::start();
    let relay = SlowRelay::start(
        &format!("127.0.0.1:{}", redis.port),
        Duration::from_millis(80),
    );
    let p = pair(
        &relay.url(),
        &config::uncapped_tier("beginner", 100_000_000, 0),
    );
    let key = p.a.user_with_key("late@example.com", &["--rpm", "20"]);
    inside_one_minute(Duration::from_secs(15)).await;
    let served = flood(&p, &key, 16, Duration::from_secs(3)).await;
    assert_eq!(served, 20, "a limit of 20 a minute across both instances");
    assert_eq!(p.mock.served().await, 20);
    assert!(!breaker_opened(&p.a), "{}", p.a.log());
    assert!(!breaker_opened(&p.b), "{}", p.b.log());
}

/// Waits until both instances have registered with Redis and read their count.
async fn both_registered(redis: &PrivateRedis) {
    let until = Instant::now() + Duration::from_secs(10);
    let mut conn = redis::Client::open(redis.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    loop {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("load:*:instances")
            .query_async(&mut conn)
            .await
            .expect("keys");
        let mut live = 0;
        for k in &keys {
            live += redis::cmd("ZCARD")
                .arg(k)
                .query_async::<u64>(&mut conn)
                .await
                .expect("zcard");
        }
        if live == 2 {
            break;
        }
        assert!(Instant::now() < until, "instances registered: {live}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each reads the count at its next registration, within a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
}

#[tokio::test]
async fn during_an_outage_each_instance_admits_its_share_of_a_window() {
    let mut redis = PrivateRedis::start();
    let p = pair(
        &redis.url(),
        &config::uncapped_tier("beginner", 100_000_000, 0),
    );
    let key = p.a.user_with_key("window@example.com", &["--rpm", "20"]);
    both_registered(&redis).await;
    inside_one_minute(Duration::from_secs(15)).await;
    redis.kill();
    let served = flood(&p, &key, 8, Duration::from_secs(2)).await;
    assert!(
        (10..=20).contains(&served),
        "served {served}: at most 10 a minute on each of two instances"
    );
    assert!(breaker_opened(&p.a) && breaker_opened(&p.b));
}

#[tokio::test]
async fn during_an_outage_each_instance_spends_its_share_of_a_balance() {
    let mut redis = PrivateRedis::start();
    // Twenty requests a week, no per-minute limit.
    let p = pair(
        &redis.url(),
        &config::uncapped_tier("beginner", 100_000_000, 20),
    );
    let key = p.a.user_with_key("balance@example.com", &[]);
    // Two of the twenty spent, and recorded, before Redis goes.
    for gw in [&p.a, &p.b] {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&json!({"model": "mock-gpt", "max_tokens": 20,
                          "messages": [{"role": "user", "content": "before"}]}))
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
    }
    assert_eq!(p.a.wait_usage(2).await.len(), 2);
    both_registered(&redis).await;
    redis.kill();
    let served = flood(&p, &key, 8, Duration::from_secs(2)).await;
    // Nine each of the eighteen left (a request admitted against a lease just before Redis went
    // is counted in the database once settled, so a share may come out smaller, never larger).
    assert!((9..=18).contains(&served), "served {served} of the 18 left");
    assert!(breaker_opened(&p.a) && breaker_opened(&p.b));
}
