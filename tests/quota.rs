//! Quota, tiers and per-minute limits under concurrency, across instances and across crashes.
//! Runs on the in-process engine by default; with `GATEWAY_TEST_REDIS` set (CI's Postgres run)
//! every gateway here shares balances through Redis instead.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A model whose tokens cost more than one quota token each: the mock's answer (25 input
/// tokens, 5 of them cached, and 24 output tokens) costs 20 × 2 + 5 × 0.5 + 24 × 3 = 114.5,
/// charged as 115.
const WEIGHTED_MODEL: &str = r#"
[[models]]
id = "mock-weighted"
provider = "mock"
upstream_model = "mock-gpt"
input_weight = 2
output_weight = 3
cached_input_weight = 0.5
"#;

/// The model a concurrency test calls and what its tokens cost.
#[derive(Clone, Copy)]
struct Rates {
    model: &'static str,
    /// Quota tokens per estimated input token and per requested output token (whole numbers,
    /// so the test computes the reservation exactly).
    input_weight: u64,
    output_weight: u64,
    /// What the mock's answer is charged.
    charge: u64,
}

const UNWEIGHTED: Rates = Rates {
    model: "mock-gpt",
    input_weight: 1,
    output_weight: 1,
    charge: 49,
};

const WEIGHTED: Rates = Rates {
    model: "mock-weighted",
    input_weight: 2,
    output_weight: 3,
    charge: 115,
};

/// Only lots pay (a test controls the balance exactly with `lot grant`), with the weighted
/// model configured too.
fn lots_only_weighted() -> String {
    format!("{}{WEIGHTED_MODEL}", config::lots_only())
}

fn redis_options(extra: &str) -> Options {
    Options::with_toml(extra).on_test_redis()
}

fn body(max_tokens: u64) -> Value {
    body_for("mock-gpt", max_tokens)
}

