//! Quota weights per model, through the real server: a weighted model drains the allowance and
//! lots at its rate (streamed or not, in its own style or translated), cached input at its own
//! weight, the reservation at the weighted estimate, a reload reprices the next request and
//! never one in flight, and the records, the usage API, `/v1/model/info` and the operator's
//! report show the charge. Runs on Redis too when `GATEWAY_TEST_REDIS` is set.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Weighted models. The mock reports 25 input tokens (5 of them cached) and 24 output tokens in
/// OpenAI style; in Anthropic style 25 uncached input tokens, 5 cache reads and 24 output
/// tokens.
const WEIGHTED_MODELS: &str = r#"
[[models]]
id = "gpt-weighted"
provider = "mock"
upstream_model = "mock-gpt"
default_output_tokens = 256
input_weight = 2
output_weight = 3
cached_input_weight = 0.5
price = { input_per_million = 2, output_per_million = 8, cached_input_per_million = 1 }

[[models]]
id = "claude-weighted"
provider = "mock-anthropic"
upstream_model = "claude-mock"
default_output_tokens = 256
input_weight = 2
output_weight = 3
cached_input_weight = 0.5

[[models]]
id = "gpt-slow-weighted"
provider = "mock"
upstream_model = "slow"
input_weight = 2
output_weight = 3
cached_input_weight = 0.5
"#;

/// An OpenAI-style answer at 2 / 3 / 0.5: 20 × 2 + 5 × 0.5 + 24 × 3 = 114.5, rounded up once.
const GPT_CHARGE: u64 = 115;
/// An Anthropic-style answer: 25 × 2 + 5 × 0.5 + 24 × 3 = 124.5.
const CLAUDE_CHARGE: u64 = 125;
/// The same answer at the default weights: 25 + 24.
const UNWEIGHTED_CHARGE: u64 = 49;

/// Only lots pay and no per-minute caps, plus the weighted models; on the test Redis when set.
fn options() -> Options {
    Options::with_toml(format!("{}{WEIGHTED_MODELS}", config::lots_only())).on_test_redis()
}

