//! The developer-API pipeline end to end: every endpoint in both provider styles, the nine
//! checks' errors, routing (failover, cool-down, rename), streaming settlement and the usage
//! records, through the real server and the mock provider.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn tools_toml() -> String {
    r#"
[tools]
search_provider = "mock"
web_fetch_provider = "mock"
"#
    .to_string()
}

async fn post(gw: &Gateway, path: &str, key: &str, body: Value) -> reqwest::Response {
    client()
        .post(gw.url(path))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request")
}

async fn code(resp: reqwest::Response) -> (u16, String) {
    let s = resp.status().as_u16();
    let v: Value = resp.json().await.expect("json");
    (s, v["error"]["code"].as_str().unwrap_or("").to_string())
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello there"}]})
}

#[tokio::test]
async fn every_endpoint_in_both_styles() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::with_toml(tools_toml()));
    let key = gw.user_with_key("all@example.com", &[]);
    let c = client();

    let r = post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-request-id").is_some());
    assert!(r.headers().get("x-ratelimit-limit-requests").is_some());
    assert_eq!(
        r.json::<Value>().await.unwrap()["choices"][0]["message"]["role"],
        "assistant"
    );

    let r = post(
        &gw,
        "/v1/responses",
        &key,
        json!({"model": "mock-gpt", "input": "hi"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap()["usage"]["input_tokens"],
        25
    );

    let r = post(
        &gw,
        "/v1/responses",
        &key,
        json!({"model": "mock-gpt", "input": "hi", "stream": true}),
    )
    .await;
    let text = r.text().await.unwrap();
    assert!(text.contains("response.completed"), "{text}");

    let r = post(&gw, "/v1/messages", &key, json!({"model": "claude-mock", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], "stream": true})).await;
    let text = r.text().await.unwrap();
    assert!(text.contains("message_stop"), "{text}");

    // count_tokens: forwarded for an Anthropic-style model, counted locally otherwise.
    let r = post(
        &gw,
        "/v1/messages/count_tokens",
        &key,
        json!({"model": "claude-mock", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.json::<Value>().await.unwrap()["input_tokens"], 42);
    let r = post(
        &gw,
        "/alt/v1/messages/count_tokens",
        &key,
        json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hello there"}]}),
    )
    .await;
    let local = r.json::<Value>().await.unwrap()["input_tokens"]
        .as_u64()
        .unwrap();
    assert!(local > 2 && local < 20, "{local}");

    let r = post(
        &gw,
        "/v1/embeddings",
        &key,
        json!({"model": "mock-gpt", "input": ["a", "b"]}),
    )
    .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["data"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let r = post(
        &gw,
        "/v1/images/generations",
        &key,
        json!({"model": "mock-gpt", "prompt": "a cat"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.json::<Value>().await.unwrap()["data"][0]["b64_json"].is_string());

    let r = post(
        &gw,
        "/v1/audio/speech",
        &key,
        json!({"model": "mock-gpt", "input": "say this", "voice": "alloy"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "audio/mpeg");
    let audio = r.bytes().await.unwrap();
    assert_eq!(audio.len(), 64 * 1024);
    assert_eq!(&audio[..3], b"ID3");

    let r = post(&gw, "/v1/search", &key, json!({"query": "rust"})).await;
    assert_eq!(r.status(), 200);
    assert!(r.json::<Value>().await.unwrap()["results"].is_array());
    let r = post(
        &gw,
        "/v1/web/fetch",
        &key,
        json!({"url": "https://example.com"}),
    )
    .await;
    assert_eq!(
        r.json::<Value>().await.unwrap()["url"],
        "https://example.com"
    );

    let r = c
        .get(gw.url("/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"mock-gpt") && ids.contains(&"claude-mock"),
        "{ids:?}"
    );

    let r = c
        .get(gw.url("/v1/model/info"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let info = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "claude-mock")
        .unwrap()
        .clone();
    assert_eq!(info["provider_style"], "anthropic");
    assert_eq!(info["context_window"], 200000);
    assert_eq!(info["max_output_tokens"], 8192);
    assert!(info["endpoints"]
        .as_array()
        .unwrap()
        .contains(&json!("/v1/messages")));

    // Search and fetch without a [tools] provider are not enabled.
    let mock2 = Mock::start(&[]);
    let gw2 = Gateway::start(&mock2, Options::default());
    let key2 = gw2.user_with_key("notools@example.com", &[]);
    let (s, c2) = code(post(&gw2, "/v1/search", &key2, json!({"query": "x"})).await).await;
    assert_eq!((s, c2.as_str()), (404, "endpoint_not_enabled"));
}

#[tokio::test]
async fn the_checks_and_their_errors() {
    let mock = Mock::start(&[]);
    let extra = r#"
[[models]]
id = "tiny"
provider = "mock"
context_window = 100
max_output_tokens = 50

[quota.tiers.beginner]
weekly_tokens = 3000
"#;
    let gw = Gateway::start(&mock, Options::with_toml(extra));
    let key = gw.user_with_key("checks@example.com", &[]);
    gw.admin_json(&[
        "user",
        "set-tier",
        "--email",
        "checks@example.com",
        "--tier",
        "tryharder",
    ]);

    // Scope.
    gw.admin_json(&["user", "create", "--email", "scoped@example.com"]);
    let scoped = gw.admin_json(&[
        "key",
        "create",
        "--email",
        "scoped@example.com",
        "--scopes",
        "models",
    ])["secret"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &scoped, chat("mock-gpt")).await).await,
        (403, "insufficient_scope".into())
    );
    let r = client()
        .get(gw.url("/v1/models"))
        .bearer_auth(&scoped)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Model allowlist, and /v1/models shows only allowed models.
    gw.admin_json(&["user", "create", "--email", "allow@example.com"]);
    let allow = gw.admin_json(&[
        "key",
        "create",
        "--email",
        "allow@example.com",
        "--models",
        "claude-mock",
    ])["secret"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &allow, chat("mock-gpt")).await).await,
        (403, "model_not_allowed".into())
    );
    let v = api::get_json(gw.url("/v1/models"), &allow).await;
    assert_eq!(v["data"].as_array().unwrap().len(), 1);

    // Per-key maximums.
    gw.admin_json(&["user", "create", "--email", "max@example.com"]);
    let maxed = gw.admin_json(&[
        "key",
        "create",
        "--email",
        "max@example.com",
        "--max-input-tokens",
        "20",
        "--max-output-tokens",
        "10",
    ])["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let long = json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "this sentence has quite a few more than twenty tokens in it, because it just keeps going on and on and on"}]});
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &maxed, long).await).await,
        (400, "max_input_tokens_exceeded".into())
    );
    let out = json!({"model": "mock-gpt", "max_tokens": 11, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &maxed, out).await).await,
        (400, "max_output_tokens_exceeded".into())
    );

    // Per-model limits.
    let out =
        json!({"model": "tiny", "max_tokens": 51, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &key, out).await).await,
        (400, "max_output_tokens_exceeded".into())
    );
    let ctx = json!({"model": "tiny", "max_tokens": 50, "messages": [{"role": "user", "content": "word ".repeat(60)}]});
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &key, ctx).await).await,
        (400, "context_window_exceeded".into())
    );
    let too_long =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "word ".repeat(200)}]});
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &key, too_long).await).await,
        (400, "max_input_tokens_exceeded".into())
    );

    // Unknown model.
    assert_eq!(
        code(post(&gw, "/v1/chat/completions", &key, chat("nope")).await).await,
        (404, "model_not_found".into())
    );

    // Suspension takes effect on the next request (the change feed polls every 250 ms).
    assert_eq!(
        post(&gw, "/v1/chat/completions", &key, chat("mock-gpt"))
            .await
            .status(),
        200
    );
    gw.admin_json(&["user", "suspend", "--email", "checks@example.com"]);
    let mut seen = false;
    for _ in 0..40 {
        let (s, c) = code(post(&gw, "/v1/chat/completions", &key, chat("mock-gpt")).await).await;
        if (s, c.as_str()) == (403, "account_suspended") {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "suspension never took effect");
    gw.admin_json(&["user", "unsuspend", "--email", "checks@example.com"]);

    // Exhausted quota.
    gw.admin_json(&["user", "create", "--email", "poor@example.com"]);
    let poor = gw.admin_json(&["key", "create", "--email", "poor@example.com"])["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let fits = json!({"model": "mock-gpt", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post(&gw, "/v1/chat/completions", &poor, fits)
            .await
            .status(),
        200
    );
    let huge = json!({"model": "mock-gpt", "max_tokens": 3000, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&gw, "/v1/chat/completions", &poor, huge).await;
    assert!(r.headers().get("x-ratelimit-remaining-requests").is_some());
    let (s, c) = code(r).await;
    assert_eq!((s, c.as_str()), (429, "insufficient_quota"));
}

#[tokio::test]
async fn usage_records_match_the_provider() {
    let mock = Mock::start(&[]);
    let extra = r#"
[[models]]
id = "renamed"
provider = "mock"
upstream_model = "upstream-name"
"#;
    let gw = Gateway::start(&mock, Options::with_toml(extra));
    let key = gw.user_with_key("usage@example.com", &[]);

    post(&gw, "/v1/chat/completions", &key, chat("mock-gpt"))
        .await
        .text()
        .await
        .unwrap();
    let mut s = chat("mock-gpt");
    s["stream"] = json!(true);
    post(&gw, "/v1/chat/completions", &key, s)
        .await
        .text()
        .await
        .unwrap();
    post(&gw, "/v1/messages", &key, json!({"model": "claude-mock", "max_tokens": 32, "stream": true, "messages": [{"role": "user", "content": "hi"}]})).await.text().await.unwrap();
    post(&gw, "/v1/chat/completions", &key, chat("renamed"))
        .await
        .text()
        .await
        .unwrap();

    let events = gw.wait_usage(4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    for e in &events[..2] {
        assert_eq!(
            (e["input_tokens"].as_i64(), e["output_tokens"].as_i64()),
            (Some(25), Some(24)),
            "{e}"
        );
        assert_eq!(e["cached_tokens"], 5);
        assert_eq!(e["status"], 200);
        assert!(
            e["settlement"]
                .as_str()
                .unwrap()
                .starts_with("provider:complete"),
            "{e}"
        );
        assert!(e["id"].as_str().unwrap().starts_with("evt_"));
    }
    // Anthropic: input counts cache reads (25 + 5), output the cumulative message_delta.
    assert_eq!(
        (
            events[2]["input_tokens"].as_i64(),
            events[2]["output_tokens"].as_i64()
        ),
        (Some(30), Some(24))
    );
    assert_eq!(events[3]["model"], "renamed");
    assert_eq!(events[3]["deployment"], "mock/upstream-name");
    let seen = mock.requests().await;
    let last: Value = serde_json::from_str(seen.last().unwrap()["body"].as_str().unwrap()).unwrap();
    assert_eq!(last["model"], "upstream-name");

    // lastUsedAt is recorded, batched.
    let db = gw.db().await;
    let user = db
        .users()
        .find_by_email("usage@example.com")
        .await
        .unwrap()
        .unwrap();
    let keys = db.keys().list_for_user(&user.id).await.unwrap();
    assert!(keys[0].last_used_at.is_some());
}

/// Requests sent back to back on one connection (pipelining), and a keep-alive client that
/// sends its next request the moment it has an answer: every request arrives whole, is answered
/// in order and settles as complete (the relay watches the connection for a disconnect while
/// the client may already be sending; those bytes must not be lost or taken for a disconnect).
#[tokio::test]
async fn pipelined_and_back_to_back_requests() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("pipelined@example.com", &[]);
    let addr = gw.api.trim_start_matches("http://").to_string();

    let one = |i: usize| {
        let body = format!(
            r#"{{"model":"mock-gpt","messages":[{{"role":"user","content":"request {i}"}}]}}"#
        );
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all((0..3).map(one).collect::<String>().as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let answers = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 8192];
        loop {
            let text = String::from_utf8_lossy(&got).to_string();
            if text.matches("HTTP/1.1 ").count() == 3 && complete_bodies(&text) == 3 {
                return text;
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed after: {text}");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("pipelined answers: {}", String::from_utf8_lossy(&got)));
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 3, "{answers}");

    // Back to back on one keep-alive connection, each request as soon as the last answer is in.
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap();
    let dialled_before = mock.connections().await;
    for _ in 0..50 {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&chat("mock-gpt"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // The gateway reuses its provider connections: one client connection is served by one
    // worker thread, whose idle connection to the mock carries request after request (without
    // the pool: 50 new connections). The second count's own connection is the `- 1`.
    let dialled = mock.connections().await - dialled_before - 1;
    assert!(
        dialled <= 1,
        "{dialled} new provider connections for 50 back-to-back requests"
    );

    let events = gw.wait_usage(53).await;
    assert_eq!(events.len(), 53);
    for e in &events {
        assert_eq!(e["settlement"], "provider:complete", "{e}");
    }
}

/// How many answers in `text` have their whole body (by `content-length`).
fn complete_bodies(text: &str) -> usize {
    let mut done = 0;
    let mut rest = text;
    while let Some(head_end) = rest.find("\r\n\r\n") {
        let head = &rest[..head_end].to_ascii_lowercase();
        let Some(len) = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
        else {
            return done;
        };
        let body_start = head_end + 4;
        if rest.len() < body_start + len {
            return done;
        }
        done += 1;
        rest = &rest[body_start + len..];
    }
    done
}

#[tokio::test]
async fn disconnect_and_cut_streams_still_settle() {
    let mock = Mock::start(&["--chunks", "20", "--chunk-delay-ms", "100"]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("cut@example.com", &[]);

    // The client reads a little and goes away.
    let mut s = chat("mock-gpt");
    s["stream"] = json!(true);
    let mut r = post(&gw, "/v1/chat/completions", &key, s).await;
    let _first = r.chunk().await.unwrap();
    drop(r);

    let events = gw.wait_usage(1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert!(
        e["settlement"]
            .as_str()
            .unwrap()
            .ends_with("client_disconnect"),
        "{e}"
    );
    assert!(e["input_tokens"].as_i64().unwrap() > 0);
    assert!(
        e["output_tokens"].as_i64().unwrap() >= 1,
        "delivered text counted: {e}"
    );
}

/// The first usage event's settlement reason ends with `reason`.
fn assert_first_settled_as(events: &[Value], reason: &str) {
    let settlement = events[0]["settlement"].as_str().unwrap_or_default();
    assert!(settlement.ends_with(reason), "{events:?}");
}

#[tokio::test]
async fn provider_cut_and_midstream_errors() {
    let mock = Mock::start(&["--chunks", "6"]);
    let extra = r#"
[[models]]
id = "cutter"
provider = "mock"
upstream_model = "cut"

[[models]]
id = "broken"
provider = "mock"
upstream_model = "midstream-error"
"#;
    let gw = Gateway::start(&mock, Options::with_toml(extra));
    let key = gw.user_with_key("cutter@example.com", &[]);
    let mut s = chat("cutter");
    s["stream"] = json!(true);
    let text = post(&gw, "/v1/chat/completions", &key, s)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        text.contains("upstream_error"),
        "client sees the failure: {text}"
    );
    let mut s = chat("broken");
    s["stream"] = json!(true);
    let text = post(&gw, "/v1/chat/completions", &key, s)
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(text.contains("overloaded"), "{text}");
    let events = gw.wait_usage(2).await;
    assert_first_settled_as(&events, "upstream_error");
    assert!(events[0]["output_tokens"].as_i64().unwrap() >= 1);
}

/// The provider's idle timeout holds between a stream's events, also after the relay has read
/// what was already buffered without it (`Exchange::ready_chunk`): a provider that goes quiet
/// mid-stream ends the stream with an upstream error after about the idle timeout, not when
/// it speaks again.
#[tokio::test]
async fn a_provider_quiet_mid_stream_times_out() {
    let mock = Mock::start(&["--chunks", "6", "--chunk-delay-ms", "1500"]);
    let extra = format!(
        r#"
[[providers]]
name = "mock-quiet"
style = "openai"
base_url = "{}"
api_key_env = "MOCK_OPENAI_KEY"
first_byte_timeout_ms = 10000
idle_timeout_ms = 200

[[models]]
id = "quiet-gpt"
provider = "mock-quiet"
"#,
        mock.url()
    );
    let gw = Gateway::start(&mock, Options::with_toml(extra));
    let key = gw.user_with_key("quiet@example.com", &[]);
    let mut s = chat("quiet-gpt");
    s["stream"] = json!(true);
    let started = Instant::now();
    let resp = post(&gw, "/v1/chat/completions", &key, s).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap_or_default();
    let took = started.elapsed();
    assert!(text.contains("data: {"), "the first event arrives: {text}");
    assert!(
        text.contains("upstream_error"),
        "the client sees the timeout: {text}"
    );
    // The mock's second event would come 1.5 s after its first.
    assert!(
        took < Duration::from_millis(1300),
        "ended after the idle timeout, not the provider's pause: {took:?}"
    );
    let events = gw.wait_usage(1).await;
    assert_first_settled_as(&events, "upstream_error");
}

#[tokio::test]
async fn failover_and_a_failing_single_deployment() {
    let mock = Mock::start(&[]);
    let extra = r#"
[[providers]]
name = "dead"
style = "openai"
base_url = "http://127.0.0.1:9"
cooldown_seconds = 2
connect_timeout_ms = 500

[[models]]
id = "balanced"
deployments = [
  { provider = "mock", upstream_model = "fail500", weight = 100 },
  { provider = "dead", upstream_model = "mock-gpt", weight = 100 },
  { provider = "mock", upstream_model = "mock-gpt", weight = 1 },
]

[[models]]
id = "flaky"
provider = "mock"
upstream_model = "flaky-fail500"
"#;
    let gw = Gateway::start(&mock, Options::with_toml(extra));
    let key = gw.user_with_key("route@example.com", &[]);
    for _ in 0..6 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("balanced")).await;
        assert_eq!(r.status(), 200);
    }
    let seen = mock.requests().await;
    let fails = seen
        .iter()
        .filter(|r| r["body"].as_str().unwrap_or("").contains("fail500"))
        .count();
    assert!(
        fails <= 3,
        "a failing deployment is ejected after three failures in a row: {fails}"
    );

    // A single failing deployment is still asked every time (nothing else could answer), and
    // its error passes through with its body.
    mock.clear().await;
    for _ in 0..4 {
        let r = post(&gw, "/v1/chat/completions", &key, chat("flaky")).await;
        assert_eq!(r.status(), 500);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["message"], "mock failure");
    }
    assert_eq!(mock.requests().await.len(), 4, "every request was tried");
    let events = gw.wait_usage(10).await;
    assert_eq!(events.len(), 10, "{events:?}");
}

#[tokio::test]
async fn official_sdks() {
    let Some(python) = sdk::python() else {
        return;
    };
    let mock = Mock::start(&[]);
    // An id with a slash, which the SDKs percent-encode in a retrieval's path.
    let routed = "\n[[models]]\nid = \"openai/gpt-4o\"\nprovider = \"mock\"\n";
    let gw = Gateway::start(&mock, Options::with_toml(routed));
    let key = gw.user_with_key("sdk@example.com", &[]);
    sdk::run_script(&python, "sdk_clients.py", &[&gw.api, &key, "native"]);
}
