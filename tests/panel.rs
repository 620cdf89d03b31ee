//! The web panel: its headers and QR endpoint through the real server, and the whole panel in
//! headless Chromium (`tests/browser/panel.mjs` through playwright-core, at 1280x800 and
//! 390x844): sign-in with the code and with the magic link delivered to a test SMTP server (the
//! link's confirmation form submitted in the browser that asked, in a fresh one, and with a
//! second factor), key rotation and copy, developer calls with the new key, the usage chart,
//! the two-factor QR code and new recovery codes, a billing order with its VietQR code, an
//! operator's key beside the global key, revocation of each.
//! Screenshots land in `target/panel-screenshots/`.
//!
//! The browser test skips (with a message) when `node`, `/usr/bin/chromium` or
//! `tests/browser/node_modules` is missing; `scripts/setup` installs them.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::config::ROOMY_SIGN_IN;
use common::smtp::SmtpSink;
use common::*;
use serde_json::{json, Value};

const PAYMENT: &str = r#"
[payment]
webhook_provider = "sepay"
code_prefix = "GW"
max_pending_orders = 5
orders_per_hour = 100
lot_days = 30
token_price_vnd_per_million = 1000
request_price_vnd_per_thousand = 500
bank_bin = "970415"
account_number = "0123456789"
account_name = "GATEWAY CO"
"#;

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_assets_headers_and_qr() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::with_toml(ROOMY_SIGN_IN));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    for page in [
        "/panel",
        "/panel/signin",
        "/panel/keys",
        "/panel/usage",
        "/panel/security",
        "/panel/billing",
        "/panel/terms",
    ] {
        let r = http.get(gw.site_url(page)).send().await.expect("page");
        assert_eq!(r.status(), 200, "{page}");
        assert_eq!(header(&r, "content-security-policy"), CSP, "{page}");
        assert_eq!(header(&r, "x-content-type-options"), "nosniff");
        assert_eq!(header(&r, "referrer-policy"), "no-referrer");
        assert_eq!(header(&r, "cache-control"), "no-store");
        assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
        let html = r.text().await.expect("html");
        assert!(html.contains(r#"<script type="module" src="/panel/assets/app.js">"#));
        assert!(!html.contains("style="), "no inline styles");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no other hosts"
        );
    }
    // `/` opens the panel; unknown panel paths get the panel's own HTML 404 page.
    let r = http.get(gw.site_url("/")).send().await.expect("root");
    assert_eq!(r.status(), 307);
    assert_eq!(header(&r, "location"), "/panel");
    for missing in [
        "/panel/nope",
        "/panel/keys/extra",
        "/panel/assets/missing.js",
    ] {
        let r = http.get(gw.site_url(missing)).send().await.expect("404");
        assert_eq!(r.status(), 404, "{missing}");
        assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
        assert_eq!(header(&r, "content-security-policy"), CSP);
        assert_eq!(header(&r, "cache-control"), "no-store");
        let html = r.text().await.expect("html");
        assert!(html.contains("Page not found"), "{html}");
        assert!(html.contains(r#"<script type="module" src="/panel/assets/app.js">"#));
    }
    // The API keeps its JSON 404.
    let r = http
        .get(gw.site_url("/api/nope"))
        .send()
        .await
        .expect("api 404");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "not_found");

    for (asset, ctype) in [
        ("/panel/assets/app.js", "text/javascript; charset=utf-8"),
        (
            "/panel/assets/security.js",
            "text/javascript; charset=utf-8",
        ),
        ("/panel/assets/panel.css", "text/css; charset=utf-8"),
        ("/panel/assets/icon.svg", "image/svg+xml"),
    ] {
        let r = http.get(gw.site_url(asset)).send().await.expect("asset");
        assert_eq!(r.status(), 200, "{asset}");
        assert_eq!(header(&r, "content-type"), ctype);
        assert_eq!(header(&r, "cache-control"), "public, max-age=300");
        assert_eq!(header(&r, "content-security-policy"), CSP);
        let body = r.text().await.expect("asset body");
        assert!(
            !body.contains("https://"),
            "{asset} loads nothing from elsewhere"
        );
    }

    // QR: refused without origin, session or CSRF.
    let qr = |origin: Option<&str>, cookie: Option<&str>, csrf: Option<&str>, body: Value| {
        let mut req = http.post(gw.site_url("/panel/qr")).json(&body);
        if let Some(o) = origin {
            req = req.header("origin", o.to_string());
        }
        if let Some(c) = cookie {
            req = req.header("cookie", c.to_string());
        }
        if let Some(t) = csrf {
            req = req.header("x-csrf-token", t.to_string());
        }
        req.send()
    };
    let origin = "http://127.0.0.1:8081";
    let r = qr(None, None, None, json!({"text": "x"}))
        .await
        .expect("qr");
    assert_eq!(r.status(), 403);
    let r = qr(Some(origin), None, None, json!({"text": "x"}))
        .await
        .expect("qr");
    assert_eq!(r.status(), 401);

    // Sign in by code from the file outbox.
    let email = "qr@example.com";
    let r = http
        .post(gw.site_url("/api/auth/request-code"))
        .header("origin", origin)
        .json(&json!({"email": email, "acceptedTerms": true}))
        .send()
        .await
        .expect("request-code");
    assert_eq!(r.status(), 200);
    let otp = cookies(&r);
    let code = outbox_code(&gw.outbox(), email);
    let r = http
        .post(gw.site_url("/api/auth/verify-code"))
        .header("origin", origin)
        .header("cookie", otp)
        .json(&json!({"email": email, "code": code}))
        .send()
        .await
        .expect("verify-code");
    assert_eq!(r.status(), 200);
    let cookie = cookies(&r);
    let s: Value = http
        .get(gw.site_url("/api/auth/session"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("session")
        .json()
        .await
        .expect("json");
    let csrf = s["csrfToken"].as_str().expect("csrf").to_string();

    let r = qr(Some(origin), Some(&cookie), None, json!({"text": "x"}))
        .await
        .expect("qr");
    assert_eq!(r.status(), 403, "no CSRF token");
    let r = qr(
        Some("http://evil.example"),
        Some(&cookie),
        Some(&csrf),
        json!({"text": "x"}),
    )
    .await
    .expect("qr");
    assert_eq!(r.status(), 403, "foreign origin");
    for bad in [
        json!({}),
        json!({"text": ""}),
        json!({"text": "x".repeat(1025)}),
    ] {
        let r = qr(Some(origin), Some(&cookie), Some(&csrf), bad)
            .await
            .expect("qr");
        assert_eq!(r.status(), 400);
    }
    let r = qr(
        Some(origin),
        Some(&cookie),
        Some(&csrf),
        json!({"text": "otpauth://totp/Gateway:qr%40example.com?secret=JBSWY3DPEHPK3PXP&issuer=Gateway"}),
    )
    .await
    .expect("qr");
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "image/svg+xml");
    assert_eq!(header(&r, "cache-control"), "no-store");
    assert_eq!(header(&r, "content-security-policy"), CSP);
    let svg = r.text().await.expect("svg");
    assert!(svg.contains("<svg") && svg.contains("<path"), "{svg}");
    let r = qr(
        Some(origin),
        Some(&cookie),
        Some(&csrf),
        json!({"text": "é".repeat(1024)}),
    )
    .await
    .expect("qr");
    assert_eq!(r.status(), 200, "1024 characters are accepted");
}

/// `name=value` pairs of every `Set-Cookie` that is not a deletion.
fn cookies(r: &reqwest::Response) -> String {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter(|c| !c.contains("Max-Age=0"))
        .filter_map(|c| c.split(';').next())
        .collect::<Vec<_>>()
        .join("; ")
}

fn outbox_code(dir: &Path, email: &str) -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("outbox")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    names.sort();
    names
        .iter()
        .rev()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter(|raw| raw.contains(email))
        .find_map(|raw| {
            raw.split("\r\n")
                .map(str::trim)
                .find(|l| l.len() == 6 && l.bytes().all(|b| b.is_ascii_digit()))
                .map(str::to_string)
        })
        .expect("a sign-in code in the outbox")
}

/// Why the browser test cannot run here, if it cannot.
fn browser_missing(root: &Path) -> Option<String> {
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !node {
        return Some("node is not installed".into());
    }
    if !Path::new("/usr/bin/chromium").exists() {
        return Some("/usr/bin/chromium is not installed".into());
    }
    if !root
        .join("tests/browser/node_modules/playwright-core")
        .exists()
    {
        return Some(
            "tests/browser/node_modules is missing (npm ci --prefix tests/browser)".into(),
        );
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn panel_in_headless_chromium() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if let Some(why) = browser_missing(&root) {
        eprintln!("SKIPPED panel_in_headless_chromium: {why}; run scripts/setup");
        return;
    }
    let sink = SmtpSink::start().await;
    let mock = Mock::start(&[]);
    // The browser sends the page's own origin, so site_origin must be the address the site
    // listens on: pick a free port, start, then pin the listener to it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let origin = format!("http://127.0.0.1:{port}");
    let mut gw = Gateway::start(
        &mock,
        Options {
            site_origin: Some(origin.clone()),
            mail_toml: Some(format!(
                "transport = \"smtp\"\nsmtp_url = \"{}\"\nfrom = \"Gateway <no-reply@example.test>\"",
                sink.url()
            )),
            extra_toml: format!("{ROOMY_SIGN_IN}{PAYMENT}"),
            ..Options::default()
        },
    );
    gw.terminate();
    let text = std::fs::read_to_string(&gw.config_path).expect("config");
    let text = text.replace(
        "site_listen = \"127.0.0.1:0\"",
        &format!("site_listen = \"127.0.0.1:{port}\""),
    );
    std::fs::write(&gw.config_path, text).expect("write config");
    gw.spawn();
    assert_eq!(gw.site, origin);

    // Every message the SMTP server receives becomes a .eml file the script can read.
    let mail_dir = gw.dir.path().join("smtp-dump");
    std::fs::create_dir_all(&mail_dir).expect("mail dir");
    let dump = {
        let mail_dir = mail_dir.clone();
        let messages = std::sync::Arc::new(sink);
        let m = messages.clone();
        tokio::spawn(async move {
            let mut written = 0;
            loop {
                let got = m.messages();
                for (i, msg) in got.iter().enumerate().skip(written) {
                    let path = mail_dir.join(format!("{i:04}.eml"));
                    let tmp = mail_dir.join(format!("{i:04}.tmp"));
                    if std::fs::write(&tmp, &msg.data).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                }
                written = got.len();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let shots = root.join("target/panel-screenshots");
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new("node")
            .arg(root.join("tests/browser/panel.mjs"))
            .arg(&gw.site)
            .arg(&gw.api)
            .arg(&mail_dir)
            .arg(&shots)
            .env("WEBHOOK_SECRET", WEBHOOK_SECRET)
            // For `gateway key create` (an operator's key beside the panel's global key).
            .env("GATEWAY_BIN", env!("CARGO_BIN_EXE_gateway"))
            .env("GATEWAY_CONFIG", &gw.config_path)
            .envs(gw.env.iter().cloned())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("browser script timed out")
    .expect("run node");
    dump.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        out.status.success() && stdout.contains("PANEL_OK"),
        "browser script failed:\n{stdout}\n{stderr}\ngateway log:\n{}",
        gw.log()
    );

    // The panel's developer requests were metered; its last key was revoked.
    let key = stdout
        .lines()
        .find_map(|l| l.strip_prefix("KEY="))
        .expect("the script prints the rotated key");
    assert!(key.starts_with("sk-"));
    let events = gw.wait_usage(2).await;
    assert!(events.len() >= 2, "{events:?}");
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 401, "revoked in the panel");
    for size in ["desktop", "mobile"] {
        for name in [
            "01-signin",
            "02-two-factor",
            "03-keys",
            "04-usage-24h",
            "04-usage-7d",
            "05-security-scan",
            "05-security-recovery",
            "05-security-on",
            "05-security-regenerated",
            "06-billing",
            "07-order",
            "08-paid",
            "09-cancelled",
            "10-overview",
            "11-terms",
            "12-not-found",
            "13-confirm",
            "14-revoked",
            "15-link-fresh-confirm",
            "15-link-fresh-signed-in",
            "16-link-same-confirm",
            "16-link-same-signed-in",
            "17-link-two-factor-confirm",
            "17-link-two-factor-signed-in",
        ] {
            assert!(
                shots.join(format!("{size}-{name}.png")).exists(),
                "screenshot {size}-{name}"
            );
        }
    }
}
