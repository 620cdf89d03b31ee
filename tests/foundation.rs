//! Foundation: the binary, the developer-API surface, key authentication, header hygiene,
//! streaming and large bodies, admin commands — all through the real server.

mod common;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

async fn error_code(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(ct.as_deref(), Some("application/json; charset=utf-8"));
    assert!(resp.headers().get("x-request-id").is_some());
    (status, resp.json().await.expect("json body"))
}

#[tokio::test]
async fn surface_and_key_errors() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("dev@example.com", &[]);
    let c = client();

    for path in ["/", "/health"] {
        let r = c.get(gw.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap(), json!({"ok": true}));
    }
    for path in ["/nope", "/altogether", "/v2/chat/completions"] {
        let (s, v) = error_code(c.post(gw.url(path)).send().await.unwrap()).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{path}"
        );
    }

    let chat = gw.url("/v1/chat/completions");
    let body = json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}]});
    let (s, v) = error_code(c.post(&chat).json(&body).send().await.unwrap()).await;
    assert_eq!(s, 401);
    assert_eq!(v["error"]["code"], "missing_api_key");
    assert_eq!(v["error"]["type"], "authentication_error");

    let (s, v) = error_code(
        c.post(&chat)
            .bearer_auth("not-a-key")
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("missing_api_key"))
    );

    let (s, v) = error_code(
        c.post(&chat)
            .bearer_auth("sk-thisisnotarealkeybutlooksfine0123456789")
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );

    // Check 2 runs after the key: a valid key with a credential in the query string.
    let (s, v) = error_code(
        c.post(format!("{chat}?api_key=abc"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("sensitive_query_param"))
    );
    let (s, v) = error_code(
        c.post(format!("{chat}?x=sk-leaked"))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("sensitive_query_param"))
    );

    // Check 3: under /v1 but not allowlisted, only after the key checks.
    let (s, v) = error_code(c.post(gw.url("/v1/files")).send().await.unwrap()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (401, Some("missing_api_key"))
    );
    let (s, v) = error_code(
        c.post(gw.url("/v1/files"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("endpoint_not_enabled"))
    );

    // Style B errors carry the top-level type.
    let (s, v) = error_code(c.post(gw.url("/alt/v1/messages")).send().await.unwrap()).await;
    assert_eq!(s, 401);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["code"], "missing_api_key");

    // Bad bodies.
    let (s, v) = error_code(
        c.post(&chat)
            .bearer_auth(&key)
            .body("{not json")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("invalid_json"))
    );
    let (s, v) = error_code(
        c.post(&chat)
            .bearer_auth(&key)
            .json(&json!({"messages": []}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (400, Some("missing_model"))
    );
}

#[tokio::test]
async fn key_secret_not_configured_is_503() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            pepper: false,
            ..Options::default()
        },
    );
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-whatever0123456789012345678901")
        .json(&json!({"model": "mock-gpt"}))
        .send()
        .await
        .unwrap();
    let (s, v) = error_code(r).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("key_secret_not_configured"))
    );
}

/// The mock answers like a real provider, with a cookie, its account's organization and its
/// account's rate-limit headers: none of them may reach the client, and the client's
/// `x-ratelimit-*` (and, in style B, `anthropic-ratelimit-*`) are the gateway's own, one value
/// each.
fn assert_no_provider_account_headers(h: &reqwest::header::HeaderMap) {
    for name in ["set-cookie", "openai-organization"] {
        assert!(h.get(name).is_none(), "{name} reached the client: {h:?}");
    }
    let anthropic: Vec<_> = h
        .get_all("anthropic-ratelimit-requests-limit")
        .iter()
        .collect();
    assert!(anthropic.len() <= 1, "{h:?}");
    assert!(anthropic.iter().all(|v| *v != "4000"), "{h:?}");
    let limits: Vec<_> = h.get_all("x-ratelimit-limit-requests").iter().collect();
    assert_eq!(limits.len(), 1, "{h:?}");
    assert_ne!(limits[0], "5000", "{h:?}");
    let remaining: Vec<_> = h.get_all("x-ratelimit-remaining-requests").iter().collect();
    assert_eq!(remaining.len(), 1, "{h:?}");
    assert_ne!(remaining[0], "4999", "{h:?}");
}

