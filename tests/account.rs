//! The account API through the real server (spec §4.3, CONTRACT §3): profile, usage report,
//! key rotation and revocation, two-factor setting, every gate and error code. SQLite by
//! default; `GATEWAY_TEST_DATABASE=postgres cargo test --test account` runs it on Postgres.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::config::ROOMY_SIGN_IN;
use common::site::{
    now_s, request_two_factor, signed_in, two_factor_with_code, two_factor_without_code,
    wrong_totp, Browser, Reply,
};
use common::*;
use gateway_core::storage::usage::UsageTotals;
use gateway_core::storage::UsageEvent;
use gateway_core::util::{iso, now_ms};
use gateway_site::twofactor;
use serde_json::{json, Value};

/// Header overrides for `Browser::post_with`.
type Headers<'a> = &'a [(&'a str, &'a str)];

/// A gateway with generous sign-in limits (only the tests that mean to meet a limit do) and
/// `extra_toml`.
fn gateway_with(extra_toml: &str) -> (Mock, Gateway) {
    config::start_with_toml(&format!("{ROOMY_SIGN_IN}{extra_toml}"))
}

/// A developer-API chat request with `key`; returns (status, error code or "").
async fn dev_chat(gw: &Gateway, key: &str, body: Value) -> (u16, String) {
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request");
    api::status_and_code(r).await
}

fn hello(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello there"}]})
}

/// Rotates and returns (key id, secret) after checking the answer's exact shape.
async fn rotate(b: &mut Browser) -> (String, String) {
    let v = b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .ok_json();
    assert_eq!(v["ok"], json!(true));
    let key = v["key"].as_object().expect("key");
    assert_eq!(key.len(), 3, "{v}");
    assert_eq!(v["key"]["name"], json!("Global key"));
    assert_eq!(v["key"]["status"], json!("active"));
    let id = v["key"]["id"].as_str().expect("id").to_string();
    assert!(gateway_core::util::is_valid_id("key", &id), "{id}");
    let secret = v["secret"].as_str().expect("secret").to_string();
    assert!(secret.starts_with("sk-"));
    assert_eq!(v.as_object().map(|o| o.len()), Some(3), "{v}");
    (id, secret)
}

async fn keys(b: &mut Browser) -> Vec<Value> {
    let v = b.get("/api/account/keys").await.ok_json();
    v["keys"].as_array().expect("keys").clone()
}

fn find<'a>(keys: &'a [Value], id: &str) -> &'a Value {
    keys.iter()
        .find(|k| k["id"] == json!(id))
        .unwrap_or_else(|| panic!("key {id} not listed"))
}