/// One call; the whole answer is read (a stream to its end). Returns the status and body.
async fn call(gw: &Gateway, key: &str, path: &str, body: Value) -> (u16, String) {
    let r = client()
        .post(gw.url(path))
        .bearer_auth(key)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// A whole (not streamed) chat completion from `model`; the status and body.
async fn complete(gw: &Gateway, key: &str, model: &str) -> (u16, String) {
    call(gw, key, "/v1/chat/completions", chat(model, false)).await
}

fn chat(model: &str, stream: bool) -> Value {
    let mut b = json!({"model": model, "max_tokens": 100,
                       "messages": [{"role": "user", "content": "weigh me"}]});
    if stream {
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

fn messages(model: &str, stream: bool) -> Value {
    json!({"model": model, "max_tokens": 100, "stream": stream,
           "messages": [{"role": "user", "content": "weigh me"}]})
}

/// The `quota_charged` of every generation event (not token counts or model listings), oldest
/// first, once `n` of them are recorded.
async fn charges(gw: &Gateway, n: usize) -> Vec<i64> {
    let mut found = Vec::new();
    for _ in 0..200 {
        found = gw
            .usage_events()
            .await
            .iter()
            .filter(|e| e["endpoint"] == "chat_completions" || e["endpoint"] == "messages")
            .map(|e| e["quota_charged"].as_i64().unwrap_or(-1))
            .collect();
        if found.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(found.len(), n, "{found:?}");
    found
}

/// The charge of the newest of `n` generation events.
async fn last_charge(gw: &Gateway, n: usize) -> i64 {
    charges(gw, n).await[n - 1]
}

#[tokio::test]
async fn a_weighted_model_drains_lots_at_its_rate_in_every_style() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options());
    let email = "weights@example.com";
    let key = gw.user_with_key(email, &[]);
    let lot = 100_000;
    lots::grant_tokens_and_wait(&gw, email, lot).await;

    // (path, body, what the answer costs)
    let cases = [
        (
            "/v1/chat/completions",
            chat("gpt-weighted", false),
            GPT_CHARGE,
        ),
        (
            "/v1/chat/completions",
            chat("gpt-weighted", true),
            GPT_CHARGE,
        ),
        // An OpenAI-style model called in Anthropic style: translated, same usage.
        ("/v1/messages", messages("gpt-weighted", false), GPT_CHARGE),
        ("/v1/messages", messages("gpt-weighted", true), GPT_CHARGE),
        (
            "/v1/messages",
            messages("claude-weighted", false),
            CLAUDE_CHARGE,
        ),
        (
            "/v1/messages",
            messages("claude-weighted", true),
            CLAUDE_CHARGE,
        ),
        // An Anthropic-style model called in OpenAI style.
        (
            "/v1/chat/completions",
            chat("claude-weighted", false),
            CLAUDE_CHARGE,
        ),
        (
            "/v1/chat/completions",
            chat("claude-weighted", true),
            CLAUDE_CHARGE,
        ),
        // The same answer from a model without weights: raw tokens.
        (
            "/v1/chat/completions",
            chat("mock-gpt", false),
            UNWEIGHTED_CHARGE,
        ),
    ];
    let mut spent = 0;
    for (n, (path, body, charge)) in cases.into_iter().enumerate() {
        let what = format!("{path} {body}");
        let (status, text) = call(&gw, &key, path, body).await;
        assert_eq!(status, 200, "{what}: {text}");
        spent += charge;
        assert_eq!(last_charge(&gw, n + 1).await, charge as i64, "{what}");
        // The raw counts stay as the provider reported them.
        let events = gw.usage_events().await;
        let e = &events[n];
        assert_eq!(e["output_tokens"], 24, "{what}");
        assert_eq!(e["cached_tokens"], 5, "{what}");
        assert_eq!(
            lots::lots_remaining_of(&gw, email).await,
            lot - spent,
            "{what}"
        );
    }

    // The usage API: each recent request and the summary carry the charge beside raw tokens.
    let mut browser = common::site::signed_in(&gw, email).await;
    let u = browser.get("/api/account/usage?period=1h").await.ok_json();
    assert_eq!(u["summary"]["quotaCharged"], spent, "{u}");
    assert_eq!(u["summary"]["requests"], 9);
    assert_eq!(u["summary"]["cachedTokens"], 45);
    let recent = u["recentRequests"].as_array().unwrap();
    assert_eq!(recent.len(), 9);
    assert_eq!(recent[0]["model"], "mock-gpt");
    assert_eq!(recent[0]["quotaCharged"], UNWEIGHTED_CHARGE);
    assert_eq!(recent[0]["totalTokens"], 49);
    let by_model: Vec<(&str, u64)> = u["byModel"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["model"].as_str().unwrap(),
                m["quotaCharged"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by_model,
        [
            ("claude-weighted", 4 * CLAUDE_CHARGE),
            ("gpt-weighted", 4 * GPT_CHARGE),
            ("mock-gpt", UNWEIGHTED_CHARGE)
        ]
    );
    let weighted = u["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "gpt-weighted")
        .cloned();
    assert_eq!(
        weighted,
        Some(
            json!({"id": "gpt-weighted", "inputWeight": 2.0, "outputWeight": 3.0,
                    "cachedInputWeight": 0.5})
        )
    );

    // The operator's report: charged quota and the provider cost at the configured prices.
    let report = gw.admin_json(&["usage", "report", "--by", "model"]);
    let rows = report["rows"].as_array().unwrap();
    let row = |model: &str| {
        rows.iter()
            .find(|r| r["model"] == model)
            .cloned()
            .unwrap_or_else(|| panic!("{model} in {report}"))
    };
    let gpt = row("gpt-weighted");
    assert_eq!(gpt["quotaCharged"], 4 * GPT_CHARGE);
    assert_eq!(gpt["cachedInputTokens"], 20);
    // 4 × (20 uncached × 2 + 5 cached × 1 + 24 out × 8) per million.
    let cost = gpt["providerCost"].as_f64().unwrap();
    assert!((cost - 4.0 * 237.0 / 1e6).abs() < 1e-9, "{gpt}");
    assert_eq!(gpt["unpricedTokens"], 0);
    // No price: nothing in the cost, every token listed as unpriced.
    assert_eq!(row("claude-weighted")["providerCost"], 0.0);
    assert_eq!(row("claude-weighted")["unpricedTokens"], 4 * 54);
    // Most quota first.
    assert_eq!(rows[0]["model"], "claude-weighted");
    let (ok, csv) = gw.admin(&["usage", "report", "--by", "user", "--format", "csv"]);
    assert!(ok, "{csv}");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "user,requests,inputTokens,cachedInputTokens,outputTokens,totalTokens,\
             quotaCharged,providerCost,unpricedTokens"
        )
    );
    let line = lines.next().unwrap_or_default();
    assert!(
        line.starts_with(&format!("{email},9,")) && line.contains(&format!(",{spent},")),
        "{line}"
    );
}

#[tokio::test]
async fn model_info_shows_each_models_weights() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options());
    let key = gw.user_with_key("info@example.com", &[]);
    let v = api::get_json(gw.url("/v1/model/info"), &key).await;
    let weights = |id: &str| {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .map(|m| m["quota_weights"].clone())
    };
    assert_eq!(
        weights("gpt-weighted"),
        Some(json!({"input": 2.0, "output": 3.0, "cached_input": 0.5}))
    );
    assert_eq!(
        weights("mock-gpt"),
        Some(json!({"input": 1.0, "output": 1.0, "cached_input": 1.0}))
    );
}

