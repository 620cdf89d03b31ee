//! Website sign-in through the real server: email code and magic link, sessions, CSRF and
//! origin checks, every gate, captcha, two-factor, cookie flags, and real SMTP delivery.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::config::ROOMY_SIGN_IN;
use common::site::{now_s, outbox_mails, wrong_totp, Browser, ORIGIN};
use common::smtp::SmtpSink;
use common::*;
use gateway_core::storage::Db;
use gateway_site::twofactor;
use serde_json::{json, Value};

/// A sign-in mail from the outbox (or the SMTP sink).
#[derive(Debug)]
struct Mail {
    raw: String,
    code: String,
    token: String,
}

fn parse_mail(raw: &str, origin: &str) -> Mail {
    let code = raw
        .split("\r\n")
        .map(str::trim)
        .find(|l| l.len() == 6 && l.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or_else(|| panic!("no standalone code in {raw}"))
        .to_string();
    let prefix = format!("{origin}/api/auth/verify-link?token=");
    let at = raw
        .find(&prefix)
        .unwrap_or_else(|| panic!("no link in {raw}"))
        + prefix.len();
    let token: String = raw[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    assert_eq!(token.len(), 43, "32 bytes base64url");
    Mail {
        raw: raw.to_string(),
        code,
        token,
    }
}

/// Every `.eml` in the outbox addressed to `email`, oldest first.
fn mails_to(gw: &Gateway, email: &str) -> Vec<Mail> {
    outbox_mails(gw, email)
        .iter()
        .map(|raw| parse_mail(raw, ORIGIN))
        .collect()
}

fn latest_mail(gw: &Gateway, email: &str) -> Mail {
    mails_to(gw, email)
        .pop()
        .unwrap_or_else(|| panic!("no mail to {email}"))
}

fn request_body(email: &str) -> Value {
    json!({ "email": email, "acceptedTerms": true })
}

/// Requests a code and signs in with it; returns the verify-code answer.
async fn sign_in(gw: &Gateway, b: &mut Browser, email: &str) -> Value {
    b.post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let mail = latest_mail(gw, email);
    b.post(
        "/api/auth/verify-code",
        &json!({ "email": email, "code": mail.code }),
    )
    .await
    .ok_json()
}

/// A different 6-digit code.
fn wrong(code: &str) -> String {
    format!(
        "{:06}",
        (code.parse::<u32>().expect("digits") + 1) % 1_000_000
    )
}

async fn session_rows(db: &Db, email: &str) -> i64 {
    use sqlx::Row;
    sqlx::query(
        "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM auth_sessions s JOIN users u \
         ON u.id = s.user_id WHERE u.email = $1",
    )
    .bind(email)
    .fetch_one(&db.pool)
    .await
    .expect("count")
    .try_get("n")
    .expect("n")
}

#[tokio::test]
async fn code_flow_signs_in_and_out() {
    let (_mock, gw) = config::start_with_toml(ROOMY_SIGN_IN);
    let mut b = Browser::new(&gw);

    let r = b.get("/api/auth/session").await;
    assert_eq!(r.ok_json(), Value::Null);
    assert!(r.header("vary").contains("Cookie"));
    let cfg = b.get("/api/auth/config").await.ok_json();
    assert_eq!(cfg["ok"], json!(true));
    assert_eq!(cfg["captchaSiteKey"], Value::Null);

    let r = b
        .post(
            "/api/auth/request-code",
            &request_body("  New.User@Example.COM "),
        )
        .await;
    let v = r.ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "email": "new.user@example.com", "expiresIn": 600, "requiresCode": true})
    );
    assert!(r.header("vary").contains("Origin"));
    let otp = r.set_cookie("gw_otp").expect("otp cookie");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(otp.contains(attr), "{otp}");
    }
    assert!(!otp.contains("Secure"), "{otp}");

    // The mail: both parts, the code on its own line, the link to the site origin.
    let email = "new.user@example.com";
    let mail = latest_mail(&gw, email);
    assert!(mail.raw.contains("multipart/alternative"));
    assert!(mail.raw.contains("text/plain"));
    assert!(mail.raw.contains("text/html"));
    assert!(
        mail.raw.matches(&mail.code).count() >= 2,
        "code in both parts"
    );
    assert!(
        mail.raw.matches(&mail.token).count() >= 2,
        "link in both parts"
    );

    // The code belongs to this address and this browser.
    let (s, c) = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": "other@example.com", "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    let mut stranger = Browser::new(&gw);
    let (s, c) = stranger
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));

    let otp_value = b.cookie("gw_otp").expect("otp in jar");
    let r = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": "New.User@example.com", "code": mail.code}),
        )
        .await;
    let v = r.ok_json();
    assert_eq!(v["ok"], json!(true));
    assert_eq!(v["session"]["user"]["email"], json!(email));
    assert!(v["session"]["expires"]
        .as_str()
        .expect("expires")
        .ends_with('Z'));
    let cookie = r.set_cookie("gw_session").expect("session cookie");
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/", "Max-Age="] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(!cookie.contains("Secure"));
    assert!(r
        .set_cookie("gw_otp")
        .expect("otp cleared")
        .contains("Max-Age=0"));

    // First sign-in created the user with the default tier and recorded the login.
    let db = gw.db().await;
    let user = db
        .users()
        .find_by_email(email)
        .await
        .expect("query")
        .expect("user created");
    assert!(user.last_login_at.is_some());
    assert_eq!(user.manual_tier.as_str(), "beginner");

    let s = b.get("/api/auth/session").await.ok_json();
    assert_eq!(s["user"]["email"], json!(email));
    assert!(s["expires"].is_string());
    let csrf = s["csrfToken"].as_str().expect("csrf").to_string();

    // A used code is spent, even with the OTP cookie that asked for it.
    let mut replay = Browser::new(&gw);
    replay.jar.insert("gw_otp".into(), otp_value);
    let (s, c) = replay
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));

    // Signout: origin, then CSRF, then the session is gone server-side.
    let (s, c) = b
        .post_with(
            "/api/auth/signout",
            &json!({}),
            &[("origin", "https://evil.example")],
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "invalid_origin"));
    let (s, c) = b.post("/api/auth/signout", &json!({})).await.error();
    assert_eq!((s, c.as_str()), (403, "invalid_csrf"));
    let (s, c) = b
        .post_with(
            "/api/auth/signout",
            &json!({}),
            &[("x-csrf-token", "forged")],
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "invalid_csrf"));
    assert_eq!(session_rows(&db, email).await, 1);
    let stolen = b.cookie("gw_session").expect("session");
    let r = b
        .post_with("/api/auth/signout", &json!({}), &[("x-csrf-token", &csrf)])
        .await;
    assert_eq!(r.ok_json(), json!({"ok": true}));
    assert!(r
        .set_cookie("gw_session")
        .expect("cleared")
        .contains("Max-Age=0"));
    assert!(r
        .set_cookie("gw_otp")
        .expect("cleared")
        .contains("Max-Age=0"));
    assert_eq!(session_rows(&db, email).await, 0);
    let mut thief = Browser::new(&gw);
    thief.jar.insert("gw_session".into(), stolen);
    assert_eq!(thief.get("/api/auth/session").await.ok_json(), Value::Null);

    // The token is also accepted as the JSON field `csrfToken`; a new sign-in is a new session.
    sign_in(&gw, &mut b, email).await;
    let s = b.get("/api/auth/session").await.ok_json();
    let r = b
        .post("/api/auth/signout", &json!({"csrfToken": s["csrfToken"]}))
        .await;
    assert_eq!(r.ok_json(), json!({"ok": true}));
    assert_eq!(session_rows(&db, email).await, 0);
}

