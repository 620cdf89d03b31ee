//! Payments through the real server (SQLite, or Postgres with `GATEWAY_TEST_DATABASE=postgres`):
//! the order API and every error code, the webhook (secret, size, schema, each item status,
//! concurrent duplicates, expiry, personal-code top-ups), the operator's reconciliation
//! commands, and the terms-of-service content endpoint.

mod common;

use std::time::Duration;

use common::site::{signed_in, Browser, Reply};
use common::*;
use serde_json::{json, Value};

/// Prices set, three pending orders at most, distinct per-minute defaults per tier so the
/// developer API's headers show the effective tier.
const PAY: &str = r#"
[limits]
request_code_per_hour = 1000

[payment]
webhook_provider = "sepay"
code_prefix = "GW"
max_pending_orders = 3
orders_per_hour = 100
lot_days = 30
token_price_vnd_per_million = 1000
request_price_vnd_per_thousand = 500
min_order_vnd = 500
bank_bin = "970415"
account_number = "0123456789"
account_name = "GATEWAY CO"

[quota.tiers.beginner]
requests_per_minute = 60

[quota.tiers.persistent]
requests_per_minute = 700
weekly_requests = 100000
"#;

/// `POST /api/payment/orders` as the signed-in browser.
trait Orders {
    async fn order(&mut self, body: Value) -> Reply;
}

impl Orders for Browser {
    async fn order(&mut self, body: Value) -> Reply {
        self.post("/api/payment/orders", &body).await
    }
}

fn item(id: &str, kind: &str, amount: i64, description: &str) -> Value {
    json!({
        "transactionID": id,
        "type": kind,
        "amount": amount,
        "description": description,
        "date": "2026-11-22 10:15:00",
        "bank": "Vietcombank",
    })
}

fn notification(items: Vec<Value>) -> Value {
    json!({ "status": true, "data": items })
}

/// Posts a raw body to the webhook with `authorization` (None: no header).
async fn hook_raw(gw: &Gateway, authorization: Option<&str>, body: Vec<u8>) -> Reply {
    let mut req = client()
        .post(gw.site_url("/api/payment/sepay/callback"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let resp = req.send().await.expect("webhook");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("body");
    Reply {
        status,
        headers,
        text,
    }
}

/// Posts a notification with the right secret; returns the answer's JSON after checking 200.
async fn hook(gw: &Gateway, body: &Value) -> Value {
    let r = hook_raw(
        gw,
        Some(&format!("Apikey {WEBHOOK_SECRET}")),
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], json!(true), "{v}");
    v
}

/// The status of each processed item.
fn statuses(v: &Value) -> Vec<String> {
    v["processed"]
        .as_array()
        .expect("processed")
        .iter()
        .map(|p| p["status"].as_str().expect("status").to_string())
        .collect()
}

async fn count(gw: &Gateway, sql: &str) -> i64 {
    use sqlx::Row;
    let db = gw.db().await;
    sqlx::query(sql)
        .fetch_one(&db.pool)
        .await
        .expect("count")
        .try_get::<i64, _>(0)
        .expect("n")
}

fn is_code(s: &str, body_len: usize) -> bool {
    s.len() == 2 + body_len
        && s.starts_with("GW")
        && s[2..]
            .bytes()
            .all(|b| b"ABCDEFGHJKMNPQRSTUVWXYZ23456789".contains(&b))
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn signed_out_orders_have_the_exact_empty_shape() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let mut b = Browser::new(&gw);
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "authenticated": false, "packages": [], "orders": [], "quotaLots": [],
               "pricing": {}, "config": {}, "csrfToken": null})
    );
    // Creating an order needs the origin, then a session.
    let r = client()
        .post(gw.site_url("/api/payment/orders"))
        .json(&json!({"packageId": "steady-100m"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.json::<Value>().await.expect("json")["code"],
        "invalid_origin"
    );
    let (status, code) = b.order(json!({"packageId": "steady-100m"})).await.error();
    assert_eq!((status, code.as_str()), (401, "unauthorized"));
}

#[tokio::test]
async fn orders_for_packages_and_custom_quantities() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let mut b = signed_in(&gw, "buyer@example.com").await;

    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["authenticated"], json!(true));
    assert_eq!(v["csrfToken"], json!(b.csrf));
    assert_eq!(
        v["packages"],
        json!([
            {"id": "steady-100m", "name": "Steady 100M", "tier": "steady",
             "tokens": 100_000_000u64, "amount": 85_000, "currency": "VND", "lotDays": 30},
            {"id": "persistent-1b", "name": "Persistent 1B", "tier": "persistent",
             "tokens": 1_000_000_000u64, "amount": 240_000, "currency": "VND", "lotDays": 30},
            {"id": "tryharder-10b", "name": "Tryharder 10B", "tier": "tryharder",
             "tokens": 10_000_000_000u64, "amount": 950_000, "currency": "VND", "lotDays": 30},
        ])
    );
    assert_eq!(v["orders"], json!([]));
    assert_eq!(v["quotaLots"], json!([]));
    assert_eq!(v["pricing"]["tokenPricePerMillion"], json!(1000));
    assert_eq!(v["pricing"]["requestPricePerThousand"], json!(500));
    assert_eq!(v["config"]["accountNumber"], "0123456789");
    assert_eq!(v["config"]["accountName"], "GATEWAY CO");
    assert_eq!(v["config"]["bank"], "970415");
    assert!(!v.to_string().contains(WEBHOOK_SECRET));
    let personal = v["paymentCode"]
        .as_str()
        .expect("personal code")
        .to_string();
    assert!(is_code(&personal, 10), "{personal}");
    // Stable across reads.
    let again = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(again["paymentCode"], json!(personal));

    // A package order.
    let o = b
        .order(json!({"packageId": "persistent-1b"}))
        .await
        .ok_json()["order"]
        .clone();
    assert!(o["id"].as_str().expect("id").starts_with("ord_"), "{o}");
    assert_eq!(o["paymentStatus"], "pending");
    assert_eq!(o["amount"], json!(240_000));
    assert_eq!(o["packageId"], "persistent-1b");
    assert_eq!(o["tier"], "persistent");
    let code = o["paymentCode"].as_str().expect("code");
    assert!(is_code(code, 8), "{code}");
    let t = &o["transfer"];
    assert_eq!(t["bank"], "970415");
    assert_eq!(t["accountNumber"], "0123456789");
    assert_eq!(t["accountName"], "GATEWAY CO");
    assert_eq!(t["amount"], json!(240_000));
    assert_eq!(t["description"], json!(code));
    let qr = t["vietqr"].as_str().expect("vietqr");
    assert!(
        qr.starts_with("https://img.vietqr.io/image/970415-0123456789-")
            && qr.contains("amount=240000")
            && qr.contains(&format!("addInfo={code}")),
        "{qr}"
    );
    assert!(t["qrPayload"]
        .as_str()
        .expect("payload")
        .contains(&format!("08{:02}{code}", code.len())));
    assert!(o["expiresAt"].as_str().is_some());

    // Custom orders: quantity counts tokens or requests; the price rounds up to whole VND.
    let tok = b
        .order(json!({"quotaType": "token", "quantity": 2_500_000}))
        .await
        .ok_json()["order"]
        .clone();
    assert_eq!(tok["amount"], json!(2500));
    assert_eq!(tok["quotaType"], "token");
    assert_eq!(tok["quantity"], json!(2_500_000));
    assert_eq!(tok["tier"], Value::Null);
    let req = b
        .order(json!({"quotaType": "request", "quantity": 1001, "csrfToken": b.csrf}))
        .await
        .ok_json()["order"]
        .clone();
    assert_eq!(req["amount"], json!(501));
    assert_ne!(req["paymentCode"], tok["paymentCode"]);

    // History, newest first.
    let v = b.get("/api/payment/orders").await.ok_json();
    let ids: Vec<_> = v["orders"]
        .as_array()
        .expect("orders")
        .iter()
        .map(|o| o["id"].clone())
        .collect();
    assert_eq!(
        ids,
        vec![req["id"].clone(), tok["id"].clone(), o["id"].clone()]
    );
    assert_eq!(v["orders"][2]["paymentStatus"], "pending");
    assert_eq!(v["orders"][2]["paidAt"], Value::Null);

    // Three pending orders are the limit.
    let (status, code) = b.order(json!({"packageId": "steady-100m"})).await.error();
    assert_eq!(
        (status, code.as_str()),
        (409, "too_many_pending_payment_orders")
    );

    // Input errors.
    for (body, want) in [
        (json!({"packageId": "gold-1t"}), "invalid_package"),
        (json!({"packageId": 3}), "invalid_package"),
        (json!({}), "invalid_package"),
        (
            json!({"quotaType": "image", "quantity": 5}),
            "invalid_quota_type",
        ),
        (
            json!({"quotaType": "token", "quantity": 0}),
            "invalid_quantity",
        ),
        (
            json!({"quotaType": "token", "quantity": -5}),
            "invalid_quantity",
        ),
        (
            json!({"quotaType": "token", "quantity": 1.5}),
            "invalid_quantity",
        ),
        (json!({"quotaType": "request"}), "invalid_quantity"),
    ] {
        let (status, code) = b.order(body.clone()).await.error();
        assert_eq!((status, code.as_str()), (400, want), "{body}");
    }

    // CSRF.
    let saved = std::mem::take(&mut b.csrf);
    let (status, code) = b.order(json!({"packageId": "steady-100m"})).await.error();
    assert_eq!((status, code.as_str()), (403, "invalid_csrf"));
    b.csrf = saved;
}