/// Polls a developer request until it answers `want` (other instances learn through the change
/// feed); returns how long that took.
async fn until_dev_status(gw: &Gateway, key: &str, want: u16) -> Duration {
    let start = Instant::now();
    loop {
        let (s, _) = dev_chat(gw, key, hello("mock-gpt")).await;
        if s == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still {s}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn rotate_and_revoke_keys() {
    let (_mock, gw) = gateway_with("");
    let mut b = signed_in(&gw, "keys@example.com").await;

    // A new account has no key; the list carries quota and the session's CSRF token.
    let r = b.get("/api/account/keys").await;
    let v = r.ok_json();
    assert_eq!(v["ok"], json!(true));
    assert_eq!(v["keys"], json!([]));
    assert_eq!(v["csrfToken"].as_str(), b.csrf.as_deref());
    assert_eq!(v["quota"]["effectiveTier"], json!("beginner"));
    assert!(r.header("vary").contains("Cookie"));

    // First rotation: the secret works on the developer API at once.
    let (first, secret1) = rotate(&mut b).await;
    assert_eq!(dev_chat(&gw, &secret1, hello("mock-gpt")).await.0, 200);

    // The list shows every spec §2.1 field and never the secret or its hash.
    let r = b.get("/api/account/keys").await;
    assert!(!r.text.contains(&secret1));
    assert!(!r.text.to_lowercase().contains("hash"));
    let listed = keys(&mut b).await;
    assert_eq!(listed.len(), 1);
    let k = &listed[0];
    let fields: Vec<&str> = k
        .as_object()
        .expect("key")
        .keys()
        .map(String::as_str)
        .collect();
    for f in [
        "id",
        "name",
        "status",
        "keyPrefix",
        "keySuffix",
        "scopes",
        "limitMode",
        "customInputTokensPerMinute",
        "customOutputTokensPerMinute",
        "customRequestsPerMinute",
        "modelAllowlist",
        "maxInputTokensPerRequest",
        "maxOutputTokensPerRequest",
        "createdAt",
        "lastUsedAt",
        "revokedAt",
    ] {
        assert!(fields.contains(&f), "missing {f}: {k}");
    }
    assert_eq!(k["id"], json!(first));
    assert_eq!(k["name"], json!("Global key"));
    assert_eq!(k["status"], json!("active"));
    assert_eq!(k["scopes"], json!(["*"]));
    assert_eq!(k["limitMode"], json!("account_pool"));
    assert_eq!(k["modelAllowlist"], json!([]));
    assert_eq!(k["customRequestsPerMinute"], Value::Null);
    assert_eq!(k["maxInputTokensPerRequest"], Value::Null);
    assert_eq!(k["revokedAt"], Value::Null);
    let prefix = k["keyPrefix"].as_str().expect("prefix");
    let suffix = k["keySuffix"].as_str().expect("suffix");
    assert!(prefix.starts_with("sk-") && secret1.starts_with(prefix));
    assert!(secret1.ends_with(suffix));
    assert!(k["createdAt"].as_str().expect("createdAt").ends_with('Z'));

    // Second rotation revokes the first key in the same step: its very next request fails.
    let (second, secret2) = rotate(&mut b).await;
    assert_ne!(second, first);
    assert_eq!(
        dev_chat(&gw, &secret1, hello("mock-gpt")).await,
        (401, "invalid_api_key".to_string())
    );
    assert_eq!(dev_chat(&gw, &secret2, hello("mock-gpt")).await.0, 200);
    let listed = keys(&mut b).await;
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["id"], json!(second), "newest first");
    let old = find(&listed, &first);
    assert_eq!(old["status"], json!("revoked"));
    assert!(old["revokedAt"].is_string());
    assert_eq!(find(&listed, &second)["status"], json!("active"));

    // Revoke by revokeId: fails at once.
    let v = b
        .post("/api/account/keys", &json!({"revokeId": second}))
        .await
        .ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "key": {"id": second, "status": "revoked"}})
    );
    assert_eq!(
        dev_chat(&gw, &secret2, hello("mock-gpt")).await,
        (401, "invalid_api_key".to_string())
    );
    // Revoking it again answers the same.
    let again = b
        .post("/api/account/keys", &json!({"revokeId": second}))
        .await
        .ok_json();
    assert_eq!(again, v);

    // Revoke by DELETE: fails at once.
    let (third, secret3) = rotate(&mut b).await;
    assert_eq!(dev_chat(&gw, &secret3, hello("mock-gpt")).await.0, 200);
    let v = b
        .delete(&format!("/api/account/keys/{third}"))
        .await
        .ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "key": {"id": third, "status": "revoked"}})
    );
    assert_eq!(
        dev_chat(&gw, &secret3, hello("mock-gpt")).await,
        (401, "invalid_api_key".to_string())
    );
    let listed = keys(&mut b).await;
    assert!(listed.iter().all(|k| k["status"] == json!("revoked")));
    assert!(listed.iter().all(|k| k["revokedAt"].is_string()));

    // Malformed ids, unknown ids, another account's key.
    for bad in [
        "nope",
        "key_short",
        "usr_aaaaaaaaaaaaaaaaaaaa",
        "key_aaaaaaaaaaaaaaaaaaa!",
    ] {
        let (s, c) = b
            .post("/api/account/keys", &json!({"revokeId": bad}))
            .await
            .error();
        assert_eq!((s, c.as_str()), (400, "invalid_key_id"), "{bad}");
    }
    let (s, c) = b.delete("/api/account/keys/nope").await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_key_id"));
    let (s, c) = b
        .post("/api/account/keys", &json!({"revokeId": 42}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_key_id"));
    let unknown = "key_AAAAAAAAAAAAAAAAAAAA";
    let (s, c) = b
        .post("/api/account/keys", &json!({"revokeId": unknown}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (404, "not_found"));
    let theirs = gw.admin_json(&["user", "create", "--email", "other@example.com"]);
    assert!(theirs["id"].is_string());
    let other = gw.admin_json(&["key", "create", "--email", "other@example.com"]);
    let other_id = other["id"].as_str().expect("id");
    let other_secret = other["secret"].as_str().expect("secret");
    let (s, c) = b
        .post("/api/account/keys", &json!({"revokeId": other_id}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (404, "not_found"));
    let (s, c) = b
        .delete(&format!("/api/account/keys/{other_id}"))
        .await
        .error();
    assert_eq!((s, c.as_str()), (404, "not_found"));
    assert_eq!(dev_chat(&gw, other_secret, hello("mock-gpt")).await.0, 200);
    assert!(keys(&mut b)
        .await
        .iter()
        .all(|k| k["id"] != json!(other_id)));

    // Anything that is neither a rotation nor a revocation.
    for body in [
        json!({}),
        json!({"rotate": false}),
        json!({"rotate": "true"}),
        json!({"name": "my key", "scopes": ["chat"]}),
        json!([1, 2]),
    ] {
        let (s, c) = b.post("/api/account/keys", &body).await.error();
        assert_eq!((s, c.as_str()), (403, "advanced_keys_disabled"), "{body}");
    }
    let r = b
        .send(
            b.client
                .post(gw.site_url("/api/account/keys"))
                .header("origin", common::site::ORIGIN)
                .header("x-csrf-token", b.csrf.clone().expect("csrf"))
                .body("not json"),
        )
        .await;
    assert_eq!(r.error(), (403, "advanced_keys_disabled".to_string()));
}

#[tokio::test]
async fn mutations_need_origin_and_csrf() {
    let (_mock, gw) = gateway_with("");
    let mut b = signed_in(&gw, "csrf@example.com").await;
    let csrf = b.csrf.clone().expect("csrf");
    let (id, secret) = rotate(&mut b).await;
    let rotate_body = json!({"rotate": true});
    let revoke_body = json!({"revokeId": id});
    let tfa_body = json!({"twoFactorEnabled": true});
    let del = format!("/api/account/keys/{id}");

    for (path, body) in [
        ("/api/account/keys", &rotate_body),
        ("/api/account/keys", &revoke_body),
        ("/api/account/security", &tfa_body),
    ] {
        let cases: [(Headers, (u16, &str)); 5] = [
            (&[("x-csrf-token", "")], (403, "invalid_csrf")),
            (&[("x-csrf-token", "forged")], (403, "invalid_csrf")),
            (
                &[("origin", "https://evil.example")],
                (403, "invalid_origin"),
            ),
            (&[("origin", "")], (403, "invalid_origin")),
            (
                &[("origin", ""), ("sec-fetch-site", "cross-site")],
                (403, "invalid_origin"),
            ),
        ];
        for (headers, (status, code)) in cases {
            let (s, c) = b.post_with(path, body, headers).await.error();
            assert_eq!((s, c.as_str()), (status, code), "{path} {body} {headers:?}");
        }
    }
    for (headers, (status, code)) in [
        (&[("x-csrf-token", "")][..], (403, "invalid_csrf")),
        (
            &[("origin", "https://evil.example")][..],
            (403, "invalid_origin"),
        ),
    ] {
        let (s, c) = b.delete_with(&del, headers).await.error();
        assert_eq!((s, c.as_str()), (status, code));
    }
    // Nothing changed: the key still works and two-factor is still off.
    assert_eq!(dev_chat(&gw, &secret, hello("mock-gpt")).await.0, 200);
    assert_eq!(keys(&mut b).await.len(), 1);
    let v = b.get("/api/account/security").await.ok_json();
    assert_eq!(v["security"]["twoFactorEnabled"], json!(false));

    // Sec-Fetch-Site same-origin stands in for a missing Origin; csrfToken may ride in the body.
    let v = b
        .post_with(
            "/api/account/keys",
            &json!({"revokeId": id, "csrfToken": csrf}),
            &[
                ("origin", ""),
                ("sec-fetch-site", "same-origin"),
                ("x-csrf-token", ""),
            ],
        )
        .await
        .ok_json();
    assert_eq!(v["key"]["status"], json!("revoked"));

    // Another session's token is not this session's token.
    let other = signed_in(&gw, "csrf2@example.com").await;
    let (s, c) = b
        .post_with(
            "/api/account/keys",
            &json!({"rotate": true}),
            &[("x-csrf-token", other.csrf.as_deref().expect("csrf"))],
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "invalid_csrf"));
}

#[tokio::test]
async fn credentials_do_not_cross_surfaces() {
    let (_mock, gw) = gateway_with("");
    let mut b = signed_in(&gw, "cross@example.com").await;
    let (_, secret) = rotate(&mut b).await;

    // No session, or only an API key: every account endpoint is `unauthorized`.
    let anon = reqwest::Client::new();
    let gets = [
        "/profile",
        "/usage",
        "/usage?period=1h",
        "/keys",
        "/security",
    ];
    for path in gets {
        let url = gw.site_url(&format!("/api/account{path}"));
        for req in [
            anon.get(&url),
            anon.get(&url).bearer_auth(&secret),
            anon.get(&url).header("x-api-key", &secret),
        ] {
            let r = Browser::new(&gw).send(req).await;
            assert_eq!(r.error(), (401, "unauthorized".to_string()), "{path}");
        }
    }
    let mutations = [
        ("/api/account/keys", json!({"rotate": true})),
        (
            "/api/account/keys",
            json!({"revokeId": "key_AAAAAAAAAAAAAAAAAAAA"}),
        ),
        ("/api/account/security", json!({"twoFactorEnabled": true})),
    ];
    for (path, body) in &mutations {
        let mut anon_b = Browser::new(&gw);
        let r = anon_b
            .post_with(
                path,
                body,
                &[("authorization", &format!("Bearer {secret}"))],
            )
            .await;
        assert_eq!(r.error(), (401, "unauthorized".to_string()), "{path}");
    }
    let r = Browser::new(&gw)
        .delete_with(
            "/api/account/keys/key_AAAAAAAAAAAAAAAAAAAA",
            &[("authorization", &format!("Bearer {secret}"))],
        )
        .await;
    assert_eq!(r.error(), (401, "unauthorized".to_string()));
    // A forged or stale session cookie is no better.
    let r = Browser::new(&gw)
        .send(anon.get(gw.site_url("/api/account/profile")).header(
            "cookie",
            "gw_session=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        ))
        .await;
    assert_eq!(r.error(), (401, "unauthorized".to_string()));

    // The session cookie is not a credential on the developer API, alone or as a bearer token.
    let session = b.jar.get("gw_session").expect("session cookie").clone();
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("cookie", b.cookie_header())
        .json(&hello("mock-gpt"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], json!("missing_api_key"));
    assert_eq!(
        dev_chat(&gw, &session, hello("mock-gpt")).await,
        (401, "missing_api_key".to_string())
    );
    let csrf = b.csrf.clone().expect("csrf");
    assert_eq!(dev_chat(&gw, &csrf, hello("mock-gpt")).await.0, 401);
    // The key itself works there.
    assert_eq!(dev_chat(&gw, &secret, hello("mock-gpt")).await.0, 200);
}

#[tokio::test]
async fn profile_shows_user_and_quota() {
    let (_mock, gw) = gateway_with("");
    let email = "profile@example.com";
    let mut b = signed_in(&gw, email).await;
    let before = now_ms();
    let r = b.get("/api/account/profile").await;
    let v = r.ok_json();
    assert_eq!(v["ok"], json!(true));
    let u = &v["user"];
    assert!(gateway_core::util::is_valid_id(
        "usr",
        u["id"].as_str().expect("id")
    ));
    assert_eq!(u["email"], json!(email));
    for f in ["createdAt", "updatedAt", "lastLoginAt"] {
        let t = u[f].as_str().unwrap_or_else(|| panic!("{f}: {u}"));
        assert!(t.len() == 24 && t.ends_with('Z'), "{f} = {t}");
    }
    assert_eq!(u["twoFactorEnabled"], json!(false));
    assert_eq!(u["quotaTier"], json!("beginner"));
    assert_eq!(u["quotaUnlimited"], json!(false));
    let q = &v["quota"];
    assert_eq!(q["effectiveTier"], json!("beginner"));
    assert_eq!(q["manualTier"], json!("beginner"));
    assert_eq!(q["usageTier"], json!("beginner"));
    assert_eq!(q["entitlementTier"], Value::Null);
    assert_eq!(q["maxTier"], Value::Null);
    assert_eq!(q["unlimited"], json!(false));
    assert_eq!(q["suspended"], json!(false));
    assert!(q["weeklyTokens"].as_u64().expect("weeklyTokens") > 0);
    assert!(q["thresholds"].as_array().is_some_and(|t| !t.is_empty()));
    let computed = q["computedAt"].as_str().expect("computedAt");
    assert!(computed >= iso(before - 1000).as_str(), "{computed}");

    // Operator changes show up: manual tier, unlimited, a lot with an entitlement tier.
    gw.admin_json(&["user", "set-tier", "--email", email, "--tier", "steady"]);
    lots::grant_lot(&gw, email, "token", 5000, &["--tier", "persistent"]);
    let v = b.get("/api/account/profile").await.ok_json();
    assert_eq!(v["user"]["quotaTier"], json!("steady"));
    assert_eq!(v["quota"]["manualTier"], json!("steady"));
    assert_eq!(v["quota"]["entitlementTier"], json!("persistent"));
    assert_eq!(v["quota"]["effectiveTier"], json!("persistent"));
    let u = b.get("/api/account/usage").await.ok_json();
    let lots = u["quotaLots"].as_array().expect("lots");
    assert_eq!(lots.len(), 1);
    assert_eq!(lots[0]["amount"], json!(5000));
    assert_eq!(lots[0]["tier"], json!("persistent"));
    assert_eq!(u["quota"]["entitlementTier"], json!("persistent"));
}

/// Sums of recorded events, the way the report should show them.
fn sums<'a>(events: impl Iterator<Item = &'a Value>) -> Value {
    let (mut n, mut i, mut o, mut c, mut q) = (0i64, 0i64, 0i64, 0i64, 0i64);
    for e in events {
        n += 1;
        i += e["input_tokens"].as_i64().expect("in");
        o += e["output_tokens"].as_i64().expect("out");
        c += e["cached_tokens"].as_i64().expect("cached");
        q += e["quota_charged"].as_i64().expect("charged");
    }
    json!({"requests": n, "inputTokens": i, "outputTokens": o, "totalTokens": i + o,
           "cachedTokens": c, "quotaCharged": q})
}

#[tokio::test]
async fn usage_report_matches_what_the_developer_api_recorded() {
    let (_mock, gw) = gateway_with("");
    let mut b = signed_in(&gw, "usage@example.com").await;

    // Nothing yet.
    let v = b.get("/api/account/usage").await.ok_json();
    assert_eq!(
        v["summary"],
        json!({"requests": 0, "inputTokens": 0, "outputTokens": 0, "totalTokens": 0,
               "cachedTokens": 0, "quotaCharged": 0, "lastApiCall": null})
    );
    assert_eq!(v["recentRequests"], json!([]));
    assert_eq!(v["byModel"], json!([]));

    let (_, key) = rotate(&mut b).await;
    let mut reasoning = hello("mock-gpt");
    reasoning["reasoning_effort"] = json!("low");
    assert_eq!(dev_chat(&gw, &key, hello("mock-gpt")).await.0, 200);
    assert_eq!(dev_chat(&gw, &key, reasoning).await.0, 200);
    assert_eq!(dev_chat(&gw, &key, hello("mock-big")).await.0, 200);
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", &key)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-mock", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("messages");
    assert_eq!(r.status(), 200);
    // A request another account makes is not ours.
    let other = gw.user_with_key("stranger@example.com", &[]);
    assert_eq!(dev_chat(&gw, &other, hello("mock-gpt")).await.0, 200);

    let all = gw.wait_usage(5).await;
    assert_eq!(all.len(), 5);
    let user_id = b.get("/api/account/profile").await.ok_json()["user"]["id"].clone();
    let mine: Vec<&Value> = all.iter().filter(|e| e["user_id"] == user_id).collect();
    assert_eq!(mine.len(), 4);

    let r = b.get("/api/account/usage?period=24h").await;
    let v = r.ok_json();
    assert_eq!(v["ok"], json!(true));
    assert_eq!(v["period"], json!("24h"));
    let mut summary = sums(mine.iter().copied());
    let last = v["summary"]["lastApiCall"]
        .as_str()
        .expect("lastApiCall")
        .to_string();
    summary["lastApiCall"] = json!(last);
    assert_eq!(v["summary"], summary);
    assert!(v["quota"]["computedAt"].is_string());
    assert!(v["quotaLots"].is_array());

    // daily: today (UTC) carries everything; days ascending, ending today.
    let today = iso(now_ms())[..10].to_string();
    let daily = v["daily"].as_array().expect("daily");
    assert!(!daily.is_empty() && daily.len() <= 2, "{daily:?}");
    let days: Vec<&str> = daily
        .iter()
        .map(|d| d["day"].as_str().expect("day"))
        .collect();
    let mut sorted = days.clone();
    sorted.sort();
    assert_eq!(days, sorted);
    let t = daily.last().expect("today");
    assert_eq!(t["day"], json!(today));
    let mut expect_today = sums(mine.iter().copied());
    expect_today["day"] = json!(today);
    assert_eq!(*t, expect_today);

    // byModel: per model, most tokens first.
    let by_model = v["byModel"].as_array().expect("byModel");
    assert_eq!(by_model.len(), 3);
    for m in by_model {
        let name = m["model"].as_str().expect("model");
        let mut want = sums(mine.iter().copied().filter(|e| e["model"] == json!(name)));
        want["model"] = json!(name);
        assert_eq!(*m, want);
    }
    let totals: Vec<i64> = by_model
        .iter()
        .map(|m| m["totalTokens"].as_i64().expect("total"))
        .collect();
    assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{totals:?}");
    let gpt = by_model
        .iter()
        .find(|m| m["model"] == json!("mock-gpt"))
        .expect("mock-gpt");
    assert_eq!(gpt["requests"], json!(2));

    // recentRequests: exactly our events, newest first, with the spec's fields.
    let recent = v["recentRequests"].as_array().expect("recent");
    assert_eq!(recent.len(), 4);
    let mut ids: Vec<&str> = recent
        .iter()
        .map(|e| e["id"].as_str().expect("id"))
        .collect();
    let times: Vec<&str> = recent
        .iter()
        .map(|e| e["createdAt"].as_str().expect("createdAt"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    assert_eq!(times[0], last);
    for e in recent {
        let id = e["id"].as_str().expect("id");
        assert!(id.starts_with("evt_"));
        let rec = mine
            .iter()
            .find(|m| m["id"] == json!(id))
            .unwrap_or_else(|| panic!("{id} is not ours"));
        assert_eq!(e["model"], rec["model"]);
        assert_eq!(e["inputTokens"], rec["input_tokens"]);
        assert_eq!(e["outputTokens"], rec["output_tokens"]);
        assert_eq!(e["cachedTokens"], rec["cached_tokens"]);
        // No weights on these models: every token costs one quota token.
        assert_eq!(e["quotaCharged"], e["totalTokens"]);
        assert_eq!(e["quotaCharged"], rec["quota_charged"]);
        assert_eq!(
            e["totalTokens"].as_i64(),
            Some(
                rec["input_tokens"].as_i64().expect("in")
                    + rec["output_tokens"].as_i64().expect("out")
            )
        );
        let keys: Vec<&str> = e
            .as_object()
            .expect("event")
            .keys()
            .map(String::as_str)
            .collect();
        for f in [
            "id",
            "model",
            "reasoningEffort",
            "inputTokens",
            "outputTokens",
            "totalTokens",
            "createdAt",
        ] {
            assert!(keys.contains(&f), "{f} missing: {e}");
        }
    }
    let efforts: Vec<&Value> = recent.iter().map(|e| &e["reasoningEffort"]).collect();
    assert_eq!(efforts.iter().filter(|e| **e == &json!("low")).count(), 1);
    assert_eq!(efforts.iter().filter(|e| e.is_null()).count(), 3);
    ids.sort();
    let mut want_ids: Vec<&str> = mine.iter().map(|e| e["id"].as_str().expect("id")).collect();
    want_ids.sort();
    assert_eq!(ids, want_ids);

    // Every period reports the same recent usage; unknown periods are 7d.
    for (asked, answered, days) in [
        ("1h", "1h", 1..=2),
        ("24h", "24h", 1..=2),
        ("7d", "7d", 8..=8),
        ("30d", "30d", 31..=31),
        ("90d", "7d", 8..=8),
        ("", "7d", 8..=8),
        ("1H", "7d", 8..=8),
    ] {
        let t0 = now_ms();
        let v = b
            .get(&format!("/api/account/usage?period={asked}"))
            .await
            .ok_json();
        assert_eq!(v["period"], json!(answered), "{asked}");
        let span = match answered {
            "1h" => 3_600_000,
            "24h" => 86_400_000,
            "7d" => 7 * 86_400_000,
            _ => 30 * 86_400_000,
        };
        let starts = v["startsAt"].as_str().expect("startsAt");
        assert!(
            starts >= iso(t0 - span - 1000).as_str() && starts <= iso(now_ms() - span).as_str(),
            "{asked}: {starts}"
        );
        assert_eq!(v["summary"]["requests"], json!(4), "{asked}");
        let n = v["daily"].as_array().expect("daily").len();
        assert!(days.contains(&n), "{asked}: {n} days");
        // 1h and 24h also chart by hour: every UTC hour of the window, this one last, holding
        // all four requests; longer periods have no hourly array.
        match answered {
            "1h" | "24h" => {
                let hourly = v["hourly"].as_array().expect("hourly");
                let want = if answered == "1h" { 2..=2 } else { 25..=25 };
                assert!(
                    want.contains(&hourly.len()),
                    "{asked}: {} hours",
                    hourly.len()
                );
                let hour_of = |ms: i64| json!(format!("{}:00:00.000Z", &iso(ms)[..13]));
                let last = &hourly.last().expect("this hour")["hour"];
                assert!(
                    *last == hour_of(t0) || *last == hour_of(now_ms()),
                    "{asked}: {last}"
                );
                let requests: i64 = hourly
                    .iter()
                    .map(|h| h["requests"].as_i64().expect("requests"))
                    .sum();
                assert_eq!(requests, 4, "{asked}: {hourly:?}");
                let hours: Vec<&str> = hourly
                    .iter()
                    .map(|h| h["hour"].as_str().expect("hour"))
                    .collect();
                assert!(hours.windows(2).all(|w| w[0] < w[1]), "{hours:?}");
                assert!(
                    hours.iter().all(|h| h.ends_with(":00:00.000Z")),
                    "{hours:?}"
                );
            }
            _ => assert!(v.get("hourly").is_none(), "{asked}"),
        }
        assert_eq!(
            v["daily"]
                .as_array()
                .and_then(|d| d.last())
                .map(|d| d["day"].clone()),
            Some(json!(today))
        );
    }
    let v = b.get("/api/account/usage").await.ok_json();
    assert_eq!(v["period"], json!("7d"));
}

/// The rollup report against a brute-force sum of the raw events, for windows that start on an
/// hour, early in an hour (the edge is subtracted) and late in one (the edge is added).
#[tokio::test]
async fn usage_rollup_equals_raw_events() {
    let (_mock, gw) = gateway_with("");
    let db = gw.db().await;
    let hour = 3_600_000i64;
    let now = now_ms();
    let models = ["alpha", "beta", "gamma"];
    let mut events = Vec::new();
    // 3 days of events, one every ~7 minutes, for two accounts; distinct timestamps.
    let mut t = now - 3 * 24 * hour;
    let mut n = 0u64;
    while t <= now {
        for user in ["usr_rollupAAAAAAAAAAAAAA", "usr_rollupBBBBBBBBBBBBBB"] {
            n += 1;
            events.push(UsageEvent {
                id: format!("evt_r{n:019}"),
                user_id: user.to_string(),
                key_id: "key_x".into(),
                model: models[(n % 3) as usize].into(),
                endpoint: "/v1/chat/completions",
                reasoning_effort: n.is_multiple_of(5).then(|| "high".to_string()),
                input_tokens: n % 97 + 1,
                output_tokens: n % 13,
                cached_tokens: (n % 97 + 1) / 3,
                quota_charged: 2 * (n % 97 + 1) + 3 * (n % 13),
                status: 200,
                latency_ms: 5,
                ttfb_ms: None,
                settlement: "provider",
                deployment: None,
                error_code: None,
                created_at: t + (n % 2) as i64,
                breakdown: None,
            });
        }
        t += 7 * 60_000 + 1_234;
    }
    // Overlapping batches, as a retry after a lost commit answer sends them: each repeats the
    // previous batch's last 13 events, which are written and counted once.
    let mut start = 0;
    while start < events.len() {
        let end = (start + 97).min(events.len());
        let batch = &events[start.saturating_sub(13)..end];
        db.usage().insert_batch(batch).await.expect("insert");
        start = end;
    }
    // A retried batch counts once.
    db.usage().insert_batch(&events[..50]).await.expect("retry");

    let user = "usr_rollupAAAAAAAAAAAAAA";
    let boundary = (now - 30 * hour).div_euclid(hour) * hour;
    for from in [
        now - hour,
        now - 24 * hour,
        now - 48 * hour - 17,
        boundary,
        boundary + 10 * 60_000,
        boundary + 50 * 60_000,
        boundary + 30 * 60_000,
    ] {
        let report = db
            .usage()
            .report(user, from, now, 50)
            .await
            .expect("report");
        let mut want_daily: BTreeMap<i64, UsageTotals> = BTreeMap::new();
        let mut want_models: BTreeMap<String, UsageTotals> = BTreeMap::new();
        let mut want_hourly: BTreeMap<i64, UsageTotals> = BTreeMap::new();
        let inside_iter = events
            .iter()
            .filter(|e| e.user_id == user && e.created_at >= from && e.created_at <= now);
        let mut inside: Vec<&UsageEvent> = inside_iter.collect();
        for e in &inside {
            let t = UsageTotals {
                requests: 1,
                input_tokens: e.input_tokens,
                output_tokens: e.output_tokens,
                total_tokens: e.input_tokens + e.output_tokens,
                cached_tokens: e.cached_tokens,
                quota_charged: e.quota_charged,
            };
            want_daily
                .entry(e.created_at.div_euclid(24 * hour))
                .or_default()
                .add(&t);
            want_models.entry(e.model.clone()).or_default().add(&t);
            want_hourly
                .entry(e.created_at.div_euclid(hour))
                .or_default()
                .add(&t);
        }
        assert_eq!(report.daily, want_daily, "from {}", iso(from));
        // Windows of a day or less also carry their hours, the cut first hour included.
        let want_hourly = (now - from <= 24 * hour).then_some(want_hourly);
        assert_eq!(report.hourly, want_hourly, "from {}", iso(from));
        assert_eq!(report.by_model, want_models, "from {}", iso(from));
        inside.sort_by_key(|e| std::cmp::Reverse(e.created_at));
        let want_recent: Vec<&str> = inside.iter().take(50).map(|e| e.id.as_str()).collect();
        let got_recent: Vec<&str> = report.recent.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(got_recent, want_recent, "from {}", iso(from));
        let charged: Vec<(u64, u64)> = inside
            .iter()
            .take(50)
            .map(|e| (e.cached_tokens, e.quota_charged))
            .collect();
        let got_charged: Vec<(u64, u64)> = report
            .recent
            .iter()
            .map(|e| (e.cached_tokens, e.quota_charged))
            .collect();
        assert_eq!(got_charged, charged, "from {}", iso(from));
        let newest = events
            .iter()
            .filter(|e| e.user_id == user)
            .map(|e| e.created_at)
            .max();
        assert_eq!(report.last_call, newest);
    }
}

#[tokio::test]
async fn two_factor_on_and_off() {
    let (_mock, gw) = gateway_with("");
    let email = "tfa@example.com";
    let mut b = signed_in(&gw, email).await;
    let v = b.get("/api/account/security").await.ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": false, "twoFactorPending": false},
               "csrfToken": b.csrf})
    );

    for body in [
        json!({}),
        json!({"twoFactorEnabled": "true"}),
        json!({"twoFactorEnabled": 1}),
        json!({"twoFactorEnabled": null}),
        json!("on"),
    ] {
        let (s, c) = b.post("/api/account/security", &body).await.error();
        assert_eq!((s, c.as_str()), (400, "invalid_body"), "{body}");
    }
    // Turning off while off changes nothing and needs no code.
    let v = two_factor_without_code(&mut b, false).await.ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": false}})
    );

    // Enrolment: the secret and its otpauth URL, once; on after a code of it confirms it (with
    // the previous step's code, so this step's stays unused for the sign-in below).
    let v = request_two_factor(&mut b).await;
    assert_eq!(v["security"]["twoFactorEnabled"], json!(false));
    assert_eq!(v["security"]["twoFactorPending"], json!(true));
    let secret = v["security"]["totpSecret"]
        .as_str()
        .expect("totpSecret")
        .to_string();
    let url = v["security"]["otpauthUrl"].as_str().expect("otpauthUrl");
    assert!(
        url.starts_with("otpauth://totp/") && url.contains(&format!("secret={secret}")),
        "{url}"
    );
    let confirm = twofactor::code_at(&secret, now_s() - 30).expect("code");
    let v = two_factor_with_code(&mut b, true, &confirm).await.ok_json();
    assert_eq!(v["security"], json!({"twoFactorEnabled": true}));
    assert_eq!(v["recoveryCodes"].as_array().map(Vec::len), Some(10));
    let v = b.get("/api/account/security").await.ok_json();
    assert_eq!(
        v["security"],
        json!({"twoFactorEnabled": true, "twoFactorPending": false, "recoveryCodesLeft": 10})
    );
    let v = request_two_factor(&mut b).await;
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": true}})
    );
    let p = b.get("/api/account/profile").await.ok_json();
    assert_eq!(p["user"]["twoFactorEnabled"], json!(true));

    // Signing in now needs the TOTP code.
    let mut other = Browser::new(&gw);
    let r = other.sign_in_with(&gw, email, None).await;
    assert_eq!(r.error(), (401, "two_factor_code_required".to_string()));
    let code = twofactor::code_at(&secret, now_s()).expect("code");
    let r = other.sign_in_with(&gw, email, Some(&code)).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Off: needs a valid code.
    let (s, c) = two_factor_without_code(&mut b, false).await.error();
    assert_eq!((s, c.as_str()), (401, "two_factor_code_required"));
    let wrong = wrong_totp(&secret);
    let (s, c) = two_factor_with_code(&mut b, false, &wrong).await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    assert_eq!(
        b.get("/api/account/security").await.ok_json()["security"]["twoFactorEnabled"],
        json!(true)
    );
    // The sign-in above used this step's code; a code is accepted once, so the next step's.
    let code = twofactor::code_at(&secret, now_s() + 30).expect("code");
    let v = two_factor_with_code(&mut b, false, &code).await.ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": false}})
    );
    let r = Browser::new(&gw).sign_in_with(&gw, email, None).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Guessing is bounded: five wrong codes per account in fifteen minutes, then even the right
    // code waits.
    let v = request_two_factor(&mut b).await;
    let secret = v["security"]["totpSecret"]
        .as_str()
        .expect("secret")
        .to_string();
    let confirm = twofactor::code_at(&secret, now_s() - 30).expect("code");
    two_factor_with_code(&mut b, true, &confirm).await.ok_json();
    // One wrong code above, four more now; the next is refused unchecked.
    for _ in 0..4 {
        let (s, c) = two_factor_with_code(&mut b, false, "abcdef").await.error();
        assert_eq!((s, c.as_str()), (400, "invalid_code"));
    }
    let code = twofactor::code_at(&secret, now_s()).expect("code");
    let (s, c) = two_factor_with_code(&mut b, false, &code).await.error();
    assert_eq!((s, c.as_str()), (429, "too_many_attempts"));
}