#[tokio::test]
async fn magic_link_needs_a_post() {
    let (_mock, gw) = config::start_with_toml(ROOMY_SIGN_IN);
    let email = "linker@example.com";
    let mut asker = Browser::new(&gw);
    asker
        .post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let mail = latest_mail(&gw, email);

    // Opening the link (a person or a mail scanner) shows a form and signs nobody in.
    let mut other = Browser::new(&gw);
    let path = format!("/api/auth/verify-link?token={}", mail.token);
    for _ in 0..2 {
        let r = other.get(&path).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
        assert_eq!(r.header("cache-control"), "no-store");
        let csp = r.header("content-security-policy");
        assert!(csp.contains("default-src 'none'") && csp.contains("form-action 'self'"));
        // Browsers send `Origin: null` for a form POST from a page under `no-referrer`, a
        // `sandbox` CSP or a `rel=noreferrer` form, and the same-origin check refuses it.
        assert_eq!(r.header("referrer-policy"), "strict-origin");
        assert!(!csp.contains("sandbox"), "{csp}");
        assert!(!r.text.contains("noreferrer"), "{}", r.text);
        assert!(r.header("set-cookie").is_empty());
        assert!(r.text.contains("method=\"post\""));
        assert!(r.text.contains(&format!("value=\"{}\"", mail.token)));
    }
    assert_eq!(other.get("/api/auth/session").await.ok_json(), Value::Null);
    let (s, c) = other.get("/api/auth/verify-link").await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_link"));

    // The form's POST (another browser than the one that asked) signs in and redirects.
    let (s, c) = other
        .post_with(
            "/api/auth/verify-link",
            &json!({"token": mail.token}),
            &[("origin", "https://evil.example")],
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "invalid_origin"));
    let r = other
        .post_form(
            "/api/auth/verify-link",
            &[("token", &mail.token), ("twoFactorCode", "")],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.text);
    assert_eq!(r.header("location"), "/panel/keys");
    assert_eq!(r.header("cache-control"), "no-store");
    assert!(r.set_cookie("gw_session").is_some());
    let s = other.get("/api/auth/session").await.ok_json();
    assert_eq!(s["user"]["email"], json!(email));

    // Single use, for the link and for the code of the same challenge.
    let mut third = Browser::new(&gw);
    let (s, c) = third
        .post_form("/api/auth/verify-link", &[("token", &mail.token)])
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_link"));
    let (s, c) = asker
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));

    // Token in a JSON body, and in the query string.
    asker
        .post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let t = latest_mail(&gw, email).token;
    let r = third
        .post("/api/auth/verify-link", &json!({"token": t}))
        .await;
    assert_eq!(
        (r.status, r.header("location")),
        (303, "/panel/keys".to_string())
    );
    asker
        .post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let t = latest_mail(&gw, email).token;
    let mut fourth = Browser::new(&gw);
    let r = fourth
        .post(&format!("/api/auth/verify-link?token={t}"), &json!({}))
        .await;
    assert_eq!(r.status, 303, "{}", r.text);

    // Unknown and malformed tokens.
    let unknown = "A".repeat(43);
    for token in [unknown.as_str(), "short", ""] {
        let (s, c) = fourth
            .post("/api/auth/verify-link", &json!({"token": token}))
            .await
            .error();
        assert_eq!((s, c.as_str()), (400, "invalid_link"), "{token:?}");
    }
}