#[tokio::test]
async fn unpriced_orders_rate_limit_and_unpriced_top_ups() {
    let extra = r#"
[limits]
request_code_per_hour = 1000

[payment]
max_pending_orders = 10
orders_per_hour = 2
"#;
    let (_mock, gw) = config::start_with_toml(extra);
    let mut b = signed_in(&gw, "cheap@example.com").await;
    let (status, code) = b
        .order(json!({"quotaType": "token", "quantity": 1000}))
        .await
        .error();
    assert_eq!((status, code.as_str()), (503, "price_not_configured"));
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["pricing"]["tokenPricePerMillion"], Value::Null);
    let personal = v["paymentCode"].as_str().expect("code").to_string();

    b.order(json!({"packageId": "steady-100m"})).await.ok_json();
    b.order(json!({"packageId": "steady-100m"})).await.ok_json();
    let (status, code) = b.order(json!({"packageId": "steady-100m"})).await.error();
    assert_eq!((status, code.as_str()), (429, "rate_limited"));

    // No token price: a transfer with the personal code waits for an operator.
    let v = hook(
        &gw,
        &notification(vec![item(
            "TOPUP-NOPRICE",
            "IN",
            50_000,
            &format!("nap {personal}"),
        )]),
    )
    .await;
    assert_eq!(statuses(&v), ["unmatched"]);
    assert_eq!(v["processed"][0]["paymentCode"], json!(personal));
    assert!(lots::lots_of(&gw, "cheap@example.com").await.is_empty());
}

