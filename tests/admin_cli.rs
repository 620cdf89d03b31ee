//! The operator commands of CONTRACT §1 through the real binary: their output shapes, their
//! errors for unknown accounts and ids, their help text, and a revocation reaching a running
//! gateway.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Runs an admin command that must fail; returns its stderr.
fn admin_fails(gw: &Gateway, args: &[&str]) -> String {
    let (ok, out) = gw.admin(args);
    assert!(!ok, "admin {args:?} should fail, printed {out}");
    out
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("array")
        .iter()
        .map(|v| v["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn user_key_and_lot_commands_print_their_shapes_and_name_unknowns() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let alice = gw.admin_json(&["user", "create", "--email", "alice@example.com"]);
    let bob = gw.admin_json(&[
        "user",
        "create",
        "--email",
        "bob@example.com",
        "--unlimited",
    ]);
    gw.admin_json(&["user", "suspend", "--email", "bob@example.com"]);
    let alice_id = alice["id"].as_str().unwrap().to_string();
    let bob_id = bob["id"].as_str().unwrap().to_string();

    // user list: newest first, filters, limit, the contract's fields.
    let all = gw.admin_json(&["user", "list"]);
    assert_eq!(ids(&all["users"]), [bob_id.clone(), alice_id.clone()]);
    let first = &all["users"][1];
    let mut fields: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "createdAt",
            "email",
            "id",
            "lastLoginAt",
            "quotaTier",
            "quotaUnlimited",
            "status"
        ]
    );
    assert_eq!(first["email"], "alice@example.com");
    assert_eq!(first["status"], "active");
    assert_eq!(first["quotaTier"], "beginner");
    assert_eq!(first["quotaUnlimited"], false);
    assert_eq!(first["lastLoginAt"], Value::Null);
    assert_eq!(all["users"][0]["quotaUnlimited"], true);
    let suspended = gw.admin_json(&["user", "list", "--status", "suspended"]);
    assert_eq!(ids(&suspended["users"]), std::slice::from_ref(&bob_id));
    assert_eq!(suspended["users"][0]["status"], "suspended");
    let active = gw.admin_json(&["user", "list", "--status", "active"]);
    assert_eq!(ids(&active["users"]), std::slice::from_ref(&alice_id));
    let limited = gw.admin_json(&["user", "list", "--limit", "1"]);
    assert_eq!(ids(&limited["users"]), std::slice::from_ref(&bob_id));
    assert!(admin_fails(&gw, &["user", "list", "--status", "gone"]).contains("gone"));
    assert!(admin_fails(&gw, &["user", "list", "--limit", "0"]).contains("--limit"));

    // Keys: list (never a secret or a hash), show, revoke.
    let k1 = gw.admin_json(&[
        "key",
        "create",
        "--email",
        "alice@example.com",
        "--name",
        "ci",
    ]);
    let k2 = gw.admin_json(&["key", "create", "--email", "alice@example.com"]);
    let secret = k1["secret"].as_str().unwrap().to_string();
    let (ok, raw) = gw.admin(&["key", "list", "--email", "alice@example.com"]);
    assert!(ok, "{raw}");
    assert!(
        !raw.contains(&secret) && !raw.contains("secret") && !raw.to_lowercase().contains("hash")
    );
    let keys: Value = serde_json::from_str(raw.trim()).unwrap();
    assert_eq!(ids(&keys["keys"]).len(), 2);
    let listed = keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == k1["id"])
        .expect("k1 listed");
    for field in ["name", "status", "keyPrefix", "keySuffix", "scopes"] {
        assert_eq!(listed[field], k1[field], "{field}");
    }
    assert_eq!(listed["status"], "active");
    let revoked = gw.admin_json(&["key", "revoke", "--id", k2["id"].as_str().unwrap()]);
    assert_eq!(revoked["id"], k2["id"]);
    assert_eq!(revoked["status"], "revoked");
    // Revoking again changes nothing and still answers.
    let again = gw.admin_json(&["key", "revoke", "--id", k2["id"].as_str().unwrap()]);
    assert_eq!(again["status"], "revoked");
    assert_eq!(again["revokedAt"], revoked["revokedAt"]);
    let err = admin_fails(&gw, &["key", "revoke", "--id", "key_doesnotexist000000"]);
    assert!(err.contains("key_doesnotexist000000"), "{err}");
    assert!(
        admin_fails(&gw, &["key", "list", "--email", "nobody@example.com"])
            .contains("nobody@example.com")
    );

    // Lots: granted ones are listed with the contract's fields.
    let lot = gw.admin_json(&[
        "lot",
        "grant",
        "--email",
        "alice@example.com",
        "--type",
        "token",
        "--amount",
        "5000",
        "--days",
        "3",
        "--tier",
        "steady",
    ]);
    let lots = gw.admin_json(&["lot", "list", "--email", "alice@example.com"]);
    assert_eq!(
        ids(&lots["lots"]),
        [lot["id"].as_str().unwrap().to_string()]
    );
    let l = &lots["lots"][0];
    assert_eq!(
        (&l["type"], &l["amount"], &l["remaining"], &l["tier"]),
        (
            &json!("token"),
            &json!(5000),
            &json!(5000),
            &json!("steady")
        )
    );
    assert_eq!(l["expiresAt"], lot["expiresAt"]);
    let none = gw.admin_json(&["lot", "list", "--email", "bob@example.com"]);
    assert_eq!(none, json!({"lots": []}));
    assert!(
        admin_fails(&gw, &["lot", "list", "--email", "nobody@example.com"])
            .contains("nobody@example.com")
    );

    // user show: profile, keys, lots and quota together.
    let shown = gw.admin_json(&["user", "show", "--email", "alice@example.com"]);
    assert_eq!(shown["user"]["id"], alice["id"]);
    assert_eq!(shown["user"]["status"], "active");
    assert_eq!(ids(&shown["keys"]).len(), 2);
    assert_eq!(ids(&shown["lots"]), ids(&lots["lots"]));
    assert_eq!(shown["quota"]["entitlementTier"], "steady");
    assert_eq!(shown["quota"]["effectiveTier"], "steady");
    assert!(!shown.to_string().contains(&secret));
    assert!(
        admin_fails(&gw, &["user", "show", "--email", "nobody@example.com"])
            .contains("nobody@example.com")
    );

    // reset-2fa turns two-factor off and clears its secret.
    let db = gw.db().await;
    sqlx::query(
        "UPDATE users SET two_factor_enabled = 1, totp_secret = 'JBSWY3DPEHPK3PXP' WHERE id = $1",
    )
    .bind(&alice_id)
    .execute(&db.pool)
    .await
    .unwrap();
    let shown = gw.admin_json(&["user", "show", "--email", "alice@example.com"]);
    assert_eq!(shown["user"]["twoFactorEnabled"], true);
    let reset = gw.admin_json(&["user", "reset-2fa", "--email", "alice@example.com"]);
    assert_eq!(reset["id"], alice["id"]);
    assert_eq!(reset["twoFactorEnabled"], false);
    let shown = gw.admin_json(&["user", "show", "--email", "alice@example.com"]);
    assert_eq!(shown["user"]["twoFactorEnabled"], false);
    let secret_left: Option<String> =
        sqlx::query_scalar("SELECT totp_secret FROM users WHERE id = $1")
            .bind(&alice_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(secret_left, None);
    assert!(
        admin_fails(&gw, &["user", "reset-2fa", "--email", "nobody@example.com"])
            .contains("nobody@example.com")
    );
}

