//! What real clients expect of the developer API beyond the spec's tables, through the real
//! server: retrieving one model (`client.models.retrieve`) in both styles; Anthropic's shapes
//! for style B (the model list and its paging, `request-id`, `anthropic-ratelimit-*`) and each
//! style's own error types; output ceilings clamped to a model's limit for clients that fill
//! `max_tokens` with a default of their own (`clamp_output_tokens`).

mod common;

use common::config::uncapped_tier;
use common::*;
use serde_json::{json, Value};

/// Models whose ids carry a `/` and a `:`, as routers and local runtimes name them.
const ODD_IDS: &str = r#"
[[models]]
id = "openai/gpt-4o"
provider = "mock"

[[models]]
id = "llama3:8b"
provider = "mock"
"#;

/// `GET path` with `key` in the style of the path (see [`api::post_in_style`]).
async fn get_in_style(gw: &Gateway, path: &str, key: &str) -> reqwest::Response {
    let req = client().get(gw.url(path));
    let req = if path.starts_with("/alt") {
        req.header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
    } else {
        req.bearer_auth(key)
    };
    req.send().await.expect("request")
}

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn one_model_is_retrieved_in_each_style() {
    let extra = format!("{ODD_IDS}{}", uncapped_tier("beginner", 1_000_000, 0));
    let (_mock, gw) = config::start_with_toml(&extra);
    let key = gw.user_with_key("retrieve@example.com", &[]);

    // OpenAI's shape on /v1.
    let (s, v) = json_of(get_in_style(&gw, "/v1/models/mock-gpt", &key).await).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        json!({"id": "mock-gpt", "object": "model", "created": 0, "owned_by": "mock"})
    );

    // Anthropic's on /alt.
    let (s, v) = json_of(get_in_style(&gw, "/alt/v1/models/claude-mock", &key).await).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["type"], "model");
    assert_eq!(v["id"], "claude-mock");
    assert_eq!(v["display_name"], "claude-mock");
    assert_eq!(v["created_at"], "1970-01-01T00:00:00Z");
    assert_eq!(v["max_input_tokens"], 200000);
    assert_eq!(v["max_tokens"], 8192);

    // Ids with `/` and `:`, percent-encoded (as the SDKs send them) or not.
    for (path, id) in [
        ("/v1/models/openai%2Fgpt-4o", "openai/gpt-4o"),
        ("/v1/models/openai%2fgpt-4o", "openai/gpt-4o"),
        ("/v1/models/openai/gpt-4o", "openai/gpt-4o"),
        ("/alt/v1/models/openai%2Fgpt-4o", "openai/gpt-4o"),
        ("/alt/v1/models/openai/gpt-4o", "openai/gpt-4o"),
        ("/v1/models/llama3:8b", "llama3:8b"),
        ("/v1/models/llama3%3A8b", "llama3:8b"),
    ] {
        let (s, v) = json_of(get_in_style(&gw, path, &key).await).await;
        assert_eq!((s, v["id"].as_str()), (200, Some(id)), "{path}: {v}");
    }

    // Unknown ids: 404 in each style's shape.
    let (s, v) = json_of(get_in_style(&gw, "/v1/models/no-such-model", &key).await).await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert!(v.get("type").is_none(), "{v}");
    for path in [
        "/alt/v1/models/no-such-model",
        "/alt/v1/models/openai",
        "/alt/v1/models/%FF%FE",
    ] {
        let (s, v) = json_of(get_in_style(&gw, path, &key).await).await;
        assert_eq!(s, 404, "{path}");
        assert_eq!(v["type"], "error", "{path}: {v}");
        assert_eq!(v["error"]["code"], "model_not_found", "{path}: {v}");
    }

    // Only GET.
    let r = client()
        .post(gw.url("/v1/models/mock-gpt"))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .expect("post");
    assert_eq!(
        api::status_and_code(r).await,
        (405, "method_not_allowed".into())
    );

    // Each retrieval is one reserved request, recorded like a listing; a 404 costs nothing.
    gw.wait_usage(9).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let events = gw.usage_events().await;
    assert_eq!(events.len(), 9, "{events:?}");
    assert!(events.iter().all(|e| e["endpoint"] == "model"
        && e["status"] == 200
        && e["input_tokens"] == 0
        && e["output_tokens"] == 0));
    let count = |m: &str| events.iter().filter(|e| e["model"] == m).count();
    assert_eq!(
        [
            count("mock-gpt"),
            count("claude-mock"),
            count("openai/gpt-4o"),
            count("llama3:8b")
        ],
        [1, 1, 5, 2]
    );
}