/// A custom order below `min_order_vnd` (default 10,000 VND) is refused before anything is
/// stored; the operator's package amounts replace the catalogue's.
#[tokio::test]
async fn small_orders_are_refused_and_operators_price_packages() {
    let priced = r#"
[limits]
request_code_per_hour = 1000

[payment]
token_price_vnd_per_million = 1000

[payment.packages.steady-100m]
amount_vnd = 99000
"#;
    let (_mock, gw) = config::start_with_toml(priced);
    let mut b = signed_in(&gw, "small@example.com").await;
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["pricing"]["minOrderAmount"], json!(10_000));
    assert_eq!(v["packages"][0]["id"], "steady-100m");
    assert_eq!(v["packages"][0]["amount"], json!(99_000));
    assert_eq!(v["packages"][1]["amount"], json!(240_000));

    // 1,500 tokens would be a 2 VND order.
    let (status, code) = b
        .order(json!({"quotaType": "token", "quantity": 1_500}))
        .await
        .error();
    assert_eq!((status, code.as_str()), (400, "order_below_minimum"));
    let (status, code) = b
        .order(json!({"quotaType": "token", "quantity": 9_999_000}))
        .await
        .error();
    assert_eq!((status, code.as_str()), (400, "order_below_minimum"));
    assert_eq!(
        count(&gw, "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_orders").await,
        0
    );
    let o = b
        .order(json!({"quotaType": "token", "quantity": 10_000_000}))
        .await
        .ok_json()["order"]
        .clone();
    assert_eq!(o["amount"], json!(10_000));
    let o = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    assert_eq!(o["amount"], json!(99_000));
    assert_eq!(o["transfer"]["amount"], json!(99_000));
    assert_eq!(o["quantity"], json!(100_000_000u64));

    // A bad override names its key; the running config is not touched by `config check`.
    let bad = gw.dir.path().join("bad.toml");
    let text = std::fs::read_to_string(&gw.config_path).expect("config")
        + "\n[payment.packages.gold-1t]\namount_vnd = 5\n";
    std::fs::write(&bad, text).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--config")
        .arg(&bad)
        .args(["config", "check"])
        .output()
        .expect("config check");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("payment.packages.gold-1t") && err.contains("unknown package"),
        "{err}"
    );
}

/// With every tier uncapped (the shipped tiers) requests are not metered: a request lot would
/// never be drawn, so none is sold, `config check` says why and granting one warns.
#[tokio::test]
async fn request_lots_are_sold_only_while_a_tier_caps_requests() {
    let uncapped = r#"
[limits]
request_code_per_hour = 1000

[payment]
token_price_vnd_per_million = 1000
request_price_vnd_per_thousand = 500
"#;
    let (_mock, gw) = config::start_with_toml(uncapped);
    let email = "uncapped@example.com";
    let mut b = signed_in(&gw, email).await;
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["pricing"]["tokenPricePerMillion"], json!(1000));
    assert_eq!(v["pricing"]["requestPricePerThousand"], Value::Null, "{v}");
    let (status, code) = b
        .order(json!({"quotaType": "request", "quantity": 100_000}))
        .await
        .error();
    assert_eq!((status, code.as_str()), (400, "invalid_quota_type"));
    assert_eq!(
        count(&gw, "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_orders").await,
        0
    );

    let out = gw.admin_output(&["config", "check"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let checked: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        stderr.contains("warning: payment.request_price_vnd_per_thousand is set but no tier"),
        "{stderr}"
    );
    assert!(checked["warnings"]
        .to_string()
        .contains("request lots are not sold"));

    let out = gw.admin_output(&[
        "lot", "grant", "--email", email, "--type", "request", "--amount", "1000",
    ]);
    assert!(out.status.success(), "{out:?}");
    let lot: Value = serde_json::from_slice(&out.stdout).expect("lot json");
    assert_eq!(lot["type"], "request");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: uncapped@example.com's tier beginner has no weekly request cap")
            && stderr.contains("never drawn"),
        "{stderr}"
    );
    // A token lot is drawn whatever the tier: no warning.
    let out = gw.admin_output(&[
        "lot", "grant", "--email", email, "--type", "token", "--amount", "1000",
    ]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");

    // Once a tier caps requests they are sold, and granting a lot on that tier is quiet.
    let (_mock2, capped) = config::start_with_toml(PAY);
    let mut b = signed_in(&capped, "capped@example.com").await;
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["pricing"]["requestPricePerThousand"], json!(500));
    capped.admin_json(&[
        "user",
        "set-tier",
        "--email",
        "capped@example.com",
        "--tier",
        "persistent",
    ]);
    let out = capped.admin_output(&[
        "lot",
        "grant",
        "--email",
        "capped@example.com",
        "--type",
        "request",
        "--amount",
        "10",
    ]);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let out = capped.admin_output(&["config", "check"]);
    assert!(out.stderr.is_empty(), "{out:?}");
}