/// A key revoked with the CLI (straight in the database) is refused by a running gateway
/// within a second: its change feed sees the revocation.
#[tokio::test]
async fn key_revoked_by_the_cli_is_refused_by_a_running_gateway_within_a_second() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    gw.admin_json(&["user", "create", "--email", "revoke@example.com"]);
    let doomed = gw.admin_json(&["key", "create", "--email", "revoke@example.com"]);
    let kept = gw.admin_json(&["key", "create", "--email", "revoke@example.com"]);
    let c = client();
    let status = |secret: Value| {
        let c = c.clone();
        let url = gw.url("/v1/models");
        async move {
            c.get(url)
                .bearer_auth(secret.as_str().unwrap())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // Both keys are cached by the gateway now.
    assert_eq!(status(doomed["secret"].clone()).await, 200);
    assert_eq!(status(kept["secret"].clone()).await, 200);

    gw.admin_json(&["key", "revoke", "--id", doomed["id"].as_str().unwrap()]);
    let revoked_at = Instant::now();
    loop {
        let s = status(doomed["secret"].clone()).await;
        if s == 401 {
            break;
        }
        assert_eq!(s, 200);
        assert!(
            revoked_at.elapsed() < Duration::from_secs(1),
            "the revoked key still worked a second later"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status(kept["secret"].clone()).await, 200);
}

#[tokio::test]
async fn usage_report_sums_per_day_model_and_user_as_json_and_csv() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let a = gw.user_with_key("report-a@example.com", &[]);
    let b = gw.user_with_key("report-b@example.com", &[]);
    let c = client();
    for (key, model) in [
        (&a, "mock-gpt"),
        (&a, "mock-gpt"),
        (&a, "claude-mock"),
        (&b, "mock-gpt"),
    ] {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&json!({"model": model, "max_tokens": 16,
                          "messages": [{"role": "user", "content": "count me"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    let events = gw.wait_usage(4).await;
    assert_eq!(events.len(), 4);
    let tokens = |pick: &dyn Fn(&Value) -> bool| -> (u64, u64, u64) {
        events.iter().filter(|e| pick(e)).fold((0, 0, 0), |acc, e| {
            (
                acc.0 + e["input_tokens"].as_u64().unwrap(),
                acc.1 + e["cached_tokens"].as_u64().unwrap(),
                acc.2 + e["output_tokens"].as_u64().unwrap(),
            )
        })
    };
    // Models without weights are charged their raw tokens; without prices they cost nothing
    // known, so all their tokens are unpriced.
    let row = |requests: u64, (input, cached, output): (u64, u64, u64)| {
        json!({"requests": requests, "inputTokens": input, "cachedInputTokens": cached,
               "outputTokens": output, "totalTokens": input + output,
               "quotaCharged": input + output, "providerCost": 0.0,
               "unpricedTokens": input + output})
    };
    let with = |mut v: Value, k: &str, name: &str| {
        v[k] = json!(name);
        v
    };
    let today = time::OffsetDateTime::now_utc().date().to_string();

    let by_day = gw.admin_json(&["usage", "report"]);
    assert_eq!(
        by_day,
        json!({"rows": [with(row(4, tokens(&|_| true)), "day", &today)]})
    );

    let by_model = gw.admin_json(&["usage", "report", "--by", "model"]);
    let gpt = with(
        row(3, tokens(&|e| e["model"] == "mock-gpt")),
        "model",
        "mock-gpt",
    );
    let claude = with(
        row(1, tokens(&|e| e["model"] == "claude-mock")),
        "model",
        "claude-mock",
    );
    assert_eq!(by_model, json!({"rows": [gpt.clone(), claude.clone()]}));

    let a_id =
        gw.admin_json(&["user", "show", "--email", "report-a@example.com"])["user"]["id"].clone();
    let by_user = gw.admin_json(&[
        "usage", "report", "--by", "user", "--since", &today, "--until", &today,
    ]);
    let ua = with(
        row(3, tokens(&|e| e["user_id"] == a_id)),
        "user",
        "report-a@example.com",
    );
    let ub = with(
        row(1, tokens(&|e| e["user_id"] != a_id)),
        "user",
        "report-b@example.com",
    );
    assert_eq!(by_user, json!({"rows": [ua, ub]}));

    let only_a = gw.admin_json(&[
        "usage",
        "report",
        "--by",
        "model",
        "--email",
        "report-a@example.com",
    ]);
    let a_gpt = with(
        row(
            2,
            tokens(&|e| e["user_id"] == a_id && e["model"] == "mock-gpt"),
        ),
        "model",
        "mock-gpt",
    );
    assert_eq!(only_a, json!({"rows": [a_gpt, claude]}));

    // CSV: a header line and the same rows.
    let (ok, csv) = gw.admin(&["usage", "report", "--by", "model", "--format", "csv"]);
    assert!(ok, "{csv}");
    let mut expected = String::from(
        "model,requests,inputTokens,cachedInputTokens,outputTokens,totalTokens,quotaCharged,\
         providerCost,unpricedTokens\n",
    );
    for r in by_model["rows"].as_array().unwrap() {
        expected.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r["model"].as_str().unwrap(),
            r["requests"],
            r["inputTokens"],
            r["cachedInputTokens"],
            r["outputTokens"],
            r["totalTokens"],
            r["quotaCharged"],
            r["providerCost"],
            r["unpricedTokens"]
        ));
    }
    assert_eq!(csv, expected);

    // Ranges outside the usage are empty; bad input is named.
    let old = gw.admin_json(&[
        "usage",
        "report",
        "--since",
        "2020-01-01",
        "--until",
        "2020-01-31",
    ]);
    assert_eq!(old, json!({"rows": []}));
    let (ok, csv) = gw.admin(&[
        "usage",
        "report",
        "--until",
        "2020-01-31",
        "--format",
        "csv",
    ]);
    assert!(ok);
    assert_eq!(
        csv,
        "day,requests,inputTokens,cachedInputTokens,outputTokens,totalTokens,quotaCharged,\
         providerCost,unpricedTokens\n"
    );
    let err = admin_fails(&gw, &["usage", "report", "--since", "2026-02-30"]);
    assert!(
        err.contains("--since") && err.contains("2026-02-30"),
        "{err}"
    );
    let err = admin_fails(
        &gw,
        &[
            "usage",
            "report",
            "--since",
            "2026-03-02",
            "--until",
            "2026-03-01",
        ],
    );
    assert!(
        err.contains("2026-03-02") && err.contains("2026-03-01"),
        "{err}"
    );
    assert!(
        admin_fails(&gw, &["usage", "report", "--email", "nobody@example.com"])
            .contains("nobody@example.com")
    );
    assert!(!admin_fails(&gw, &["usage", "report", "--by", "week"]).is_empty());
}

/// Every subcommand and every flag of every command explains itself in `--help`.
#[test]
fn every_command_and_flag_has_help_text() {
    fn help(path: &[String]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(path)
            .arg("--help")
            .output()
            .expect("gateway --help");
        assert!(out.status.success(), "{path:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    }
    let mut queue: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = queue.pop() {
        let text = help(&path);
        seen += 1;
        let mut section = "";
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with(' ') {
                section = line.trim_end_matches(':');
                continue;
            }
            // Entries are indented by two: "  name  Help" or "  -x, --flag <V>  Help"; clap puts
            // the help on the next, deeper line when the entry is long.
            let entry = line.len() - line.trim_start().len() == 2;
            if !entry || !(section == "Commands" || section == "Options") {
                continue;
            }
            let item = line.trim();
            let (head, desc) = match item.split_once("  ") {
                Some((h, d)) => (h.trim(), d.trim().to_string()),
                None => {
                    let next = lines.get(i + 1).copied().unwrap_or("");
                    let deeper = next.len() - next.trim_start().len() > 2;
                    (
                        item,
                        if deeper {
                            next.trim().to_string()
                        } else {
                            String::new()
                        },
                    )
                }
            };
            assert!(
                !desc.is_empty(),
                "{path:?}: {head:?} has no help text:\n{text}"
            );
            if section == "Commands" && head != "help" {
                let mut next = path.clone();
                next.push(head.to_string());
                queue.push(next);
            }
        }
    }
    // gateway, its seven command groups and their commands.
    assert!(seen >= 20, "only {seen} help pages");
}