#[tokio::test]
async fn retrieval_keeps_to_the_keys_models_scope_and_quota() {
    let extra = format!("{ODD_IDS}{}", uncapped_tier("beginner", 1_000_000, 3));
    let (_mock, gw) = config::start_with_toml(&extra);

    // A key limited to some models sees only those: the others are not found.
    let allow = gw.user_with_key(
        "allow@example.com",
        &["--models", "claude-mock,openai/gpt-4o"],
    );
    for path in ["/v1/models/mock-gpt", "/alt/v1/models/mock-gpt"] {
        let (s, v) = json_of(get_in_style(&gw, path, &allow).await).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (404, Some("model_not_found")),
            "{path}"
        );
    }
    for path in ["/v1/models/claude-mock", "/alt/v1/models/openai%2Fgpt-4o"] {
        let (s, v) = json_of(get_in_style(&gw, path, &allow).await).await;
        assert_eq!(s, 200, "{path}: {v}");
    }

    // The scope is `models`.
    let chat_only = gw.user_with_key("chat@example.com", &["--scopes", "chat"]);
    let r = get_in_style(&gw, "/v1/models/mock-gpt", &chat_only).await;
    assert_eq!(
        api::status_and_code(r).await,
        (403, "insufficient_scope".into())
    );
    let models_only = gw.user_with_key("models@example.com", &["--scopes", "models"]);
    let r = get_in_style(&gw, "/v1/models/mock-gpt", &models_only).await;
    assert_eq!(r.status(), 200);

    // Three requests a week: three retrievals, then the quota refuses the fourth. The two
    // found above were this account's first two; a not-found one reserves nothing.
    let r = get_in_style(&gw, "/v1/models/nope", &allow).await;
    assert_eq!(r.status(), 404);
    let r = get_in_style(&gw, "/v1/models/claude-mock", &allow).await;
    assert_eq!(r.status(), 200);
    let r = get_in_style(&gw, "/v1/models/claude-mock", &allow).await;
    assert_eq!(
        api::status_and_code(r).await,
        (429, "insufficient_quota".into())
    );
}