#[tokio::test]
async fn a_match_pays_the_order_and_grants_its_lot_and_tier() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "payer@example.com";
    let key = gw.user_with_key(email, &[]);
    let call = || async {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&json!({"model": "mock-gpt", "max_tokens": 5,
                          "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("developer call");
        assert_eq!(r.status(), 200);
        r.headers()["x-ratelimit-limit-requests"]
            .to_str()
            .expect("ascii")
            .to_string()
    };
    assert_eq!(call().await, "60");

    let mut b = signed_in(&gw, email).await;
    let order = b
        .order(json!({"packageId": "persistent-1b"}))
        .await
        .ok_json()["order"]
        .clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let noisy = format!("CT DEN:12345 {} chuyen tien FT2411", code.to_lowercase());
    let v = hook(
        &gw,
        &notification(vec![item("FT24110001", "IN", 240_000, &noisy)]),
    )
    .await;
    assert_eq!(
        v["processed"],
        json!([{"transactionID": "FT24110001", "paymentCode": code, "orderId": order["id"],
                "status": "matched"}])
    );
    assert!(v["msg"].as_str().is_some());

    let v = b.get("/api/payment/orders").await.ok_json();
    let o = &v["orders"][0];
    assert_eq!(o["paymentStatus"], "paid");
    assert!(o["paidAt"].as_str().is_some());
    assert_eq!(o["transactionId"], "FT24110001");
    assert!(
        o.get("transfer").is_none(),
        "paid orders carry no instructions"
    );
    let lots = v["quotaLots"].as_array().expect("lots");
    assert_eq!(lots.len(), 1, "{v}");
    assert_eq!(lots[0]["type"], "token");
    assert_eq!(lots[0]["amount"], json!(1_000_000_000u64));
    assert_eq!(lots[0]["tier"], "persistent");
    assert_eq!(lots[0]["id"], o["lotId"]);

    // The entitlement tier reaches the developer API within the change feed's interval.
    let mut seen = String::new();
    for _ in 0..40 {
        seen = call().await;
        if seen == "700" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, "700", "persistent tier's requests_per_minute");

    // The same notification again: a duplicate, naming the same order; still one lot.
    let v = hook(
        &gw,
        &notification(vec![item("FT24110001", "IN", 240_000, &noisy)]),
    )
    .await;
    assert_eq!(
        v["processed"],
        json!([{"transactionID": "FT24110001", "paymentCode": code, "orderId": order["id"],
                "status": "duplicate"}])
    );
    // A second, different transfer for the paid order is left for an operator.
    let v = hook(
        &gw,
        &notification(vec![item("FT24110002", "IN", 240_000, &code)]),
    )
    .await;
    assert_eq!(statuses(&v), ["unmatched"]);
    assert_eq!(v["processed"][0]["orderId"], order["id"]);
    assert_eq!(lots::lots_of(&gw, email).await.len(), 1);
    let raw = count(
        &gw,
        "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_transactions WHERE raw LIKE '%CT DEN:12345%'",
    )
    .await;
    assert_eq!(raw, 1, "the raw item is stored for audit");
}

#[tokio::test]
async fn twenty_concurrent_duplicates_grant_one_lot() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "race@example.com";
    let mut b = signed_in(&gw, email).await;
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let body = notification(vec![item("RACE-1", "IN", 85_000, &code)]);
    let gw_ref = &gw;
    let answers = futures::future::join_all((0..20).map(|_| {
        let body = body.clone();
        async move { hook(gw_ref, &body).await }
    }))
    .await;
    let mut all: Vec<String> = answers.iter().flat_map(statuses).collect();
    all.sort();
    let mut want = vec!["duplicate".to_string(); 19];
    want.push("matched".into());
    want.sort();
    assert_eq!(all, want);
    let lots = lots::lots_of(&gw, email).await;
    assert_eq!(lots.len(), 1);
    assert_eq!(lots[0].amount, 100_000_000);

    // Different transactions racing for one order: one pays it, the rest are unmatched.
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let answers = futures::future::join_all((0..10).map(|n| {
        let body = notification(vec![item(&format!("RACE-2-{n}"), "IN", 85_000, &code)]);
        async move { hook(gw_ref, &body).await }
    }))
    .await;
    let all: Vec<String> = answers.iter().flat_map(statuses).collect();
    assert_eq!(all.iter().filter(|s| *s == "matched").count(), 1, "{all:?}");
    assert_eq!(
        all.iter().filter(|s| *s == "unmatched").count(),
        9,
        "{all:?}"
    );
    assert_eq!(lots::lots_of(&gw, email).await.len(), 2);
}

#[tokio::test]
async fn webhook_refuses_bad_secrets_large_bodies_and_bad_schemas() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let mut b = signed_in(&gw, "guard@example.com").await;
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let good = notification(vec![item("GUARD-1", "IN", 85_000, &code)])
        .to_string()
        .into_bytes();
    let stored = || {
        count(
            &gw,
            "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_transactions",
        )
    };

    for auth in [
        None,
        Some("Apikey wrong-secret".to_string()),
        Some(format!("Bearer {WEBHOOK_SECRET}")),
        Some(format!("Apikey {WEBHOOK_SECRET}x")),
        Some(WEBHOOK_SECRET.to_string()),
    ] {
        let r = hook_raw(&gw, auth.as_deref(), good.clone()).await;
        assert_eq!(r.status, 401, "{auth:?}");
        assert_eq!(r.json(), json!({"status": false}));
    }
    assert_eq!(stored().await, 0);

    // 65 KiB: refused with 413, with or without a declared length.
    let auth = format!("Apikey {WEBHOOK_SECRET}");
    let mut big = notification(vec![item("GUARD-BIG", "IN", 85_000, &code)]);
    big["padding"] = json!("x".repeat(65 * 1024));
    let big = big.to_string().into_bytes();
    let r = hook_raw(&gw, Some(&auth), big.clone()).await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert_eq!(r.json()["status"], json!(false));
    assert!(r.json()["msg"].as_str().is_some());
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(4096).map(|c| Ok(c.to_vec())).collect();
    let resp = client()
        .post(gw.site_url("/api/payment/sepay/callback"))
        .header("authorization", &auth)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("streamed");
    assert_eq!(resp.status(), 413);
    assert_eq!(stored().await, 0);

    // Schema.
    let bad = [
        json!({"data": []}),
        json!({"status": "true", "data": []}),
        json!({"status": true, "data": {}}),
        json!({"status": true, "data": [{"transactionID": 7, "type": "IN", "amount": 1,
               "description": "", "date": "2026-11-22 10:15:00", "bank": "x"}]}),
        json!({"status": true, "data": [{"transactionID": "T", "type": "IN", "amount": "1",
               "description": "", "date": "2026-11-22 10:15:00", "bank": "x"}]}),
        json!({"status": true, "data": [{"transactionID": "T", "type": "IN", "amount": 1,
               "description": "", "date": "22/11/2026", "bank": "x"}]}),
        json!({"status": true, "data": [{"transactionID": "T", "type": "IN", "amount": 1,
               "description": "", "date": "2026-11-22 10:15:00"}]}),
        json!({"status": true, "data": [item("OK-1", "IN", 1, "x"), {"type": "IN"}]}),
    ];
    for body in bad {
        let r = hook_raw(&gw, Some(&auth), body.to_string().into_bytes()).await;
        assert_eq!(r.status, 400, "{body}");
        let v = r.json();
        assert_eq!(v["status"], json!(false));
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    let r = hook_raw(&gw, Some(&auth), b"{not json".to_vec()).await;
    assert_eq!(r.status, 400);
    assert_eq!(stored().await, 0);

    // Another provider's path is not a webhook.
    let r = client()
        .post(gw.site_url("/api/payment/casso/callback"))
        .header("authorization", &auth)
        .body(good.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.expect("json"),
        json!({"ok": false, "code": "not_found"})
    );

    // After all that, the real notification still works.
    let v = hook(&gw, &serde_json::from_slice(&good).expect("json")).await;
    assert_eq!(statuses(&v), ["matched"]);
}

