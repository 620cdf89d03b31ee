//! Secrets and config safety through the real server: broken config files refused by
//! `config check` and by live reload, no secret in the log at `RUST_LOG=trace`, TOTP seeds
//! sealed at rest and codes accepted once, data files readable by their owner only.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::site::{
    latest_code, now_s, recovery_codes, request_two_factor, signed_in, two_factor_with_code,
    Browser,
};
use common::*;
use gateway_site::twofactor;
use serde_json::json;
use sqlx::Row;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Status of a chat request for `model` with `key`.
async fn chat_status(gw_api: &str, key: &str, model: &str) -> u16 {
    client()
        .post(format!("{gw_api}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("chat")
        .status()
        .as_u16()
}

/// `gateway --config <path> config check`: (exit ok, stderr).
fn config_check(path: &Path) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--config")
        .arg(path)
        .args(["config", "check"])
        .output()
        .expect("config check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test]
async fn broken_configs_are_refused_by_check_and_by_reload() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let key = gw.user_with_key("reload@example.com", &[]);
    let original = std::fs::read_to_string(&gw.config_path).expect("config");
    let models_at = original.find("[[models]]").expect("models");
    let cut_mid_value = original.find("style = \"op").expect("style") + "style = \"op".len();
    let bad = [
        ("empty", String::new(), "empty"),
        ("blank", "\n  \n".to_string(), "empty"),
        (
            "no models",
            original[..models_at].to_string(),
            "models: missing",
        ),
        (
            "cut mid-value",
            original[..cut_mid_value].to_string(),
            "line",
        ),
        (
            "unparsable",
            format!("{original}\n[[providers]\nname = \"x\"\n"),
            "line",
        ),
    ];

    // `config check` refuses each, naming the file.
    for (what, text, says) in &bad {
        let path = gw
            .dir
            .path()
            .join(format!("{}.toml", what.replace(' ', "-")));
        std::fs::write(&path, text).expect("write");
        let (ok, err) = config_check(&path);
        assert!(!ok, "{what}: accepted");
        assert!(
            err.contains(&path.display().to_string()) && err.contains(says),
            "{what}: {err}"
        );
    }
    let (ok, err) = config_check(&gw.config_path);
    assert!(ok, "{err}");

    // Live reload ignores each; the running config keeps serving.
    for (what, text, _) in &bad {
        std::fs::write(&gw.config_path, text).expect("write");
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_eq!(chat_status(&gw.api, &key, "mock-gpt").await, 200, "{what}");
    }
    let log = gw.log();
    assert!(
        log.contains("config reload refused")
            && log.contains(&format!("{}: the file is empty", gw.config_path.display())),
        "{log}"
    );

    // A truncate-then-write slower than the debounce: the empty file and the valid first half
    // (every model but the last) never go live; the whole file does.
    let watching = Arc::new(AtomicBool::new(true));
    let watcher = tokio::spawn({
        let (api, key, watching) = (gw.api.clone(), key.clone(), watching.clone());
        async move {
            let mut statuses = vec![];
            while watching.load(Ordering::Relaxed) {
                statuses.push(chat_status(&api, &key, "claude-mock").await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            statuses
        }
    });
    let whole = format!(
        "{original}\n[[models]]\nid = \"hot-model\"\nprovider = \"mock\"\nupstream_model = \"mock-gpt\"\n"
    );
    let last_model = original.rfind("[[models]]").expect("last model");
    let mut file = std::fs::File::create(&gw.config_path).expect("truncate");
    tokio::time::sleep(Duration::from_millis(400)).await;
    file.write_all(&whole.as_bytes()[..last_model])
        .expect("first half");
    file.flush().expect("flush");
    tokio::time::sleep(Duration::from_millis(100)).await;
    file.write_all(&whole.as_bytes()[last_model..])
        .expect("second half");
    drop(file);
    let start = Instant::now();
    while chat_status(&gw.api, &key, "hot-model").await != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the whole file never went live: {}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watching.store(false, Ordering::Relaxed);
    let statuses = watcher.await.expect("watcher");
    assert!(statuses.len() > 10, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "a half-written file went live: {statuses:?}"
    );
}

#[tokio::test]
async fn trace_logs_hold_no_secrets() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            extra_toml: "\n[payment]\nwebhook_provider = \"sepay\"\n".to_string(),
            env: vec![("RUST_LOG".to_string(), "trace".to_string())],
            ..Options::default()
        },
    );
    let email = "trace@example.com";

    // Sign-in (code, then the magic link's token in a query string), key rotation, a developer
    // call with the rotated key (the provider key goes upstream), two-factor, the webhook.
    let mut b = signed_in(&gw, email).await;
    let otp = latest_code(&gw, email);
    let session = b.cookie("gw_session").expect("session cookie");
    let v = b
        .post("/api/account/keys", &json!({"rotate": true}))
        .await
        .ok_json();
    let rotated = v["secret"].as_str().expect("secret").to_string();
    assert_eq!(chat_status(&gw.api, &rotated, "mock-gpt").await, 200);
    let v = request_two_factor(&mut b).await;
    let seed = v["security"]["totpSecret"]
        .as_str()
        .expect("seed")
        .to_string();
    let confirm = twofactor::code_at(&seed, now_s() - 30).expect("totp");
    let v = two_factor_with_code(&mut b, true, &confirm).await.ok_json();
    let recovery = recovery_codes(&v);
    let totp = twofactor::code_at(&seed, now_s()).expect("totp");
    let r = Browser::new(&gw)
        .sign_in_with(&gw, email, Some(&totp))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let hook = client()
        .post(gw.site_url("/api/payment/sepay/callback"))
        .header("authorization", format!("Apikey {WEBHOOK_SECRET}"))
        .json(&json!({"id": 1}))
        .send()
        .await
        .expect("webhook");
    // Past the secret check; refused for its schema.
    assert_eq!(hook.status().as_u16(), 400);
    let link = client()
        .get(gw.site_url("/api/auth/verify-link?token=secret-link-token-0123456789"))
        .send()
        .await
        .expect("link");
    assert!(link.status().as_u16() < 500);

    let log = gw.log();
    assert!(log.contains("gateway listening"), "{log}");
    for (what, secret) in [
        ("webhook secret", WEBHOOK_SECRET),
        ("session secret", SESSION_SECRET),
        ("key pepper", PEPPER),
        ("session cookie", session.as_str()),
        ("rotated key", rotated.as_str()),
        ("provider key", "provider-openai-secret"),
        ("TOTP seed", seed.as_str()),
        ("recovery code", recovery[0].as_str()),
        ("magic-link token", "secret-link-token-0123456789"),
    ] {
        assert!(!log.contains(secret), "the log prints the {what}");
    }
    for (what, code) in [("emailed code", otp.as_str()), ("TOTP code", totp.as_str())] {
        let standalone = log.match_indices(code).any(|(at, _)| {
            let before = log[..at].chars().next_back();
            let after = log[at + code.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric())
                && !after.is_some_and(|c| c.is_ascii_alphanumeric())
        });
        assert!(!standalone, "the log prints the {what}");
    }
}

/// The stored seed of `email`.
async fn stored_seed(gw: &Gateway, email: &str) -> Option<String> {
    let db = gw.db().await;
    sqlx::query("SELECT totp_secret FROM users WHERE email = $1")
        .bind(email)
        .fetch_one(&db.pool)
        .await
        .expect("user")
        .try_get("totp_secret")
        .expect("column")
}

#[tokio::test]
async fn totp_seeds_are_sealed_and_codes_work_once() {
    let mock = Mock::start(&[]);
    let mut gw = Gateway::start(&mock, Options::with_toml(config::ROOMY_SIGN_IN));
    let email = "once@example.com";
    let mut b = signed_in(&gw, email).await;
    let v = request_two_factor(&mut b).await;
    let seed = v["security"]["totpSecret"]
        .as_str()
        .expect("seed")
        .to_string();
    // Confirmed with the previous step's code, so this step's is still unused below.
    let confirm = twofactor::code_at(&seed, now_s() - 30).expect("code");
    two_factor_with_code(&mut b, true, &confirm).await.ok_json();
    let stored = stored_seed(&gw, email).await.expect("stored seed");
    assert!(
        stored.starts_with("v1.") && !stored.contains(&seed),
        "{stored}"
    );

    // A code signs in once; the same code again is refused; a later step's code works.
    let now = now_s();
    let code = twofactor::code_at(&seed, now).expect("code");
    let r = Browser::new(&gw)
        .sign_in_with(&gw, email, Some(&code))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = Browser::new(&gw)
        .sign_in_with(&gw, email, Some(&code))
        .await;
    assert_eq!(r.error(), (400, "invalid_code".to_string()));
    // Nor can it turn two-factor off.
    let (s, c) = b
        .post(
            "/api/account/security",
            &json!({"twoFactorEnabled": false, "twoFactorCode": code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    let next = twofactor::code_at(&seed, now + 30).expect("code");
    let r = Browser::new(&gw)
        .sign_in_with(&gw, email, Some(&next))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Of concurrent claims of one step exactly one wins.
    let db = gw.db().await;
    let user = db
        .users()
        .find_by_email(email)
        .await
        .expect("query")
        .expect("user");
    let step = (now / 30 + 10) as i64;
    let claims = futures::future::join_all((0..8).map(|_| {
        let (db, id) = (db.clone(), user.id.clone());
        async move { db.auth().claim_totp_step(&id, step).await.expect("claim") }
    }))
    .await;
    assert_eq!(claims.iter().filter(|c| **c).count(), 1, "{claims:?}");

    // A plaintext seed from before sealing keeps working and is sealed at the next start.
    let plain = twofactor::generate(email).secret;
    db.auth()
        .set_two_factor(&user.id, Some(&plain), gateway_core::util::now_ms())
        .await
        .expect("plaintext seed");
    let code = twofactor::code_at(&plain, now_s()).expect("code");
    let r = Browser::new(&gw)
        .sign_in_with(&gw, email, Some(&code))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    gw.terminate();
    gw.spawn();
    let stored = stored_seed(&gw, email).await.expect("stored seed");
    assert!(
        stored.starts_with("v1.") && !stored.contains(&plain),
        "{stored}"
    );
    let code = twofactor::code_at(&plain, now_s() + 30).expect("code");
    let r = Browser::new(&gw)
        .sign_in_with(&gw, email, Some(&code))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test]
async fn data_files_are_private() {
    let mock = Mock::start(&[]);
    let mut gw = Gateway::start(&mock, Options::default());
    signed_in(&gw, "files@example.com").await;
    let outbox = gw.outbox();
    assert_eq!(mode(&outbox), 0o700);
    let mails: Vec<_> = std::fs::read_dir(&outbox)
        .expect("outbox")
        .filter_map(|e| e.ok())
        .collect();
    assert!(!mails.is_empty());
    for mail in mails {
        assert_eq!(mode(&mail.path()), 0o600, "{}", mail.path().display());
    }
    if gw.database_url.starts_with("sqlite") {
        let db = gw.dir.path().join("gateway.db");
        for suffix in ["", "-wal", "-shm"] {
            let path = db.with_file_name(format!("gateway.db{suffix}"));
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }

    // Generated development secrets: 0600 in a 0700 directory.
    gw.terminate();
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    std::fs::write(
        &gw.config_path,
        text.replace("dev_generate = false", "dev_generate = true"),
    )
    .expect("config");
    gw.env.retain(|(k, _)| k != "GATEWAY_WEBHOOK_SECRET");
    gw.spawn();
    let secrets = gw.dir.path().join("data").join("secrets");
    assert_eq!(mode(&secrets), 0o700);
    assert_eq!(mode(&secrets.join("GATEWAY_WEBHOOK_SECRET")), 0o600);
}