#[tokio::test]
async fn key_limits_and_rotation_bursts() {
    let (_mock, gw) =
        gateway_with("\n[keys]\nmax_active_per_account = 2\nrotations_per_hour = 4\n");
    let email = "limits@example.com";
    let mut b = signed_in(&gw, email).await;
    let extra = gw.admin_json(&["key", "create", "--email", email, "--name", "ci"]);
    let extra_id = extra["id"].as_str().expect("id").to_string();

    // 1 + global = 2 active: allowed; rotating replaces the global key, so still 2: allowed.
    let (_, s1) = rotate(&mut b).await;
    let (_, s2) = rotate(&mut b).await;
    assert_eq!(dev_chat(&gw, &s1, hello("mock-gpt")).await.0, 401);
    assert_eq!(dev_chat(&gw, &s2, hello("mock-gpt")).await.0, 200);
    // A third active key (made by an operator) leaves no room for a rotation.
    gw.admin_json(&["key", "create", "--email", email, "--name", "ci2"]);
    let (s, c) = b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (409, "active_key_limit_reached"));
    assert_eq!(
        dev_chat(&gw, &s2, hello("mock-gpt")).await.0,
        200,
        "nothing changed"
    );
    let active = keys(&mut b)
        .await
        .iter()
        .filter(|k| k["status"] == json!("active"))
        .count();
    assert_eq!(active, 3);

    // After a revocation there is room again.
    b.delete(&format!("/api/account/keys/{extra_id}"))
        .await
        .ok_json();
    let (_, s3) = rotate(&mut b).await;
    assert_eq!(dev_chat(&gw, &s3, hello("mock-gpt")).await.0, 200);
    // Four rotation attempts this hour: the fifth is a burst.
    let (s, c) = b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (429, "rate_limited"));
    assert_eq!(dev_chat(&gw, &s3, hello("mock-gpt")).await.0, 200);
    // Revocations are not rotations.
    let listed = keys(&mut b).await;
    let global = listed
        .iter()
        .find(|k| k["status"] == json!("active") && k["name"] == json!("Global key"))
        .expect("global");
    b.post("/api/account/keys", &json!({"revokeId": global["id"]}))
        .await
        .ok_json();
}