#[tokio::test]
async fn ignored_unmatched_and_amount_mismatch() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "items@example.com";
    let mut b = signed_in(&gw, email).await;
    let order = b
        .order(json!({"quotaType": "request", "quantity": 10_000}))
        .await
        .ok_json()["order"]
        .clone();
    assert_eq!(order["amount"], json!(5000));
    let code = order["paymentCode"].as_str().expect("code").to_string();

    // status:false stores nothing: the same transfers still count when delivered properly.
    let r = hook(
        &gw,
        &json!({"status": false, "data": [item("ITEM-MISMATCH", "IN", 4999, &code)]}),
    )
    .await;
    assert_eq!(statuses(&r), ["ignored"]);

    let v = hook(
        &gw,
        &notification(vec![
            item("ITEM-OUT", "OUT", 5000, &code),
            item("ITEM-NOCODE", "IN", 5000, "chuyen tien an trua"),
            item("ITEM-UNKNOWN", "IN", 5000, "GWAAAAAAAA"),
            item("ITEM-MISMATCH", "IN", 4999, &format!("thanh toan {code}")),
        ]),
    )
    .await;
    assert_eq!(
        statuses(&v),
        ["ignored", "unmatched", "unmatched", "amount_mismatch"]
    );
    assert_eq!(v["processed"][1]["paymentCode"], Value::Null);
    assert_eq!(v["processed"][1]["orderId"], Value::Null);
    assert_eq!(v["processed"][3]["orderId"], order["id"]);
    assert_eq!(v["processed"][3]["paymentCode"], json!(code));
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["orders"][0]["paymentStatus"], "pending");

    // Paying more than asked buys the order.
    let v = hook(
        &gw,
        &notification(vec![item("ITEM-MORE", "IN", 6000, &code)]),
    )
    .await;
    assert_eq!(statuses(&v), ["matched"]);
    let lots = lots::lots_of(&gw, email).await;
    assert_eq!(lots.len(), 1);
    assert_eq!(lots[0].kind, gateway_core::domain::LotKind::Request);
    assert_eq!(lots[0].amount, 10_000);
    assert_eq!(lots[0].tier, None);
    assert_eq!(
        count(
            &gw,
            "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_transactions"
        )
        .await,
        5
    );
}

#[tokio::test]
async fn pending_orders_expire() {
    let extra = PAY.replace("lot_days = 30\n", "lot_days = 30\norder_ttl_seconds = 1\n");
    let (_mock, gw) = config::start_with_toml(&extra);
    let email = "late@example.com";
    let mut b = signed_in(&gw, email).await;
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["orders"][0]["paymentStatus"], "expired");
    assert!(v["orders"][0].get("transfer").is_none());
    // Expired orders do not count against the pending limit.
    for _ in 0..3 {
        b.order(json!({"packageId": "steady-100m"})).await.ok_json();
    }

    // A late transfer is not credited automatically; the operator can.
    let v = hook(
        &gw,
        &notification(vec![item("LATE-1", "IN", 85_000, &code)]),
    )
    .await;
    assert_eq!(statuses(&v), ["unmatched"]);
    assert_eq!(v["processed"][0]["orderId"], order["id"]);
    assert!(lots::lots_of(&gw, email).await.is_empty());
    let id = order["id"].as_str().expect("id");
    let c = gw.admin_json(&[
        "payment",
        "credit",
        "--transaction",
        "LATE-1",
        "--order",
        id,
    ]);
    assert_eq!(c["order"]["paymentStatus"], "paid");
    assert_eq!(lots::lots_of(&gw, email).await.len(), 1);
}

