//! Secrets and config safety through the real server: broken config files refused by
//! `config check` and by live reload, no secret in the log at `RUST_LOG=trace`, TOTP seeds
//! sealed at rest and codes accepted once, data files readable by their owner only, no provider
//! credential echoed back to a client in any encoding.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use common::api::post_in_style;
use common::site::{
    latest_code, now_s, recovery_codes, request_two_factor, signed_in, two_factor_with_code,
    Browser,
};
use common::*;
use gateway_site::twofactor;
use serde_json::{json, Value};
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

/// The mock's `echo-key:<form>` encodings of the credential it received.
const ECHO_FORMS: [&str; 18] = [
    "plain",
    "pct-upper",
    "pct-lower",
    "pct-all",
    "form",
    "json-upper",
    "json-lower",
    "json-slash",
    "hex",
    "hex-upper",
    "b64-0",
    "b64-1",
    "b64-2",
    "b64url-0",
    "b64url-1",
    "b64url-2",
    "b64-json",
    "b64-pct",
];

/// `s` percent-decoded (and with `+` as a space when `form`); bytes that are no escape stay.
fn percent_decoded(s: &str, form: bool) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
                continue;
            }
            (b'+', _) if form => out.push(b' '),
            (c, _) => out.push(c),
        }
        i += 1;
    }
    out
}

/// How `key` can be read back from `text` (plainly, percent-decoded, from any run of base64 or
/// hex characters at any offset), or `None` when it cannot.
fn recoverable(text: &[u8], key: &[u8]) -> Option<String> {
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let has = |hay: &[u8]| hay.windows(key.len()).any(|w| w == key);
    let text = String::from_utf8_lossy(text).to_string();
    for (how, view) in [
        ("as it is", text.as_bytes().to_vec()),
        ("percent-decoded", percent_decoded(&text, false)),
        ("form-decoded", percent_decoded(&text, true)),
    ] {
        if has(&view) {
            return Some(how.into());
        }
        let base64_char = |c: &u8| c.is_ascii_alphanumeric() || b"+/-_".contains(c);
        for run in view.split(|c| !base64_char(c)).filter(|r| r.len() >= 8) {
            let run: Vec<u8> = run
                .iter()
                .map(|&c| match c {
                    b'-' => b'+',
                    b'_' => b'/',
                    c => c,
                })
                .collect();
            for skip in 0..4 {
                let mut part = run[skip..].to_vec();
                if part.len() % 4 == 1 {
                    part.pop();
                }
                if lenient.decode(&part).is_ok_and(|d| has(&d)) {
                    return Some(format!("base64 ({how})"));
                }
            }
        }
        for run in view.split(|c| !c.is_ascii_hexdigit()) {
            for skip in 0..2.min(run.len()) {
                let part = &run[skip..skip + (run.len() - skip) / 2 * 2];
                if hex::decode(part).is_ok_and(|d| has(&d)) {
                    return Some(format!("hex ({how})"));
                }
            }
        }
    }
    None
}

#[tokio::test]
async fn provider_credentials_echoed_in_any_encoding_never_reach_the_client() {
    // `/`, `+` and a space make every encoding differ from the plain key; the Anthropic
    // provider keeps the harness's ordinary key.
    const OPENAI_KEY: &str = "sk-proj/Echo+Key 7~x.Q_9";
    const ANTHROPIC_KEY: &str = "provider-anthropic-secret";
    let mut toml = String::new();
    for form in ECHO_FORMS {
        for provider in ["mock", "mock-anthropic"] {
            toml.push_str(&format!(
                "\n[[models]]\nid = \"{provider}-echo-{form}\"\nprovider = \"{provider}\"\n\
                 upstream_model = \"echo-key:{form}\"\n"
            ));
        }
    }
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            extra_toml: toml,
            env: vec![("MOCK_OPENAI_KEY".into(), OPENAI_KEY.into())],
            ..Options::default()
        },
    );
    let key = gw.user_with_key("echo@example.com", &["--rpm", "1000"]);
    // (provider, its key, client path): same style and translated, both ways.
    let cases = [
        ("mock", OPENAI_KEY, "/v1/chat/completions"),
        ("mock", OPENAI_KEY, "/v1/messages"),
        ("mock-anthropic", ANTHROPIC_KEY, "/v1/messages"),
        ("mock-anthropic", ANTHROPIC_KEY, "/v1/chat/completions"),
    ];
    for form in ECHO_FORMS {
        for (provider, secret, path) in cases {
            let model = format!("{provider}-echo-{form}");
            let body = json!({
                "model": model,
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}],
            });
            let r = post_in_style(&gw, path, &key, &body).await;
            let status = r.status().as_u16();
            let text = r.bytes().await.expect("body");
            let shown = String::from_utf8_lossy(&text);
            assert_eq!(status, 400, "{model} via {path}: {shown}");
            let v: Value = serde_json::from_slice(&text).expect("JSON error");
            let message = v["error"]["message"].as_str().expect("message");
            // The error is still the provider's, with the credential masked out of it.
            assert!(
                message.starts_with("Incorrect API key provided: ") && message.contains("***"),
                "{model} via {path}: {message}"
            );
            for (what, seen) in [("body", &text[..]), ("message", message.as_bytes())] {
                if let Some(how) = recoverable(seen, secret.as_bytes()) {
                    panic!("{model} via {path}: the key is in the {what}, {how}: {shown}");
                }
            }
        }
    }
    // The mock really did quote the key: asked directly, every form gives it back.
    for form in ECHO_FORMS {
        let r = client()
            .post(format!("{}/v1/chat/completions", mock.url()))
            .bearer_auth(OPENAI_KEY)
            .json(&json!({"model": format!("echo-key:{form}"), "messages": []}))
            .send()
            .await
            .expect("mock");
        let v: Value = r.json().await.expect("mock JSON");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(
            recoverable(message.as_bytes(), OPENAI_KEY.as_bytes()).is_some(),
            "{form}: {message}"
        );
    }
}