#[tokio::test]
async fn codes_and_links_expire() {
    let (_mock, gw) = config::start_with_toml(&format!(
        "{ROOMY_SIGN_IN}\n[auth]\ncode_ttl_seconds = 1\nlink_ttl_seconds = 1\n"
    ));
    let email = "late@example.com";
    let mut b = Browser::new(&gw);
    let v = b
        .post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    assert_eq!(v["expiresIn"], json!(1));
    let mail = latest_mail(&gw, email);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let (s, c) = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "code_expired"));
    let (s, c) = b
        .post_form("/api/auth/verify-link", &[("token", &mail.token)])
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "link_expired"));
}

#[tokio::test]
async fn five_wrong_codes_lock_the_challenge() {
    let (_mock, gw) = config::start_with_toml(ROOMY_SIGN_IN);
    let email = "guesser@example.com";
    let mut b = Browser::new(&gw);
    b.post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let mail = latest_mail(&gw, email);
    for _ in 0..5 {
        let (s, c) = b
            .post(
                "/api/auth/verify-code",
                &json!({"email": email, "code": wrong(&mail.code)}),
            )
            .await
            .error();
        assert_eq!((s, c.as_str()), (400, "invalid_code"));
    }
    let (s, c) = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (429, "too_many_attempts"));
}