#[tokio::test]
async fn owners_cancel_pending_orders_and_late_transfers_stay_unmatched() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "cancel@example.com";
    let mut b = signed_in(&gw, email).await;
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let id = order["id"].as_str().expect("id").to_string();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let cancel = format!("/api/payment/orders/{id}/cancel");

    // A mutation: the origin, then a session, then the CSRF token.
    let r = client()
        .post(gw.site_url(&cancel))
        .json(&json!({}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 403);
    let (status, err) = Browser::new(&gw).post(&cancel, &json!({})).await.error();
    assert_eq!((status, err.as_str()), (401, "unauthorized"));
    let (status, err) = b
        .post_with(&cancel, &json!({}), &[("x-csrf-token", "")])
        .await
        .error();
    assert_eq!((status, err.as_str()), (403, "invalid_csrf"));

    // Another account's order reads as missing, like an unknown or malformed id.
    let mut other = signed_in(&gw, "other@example.com").await;
    let (status, err) = other.post(&cancel, &json!({})).await.error();
    assert_eq!((status, err.as_str()), (404, "not_found"));
    for bad in ["ord_AAAAAAAAAAAAAAAAAAAA", "nope", "ord_%2e%2e"] {
        let (status, err) = b
            .post(&format!("/api/payment/orders/{bad}/cancel"), &json!({}))
            .await
            .error();
        assert_eq!((status, err.as_str()), (404, "not_found"), "{bad}");
    }

    let v = b.post(&cancel, &json!({})).await.ok_json();
    assert_eq!(v["ok"], json!(true));
    assert_eq!(v["order"]["id"], json!(id));
    assert_eq!(v["order"]["paymentStatus"], "cancelled");
    assert!(v["order"].get("transfer").is_none(), "{v}");
    // Twice: no longer pending.
    let (status, err) = b.post(&cancel, &json!({})).await.error();
    assert_eq!((status, err.as_str()), (409, "order_not_pending"));
    let listed = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(listed["orders"][0]["paymentStatus"], "cancelled");
    // Cancelled orders do not count against the pending limit (three here).
    for _ in 0..3 {
        b.order(json!({"packageId": "steady-100m"})).await.ok_json();
    }

    // A transfer that arrives later is unmatched, with the order named, and grants nothing.
    let v = hook(
        &gw,
        &notification(vec![item("CANCELLED-1", "IN", 85_000, &code)]),
    )
    .await;
    assert_eq!(statuses(&v), ["unmatched"]);
    assert_eq!(v["processed"][0]["orderId"], json!(id));
    assert!(lots::lots_of(&gw, email).await.is_empty());
    let listed = b.get("/api/payment/orders").await.ok_json();
    let stored = listed["orders"]
        .as_array()
        .expect("orders")
        .iter()
        .find(|o| o["id"] == json!(id))
        .expect("the cancelled order");
    assert_eq!(stored["paymentStatus"], "cancelled");
    // The operator sees it and may credit it to the order after all.
    let pending = gw.admin_json(&["payment", "list", "--status", "unmatched"]);
    assert!(pending.to_string().contains("CANCELLED-1"), "{pending}");
    let c = gw.admin_json(&[
        "payment",
        "credit",
        "--transaction",
        "CANCELLED-1",
        "--order",
        &id,
    ]);
    assert_eq!(c["order"]["paymentStatus"], "paid");
    assert_eq!(lots::lots_of(&gw, email).await.len(), 1);

    // A paid order cannot be cancelled.
    let first_pending = listed["orders"][0]["id"].as_str().expect("id").to_string();
    let first_code = listed["orders"][0]["paymentCode"]
        .as_str()
        .expect("code")
        .to_string();
    let v = hook(
        &gw,
        &notification(vec![item("PAID-1", "IN", 85_000, &first_code)]),
    )
    .await;
    assert_eq!(statuses(&v), ["matched"]);
    let (status, err) = b
        .post(
            &format!("/api/payment/orders/{first_pending}/cancel"),
            &json!({}),
        )
        .await
        .error();
    assert_eq!((status, err.as_str()), (409, "order_not_pending"));
}

#[tokio::test]
async fn personal_code_tops_up_tokens() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "topup@example.com";
    let mut b = signed_in(&gw, email).await;
    let personal = b.get("/api/payment/orders").await.ok_json()["paymentCode"]
        .as_str()
        .expect("code")
        .to_string();
    // 12,345 VND at 1,000 VND per million tokens: 12,345,000 tokens.
    let v = hook(
        &gw,
        &notification(vec![item(
            "TOPUP-1",
            "IN",
            12_345,
            &format!("MBVCB.998877.{}.nap tien", personal.to_lowercase()),
        )]),
    )
    .await;
    assert_eq!(statuses(&v), ["matched"]);
    assert_eq!(v["processed"][0]["paymentCode"], json!(personal));
    let order_id = v["processed"][0]["orderId"]
        .as_str()
        .expect("order")
        .to_string();
    let lots = lots::lots_of(&gw, email).await;
    assert_eq!(lots.len(), 1);
    assert_eq!(lots[0].amount, 12_345_000);
    assert_eq!(lots[0].tier, None);
    let v = b.get("/api/payment/orders").await.ok_json();
    let o = &v["orders"][0];
    assert_eq!(o["id"], json!(order_id));
    assert_eq!(o["orderType"], "topup");
    assert_eq!(o["paymentStatus"], "paid");
    assert_eq!(o["amount"], json!(12_345));
    assert_eq!(o["quantity"], json!(12_345_000));
    assert_eq!(o["paymentCode"], json!(personal));

    // An order code in the same description wins over the personal code.
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code");
    let v = hook(
        &gw,
        &notification(vec![item(
            "TOPUP-2",
            "IN",
            85_000,
            &format!("{personal} {code}"),
        )]),
    )
    .await;
    assert_eq!(statuses(&v), ["matched"]);
    assert_eq!(v["processed"][0]["orderId"], order["id"]);
    // Nothing to buy anything with: refused, nothing stored.
    let v = hook(
        &gw,
        &notification(vec![item("TOPUP-3", "IN", 0, &personal)]),
    )
    .await;
    assert_eq!(statuses(&v), ["amount_mismatch"]);
    assert_eq!(lots::lots_of(&gw, email).await.len(), 2);
}

