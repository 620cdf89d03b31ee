//! What real clients expect of the developer API beyond the spec's tables: retrieving one
//! model (`client.models.retrieve`) in both styles, through the real server.

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