#[tokio::test]
async fn forwards_both_styles_without_client_credentials() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("fwd@example.com", &[]);
    let c = client();

    // Style A, non-stream.
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("cookie", "session=browser-cookie")
        .header("x-api-key", &key)
        .json(&json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_no_provider_account_headers(r.headers());
    // A delimited body (chunked or sized), so the client connection stays reusable.
    assert!(
        r.headers()
            .get("transfer-encoding")
            .is_some_and(|v| v == "chunked")
            || r.headers().get("content-length").is_some(),
        "{:?}",
        r.headers()
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["prompt_tokens"], 25);

    // Style B through the /alt alias with the Anthropic SDK's headers.
    let r = c
        .post(gw.url("/alt/v1/messages"))
        .header("authorization", format!("Bearer {key}"))
        .header("anthropic-version", "2026-10-21")
        .header("anthropic-beta", "tools-2024-04-04")
        .json(&json!({"model": "claude-mock", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_no_provider_account_headers(r.headers());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message");

    // Style B with x-api-key and compat-version.
    let r = c
        .post(gw.url("/v1/messages"))
        .header("x-api-key", &key)
        .header("compat-version", "2023-06-01")
        .json(&json!({"model": "claude-mock", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let seen = mock.requests().await;
    let model_calls: Vec<&Value> = seen
        .iter()
        .filter(|r| r["path"].as_str().unwrap_or("").starts_with("/v1/"))
        .collect();
    assert_eq!(model_calls.len(), 3);
    for r in &model_calls {
        let h = &r["headers"];
        assert!(h.get("cookie").is_none(), "cookie leaked: {r}");
        let auth = h["authorization"].as_str().unwrap_or("");
        let xkey = h["x-api-key"].as_str().unwrap_or("");
        assert!(
            !auth.contains(&key) && !xkey.contains(&key),
            "client key leaked: {r}"
        );
    }
    assert_eq!(
        model_calls[0]["headers"]["authorization"],
        "Bearer provider-openai-secret"
    );
    assert_eq!(
        model_calls[1]["headers"]["x-api-key"],
        "provider-anthropic-secret"
    );
    assert_eq!(model_calls[1]["headers"]["anthropic-version"], "2026-10-21");
    assert_eq!(
        model_calls[1]["headers"]["anthropic-beta"],
        "tools-2024-04-04"
    );
    assert!(model_calls[1]["headers"].get("authorization").is_none());
    assert_eq!(model_calls[2]["headers"]["anthropic-version"], "2023-06-01");
}

#[tokio::test]
async fn streams_chunk_by_chunk() {
    let mock = Mock::start(&["--chunks", "5", "--chunk-delay-ms", "150"]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("stream@example.com", &[]);
    let started = std::time::Instant::now();
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .json(&json!({"model": "mock-gpt", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_no_provider_account_headers(r.headers());
    let first = r.chunk().await.unwrap().expect("first chunk");
    let first_at = started.elapsed();
    let mut all = first.to_vec();
    // Reads that brought an event: the provider paces its five events 150 ms apart, so each
    // arrives in a read of its own (the relay merges only what has already arrived).
    let mut event_reads = usize::from(memchr::memmem::find(&first, b"data:").is_some());
    while let Some(c) = r.chunk().await.unwrap() {
        event_reads += usize::from(memchr::memmem::find(&c, b"data:").is_some());
        all.extend_from_slice(&c);
    }
    let total = started.elapsed();
    // The first event arrives long before the stream ends: nothing was buffered.
    assert!(
        first_at + std::time::Duration::from_millis(400) < total,
        "first {first_at:?} total {total:?}"
    );
    assert!(event_reads >= 5, "{event_reads} reads brought events");
    let text = String::from_utf8(all).unwrap();
    assert!(text.contains("chat.completion.chunk"));
    assert!(text.trim_end().ends_with("data: [DONE]"));
    // The client did not ask for usage: the usage-only chunk is not passed on...
    assert!(!text.contains("\"choices\":[]"), "{text}");
    // ...but the provider was asked for it so settlement has the real numbers.
    let seen = mock.requests().await;
    let body: Value = serde_json::from_str(seen[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn five_megabyte_body_arrives_intact() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    gw.admin_json(&[
        "user",
        "create",
        "--email",
        "big@example.com",
        "--unlimited",
    ]);
    let key = gw.admin_json(&["key", "create", "--email", "big@example.com"])["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let filler = "lorem ipsum ".repeat(5 * 1024 * 1024 / 12);
    let body = serde_json::to_vec(&json!({
        "model": "mock-big",
        "messages": [{"role": "user", "content": filler}],
    }))
    .unwrap();
    assert!(body.len() > 5_000_000);
    let digest = hex::encode(Sha256::digest(&body));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let seen = mock.requests().await;
    let last = seen.last().unwrap();
    assert_eq!(last["body_len"].as_u64().unwrap() as usize, body.len());
    assert_eq!(last["body_sha256"].as_str().unwrap(), digest);
}

#[tokio::test]
async fn expect_continue_and_too_large() {
    use std::io::{Read, Write};
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("expect@example.com", &[]);
    let addr = gw.api.trim_start_matches("http://").to_string();
    let body = br#"{"model":"mock-gpt","messages":[{"role":"user","content":"hi"}]}"#;

    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 25];
    s.read_exact(&mut buf).unwrap();
    assert!(
        String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 100 Continue"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    s.write_all(body).unwrap();
    let mut rest = vec![0u8; 12];
    s.read_exact(&mut rest).unwrap();
    let head = String::from_utf8_lossy(&rest);
    assert!(head.contains("200"), "{head}");

    // Declared length over the limit: 413 without reading the body.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body(vec![b' '; 33 * 1024 * 1024])
        .send()
        .await;
    if let Ok(r) = r {
        assert_eq!(r.status(), 413);
    }
}

#[tokio::test]
async fn admin_commands() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let user = gw.admin_json(&[
        "user",
        "create",
        "--email",
        "Ops@Example.com",
        "--tier",
        "steady",
    ]);
    assert!(user["id"].as_str().unwrap().starts_with("usr_"));
    assert_eq!(user["email"], "ops@example.com");
    assert_eq!(user["quotaTier"], "steady");

    let (ok, err) = gw.admin(&["user", "create", "--email", "ops@example.com"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, err) = gw.admin(&["user", "create", "--email", "bad"]);
    assert!(!ok && err.contains("invalid email"), "{err}");
    let (ok, err) = gw.admin(&["user", "suspend", "--email", "ghost@example.com"]);
    assert!(!ok && err.contains("no user"), "{err}");
    let (ok, err) = gw.admin(&[
        "user",
        "set-tier",
        "--email",
        "ops@example.com",
        "--tier",
        "gold",
    ]);
    assert!(!ok && err.contains("unknown tier"), "{err}");
    let (ok, err) = gw.admin(&[
        "key",
        "create",
        "--email",
        "ops@example.com",
        "--scopes",
        "chat,bogus",
    ]);
    assert!(!ok && err.contains("unknown scope"), "{err}");
    let (ok, _) = gw.admin(&[
        "key",
        "create",
        "--email",
        "ops@example.com",
        "--rpm",
        "lots",
    ]);
    assert!(!ok);
    let (ok, err) = gw.admin(&["key", "create", "--email", "ops@example.com", "--rpm", "0"]);
    assert!(!ok && err.contains("positive"), "{err}");

    let key = gw.admin_json(&[
        "key",
        "create",
        "--email",
        "ops@example.com",
        "--name",
        "ci",
        "--scopes",
        "chat,models",
        "--models",
        "mock-gpt",
        "--max-input-tokens",
        "1000",
        "--max-output-tokens",
        "500",
        "--rpm",
        "10",
        "--itpm",
        "1000",
        "--otpm",
        "2000",
    ]);
    assert!(key["id"].as_str().unwrap().starts_with("key_"));
    let secret = key["secret"].as_str().unwrap();
    assert!(secret.starts_with("sk-") && secret.len() >= 35);
    assert_eq!(key["keyPrefix"].as_str().unwrap(), &secret[..7]);
    assert!(secret.ends_with(key["keySuffix"].as_str().unwrap()));
    assert_eq!(key["scopes"], json!(["chat", "models"]));
    assert_eq!(key["modelAllowlist"], json!(["mock-gpt"]));
    assert_eq!(key["customRequestsPerMinute"], 10);
    assert_eq!(key["maxOutputTokensPerRequest"], 500);
    assert_eq!(key["status"], "active");
    assert!(key.get("keyHash").is_none());

    let suspended = gw.admin_json(&["user", "suspend", "--email", "ops@example.com"]);
    assert_eq!(suspended["suspended"], true);
    let tier = gw.admin_json(&[
        "user",
        "set-tier",
        "--email",
        "ops@example.com",
        "--tier",
        "tryharder",
    ]);
    assert_eq!(tier["quotaTier"], "tryharder");

    let check = gw.admin_json(&["config", "check"]);
    assert_eq!(check["ok"], true);
}

#[test]
fn config_check_names_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.toml");
    std::fs::write(
        &path,
        "[[providers]]\nname = \"p\"\nstyle = \"grpc\"\nbase_url = \"http://127.0.0.1:1\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--config", path.to_str().unwrap(), "config", "check"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.toml"), "{err}");
    assert!(err.contains("providers[0].style"), "{err}");

    std::fs::write(&path, "[server]\napi_listen = 8080\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--config", path.to_str().unwrap(), "config", "check"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.toml") && err.contains("api_listen"),
        "{err}"
    );

    let shipped = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args([
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/conf/gateway.toml"),
            "config",
            "check",
        ])
        .output()
        .unwrap();
    assert!(
        shipped.status.success(),
        "{}",
        String::from_utf8_lossy(&shipped.stderr)
    );
}