#[tokio::test]
async fn missing_key_pepper_is_named() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            extra_toml: ROOMY_SIGN_IN.to_string(),
            pepper: false,
            ..Options::default()
        },
    );
    let mut b = signed_in(&gw, "pepper@example.com").await;
    let (s, c) = b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (503, "key_secret_not_configured"));
    assert_eq!(keys(&mut b).await.len(), 0);
}

#[tokio::test]
async fn private_beta_closes_on_reload() {
    let email = "beta@example.com";
    let (_mock, gw) = gateway_with(&format!(
        "\n[auth]\nprivate_beta = true\nbeta_allowlist = [\"{email}\"]\n"
    ));
    let mut b = signed_in(&gw, email).await;
    b.get("/api/account/profile").await.ok_json();
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    std::fs::write(
        &gw.config_path,
        text.replace(&format!("[\"{email}\"]"), "[\"@elsewhere.example\"]"),
    )
    .expect("rewrite config");
    let start = Instant::now();
    loop {
        let r = b.get("/api/account/profile").await;
        if r.status == 403 {
            assert_eq!(r.error(), (403, "private_beta_only".to_string()));
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "config not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for path in [
        "/api/account/usage",
        "/api/account/keys",
        "/api/account/security",
    ] {
        assert_eq!(
            b.get(path).await.error(),
            (403, "private_beta_only".to_string()),
            "{path}"
        );
    }
    let (s, c) = b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "private_beta_only"));
    let (s, c) = two_factor_without_code(&mut b, true).await.error();
    assert_eq!((s, c.as_str()), (403, "private_beta_only"));
}