#[tokio::test]
async fn resend_replaces_code_and_link() {
    let (_mock, gw) = config::start_with_toml(ROOMY_SIGN_IN);
    let email = "again@example.com";
    let mut b = Browser::new(&gw);

    let (s, c) = b.post("/api/auth/resend-code", &json!({})).await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"), "no challenge yet");

    b.post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let first = latest_mail(&gw, email);
    let r = b.post("/api/auth/resend-code", &json!({})).await;
    assert_eq!(
        r.ok_json(),
        json!({"ok": true, "email": email, "expiresIn": 600, "requiresCode": true})
    );
    assert!(r.set_cookie("gw_otp").is_some(), "cookie refreshed");
    let mails = mails_to(&gw, email);
    assert_eq!(mails.len(), 2);
    let second = &mails[1];
    assert_ne!(first.token, second.token);

    if first.code != second.code {
        let (s, c) = b
            .post(
                "/api/auth/verify-code",
                &json!({"email": email, "code": first.code}),
            )
            .await
            .error();
        assert_eq!((s, c.as_str()), (400, "invalid_code"));
    }
    let (s, c) = Browser::new(&gw)
        .post_form("/api/auth/verify-link", &[("token", &first.token)])
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_link"));
    let v = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": second.code}),
        )
        .await
        .ok_json();
    assert_eq!(v["session"]["user"]["email"], json!(email));

    // The challenge is used: nothing left to resend.
    let (s, c) = b.post("/api/auth/resend-code", &json!({})).await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
}

/// A request body, extra headers, and the expected status and code.
type GateCase = (Value, Vec<(&'static str, &'static str)>, u16, &'static str);

#[tokio::test]
async fn request_gates_and_rate_limits() {
    let (_mock, gw) = config::start_with_toml(
        r#"
[auth]
blocked_domains = ["blocked.example"]
private_beta = true
beta_allowlist = ["vip@example.com", "@team.example"]

[limits]
request_code_per_hour = 3
"#,
    );
    let mut b = Browser::new(&gw);
    let cases: Vec<GateCase> = vec![
        (
            request_body("vip@example.com"),
            vec![("origin", "")],
            403,
            "invalid_origin",
        ),
        (
            request_body("vip@example.com"),
            vec![("origin", "https://evil.example")],
            403,
            "invalid_origin",
        ),
        (
            request_body("vip@example.com"),
            vec![("origin", ""), ("sec-fetch-site", "cross-site")],
            403,
            "invalid_origin",
        ),
        (
            json!({"email": "vip@example.com"}),
            vec![],
            400,
            "terms_required",
        ),
        (
            json!({"email": "vip@example.com", "acceptedTerms": "yes"}),
            vec![],
            400,
            "terms_required",
        ),
        (request_body("not-an-email"), vec![], 400, "invalid_email"),
        (json!({"acceptedTerms": true}), vec![], 400, "invalid_email"),
        (
            request_body("x@blocked.example"),
            vec![],
            403,
            "blocked_domain",
        ),
        (
            request_body("x@mail.blocked.example"),
            vec![],
            403,
            "blocked_domain",
        ),
        (
            request_body("outsider@example.com"),
            vec![],
            403,
            "private_beta_only",
        ),
    ];
    for (body, headers, status, code) in cases {
        let r = b.post_with("/api/auth/request-code", &body, &headers).await;
        assert_eq!(r.error(), (status, code.to_string()), "{body}");
    }
    let (s, c) = b
        .post_with(
            "/api/auth/request-code",
            &json!("not an object"),
            &[("content-type", "application/json")],
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "terms_required"));

    // Allowed by address and by @domain; without Origin, Sec-Fetch-Site: same-origin passes.
    b.post_with(
        "/api/auth/request-code",
        &request_body("vip@example.com"),
        &[("origin", ""), ("sec-fetch-site", "same-origin")],
    )
    .await
    .ok_json();
    b.post("/api/auth/request-code", &request_body("a@team.example"))
        .await
        .ok_json();
    b.post("/api/auth/request-code", &request_body("b@team.example"))
        .await
        .ok_json();
    // Per client address: the fourth request from 127.0.0.1 this hour.
    let (s, c) = b
        .post("/api/auth/request-code", &request_body("c@team.example"))
        .await
        .error();
    assert_eq!((s, c.as_str()), (429, "rate_limited"));

    // Per address: one email from three other client addresses, then a fourth.
    for last in 2..=4u8 {
        let mut from = Browser::build(&gw, ORIGIN, Some(IpAddr::from([127, 0, 0, last])));
        from.post("/api/auth/request-code", &request_body("d@team.example"))
            .await
            .ok_json();
    }
    let mut from = Browser::build(&gw, ORIGIN, Some(IpAddr::from([127, 0, 0, 5])));
    let (s, c) = from
        .post("/api/auth/request-code", &request_body("d@team.example"))
        .await
        .error();
    assert_eq!((s, c.as_str()), (429, "rate_limited"));
    // Resends count too.
    let (s, c) = b.post("/api/auth/resend-code", &json!({})).await.error();
    assert_eq!((s, c.as_str()), (429, "rate_limited"));

    // verify-code's own checks.
    let mut fresh = Browser::new(&gw);
    for (body, headers, status, code) in [
        (
            json!({"email": "vip@example.com", "code": "123456"}),
            vec![("origin", "https://evil.example")],
            403,
            "invalid_origin",
        ),
        (
            json!({"email": "nope", "code": "123456"}),
            vec![],
            400,
            "invalid_email",
        ),
        (
            json!({"email": "vip@example.com", "code": "123456"}),
            vec![],
            400,
            "invalid_code",
        ),
    ] {
        let r = fresh
            .post_with("/api/auth/verify-code", &body, &headers)
            .await;
        assert_eq!(r.error(), (status, code.to_string()), "{body}");
    }
    // resend-code checks the origin too.
    let (s, c) = b
        .post_with("/api/auth/resend-code", &json!({}), &[("origin", "")])
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "invalid_origin"));
}