#[tokio::test]
async fn amounts_outside_the_configured_range_are_refused_and_stored_nowhere() {
    let toml = PAY.replace(
        "lot_days = 30\n",
        "lot_days = 30\nmax_webhook_amount_vnd = 5000000\n",
    );
    let (_mock, gw) = config::start_with_toml(&toml);
    let email = "absurd@example.com";
    let mut b = signed_in(&gw, email).await;
    let personal = b.get("/api/payment/orders").await.ok_json()["paymentCode"]
        .as_str()
        .expect("code")
        .to_string();
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let transactions = "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_transactions";
    let paid_orders = "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_orders WHERE status = 'paid'";

    // Too much (a top-up of i64::MAX đồng would buy ~9.2e21 tokens), nothing, less than
    // nothing, for a personal code and for an order, and for a transfer out.
    let v = hook(
        &gw,
        &notification(vec![
            item("ABSURD-MAX", "IN", i64::MAX, &personal),
            item("ABSURD-9E18", "IN", 9_200_000_000_000_000_000, &personal),
            item("ABSURD-OVER", "IN", 5_000_001, &code),
            item("ABSURD-ZERO", "IN", 0, &code),
            item("ABSURD-NEG", "IN", -85_000, &code),
            item("ABSURD-MIN", "IN", i64::MIN, &personal),
            item("ABSURD-OUT", "OUT", -1, &code),
        ]),
    )
    .await;
    // CONTRACT §3's statuses: no order or price matches such an amount; an outgoing transfer
    // is ignored whatever its amount.
    let mut expected = ["amount_mismatch"; 7];
    expected[6] = "ignored";
    assert_eq!(statuses(&v), expected);
    for p in v["processed"].as_array().expect("processed") {
        assert_eq!(p["orderId"], Value::Null, "{p}");
        assert_eq!(p["paymentCode"], Value::Null, "{p}");
    }
    assert_eq!(count(&gw, transactions).await, 0, "nothing stored");
    assert_eq!(count(&gw, paid_orders).await, 0);
    assert!(
        lots::lots_of(&gw, email).await.is_empty(),
        "nothing granted"
    );
    assert_eq!(
        b.get("/api/payment/orders").await.ok_json()["orders"][0]["paymentStatus"],
        "pending"
    );
    let log = gw.log();
    assert!(
        log.contains("payment webhook item ABSURD-NEG refused: amount -85000 VND"),
        "{log}"
    );

    // The edge of the range counts, and a refused transaction id is judged afresh when the
    // bank sends it again with a real amount.
    let v = hook(
        &gw,
        &notification(vec![
            item("ABSURD-OVER", "IN", 85_000, &code),
            item("EDGE", "IN", 5_000_000, &personal),
        ]),
    )
    .await;
    assert_eq!(statuses(&v), ["matched", "matched"]);
    assert_eq!(count(&gw, transactions).await, 2);
    let mut amounts: Vec<u64> = lots::lots_of(&gw, email)
        .await
        .iter()
        .map(|l| l.amount)
        .collect();
    amounts.sort_unstable();
    // The package's 100M tokens; 5,000,000 VND at 1,000 VND per million tokens: 5e9 tokens.
    assert_eq!(amounts, [100_000_000, 5_000_000_000]);

    // An order no single transfer may pay cannot be made (500 VND per thousand requests).
    let (s, c) = b
        .order(json!({"quotaType": "request", "quantity": 10_000_002}))
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_quantity"));
    let v = b
        .order(json!({"quotaType": "request", "quantity": 10_000_000}))
        .await
        .ok_json();
    assert_eq!(v["order"]["amount"], json!(5_000_000));
}

#[tokio::test]
async fn operators_list_and_credit_by_hand() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "ops@example.com";
    let mut b = signed_in(&gw, email).await;
    let order = b
        .order(json!({"packageId": "tryharder-10b"}))
        .await
        .ok_json()["order"]
        .clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let order_id = order["id"].as_str().expect("id").to_string();
    hook(
        &gw,
        &notification(vec![
            item("OPS-LOST", "IN", 950_000, "chuyen khoan quen ma"),
            item("OPS-SHORT", "IN", 900_000, &code),
            item("OPS-OUT", "OUT", 1, "phi"),
        ]),
    )
    .await;

    let all = gw.admin_json(&["payment", "list"]);
    let ids: Vec<_> = all["transactions"]
        .as_array()
        .expect("list")
        .iter()
        .map(|t| t["transactionID"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{all}");
    assert!(ids.contains(&"OPS-LOST".to_string()) && ids.contains(&"OPS-SHORT".to_string()));
    let un = gw.admin_json(&["payment", "list", "--status", "unmatched"]);
    assert_eq!(un["transactions"].as_array().expect("list").len(), 1);
    let t = &un["transactions"][0];
    assert_eq!(t["transactionID"], "OPS-LOST");
    assert_eq!(t["amount"], json!(950_000));
    assert_eq!(t["raw"]["description"], "chuyen khoan quen ma");
    let mm = gw.admin_json(&["payment", "list", "--status", "amount_mismatch"]);
    assert_eq!(mm["transactions"][0]["orderId"], json!(order_id));
    let (ok, err) = gw.admin(&["payment", "list", "--status", "lost"]);
    assert!(!ok && err.contains("--status"), "{err}");

    // Refusals.
    let (ok, err) = gw.admin(&[
        "payment",
        "credit",
        "--transaction",
        "NOPE",
        "--order",
        &order_id,
    ]);
    assert!(!ok && err.contains("no transaction"), "{err}");
    let (ok, err) = gw.admin(&[
        "payment",
        "credit",
        "--transaction",
        "OPS-LOST",
        "--order",
        "ord_x",
    ]);
    assert!(!ok && err.contains("no order"), "{err}");
    let (ok, err) = gw.admin(&[
        "payment",
        "credit",
        "--transaction",
        "OPS-OUT",
        "--order",
        &order_id,
    ]);
    assert!(!ok && err.contains("ignored"), "{err}");

    // The customer forgot the code: credit the transfer to the order.
    let c = gw.admin_json(&[
        "payment",
        "credit",
        "--transaction",
        "OPS-LOST",
        "--order",
        &order_id,
        "--reason",
        "support ticket 42",
        "--actor",
        "alice",
    ]);
    assert_eq!(c["ok"], json!(true));
    assert_eq!(c["order"]["paymentStatus"], "paid");
    assert_eq!(c["order"]["transactionId"], "OPS-LOST");
    assert_eq!(c["transaction"]["status"], "credited");
    assert_eq!(c["lot"]["tier"], "tryharder");
    assert_eq!(c["lot"]["amount"], json!(10_000_000_000u64));
    assert_eq!(c["audit"]["actor"], "alice");
    assert_eq!(
        count(
            &gw,
            "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_audit WHERE actor = 'alice' \
             AND reason = 'support ticket 42' AND transaction_id = 'OPS-LOST' \
             AND previous_transaction_status = 'unmatched' AND previous_order_status = 'pending'"
        )
        .await,
        1
    );

    // Exactly once: the order is paid, the transaction is spent.
    let (ok, err) = gw.admin(&[
        "payment",
        "credit",
        "--transaction",
        "OPS-SHORT",
        "--order",
        &order_id,
    ]);
    assert!(!ok && err.contains("already paid"), "{err}");
    let (ok, err) = gw.admin(&[
        "payment",
        "credit",
        "--transaction",
        "OPS-LOST",
        "--order",
        &order_id,
    ]);
    assert!(!ok && err.contains("credited"), "{err}");
    assert_eq!(lots::lots_of(&gw, email).await.len(), 1);
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["orders"][0]["paymentStatus"], "paid");
    assert_eq!(v["quotaLots"][0]["tier"], "tryharder");
}

