//! The training run of the profile-guided build (`scripts/build_pgo`): drives an instrumented
//! gateway with the traffic a deployment serves, so the optimiser learns which branches and
//! calls are hot.
//!
//! What the traffic is: mostly chat completions, streamed and not (the bulk of real LLM
//! traffic), then Anthropic-style messages, the responses API, requests translated between the
//! two styles, a renamed model, embeddings, token counting, the model list, and a few refused
//! requests (unknown key, unknown model). Code that never runs here is laid out as cold, so the mix covers every
//! path a production request takes; rare error paths are only sampled.
//!
//! Phases: SQLite with in-process quota, then, with `--redis URL`, the same mix with quota and
//! limits in Redis (the multi-instance set-up). Each phase ends with a graceful stop (SIGINT),
//! which is when an instrumented binary writes its profile.
//!
//! Run: `target/release/examples/pgo_train <instrumented gateway> [SECONDS per phase]
//! [--redis redis://127.0.0.1:6379]`, with `mock-provider` built beside this example.

use gateway_bench as support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Concurrent clients: the benchmark's middle cell.
const CLIENTS: u64 = 16;

const ENV: [(&str, &str); 2] = [
    ("GATEWAY_KEY_PEPPER", "pgo-training-pepper"),
    ("GATEWAY_REDIS_PREFIX", "pgo-train:"),
];

/// `pgo_train <gateway binary> [SECONDS] [--redis URL]`
#[derive(clap::Parser)]
struct Args {
    /// The instrumented gateway binary to train.
    gateway: PathBuf,
    /// Seconds of traffic per phase.
    #[arg(default_value_t = 20)]
    secs: u64,
    /// Also train with quota and limits in this Redis.
    #[arg(long)]
    redis: Option<String>,
}

/// A throw-away configuration: quota so large it never refuses (every request still reserves
/// and settles), one provider of each style on the mock, a model on each, and a renamed one
/// (most deployments forward the client's model name as it is, so most of the mix does too).
fn config_text(dir: &Path, mock: &str, redis: Option<&str>) -> String {
    let redis = redis
        .map(|u| format!("redis_url = \"{u}\""))
        .unwrap_or_default();
    let mut tiers = String::new();
    for tier in ["beginner", "steady", "persistent", "tryharder"] {
        tiers.push_str(&format!(
            "[quota.tiers.{tier}]\nweekly_tokens = 1000000000000\nrequests_per_minute = \
             100000000\ninput_tokens_per_minute = 1000000000000\noutput_tokens_per_minute = \
             1000000000000\n"
        ));
    }
    format!(
        r#"
[server]
api_listen = "127.0.0.1:0"
site_listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
[storage]
database_url = "sqlite://{d}/train.db"
{redis}
[secrets]
dir = "{d}/data"
[quota]
default_tier = "beginner"
[quota.usage_thresholds]
steady = 100000000000000
persistent = 200000000000000
tryharder = 300000000000000
{tiers}
[[providers]]
name = "mock"
style = "openai"
base_url = "http://{mock}"
[[providers]]
name = "mock-a"
style = "anthropic"
base_url = "http://{mock}"
[[models]]
id = "train-gpt"
provider = "mock"
[[models]]
id = "train-renamed"
provider = "mock"
upstream_model = "train-gpt"
[[models]]
id = "train-claude"
provider = "mock-a"
"#,
        d = dir.display()
    )
}