fn body_for(model: &str, max_tokens: u64) -> Value {
    json!({"model": model, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": "count me exactly"}]})
}

/// The gateway's own input estimate for `body` (count_tokens is local for OpenAI-style models).
async fn estimate(gw: &Gateway, key: &str) -> u64 {
    let v: Value = client()
        .post(gw.url("/v1/messages/count_tokens"))
        .bearer_auth(key)
        .json(&body(1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["input_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("estimate: {v}"))
}

async fn fire(
    gw_urls: Vec<String>,
    key: &str,
    n: usize,
    model: &'static str,
    max_tokens: u64,
) -> Vec<(u16, String)> {
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = format!("{}/v1/chat/completions", gw_urls[i % gw_urls.len()]);
        let c = c.clone();
        let key = key.to_string();
        tasks.push(tokio::spawn(async move {
            let r = c
                .post(url)
                .bearer_auth(key)
                .json(&body_for(model, max_tokens))
                .send()
                .await
                .unwrap();
            api::status_and_code(r).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Fifty concurrent requests against a lot for exactly ten reservations at `rates`: ten pass,
/// forty are refused, and the lot loses exactly ten charges.
async fn exactly_ten_of_fifty(gateways: &[&Gateway], mock: &Mock, email: &str, rates: Rates) {
    let gw = gateways[0];
    let key = gw.user_with_key(email, &[]);
    let served_before = mock.served().await;
    let per_request = estimate(gw, &key).await * rates.input_weight + 100 * rates.output_weight;
    lots::grant_tokens_and_wait(gw, email, 10 * per_request).await;
    let urls: Vec<String> = gateways.iter().map(|g| g.api.clone()).collect();
    let results = fire(urls, &key, 50, rates.model, 100).await;
    assert_eq!(api::served_and_refused(&results), (10, 40), "{results:?}");
    assert_eq!(mock.served().await - served_before, 10);
    // 10 chat events plus the count_tokens call that measured the estimate, of this account.
    let user_id = gw.user_id(email).await;
    let mut events = Vec::new();
    for _ in 0..200 {
        events = gw.usage_events().await;
        events.retain(|e| e["user_id"] == user_id.as_str());
        if events.len() >= 11 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let chat: Vec<&Value> = events
        .iter()
        .filter(|e| e["endpoint"] == "chat_completions")
        .collect();
    assert_eq!(chat.len(), 10);
    for e in &chat {
        assert_eq!(
            (
                e["input_tokens"].as_i64(),
                e["output_tokens"].as_i64(),
                e["quota_charged"].as_u64()
            ),
            (Some(25), Some(24), Some(rates.charge))
        );
    }
    // The balance in the database is the lot minus exactly what was recorded.
    assert_eq!(
        lots::lots_remaining_of(gw, email).await,
        10 * per_request - 10 * rates.charge
    );
}

#[tokio::test]
async fn fifty_parallel_requests_against_an_allowance_for_ten() {
    for rates in [UNWEIGHTED, WEIGHTED] {
        let mock = Mock::start(&["--latency-ms", "800"]);
        let gw = Gateway::start(&mock, redis_options(&lots_only_weighted()));
        exactly_ten_of_fifty(&[&gw], &mock, "ten@example.com", rates).await;
    }
}

#[tokio::test]
async fn two_instances_share_one_balance() {
    if std::env::var("GATEWAY_TEST_DATABASE").as_deref() != Ok("postgres")
        || std::env::var("GATEWAY_TEST_REDIS").is_err()
    {
        eprintln!("needs GATEWAY_TEST_DATABASE=postgres and GATEWAY_TEST_REDIS; skipping");
        return;
    }
    // Long enough that all fifty reserve before the first settles, however busy the host: a
    // settlement frees the difference between reservation and charge for a late request.
    let mock = Mock::start(&["--latency-ms", "2000"]);
    let a = Gateway::start(&mock, redis_options(&lots_only_weighted()));
    let mut opts = redis_options(&lots_only_weighted());
    opts.database_url = Some(a.database_url.clone());
    opts.env = a.env.clone();
    let b = Gateway::start(&mock, opts);
    exactly_ten_of_fifty(&[&a, &b], &mock, "weighted@example.com", WEIGHTED).await;
    exactly_ten_of_fifty(&[&a, &b], &mock, "shared@example.com", UNWEIGHTED).await;

    // Revocation and suspension reach the other instance within a second.
    let key = a.user_with_key("both@example.com", &[]);
    lots::grant_tokens(&a, "both@example.com", 100_000);
    let ok = |g: &Gateway| {
        let url = g.url("/v1/chat/completions");
        let key = key.clone();
        async move {
            client()
                .post(url)
                .bearer_auth(key)
                .json(&body(10))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(ok(&b).await, 200);
    a.admin_json(&["user", "suspend", "--email", "both@example.com"]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(ok(&b).await, 403);
}

#[tokio::test]
async fn requests_per_minute_and_retry_after() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, redis_options(""));
    let key = gw.user_with_key("rpm@example.com", &["--rpm", "3"]);
    let c = client();
    for i in 0..3 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&body(10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit-requests"], "3");
        assert_eq!(
            r.headers()["x-ratelimit-remaining-requests"],
            (2 - i).to_string().as_str()
        );
        assert!(r.headers()["x-ratelimit-reset-requests"]
            .to_str()
            .unwrap()
            .ends_with('s'));
        assert!(r.headers().get("x-ratelimit-limit-tokens").is_some());
    }
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=90).contains(&retry), "{retry}");
    assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "0");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(mock.served().await, 3);

    // Output tokens per minute: the reserved output counts at admission.
    let key = gw.user_with_key("otpm@example.com", &["--otpm", "150"]);
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(100))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Settlement corrected the window to the real 24 output tokens, so 100 more fit.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(100))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(140))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
}

#[tokio::test]
async fn kill_during_a_stream_charges_its_reservation_once() {
    let mock = Mock::start(&["--chunks", "40", "--chunk-delay-ms", "100"]);
    let mut gw = Gateway::start(&mock, redis_options(&config::lots_only()));
    let email = "crash@example.com";
    let key = gw.user_with_key(email, &[]);
    let r_est = estimate(&gw, &key).await;
    let lot = 2 * (r_est + 1000);
    lots::grant_tokens_and_wait(&gw, email, lot).await;

    let mut s = body(1000);
    s["stream"] = json!(true);
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&s)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.chunk().await.unwrap();
    // While the stream holds its reservation, a request for everything else does not fit.
    let big = lot - r_est; // reservation = r_est + (lot - r_est) = lot
    let blocked = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(big))
        .send()
        .await
        .unwrap();
    assert_eq!(blocked.status(), 429);

    gw.kill();
    drop(r);
    gw.spawn();
    if std::env::var("GATEWAY_TEST_REDIS").is_ok() {
        // The dead process's reservation lives in Redis until the reaper's timeout (5 s here).
        tokio::time::sleep(Duration::from_millis(5500)).await;
    }
    // The killed stream was answered by the provider: it is charged what it reserved (its input
    // estimate and its 1,000 output tokens), once, and its reservation holds nothing more.
    let reserved = r_est + 1000;
    assert_eq!(lots::lots_remaining_of(&gw, email).await, lot - reserved);
    let events = gw.usage_events().await;
    let interrupted: Vec<&Value> = events
        .iter()
        .filter(|e| e["settlement"] == "counted:interrupted")
        .collect();
    assert_eq!(interrupted.len(), 1, "{events:?}");
    assert_eq!(interrupted[0]["quota_charged"].as_u64(), Some(reserved));
    // Everything else fits.
    let rest = lot - reserved - r_est;
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(rest))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // The estimate's count_tokens call, the interrupted stream and this request: one event each
    // (reading as soon as two exist raced the third's write).
    let events = gw.wait_usage(3).await;
    let chats = events
        .iter()
        .filter(|e| e["endpoint"] == "chat_completions")
        .count();
    assert_eq!((events.len(), chats), (3, 2), "{events:?}");
    let mut remaining = lots::lots_remaining_of(&gw, email).await;
    for _ in 0..200 {
        if remaining == lot - reserved - 49 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        remaining = lots::lots_remaining_of(&gw, email).await;
    }
    assert_eq!(remaining, lot - reserved - 49);
}

#[tokio::test]
async fn allowance_first_then_the_soonest_lot_and_entitlement_tier() {
    let mock = Mock::start(&[]);
    let extra = r#"
[quota.tiers.beginner]
weekly_tokens = 10
requests_per_minute = 60

[quota.tiers.tryharder]
weekly_tokens = 10
requests_per_minute = 600
"#;
    let gw = Gateway::start(&mock, redis_options(extra));
    let email = "lots@example.com";
    let key = gw.user_with_key(email, &[]);
    let late = lots::grant_lot(&gw, email, "token", 1000, &["--days", "10"]);
    let soon = lots::grant_lot(
        &gw,
        email,
        "token",
        1000,
        &["--days", "2", "--tier", "tryharder"],
    );
    assert_eq!(soon["type"], "token");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&body(30))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The active tryharder lot lifts the effective tier: its per-minute defaults apply.
    assert_eq!(r.headers()["x-ratelimit-limit-requests"], "600");
    gw.wait_usage(1).await;
    let lots = lots::lots_of(&gw, email).await;
    let rem = |id: &Value| {
        lots.iter()
            .find(|l| l.id == id.as_str().unwrap())
            .unwrap()
            .remaining
    };
    // 49 tokens: 10 from the weekly allowance, 39 from the lot that expires first.
    assert_eq!(rem(&soon["id"]), 1000 - 39);
    assert_eq!(rem(&late["id"]), 1000);

    let (ok, err) = gw.admin(&[
        "lot", "grant", "--email", email, "--type", "gold", "--amount", "1",
    ]);
    assert!(!ok && err.contains("token or request"), "{err}");
    let (ok, err) = gw.admin(&[
        "lot", "grant", "--email", email, "--type", "token", "--amount", "0",
    ]);
    assert!(!ok && err.contains("positive"), "{err}");
}

#[tokio::test]
async fn weekly_request_meter() {
    let mock = Mock::start(&[]);
    let extra = r#"
[quota.tiers.beginner]
weekly_requests = 2
"#;
    let gw = Gateway::start(&mock, redis_options(extra));
    let key = gw.user_with_key("req@example.com", &[]);
    let results = fire(vec![gw.api.clone()], &key, 5, "mock-gpt", 10).await;
    assert_eq!(
        results.iter().filter(|(s, _)| *s == 200).count(),
        2,
        "{results:?}"
    );
    lots::grant_lot(&gw, "req@example.com", "request", 1, &[]);
    tokio::time::sleep(lots::LOT_FEED).await;
    let results = fire(vec![gw.api.clone()], &key, 3, "mock-gpt", 10).await;
    assert_eq!(
        results.iter().filter(|(s, _)| *s == 200).count(),
        1,
        "{results:?}"
    );
}