#[tokio::test]
async fn terms_of_service_are_rendered_safely_and_reread() {
    let docs = tempfile::tempdir().expect("tempdir");
    let path = docs.path().join("tos.md");
    std::fs::write(
        &path,
        "# Terms\n\nBe **nice**.\n\n<script>alert('x')</script>\n\n\
         <img src=\"a.png\" onerror=\"alert(1)\">\n\n[bad](javascript:alert(2)) \
         <a href=\"javascript:alert(3)\" onclick=\"alert(4)\">also bad</a> [good](https://example.com)\n",
    )
    .expect("write tos");
    let extra = format!("\n[content]\ntos_path = \"{}\"\n", path.display());
    let (_mock, gw) = config::start_with_toml(&extra);
    let get = || async {
        let r = client()
            .get(gw.site_url("/api/content/tos"))
            .send()
            .await
            .expect("get tos");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["cache-control"], "public, max-age=60");
        assert_eq!(
            r.headers()["content-type"],
            "application/json; charset=utf-8"
        );
        r.json::<Value>().await.expect("json")
    };
    let v = get().await;
    assert_eq!(v["ok"], json!(true));
    assert_eq!(v["slug"], "tos");
    assert!(
        v["markdown"].as_str().expect("md").contains("<script>"),
        "markdown verbatim"
    );
    let html = v["html"].as_str().expect("html");
    assert!(
        html.contains("<h1>Terms</h1>") && html.contains("<strong>nice</strong>"),
        "{html}"
    );
    assert!(html.contains("href=\"https://example.com\""), "{html}");
    for bad in ["<script", "alert", "onerror", "onclick", "javascript:"] {
        assert!(!html.contains(bad), "{bad} survived: {html}");
    }
    let first = v["updatedAt"].as_str().expect("updatedAt").to_string();
    assert!(first.ends_with('Z') && first.contains('T'), "{first}");
    assert_eq!(get().await, v, "unchanged file, same answer");

    // The file changes: the next request shows it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    std::fs::write(&path, "# Terms v2\n\nNew rules.\n").expect("rewrite");
    let v2 = get().await;
    assert_eq!(v2["markdown"], "# Terms v2\n\nNew rules.\n");
    assert!(v2["html"]
        .as_str()
        .expect("html")
        .contains("<h1>Terms v2</h1>"));

    // Gone: the empty document.
    std::fs::remove_file(&path).expect("remove");
    assert_eq!(
        get().await,
        json!({"ok": true, "slug": "tos", "markdown": "", "html": "", "updatedAt": null})
    );
}

#[tokio::test]
async fn a_storage_failure_stores_nothing_and_the_retry_grants_once() {
    let (_mock, gw) = config::start_with_toml(PAY);
    let email = "retry@example.com";
    let mut b = signed_in(&gw, email).await;
    let order = b.order(json!({"packageId": "steady-100m"})).await.ok_json()["order"].clone();
    let code = order["paymentCode"].as_str().expect("code").to_string();
    let body = notification(vec![item("RETRY-1", "IN", 85_000, &code)]);
    let db = gw.db().await;

    // Lots cannot be written: the item's transaction fails after the order update.
    sqlx::query("ALTER TABLE quota_lots RENAME TO quota_lots_away")
        .execute(&db.pool)
        .await
        .expect("rename");
    let r = hook_raw(
        &gw,
        Some(&format!("Apikey {WEBHOOK_SECRET}")),
        body.to_string().into_bytes(),
    )
    .await;
    sqlx::query("ALTER TABLE quota_lots_away RENAME TO quota_lots")
        .execute(&db.pool)
        .await
        .expect("rename back");
    assert_eq!(r.status, 500, "{}", r.text);
    assert_eq!(r.json()["status"], json!(false));
    assert_eq!(
        count(
            &gw,
            "SELECT CAST(COUNT(*) AS BIGINT) FROM payment_transactions"
        )
        .await,
        0
    );
    let v = b.get("/api/payment/orders").await.ok_json();
    assert_eq!(v["orders"][0]["paymentStatus"], "pending", "rolled back");

    // The sender retries: matched once, then duplicate.
    assert_eq!(statuses(&hook(&gw, &body).await), ["matched"]);
    assert_eq!(statuses(&hook(&gw, &body).await), ["duplicate"]);
    assert_eq!(lots::lots_of(&gw, email).await.len(), 1);
}

#[tokio::test]
async fn the_private_beta_gate_applies_to_payments() {
    let extra =
        format!("{PAY}\n[auth]\nprivate_beta = true\nbeta_allowlist = [\"beta@example.com\"]\n");
    let (_mock, gw) = config::start_with_toml(&extra);
    let mut b = signed_in(&gw, "beta@example.com").await;
    b.get("/api/payment/orders").await.ok_json();
    // The address leaves the allowlist; the live config reload takes it from there.
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    std::fs::write(
        &gw.config_path,
        text.replace(
            "beta_allowlist = [\"beta@example.com\"]",
            "beta_allowlist = []",
        ),
    )
    .expect("rewrite config");
    let mut last = (0, String::new());
    for _ in 0..100 {
        let r = b.get("/api/payment/orders").await;
        if r.status != 200 {
            last = r.error();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((last.0, last.1.as_str()), (403, "private_beta_only"));
    let (status, code) = b.order(json!({"packageId": "steady-100m"})).await.error();
    assert_eq!((status, code.as_str()), (403, "private_beta_only"));
}