/// The gateway's own input estimate of `chat(model, false)`.
async fn estimate(gw: &Gateway, key: &str, model: &str) -> u64 {
    let (status, text) = call(
        gw,
        key,
        "/v1/messages/count_tokens",
        json!({"model": model, "messages": [{"role": "user", "content": "weigh me"}]}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["input_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_lot_covers_exactly_the_weighted_reservation() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options());
    let email = "exact@example.com";
    let key = gw.user_with_key(email, &[]);
    // The reservation: the estimated input at 2 and the 100 requested output tokens at 3.
    let reserve = 2 * estimate(&gw, &key, "gpt-weighted").await + 300;

    // One token short: refused before anything reaches the provider.
    lots::grant_tokens_and_wait(&gw, email, reserve - 1).await;
    let (status, text) = complete(&gw, &key, "gpt-weighted").await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("insufficient_quota"), "{text}");
    assert_eq!(mock.served().await, 0);

    // Exactly the weighted reservation: admitted, and settled at the weighted usage.
    lots::grant_tokens_and_wait(&gw, email, 1).await;
    let (status, text) = complete(&gw, &key, "gpt-weighted").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(last_charge(&gw, 1).await, GPT_CHARGE as i64);
    assert_eq!(
        lots::lots_remaining_of(&gw, email).await,
        reserve - GPT_CHARGE
    );

    // What is left no longer covers a weighted reservation, though it would cover the same
    // request at the default weights.
    let (status, _) = complete(&gw, &key, "gpt-weighted").await;
    assert_eq!(status, 429);
    let unweighted = estimate(&gw, &key, "mock-gpt").await + 100;
    assert!(reserve - GPT_CHARGE >= unweighted);
    let (status, text) = complete(&gw, &key, "mock-gpt").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        charges(&gw, 2).await,
        [GPT_CHARGE as i64, UNWEIGHTED_CHARGE as i64]
    );
    assert_eq!(
        lots::lots_remaining_of(&gw, email).await,
        reserve - GPT_CHARGE - UNWEIGHTED_CHARGE
    );
}

#[tokio::test]
async fn a_reload_reprices_the_next_request_never_one_in_flight() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options());
    let email = "reload@example.com";
    let key = gw.user_with_key(email, &[]);
    lots::grant_tokens_and_wait(&gw, email, 100_000).await;

    // A request admitted at input weight 2, held by the provider for 3 seconds.
    let in_flight = {
        let url = gw.url("/v1/chat/completions");
        let key = key.clone();
        tokio::spawn(async move {
            client()
                .post(url)
                .bearer_auth(key)
                .json(&chat("gpt-slow-weighted", true))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    for _ in 0..100 {
        if !mock.requests().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        mock.requests().await.len(),
        1,
        "the request reached the provider"
    );

    // The input weight goes from 2 to 4 while it waits.
    let text = std::fs::read_to_string(&gw.config_path).unwrap();
    let reloaded = text.replace(
        "upstream_model = \"slow\"\ninput_weight = 2\n",
        "upstream_model = \"slow\"\ninput_weight = 4\n",
    );
    assert_ne!(text, reloaded);
    std::fs::write(&gw.config_path, reloaded).unwrap();
    let mut live = false;
    for _ in 0..100 {
        let v = api::get_json(gw.url("/v1/model/info"), &key).await;
        let input = v["data"]
            .as_array()
            .and_then(|d| d.iter().find(|m| m["id"] == "gpt-slow-weighted"))
            .map(|m| m["quota_weights"]["input"].clone());
        if input == Some(json!(4.0)) {
            live = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(live, "the new weight never applied");
    assert!(
        !in_flight.is_finished(),
        "the request must still be in flight"
    );

    // The request in flight settles at the weights it was admitted with.
    let answer = in_flight.await.unwrap();
    assert!(answer.contains("[DONE]"), "{answer}");
    assert_eq!(last_charge(&gw, 1).await, GPT_CHARGE as i64);

    // The next one pays the new input weight: 20 × 4 + 5 × 0.5 + 24 × 3 = 154.5.
    let (status, text) = complete(&gw, &key, "gpt-slow-weighted").await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(charges(&gw, 2).await, [GPT_CHARGE as i64, 155]);
    assert_eq!(
        lots::lots_remaining_of(&gw, email).await,
        100_000 - GPT_CHARGE - 155
    );
}

#[tokio::test]
async fn bad_weights_and_prices_are_refused_with_their_key() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options());
    let text = std::fs::read_to_string(&gw.config_path).unwrap();
    for (bad, key) in [
        ("input_weight = -1", "input_weight"),
        ("output_weight = nan", "output_weight"),
        ("cached_input_weight = inf", "cached_input_weight"),
        (
            "price = { output_per_million = -0.5 }",
            "price.output_per_million",
        ),
    ] {
        let probe = format!("{text}\n[[models]]\nid = \"bad\"\nprovider = \"mock\"\n{bad}\n");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, probe).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["--config", path.to_str().unwrap(), "config", "check"])
            .envs(gw.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} accepted");
        assert!(err.contains(&format!("].{key}")), "{bad}: {err}");
    }
}