/// Usage events written before migration 0008 (keyed by id, with a separate account-and-time
/// index) come through its rebuild whole: the account's count, its newest events in order, and a
/// retried batch that repeats them is still written once.
#[tokio::test]
async fn usage_events_survive_the_move_to_the_account_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = database_url(dir.path());
    let _drop = DropDatabase(url.clone());
    sqlx::any::install_default_drivers();
    let old = if url.starts_with("sqlite:") {
        format!("{url}?mode=rwc")
    } else {
        url.clone()
    };
    let pool = sqlx::AnyPool::connect(&old).await.expect("connect");
    let mut migrator = if url.starts_with("sqlite:") {
        sqlx::migrate!("migrations/sqlite")
    } else {
        sqlx::migrate!("migrations/postgres")
    };
    let before: Vec<_> = migrator
        .migrations
        .iter()
        .filter(|m| m.version < 8)
        .cloned()
        .collect();
    assert!(
        migrator.migrations.iter().any(|m| m.version == 8),
        "migration 0008 exists"
    );
    migrator.migrations = before.into();
    migrator.run(&pool).await.expect("migrations before 0008");

    let t = now_ms() - 60_000;
    let stored = [
        ("evt_0000000A", "usr_migrateA", t),
        ("evt_0000000B", "usr_migrateA", t + 5),
        ("evt_0000000C", "usr_migrateB", t + 1),
        ("evt_0000000D", "usr_migrateA", t + 5),
    ];
    for (id, user, at) in stored {
        sqlx::query(
            "INSERT INTO usage_events (id, user_id, key_id, model, endpoint, input_tokens, \
             output_tokens, total_tokens, cached_tokens, status, latency_ms, settlement, \
             created_at) VALUES ($1, $2, 'key_m', 'alpha', '/v1/chat/completions', 3, 2, 5, 0, \
             200, 4, 'provider', $3)",
        )
        .bind(id)
        .bind(user)
        .bind(at)
        .execute(&pool)
        .await
        .expect("old-layout event");
    }
    pool.close().await;

    let db = gateway_core::storage::Db::connect(&url)
        .await
        .expect("migrate to 0008");
    let usage = db.usage();
    assert_eq!(
        usage.count_for_user("usr_migrateA").await.expect("count"),
        3
    );
    assert_eq!(
        usage.count_for_user("usr_migrateB").await.expect("count"),
        1
    );
    let report = usage
        .report("usr_migrateA", t - 1, now_ms(), 10)
        .await
        .expect("report");
    let recent: Vec<&str> = report.recent.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(recent.len(), 3, "{recent:?}");
    assert_eq!(recent[2], "evt_0000000A", "newest first: {recent:?}");

    // The stored events again (as a retry sends them) with one new one: only the new one is
    // written.
    let event = |id: &str, user: &str, at: i64| UsageEvent {
        id: id.into(),
        user_id: user.into(),
        key_id: "key_m".into(),
        model: "alpha".into(),
        endpoint: "/v1/chat/completions",
        input_tokens: 3,
        output_tokens: 2,
        status: 200,
        latency_ms: 4,
        settlement: "provider",
        created_at: at,
        ..UsageEvent::default()
    };
    let mut retry: Vec<UsageEvent> = stored
        .iter()
        .map(|&(id, user, at)| event(id, user, at))
        .collect();
    retry.push(event("evt_0000000E", "usr_migrateA", t + 9));
    usage
        .insert_batch(&retry)
        .await
        .expect("retry with a new event");
    assert_eq!(
        usage.count_for_user("usr_migrateA").await.expect("count"),
        4
    );
    assert_eq!(
        usage.count_for_user("usr_migrateB").await.expect("count"),
        1
    );
    db.pool.close().await;
}