/// One request of the mix; `n` picks which.
fn pick(n: u64) -> (&'static str, Value, bool) {
    let chat = |model: &str, stream: bool| {
        let mut b = json!({
            "model": model,
            "messages": [
                {"role": "system", "content": "You are a test."},
                {"role": "user", "content": "Say something short. This prompt is fixed."}
            ],
            "max_tokens": 64,
        });
        if stream {
            b["stream"] = json!(true);
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let messages = |model: &str, stream: bool| {
        json!({
            "model": model,
            "max_tokens": 64,
            "system": "You are a test.",
            "messages": [{"role": "user", "content": "Say something short."}],
            "stream": stream,
        })
    };
    match n % 20 {
        0..=7 => ("/v1/chat/completions", chat("train-gpt", false), true),
        8..=10 => ("/v1/chat/completions", chat("train-gpt", true), true),
        11 | 12 => ("/v1/messages", messages("train-claude", false), true),
        13 | 14 => ("/v1/messages", messages("train-claude", true), true),
        15 => (
            "/v1/responses",
            json!({"model": "train-gpt", "input": "Say something short.", "stream": n % 40 == 15}),
            true,
        ),
        16 => (
            "/v1/chat/completions",
            chat("train-claude", n % 40 == 16),
            true,
        ),
        17 => ("/v1/messages", messages("train-gpt", n % 40 == 17), true),
        18 if n % 40 == 18 => (
            "/v1/embeddings",
            json!({"model": "train-gpt", "input": ["one", "two"]}),
            true,
        ),
        18 => ("/v1/chat/completions", chat("train-renamed", false), true),
        _ => match (n / 20) % 4 {
            0 => ("/v1/models", Value::Null, true),
            1 => (
                "/v1/messages/count_tokens",
                json!({"model": "train-claude", "messages": [{"role": "user", "content": "hi"}]}),
                true,
            ),
            2 => ("/v1/chat/completions", chat("train-gpt", false), false),
            _ => ("/v1/chat/completions", chat("no-such-model", false), true),
        },
    }
}

async fn one(c: &reqwest::Client, api: &str, key: &str, n: u64) -> bool {
    let (path, body, good_key) = pick(n);
    let key = if good_key { key } else { "sk-not-a-key" };
    let req = if body.is_null() {
        c.get(format!("{api}{path}"))
    } else {
        c.post(format!("{api}{path}")).json(&body)
    };
    match req.bearer_auth(key).send().await {
        Ok(mut r) => {
            let ok = r.status().is_success();
            while let Ok(Some(_)) = r.chunk().await {}
            ok
        }
        Err(_) => false,
    }
}

/// One phase: a gateway on a fresh database, the mix for `secs`, a graceful stop.
async fn phase(gateway: &Path, mock: &str, secs: u64, redis: Option<&str>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, config_text(dir.path(), mock, redis)).expect("config");
    support::admin(
        gateway,
        &config,
        &ENV,
        &["user", "create", "--email", "pgo@example.com"],
    );
    let key = support::admin(
        gateway,
        &config,
        &ENV,
        &["key", "create", "--email", "pgo@example.com"],
    )["secret"]
        .as_str()
        .expect("secret")
        .to_string();
    let mut gw = support::start_gateway(gateway, &config, &dir.path().join("gateway.log"), &ENV);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let deadline = Instant::now() + Duration::from_secs(secs);
    let ok = Arc::new(AtomicU64::new(0));
    let (api, ok_count) = (gw.api.clone(), ok.clone());
    let (tasks, counter) = support::spawn_clients(CLIENTS, deadline, move |n| {
        let (client, api, key, ok) = (client.clone(), api.clone(), key.clone(), ok_count.clone());
        async move {
            if one(&client, &api, &key, n).await {
                ok.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    for t in tasks {
        let _ = t.await;
    }
    let status = support::stop(&mut gw.child, "-INT");
    let (sent, ok) = (counter.load(Ordering::Relaxed), ok.load(Ordering::Relaxed));
    println!(
        "pgo_train: {} quota: {sent} requests, {ok} answered 2xx; gateway exited {status}",
        if redis.is_some() {
            "Redis"
        } else {
            "in-process"
        }
    );
    // Nearly all of the mix succeeds; mostly failures means the run trained error paths only.
    assert!(
        ok * 10 >= sent * 8,
        "too few requests succeeded ({ok} of {sent}): see {}",
        dir.path().display()
    );
    assert!(
        status.success(),
        "the gateway did not stop cleanly: {status}"
    );
}

#[tokio::main]
async fn main() {
    let a = <Args as clap::Parser>::parse();
    let (mut mock, mock_addr) = support::start_mock(&["--no-record", "--workers", "1"]);
    phase(&a.gateway, &mock_addr, a.secs, None).await;
    if let Some(url) = a.redis.as_deref() {
        phase(&a.gateway, &mock_addr, a.secs, Some(url)).await;
    }
    let _ = mock.kill();
    let _ = mock.wait();
}