/// A Turnstile-compatible siteverify stub: `success` exactly when the token is "good".
async fn captcha_stub() -> (String, Arc<Mutex<Vec<HashMap<String, String>>>>) {
    let seen: Arc<Mutex<Vec<HashMap<String, String>>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/siteverify",
        axum::routing::post(move |body: String| {
            let record = record.clone();
            async move {
                let form: HashMap<String, String> = form_urlencoded::parse(body.as_bytes())
                    .into_owned()
                    .collect();
                let ok = form.get("response").map(String::as_str) == Some("good");
                record.lock().expect("lock").push(form);
                axum::Json(json!({ "success": ok }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/siteverify"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captcha_is_verified() {
    let (url, seen) = captcha_stub().await;
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            extra_toml: format!(
                "{ROOMY_SIGN_IN}\n[auth]\ncaptcha_required = true\ncaptcha_verify_url = \"{url}\"\n\
                 captcha_site_key = \"site-key-1\"\n"
            ),
            env: vec![("GATEWAY_CAPTCHA_SECRET".into(), "captcha-secret".into())],
            ..Options::default()
        },
    );
    let mut b = Browser::new(&gw);
    let cfg = b.get("/api/auth/config").await.ok_json();
    assert_eq!(cfg["captchaSiteKey"], json!("site-key-1"));

    let email = "human@example.com";
    let (s, c) = b
        .post("/api/auth/request-code", &request_body(email))
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "captcha_required"));
    let (s, c) = b
        .post(
            "/api/auth/request-code",
            &json!({"email": email, "acceptedTerms": true, "captchaToken": "bad"}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "captcha_failed"));
    b.post(
        "/api/auth/request-code",
        &json!({"email": email, "acceptedTerms": true, "captchaToken": "good"}),
    )
    .await
    .ok_json();
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 2);
        let last = &seen[1];
        assert_eq!(last["secret"], "captcha-secret");
        assert_eq!(last["response"], "good");
        assert_eq!(last["remoteip"], "127.0.0.1");
    }
    let (s, c) = b.post("/api/auth/resend-code", &json!({})).await.error();
    assert_eq!((s, c.as_str()), (400, "captcha_required"));
    b.post("/api/auth/resend-code", &json!({"captchaToken": "good"}))
        .await
        .ok_json();
    let mail = latest_mail(&gw, email);
    b.post(
        "/api/auth/verify-code",
        &json!({"email": email, "code": mail.code}),
    )
    .await
    .ok_json();
}