/// Runs SQL against the gateway's database.
async fn exec(gw: &Gateway, sql: &str) {
    let db = gw.db().await;
    sqlx::raw_sql(sql)
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn assert_hidden_failure(gw: &Gateway, r: &Reply, code: &str) {
    assert_eq!(r.error(), (500, code.to_string()), "{}", r.text);
    assert!(!r.text.contains("no such table") && !r.text.contains("does not exist"));
    assert!(
        gw.log()
            .contains(&format!("account storage failed ({code})")),
        "cause logged"
    );
}

#[tokio::test]
async fn storage_failures_are_named_not_explained() {
    let (_mock, gw) = gateway_with("");
    let mut b = signed_in(&gw, "broken@example.com").await;
    let (key_id, _) = rotate(&mut b).await;
    let postgres = gw.database_url.starts_with("postgres");

    // Two-factor updates refused by the database.
    if postgres {
        exec(
            &gw,
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ \
             LANGUAGE plpgsql; CREATE TRIGGER refuse_tfa BEFORE UPDATE OF totp_pending_secret ON \
             users FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .await;
    } else {
        exec(
            &gw,
            "CREATE TRIGGER refuse_tfa BEFORE UPDATE OF totp_pending_secret ON users \
             BEGIN SELECT RAISE(ABORT, 'refused'); END;",
        )
        .await;
    }
    let r = two_factor_without_code(&mut b, true).await;
    assert_hidden_failure(&gw, &r, "security_update_failed");

    exec(&gw, "DROP TABLE usage_rollup").await;
    let r = b.get("/api/account/usage").await;
    assert_hidden_failure(&gw, &r, "usage_query_failed");

    exec(&gw, "DROP TABLE quota_lots").await;
    let r = b.get("/api/account/profile").await;
    assert_hidden_failure(&gw, &r, "profile_query_failed");
    let r = b.get("/api/account/keys").await;
    assert_hidden_failure(&gw, &r, "account_query_failed");

    exec(&gw, "DROP TABLE api_keys").await;
    let r = b.post("/api/account/keys", &json!({"rotate": true})).await;
    assert_hidden_failure(&gw, &r, "key_creation_failed");
    let r = b
        .post("/api/account/keys", &json!({"revokeId": key_id}))
        .await;
    assert_hidden_failure(&gw, &r, "key_revoke_failed");
    let r = b.delete(&format!("/api/account/keys/{key_id}")).await;
    assert_hidden_failure(&gw, &r, "key_revoke_failed");

    exec(&gw, "DROP TABLE auth_sessions").await;
    let r = b.get("/api/account/security").await;
    assert_eq!(r.error(), (500, "account_persistence_failed".to_string()));
}

/// Two instances on one database: a session works on both, a revocation on one is refused by
/// the other within the change-feed interval, and the rotation budget is shared.
#[tokio::test]
async fn instances_share_sessions_revocations_and_rotation_budget() {
    let mock = Mock::start(&[]);
    let extra = format!("{ROOMY_SIGN_IN}\n[keys]\nrotations_per_hour = 3\n");
    let a = Gateway::start(&mock, Options::with_toml(extra.clone()));
    let b_gw = Gateway::start(
        &mock,
        Options {
            extra_toml: extra,
            database_url: Some(a.database_url.clone()),
            ..Options::default()
        },
    );
    let mut on_a = signed_in(&a, "multi@example.com").await;
    let mut on_b = on_a.on(&b_gw);

    let (_, s1) = rotate(&mut on_a).await;
    assert_eq!(dev_chat(&b_gw, &s1, hello("mock-gpt")).await.0, 200);
    assert_eq!(dev_chat(&a, &s1, hello("mock-gpt")).await.0, 200);
    // Rotation on B revokes A's key; A learns it through the feed.
    let (id2, s2) = rotate(&mut on_b).await;
    assert_eq!(dev_chat(&b_gw, &s1, hello("mock-gpt")).await.0, 401);
    let waited = until_dev_status(&a, &s1, 401).await;
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert_eq!(dev_chat(&a, &s2, hello("mock-gpt")).await.0, 200);
    assert_eq!(dev_chat(&b_gw, &s2, hello("mock-gpt")).await.0, 200);
    // Revocation on A; B refuses within the feed interval.
    on_a.delete(&format!("/api/account/keys/{id2}"))
        .await
        .ok_json();
    let waited = until_dev_status(&b_gw, &s2, 401).await;
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    // Two rotations used; one more on A, then B is over the shared budget.
    rotate(&mut on_a).await;
    let (s, c) = on_b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (429, "rate_limited"));
}