/// `(limit, remaining)` of the `x-ratelimit-*-{what}` headers, and the reset in seconds.
fn openai_window(r: &reqwest::Response, what: &str) -> (u64, u64, u64) {
    let get = |name: String| -> String {
        r.headers()
            .get(&name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no {name}"))
            .to_string()
    };
    (
        get(format!("x-ratelimit-limit-{what}"))
            .parse()
            .expect("limit"),
        get(format!("x-ratelimit-remaining-{what}"))
            .parse()
            .expect("remaining"),
        get(format!("x-ratelimit-reset-{what}"))
            .trim_end_matches('s')
            .parse()
            .expect("reset"),
    )
}

/// Asserts that a style-B answer carries `request-id` (the gateway's `x-request-id`) and
/// Anthropic's rate-limit headers with the numbers of the OpenAI-style ones, resets as
/// RFC 3339 times within the minute.
fn assert_style_b_headers(r: &reqwest::Response, what: &str) {
    let h = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok());
    let id = h("request-id").unwrap_or_else(|| panic!("{what}: no request-id"));
    assert!(id.starts_with("req_"), "{what}: {id}");
    assert_eq!(Some(id), h("x-request-id"), "{what}");
    let now = time::OffsetDateTime::now_utc();
    for (anthropic, openai) in [
        ("requests", "requests"),
        ("input-tokens", "input-tokens"),
        ("output-tokens", "output-tokens"),
    ] {
        let (limit, remaining, _) = openai_window(r, openai);
        let a = |k: &str| {
            h(&format!("anthropic-ratelimit-{anthropic}-{k}"))
                .unwrap_or_else(|| panic!("{what}: no anthropic-ratelimit-{anthropic}-{k}"))
                .to_string()
        };
        assert_eq!(a("limit"), limit.to_string(), "{what}: {anthropic}");
        assert_eq!(a("remaining"), remaining.to_string(), "{what}: {anthropic}");
        let reset = time::OffsetDateTime::parse(
            &a("reset"),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap_or_else(|e| panic!("{what}: reset {:?}: {e}", a("reset")));
        let ahead = (reset - now).whole_seconds();
        // A refused window resets when the sliding window admits again (the retry-after,
        // up to two minutes for a per-minute window); any other within the minute.
        let retry_after = h("retry-after").and_then(|v| v.parse::<i64>().ok());
        match retry_after.filter(|_| a("remaining") == "0") {
            Some(wait) => assert!(
                (ahead - wait).abs() <= 2,
                "{what}: {anthropic} reset {ahead} s ahead, retry-after {wait}"
            ),
            None => assert!(
                (-2..=62).contains(&ahead),
                "{what}: {anthropic} reset {ahead} s ahead"
            ),
        }
    }
    // `tokens`: the window with fewer tokens left.
    let (_, input_left, _) = openai_window(r, "input-tokens");
    let (_, output_left, _) = openai_window(r, "output-tokens");
    assert_eq!(
        h("anthropic-ratelimit-tokens-remaining"),
        Some(input_left.min(output_left).to_string().as_str()),
        "{what}"
    );
}

#[tokio::test]
async fn style_b_lists_models_in_anthropics_shape_and_pages() {
    let (_mock, gw) = config::start_with_toml(ODD_IDS);
    let key = gw.user_with_key("list@example.com", &[]);
    let all = [
        "mock-gpt",
        "mock-big",
        "mock-tools",
        "claude-tools",
        "claude-mock",
        "openai/gpt-4o",
        "llama3:8b",
    ];

    let r = get_in_style(&gw, "/alt/v1/models", &key).await;
    assert_eq!(r.status(), 200);
    assert_style_b_headers(&r, "model list");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["has_more"], false, "{v}");
    assert_eq!(v["first_id"], "mock-gpt");
    assert_eq!(v["last_id"], "llama3:8b");
    assert!(v.get("object").is_none(), "{v}");
    let data = v["data"].as_array().expect("data");
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, all);
    for m in data {
        assert_eq!(m["type"], "model", "{m}");
        assert!(!m["display_name"].as_str().unwrap_or("").is_empty(), "{m}");
        assert!(!m["created_at"].as_str().unwrap_or("").is_empty(), "{m}");
    }

    // Pages forward and back.
    let page = |q: &'static str| {
        let gw = &gw;
        let key = &key;
        async move {
            let r = get_in_style(gw, &format!("/alt/v1/models?{q}"), key).await;
            let status = r.status().as_u16();
            let v: Value = r.json().await.expect("json");
            (status, v)
        }
    };
    let ids_of = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (s, v) = page("limit=3").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(ids_of(&v), all[..3]);
    assert_eq!(
        (v["has_more"].clone(), v["last_id"].clone()),
        (json!(true), json!("mock-tools"))
    );
    let (_, v) = page("limit=3&after_id=mock-tools").await;
    assert_eq!(ids_of(&v), all[3..6]);
    assert_eq!(v["has_more"], true);
    let (_, v) = page("limit=3&after_id=openai%2Fgpt-4o").await;
    assert_eq!(ids_of(&v), all[6..]);
    assert_eq!(v["has_more"], false);
    let (_, v) = page("limit=2&before_id=claude-tools").await;
    assert_eq!(ids_of(&v), all[1..3]);
    assert_eq!(
        (v["has_more"].clone(), v["first_id"].clone()),
        (json!(true), json!("mock-big"))
    );
    let (_, v) = page("after_id=no-such-model").await;
    assert_eq!(
        v,
        json!({"data": [], "has_more": false, "first_id": null, "last_id": null})
    );
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=ten",
        "after_id=a&before_id=b",
    ] {
        let (s, v) = page(bad).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert_eq!(v["type"], "error", "{bad}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{bad}: {v}");
    }

    // A key limited to some models pages through those alone.
    let allow = gw.user_with_key("allow@example.com", &["--models", "llama3:8b,claude-mock"]);
    let r = get_in_style(&gw, "/alt/v1/models?limit=1", &allow).await;
    let v: Value = r.json().await.expect("json");
    assert_eq!(
        (ids_of(&v), v["has_more"].clone()),
        (vec!["claude-mock".to_string()], json!(true))
    );

    // /v1 keeps OpenAI's list, and none of Anthropic's headers.
    let r = get_in_style(&gw, "/v1/models?limit=1", &key).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("request-id").is_none());
    assert!(r
        .headers()
        .get("anthropic-ratelimit-requests-limit")
        .is_none());
    assert!(r.headers().get("x-ratelimit-limit-requests").is_some());
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(all.len()));
}