#[tokio::test]
async fn missing_configuration_is_named() {
    let mock = Mock::start(&[]);
    let email = request_body("someone@example.com");

    let no_secret = Gateway::start(
        &mock,
        Options {
            env: vec![("GATEWAY_SESSION_SECRET".into(), String::new())],
            ..Options::default()
        },
    );
    let mut b = Browser::new(&no_secret);
    for path in [
        "/api/auth/request-code",
        "/api/auth/resend-code",
        "/api/auth/verify-code",
        "/api/auth/verify-link",
    ] {
        let (s, c) = b.post(path, &email).await.error();
        assert_eq!((s, c.as_str()), (503, "auth_not_configured"), "{path}");
    }
    assert_eq!(b.get("/api/auth/session").await.ok_json(), Value::Null);
    drop(no_secret);

    let no_mail = Gateway::start(
        &mock,
        Options {
            mail_toml: Some(String::new()),
            ..Options::default()
        },
    );
    let (s, c) = Browser::new(&no_mail)
        .post("/api/auth/request-code", &email)
        .await
        .error();
    assert_eq!((s, c.as_str()), (503, "email_not_configured"));
    drop(no_mail);

    let no_captcha = Gateway::start(
        &mock,
        Options::with_toml("\n[auth]\ncaptcha_required = true\n"),
    );
    let (s, c) = Browser::new(&no_captcha)
        .post("/api/auth/request-code", &email)
        .await
        .error();
    assert_eq!((s, c.as_str()), (503, "captcha_not_configured"));
}

#[tokio::test]
async fn two_factor_is_required_when_on() {
    let (_mock, gw) = config::start_with_toml(ROOMY_SIGN_IN);
    let email = "careful@example.com";
    let mut b = Browser::new(&gw);
    sign_in(&gw, &mut b, email).await;
    let db = gw.db().await;
    let user = db
        .users()
        .find_by_email(email)
        .await
        .expect("query")
        .expect("user");
    let setup = twofactor::generate(email);
    assert!(setup.otpauth_url.starts_with("otpauth://totp/"));
    db.auth()
        .set_two_factor(&user.id, Some(&setup.secret), gateway_core::util::now_ms())
        .await
        .expect("2fa on");

    // Code flow: required, wrong, right — the emailed code stays usable until it all passes.
    b.post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let mail = latest_mail(&gw, email);
    let (s, c) = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (401, "two_factor_code_required"));
    let (s, c) = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code, "twoFactorCode": wrong_totp(&setup.secret)}),
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    let totp = twofactor::code_at(&setup.secret, now_s()).expect("totp");
    let v = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code, "twoFactorCode": totp}),
        )
        .await
        .ok_json();
    assert_eq!(v["session"]["user"]["email"], json!(email));

    // Link flow.
    b.post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let mail = latest_mail(&gw, email);
    let mut other = Browser::new(&gw);
    let (s, c) = other
        .post_form("/api/auth/verify-link", &[("token", &mail.token)])
        .await
        .error();
    assert_eq!((s, c.as_str()), (401, "two_factor_code_required"));
    let bad = wrong_totp(&setup.secret);
    let (s, c) = other
        .post_form(
            "/api/auth/verify-link",
            &[("token", &mail.token), ("twoFactorCode", &bad)],
        )
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    // The code flow used this step's code; a code is accepted once, so the next step's.
    let totp = twofactor::code_at(&setup.secret, now_s() + 30).expect("totp");
    let r = other
        .post_form(
            "/api/auth/verify-link",
            &[("token", &mail.token), ("twoFactorCode", &totp)],
        )
        .await;
    assert_eq!(r.status, 303, "{}", r.text);

    // Off again: the emailed code alone suffices.
    db.auth()
        .set_two_factor(&user.id, None, gateway_core::util::now_ms())
        .await
        .expect("2fa off");
    sign_in(&gw, &mut b, email).await;
}

#[tokio::test]
async fn https_origin_gets_host_prefixed_secure_cookies() {
    let mock = Mock::start(&[]);
    let origin = "https://gw.example.test";
    let gw = Gateway::start(
        &mock,
        Options {
            site_origin: Some(origin.into()),
            extra_toml: ROOMY_SIGN_IN.into(),
            ..Options::default()
        },
    );
    let email = "secure@example.com";
    let mut b = Browser::build(&gw, origin, None);
    let r = b.post("/api/auth/request-code", &request_body(email)).await;
    r.ok_json();
    let otp = r.set_cookie("__Host-gw_otp").expect("prefixed otp cookie");
    for attr in ["Secure", "HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(otp.contains(attr), "{otp}");
    }
    assert!(!otp.contains("Domain"), "__Host- cookies carry no Domain");
    let raw = std::fs::read_dir(gw.outbox())
        .expect("outbox")
        .filter_map(|e| e.ok())
        .map(|e| std::fs::read_to_string(e.path()).expect("eml"))
        .find(|m| m.contains(&format!("To: {email}")))
        .expect("mail");
    let mail = parse_mail(&raw, origin);

    let r = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await;
    r.ok_json();
    let cookie = r
        .set_cookie("__Host-gw_session")
        .expect("prefixed session cookie");
    assert!(
        cookie.contains("Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let s = b.get("/api/auth/session").await.ok_json();
    assert_eq!(s["user"]["email"], json!(email));

    // The unprefixed name means nothing on an https site.
    let id = b.cookie("__Host-gw_session").expect("cookie");
    let mut plain = Browser::build(&gw, origin, None);
    plain.jar.insert("gw_session".into(), id);
    assert_eq!(plain.get("/api/auth/session").await.ok_json(), Value::Null);
    // And the http origin is now foreign.
    let (s, c) = b
        .post_with("/api/auth/signout", &json!({}), &[("origin", ORIGIN)])
        .await
        .error();
    assert_eq!((s, c.as_str()), (403, "invalid_origin"));
}

#[tokio::test]
async fn sessions_end_when_idle_or_expired() {
    let (_mock, gw) = config::start_with_toml(ROOMY_SIGN_IN);
    let db = gw.db().await;
    let email = "sleepy@example.com";
    let mut b = Browser::new(&gw);

    sign_in(&gw, &mut b, email).await;
    let first = b.cookie("gw_session").expect("cookie");
    // Signing in again replaces the session: new id, the old one deleted.
    sign_in(&gw, &mut b, email).await;
    let second = b.cookie("gw_session").expect("cookie");
    assert_ne!(first, second);
    assert_eq!(session_rows(&db, email).await, 1);

    // Idle for longer than session_idle (default 168 h).
    let idle_ms: i64 = 168 * 3600 * 1000;
    sqlx::query("UPDATE auth_sessions SET last_seen_at = last_seen_at - $1")
        .bind(idle_ms + 1000)
        .execute(&db.pool)
        .await
        .expect("age");
    assert_eq!(b.get("/api/auth/session").await.ok_json(), Value::Null);
    assert!(b.cookie("gw_session").is_none(), "stale cookie cleared");
    assert_eq!(session_rows(&db, email).await, 0);

    // Past the absolute expiry.
    sign_in(&gw, &mut b, email).await;
    assert!(b.get("/api/auth/session").await.ok_json().is_object());
    sqlx::query("UPDATE auth_sessions SET expires_at = $1")
        .bind(gateway_core::util::now_ms() - 1)
        .execute(&db.pool)
        .await
        .expect("expire");
    assert_eq!(b.get("/api/auth/session").await.ok_json(), Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smtp_delivery_end_to_end() {
    let sink = SmtpSink::start().await;
    let mock = Mock::start(&[]);
    let gw = Gateway::start(
        &mock,
        Options {
            mail_toml: Some(format!(
                "transport = \"smtp\"\nsmtp_url = \"{}\"\nfrom = \"Gateway <no-reply@example.test>\"",
                sink.url()
            )),
            extra_toml: ROOMY_SIGN_IN.into(),
            ..Options::default()
        },
    );
    let email = "smtp-user@example.com";
    let mut b = Browser::new(&gw);
    b.post("/api/auth/request-code", &request_body(email))
        .await
        .ok_json();
    let got = sink.wait_for(1).await;
    assert_eq!(got[0].from, "no-reply@example.test");
    assert_eq!(got[0].to, vec![email.to_string()]);
    assert!(got[0].data.contains("Subject: Your sign-in code"));
    assert!(got[0].data.contains("text/plain") && got[0].data.contains("text/html"));
    let mail = parse_mail(&got[0].data, ORIGIN);
    assert!(!gw.outbox().exists(), "nothing in the file outbox");
    let v = b
        .post(
            "/api/auth/verify-code",
            &json!({"email": email, "code": mail.code}),
        )
        .await
        .ok_json();
    assert_eq!(v["session"]["user"]["email"], json!(email));
}