#[tokio::test]
async fn style_b_answers_carry_request_id_and_anthropic_rate_headers() {
    let (_mock, gw) = config::start_with_toml("");
    let key = gw.user_with_key("headers@example.com", &[]);
    let hello = |stream: bool| {
        json!({"model": "claude-mock", "max_tokens": 32, "stream": stream,
               "messages": [{"role": "user", "content": "hi"}]})
    };

    // Relayed, whole and streamed, on both style-B paths; translated from an OpenAI-style model.
    for path in ["/alt/v1/messages", "/v1/messages"] {
        for stream in [false, true] {
            let r = api::post_in_style(&gw, path, &key, &hello(stream)).await;
            assert_eq!(r.status(), 200, "{path}");
            assert_style_b_headers(&r, &format!("{path} stream={stream}"));
            let text = r.text().await.expect("body");
            assert!(
                text.contains("claude-mock") || text.contains("message"),
                "{text}"
            );
        }
    }
    let mut translated = hello(true);
    translated["model"] = json!("mock-gpt");
    let r = api::post_in_style(&gw, "/alt/v1/messages", &key, &translated).await;
    assert_eq!(r.status(), 200);
    assert_style_b_headers(&r, "translated stream");
    let r = api::post_in_style(
        &gw,
        "/alt/v1/messages/count_tokens",
        &key,
        &json!({"model": "claude-mock", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_style_b_headers(&r, "count_tokens");

    // Errors: after the key, with the windows; before it, the request id alone.
    let mut unknown = hello(false);
    unknown["model"] = json!("no-such-model");
    let r = api::post_in_style(&gw, "/alt/v1/messages", &key, &unknown).await;
    assert_eq!(r.status(), 404);
    let id = r.headers()["request-id"].to_str().unwrap().to_string();
    assert_eq!(r.headers()["x-request-id"].to_str().unwrap(), id);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["type"], "error");
    for (path, key) in [
        (
            "/alt/v1/messages",
            "sk-not-a-real-key-0000000000000000000000",
        ),
        ("/alt/no-such-thing", key.as_str()),
    ] {
        let r = api::post_in_style(&gw, path, key, &hello(false)).await;
        assert!(
            r.status() == 401 || r.status() == 404,
            "{path}: {}",
            r.status()
        );
        let id = r
            .headers()
            .get("request-id")
            .map(|v| v.to_str().unwrap().to_string());
        assert!(
            id.as_deref().is_some_and(|i| i.starts_with("req_")),
            "{path}: {id:?}"
        );
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["type"], "error", "{path}: {v}");
    }

    // Style A: none of it.
    let r = api::post_in_style(
        &gw,
        "/v1/chat/completions",
        &key,
        &json!({"model": "claude-mock", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("request-id").is_none());
    assert!(r
        .headers()
        .get("anthropic-ratelimit-tokens-limit")
        .is_none());
}

#[tokio::test]
async fn a_refused_reservation_in_style_b_carries_the_windows() {
    let tier = "\n[quota.tiers.beginner]\nweekly_tokens = 1000000\nrequests_per_minute = 1\n";
    let (_mock, gw) = config::start_with_toml(tier);
    let key = gw.user_with_key("limited@example.com", &[]);
    let body = json!({"model": "claude-mock", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = api::post_in_style(&gw, "/alt/v1/messages", &key, &body).await;
    assert_eq!(r.status(), 200);
    let r = api::post_in_style(&gw, "/alt/v1/messages", &key, &body).await;
    assert_eq!(r.status(), 429);
    assert_style_b_headers(&r, "rate limited");
    assert_eq!(r.headers()["anthropic-ratelimit-requests-remaining"], "0");
    assert!(r.headers().get("retry-after").is_some());
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
}

/// A 429 for a per-minute limit tells one wait: `retry-after`, the refused window's reset
/// (`x-ratelimit-reset-requests`, and Anthropic's reset time in style B) and the message agree.
#[tokio::test]
async fn a_rate_limited_answer_tells_one_wait_in_both_styles() {
    let tier = "\n[quota.tiers.beginner]\nweekly_tokens = 1000000\nrequests_per_minute = 1\n";
    let (_mock, gw) = config::start_with_toml(tier);
    for (path, model) in [
        ("/v1/chat/completions", "mock-gpt"),
        ("/alt/v1/messages", "claude-mock"),
    ] {
        let key = gw.user_with_key(&format!("wait{}@example.com", path.len()), &[]);
        let body = json!({"model": model, "max_tokens": 8,
                          "messages": [{"role": "user", "content": "hi"}]});
        let r = api::post_in_style(&gw, path, &key, &body).await;
        assert_eq!(r.status(), 200, "{path}");
        let r = api::post_in_style(&gw, path, &key, &body).await;
        assert_eq!(r.status(), 429, "{path}");
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let retry: u64 = header("retry-after").parse().expect("retry-after seconds");
        assert_eq!(
            header("x-ratelimit-reset-requests"),
            format!("{retry}s"),
            "{path}"
        );
        assert_eq!(header("x-ratelimit-remaining-requests"), "0", "{path}");
        if path.starts_with("/alt") {
            let at = time::OffsetDateTime::parse(
                &header("anthropic-ratelimit-requests-reset"),
                &time::format_description::well_known::Rfc3339,
            )
            .expect("an RFC 3339 reset");
            let wait = (at - time::OffsetDateTime::now_utc()).whole_seconds();
            assert!(
                (wait - retry as i64).abs() <= 2,
                "{path}: reset in {wait} s, retry {retry}"
            );
        }
        let v: Value = r.json().await.expect("json");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("retry after {retry} s")),
            "{path}: {message}"
        );
    }
}

#[tokio::test]
async fn error_types_are_each_styles_own() {
    let (_mock, gw) = config::start_with_toml(&uncapped_tier("beginner", 1_000_000, 0));
    let key = gw.user_with_key("types@example.com", &[]);
    let scoped = gw.user_with_key("scoped@example.com", &["--scopes", "models"]);
    let chat =
        |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let messages = |model: &str| json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let cases: Vec<(&str, &str, Value, u16, &str, &str)> = vec![
        // OpenAI calls a missing model or route an invalid request.
        (
            "/v1/chat/completions",
            key.as_str(),
            chat("nope"),
            404,
            "model_not_found",
            "invalid_request_error",
        ),
        (
            "/v1/nothing-here",
            key.as_str(),
            chat("mock-gpt"),
            404,
            "endpoint_not_enabled",
            "invalid_request_error",
        ),
        (
            "/v1/chat/completions",
            scoped.as_str(),
            chat("mock-gpt"),
            403,
            "insufficient_scope",
            "permission_error",
        ),
        (
            "/v1/chat/completions",
            "sk-unknown-0000000000000000000000000",
            chat("mock-gpt"),
            401,
            "invalid_api_key",
            "authentication_error",
        ),
        // Anthropic has a type per status.
        (
            "/v1/messages",
            key.as_str(),
            messages("nope"),
            404,
            "model_not_found",
            "not_found_error",
        ),
        (
            "/alt/v1/messages",
            key.as_str(),
            messages("nope"),
            404,
            "model_not_found",
            "not_found_error",
        ),
        (
            "/alt/v1/nothing-here",
            key.as_str(),
            messages("claude-mock"),
            404,
            "endpoint_not_enabled",
            "not_found_error",
        ),
        (
            "/alt/nothing-here",
            key.as_str(),
            messages("claude-mock"),
            404,
            "not_found",
            "not_found_error",
        ),
        (
            "/alt/v1/messages",
            scoped.as_str(),
            messages("claude-mock"),
            403,
            "insufficient_scope",
            "permission_error",
        ),
        (
            "/alt/v1/messages",
            "sk-unknown-0000000000000000000000000",
            messages("claude-mock"),
            401,
            "invalid_api_key",
            "authentication_error",
        ),
        (
            "/alt/v1/messages",
            key.as_str(),
            json!({"max_tokens": 8}),
            400,
            "missing_model",
            "invalid_request_error",
        ),
    ];
    for (path, k, body, status, code, kind) in cases {
        let r = api::post_in_style(&gw, path, k, &body).await;
        assert_eq!(r.status().as_u16(), status, "{path} {code}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["code"], code, "{path}: {v}");
        assert_eq!(v["error"]["type"], kind, "{path}: {v}");
        assert_eq!(
            v.get("type").is_some(),
            path.starts_with("/alt") || path.starts_with("/v1/messages"),
            "{path}: {v}"
        );
    }
    for (path, kind) in [
        ("/v1/models/nope", "invalid_request_error"),
        ("/alt/v1/models/nope", "not_found_error"),
    ] {
        let r = get_in_style(&gw, path, &key).await;
        assert_eq!(r.status(), 404, "{path}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["type"], kind, "{path}: {v}");
    }
}

/// Models with an output limit of 1000, refusing or clamping larger asks, and an account whose
/// week (20000 tokens) could never hold a 128000-token reservation.
const CLAMPING: &str = r#"
[[models]]
id = "strict-small"
provider = "mock"
max_output_tokens = 1000

[[models]]
id = "clamped-small"
provider = "mock"
max_output_tokens = 1000
clamp_output_tokens = true

[[models]]
id = "claude-clamped"
provider = "mock-anthropic"
context_window = 200000
max_output_tokens = 1000
clamp_output_tokens = true

[quota.tiers.beginner]
weekly_tokens = 20000
weekly_requests = 0
requests_per_minute = 0
input_tokens_per_minute = 0
output_tokens_per_minute = 50000
"#;

/// The body of the one model request the mock received since it was last cleared.
async fn received(mock: &Mock) -> Value {
    let seen: Vec<Value> = mock
        .requests()
        .await
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap_or("").starts_with("/v1/"))
        .collect();
    assert_eq!(seen.len(), 1, "{seen:?}");
    serde_json::from_str(seen[0]["body"].as_str().expect("recorded body")).expect("JSON body")
}

#[tokio::test]
async fn output_asks_over_a_models_limit_are_clamped_where_configured() {
    let (mock, gw) = config::start_with_toml(CLAMPING);
    let key = gw.user_with_key("clamp@example.com", &[]);
    let chat = |model: &str, field: &str, n: u64| {
        let mut b = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        b[field] = json!(n);
        b
    };

    // Without the option, the spec's refusal; nothing reaches the provider.
    let r = api::post_in_style(
        &gw,
        "/v1/chat/completions",
        &key,
        &chat("strict-small", "max_tokens", 128000),
    )
    .await;
    assert_eq!(
        api::status_and_code(r).await,
        (400, "max_output_tokens_exceeded".into())
    );
    assert!(mock
        .requests()
        .await
        .iter()
        .all(|r| r["path"] != "/v1/chat/completions"));

    // With it, the request goes out with the limit and reserves the limit: the week's 20000
    // tokens could not hold 128000, and the output window shows 1000 taken.
    mock.clear().await;
    let r = api::post_in_style(
        &gw,
        "/v1/chat/completions",
        &key,
        &chat("clamped-small", "max_tokens", 128000),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-ratelimit-remaining-output-tokens"], "49000");
    assert_eq!(received(&mock).await["max_tokens"], 1000);

    // Every name an output ceiling goes by, both styles, native and translated.
    let cases = [
        (
            "/v1/chat/completions",
            chat("clamped-small", "max_completion_tokens", 128000),
            "/v1/chat/completions",
        ),
        (
            "/alt/v1/messages",
            json!({"model": "claude-clamped", "max_tokens": 128000,
            "messages": [{"role": "user", "content": "hi"}]}),
            "/v1/messages",
        ),
        (
            "/alt/v1/messages",
            json!({"model": "clamped-small", "max_tokens": 128000,
            "messages": [{"role": "user", "content": "hi"}]}),
            "/v1/chat/completions",
        ),
        (
            "/v1/chat/completions",
            chat("claude-clamped", "max_tokens", 128000),
            "/v1/messages",
        ),
        (
            "/v1/responses",
            json!({"model": "clamped-small", "input": "hi", "max_output_tokens": 128000}),
            "/v1/responses",
        ),
    ];
    for (path, body, upstream) in cases {
        mock.clear().await;
        let r = api::post_in_style(&gw, path, &key, &body).await;
        assert_eq!(r.status(), 200, "{path} {body}");
        let seen = mock.requests().await;
        assert!(
            seen.iter().any(|r| r["path"] == upstream),
            "{path}: {seen:?}"
        );
        let sent = received(&mock).await;
        for field in ["max_tokens", "max_completion_tokens", "max_output_tokens"] {
            assert!(
                sent.get(field).is_none_or(|v| v == 1000),
                "{path} -> {upstream}: {sent}"
            );
        }
        assert!(
            ["max_tokens", "max_completion_tokens", "max_output_tokens"]
                .iter()
                .any(|f| sent[*f] == 1000),
            "{path} -> {upstream}: {sent}"
        );
    }

    // An ask within the limit goes out as it was.
    mock.clear().await;
    let r = api::post_in_style(
        &gw,
        "/v1/chat/completions",
        &key,
        &chat("clamped-small", "max_tokens", 500),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(received(&mock).await["max_tokens"], 500);

    // A key's own maximum still refuses.
    let capped = gw.user_with_key("capped@example.com", &["--max-output-tokens", "500"]);
    for n in [128000, 600] {
        let r = api::post_in_style(
            &gw,
            "/v1/chat/completions",
            &capped,
            &chat("clamped-small", "max_tokens", n),
        )
        .await;
        let (s, v) = json_of(r).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("max_output_tokens_exceeded")),
            "{n}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("limit of 500"),
            "{v}"
        );
    }
}

#[tokio::test]
async fn clamping_is_validated_and_reloaded() {
    let (_mock, gw) = config::start_with_toml(CLAMPING);
    let key = gw.user_with_key("reload-clamp@example.com", &[]);
    let ask = json!({"model": "clamped-small", "max_tokens": 128000,
                     "messages": [{"role": "user", "content": "hi"}]});
    let status = || async {
        api::post_in_style(&gw, "/v1/chat/completions", &key, &ask)
            .await
            .status()
            .as_u16()
    };
    assert_eq!(status().await, 200);
    let original = std::fs::read_to_string(&gw.config_path).expect("config");

    // Clamping needs the limit to clamp to, and a boolean: such a file is refused, and the
    // running config stays.
    for (broken, why) in [
        (
            original.replace(
                "max_output_tokens = 1000\nclamp_output_tokens = true",
                "clamp_output_tokens = true",
            ),
            "clamp_output_tokens",
        ),
        (
            original.replace(
                "clamp_output_tokens = true",
                "clamp_output_tokens = \"yes\"",
            ),
            "clamp_output_tokens",
        ),
    ] {
        assert_ne!(broken, original);
        std::fs::write(&gw.config_path, &broken).expect("write");
        let (ok, err) = gw.admin(&["config", "check"]);
        assert!(!ok && err.contains(why) && err.contains("models["), "{err}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert_eq!(status().await, 200, "a refused file changes nothing");

    // Turned off by a reload: the spec's refusal again.
    std::fs::write(
        &gw.config_path,
        original.replace("clamp_output_tokens = true", "clamp_output_tokens = false"),
    )
    .expect("write");
    let mut refused = false;
    for _ in 0..60 {
        if status().await == 400 {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(refused, "the reload never took clamping off");
}
