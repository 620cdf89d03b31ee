//! A browser for the site listener: a cookie jar kept by hand (so tests see every
//! `Set-Cookie`), the site's `Origin` on every mutation, the session's CSRF token once signed
//! in, and sign-in through the real email-code flow (the code read from the outbox). Also the
//! two-factor steps of the account's security settings and the TOTP codes they take.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use gateway_site::twofactor;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use super::Gateway;

/// The harness's `server.site_origin`.
pub const ORIGIN: &str = "http://127.0.0.1:8081";

/// One answer, read fully.
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text))
    }

    pub fn header(&self, name: &str) -> String {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("ascii header").to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The `Set-Cookie` line for cookie `name`, if any.
    pub fn set_cookie(&self, name: &str) -> Option<String> {
        self.headers
            .get_all("set-cookie")
            .iter()
            .map(|v| v.to_str().expect("ascii").to_string())
            .find(|c| c.starts_with(&format!("{name}=")))
    }

    /// `(status, code)` of a `{ok:false, code}` error, after checking its headers and shape.
    pub fn error(&self) -> (u16, String) {
        assert_eq!(
            self.header("content-type"),
            "application/json; charset=utf-8",
            "{}",
            self.text
        );
        assert_eq!(self.header("cache-control"), "no-store");
        let v = self.json();
        assert_eq!(v["ok"], json!(false), "{v}");
        assert_eq!(
            v.as_object().map(|o| o.len()),
            Some(2),
            "only ok and code: {v}"
        );
        (self.status, v["code"].as_str().expect("code").to_string())
    }

    /// The JSON of a 200 answer, after checking its headers and `ok: true`.
    pub fn ok_json(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.text);
        assert_eq!(
            self.header("content-type"),
            "application/json; charset=utf-8"
        );
        assert_eq!(self.header("cache-control"), "no-store");
        self.json()
    }
}

/// A browser on the site listener.
pub struct Browser {
    pub client: reqwest::Client,
    pub base: String,
    pub origin: String,
    pub jar: BTreeMap<String, String>,
    /// The session's CSRF token, sent as `x-csrf-token` on mutations once known.
    pub csrf: Option<String>,
}

impl Browser {
    pub fn new(gw: &Gateway) -> Browser {
        Browser::build(gw, ORIGIN, None)
    }

    /// A browser that sends `origin` on mutations and, with `local`, connects from that
    /// loopback address (per-address limits).
    pub fn build(gw: &Gateway, origin: &str, local: Option<IpAddr>) -> Browser {
        let mut b = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none());
        if let Some(ip) = local {
            b = b.local_address(ip);
        }
        Browser {
            client: b.build().expect("client"),
            base: gw.site.clone(),
            origin: origin.to_string(),
            jar: BTreeMap::new(),
            csrf: None,
        }
    }

    /// The jar's value of cookie `name`.
    pub fn cookie(&self, name: &str) -> Option<String> {
        self.jar.get(name).cloned()
    }

    /// The same session (cookies and CSRF token) on another gateway sharing the database.
    pub fn on(&self, gw: &Gateway) -> Browser {
        let mut b = Browser::new(gw);
        b.jar = self.jar.clone();
        b.csrf = self.csrf.clone();
        b
    }

    /// The `Cookie` header value of the jar.
    pub fn cookie_header(&self) -> String {
        self.jar
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub async fn send(&mut self, mut req: reqwest::RequestBuilder) -> Reply {
        if !self.jar.is_empty() {
            req = req.header("cookie", self.cookie_header());
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        for c in headers.get_all("set-cookie") {
            let c = c.to_str().expect("ascii");
            let (pair, attrs) = c.split_once(';').unwrap_or((c, ""));
            let (name, value) = pair.split_once('=').expect("cookie pair");
            if attrs.contains("Max-Age=0") {
                self.jar.remove(name);
            } else {
                self.jar.insert(name.to_string(), value.to_string());
            }
        }
        let text = resp.text().await.expect("body");
        Reply {
            status,
            headers,
            text,
        }
    }

    pub async fn get(&mut self, path: &str) -> Reply {
        let req = self.client.get(format!("{}{path}", self.base));
        self.send(req).await
    }

    /// A mutation with the site's `Origin` and the session's CSRF header.
    pub async fn post(&mut self, path: &str, body: &Value) -> Reply {
        self.post_with(path, body, &[]).await
    }

    /// `post` with header overrides: a name given here replaces the default (`origin`,
    /// `x-csrf-token`); an empty value means "do not send it".
    pub async fn post_with(&mut self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        let req = self.client.post(format!("{}{path}", self.base)).json(body);
        let req = self.decorate(req, headers);
        self.send(req).await
    }

    /// A form POST (`application/x-www-form-urlencoded`) with the site's `Origin`.
    pub async fn post_form(&mut self, path: &str, form: &[(&str, &str)]) -> Reply {
        let req = self
            .client
            .post(format!("{}{path}", self.base))
            .header("origin", &self.origin)
            .form(form);
        self.send(req).await
    }

    pub async fn delete(&mut self, path: &str) -> Reply {
        self.delete_with(path, &[]).await
    }

    pub async fn delete_with(&mut self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let req = self.client.delete(format!("{}{path}", self.base));
        let req = self.decorate(req, headers);
        self.send(req).await
    }

    fn decorate(
        &self,
        mut req: reqwest::RequestBuilder,
        headers: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let given = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        if !given("origin") {
            req = req.header("origin", &self.origin);
        }
        if let (false, Some(csrf)) = (given("x-csrf-token"), &self.csrf) {
            req = req.header("x-csrf-token", csrf);
        }
        for (k, v) in headers {
            if !v.is_empty() {
                req = req.header(*k, *v);
            }
        }
        req
    }

    /// Signs in with the emailed code (and `two_factor` when given); afterwards the browser
    /// carries the session cookie and its CSRF token. Returns the verify-code answer.
    pub async fn sign_in_with(
        &mut self,
        gw: &Gateway,
        email: &str,
        two_factor: Option<&str>,
    ) -> Reply {
        self.post(
            "/api/auth/request-code",
            &json!({ "email": email, "acceptedTerms": true }),
        )
        .await
        .ok_json();
        let code = latest_code(gw, email);
        let mut body = json!({ "email": email, "code": code });
        if let Some(t) = two_factor {
            body["twoFactorCode"] = json!(t);
        }
        let r = self.post("/api/auth/verify-code", &body).await;
        if r.status == 200 {
            let s = self.get("/api/auth/session").await.ok_json();
            self.csrf = s["csrfToken"].as_str().map(str::to_string);
        }
        r
    }

    pub async fn sign_in(&mut self, gw: &Gateway, email: &str) {
        let r = self.sign_in_with(gw, email, None).await;
        assert_eq!(r.status, 200, "sign-in failed: {}", r.text);
    }
}

/// A signed-in browser for `email` (the account is created on first sign-in).
pub async fn signed_in(gw: &Gateway, email: &str) -> Browser {
    let mut b = Browser::new(gw);
    b.sign_in(gw, email).await;
    b
}

/// Every mail to `email` in the outbox, raw and oldest first (none when nothing was sent).
pub fn outbox_mails(gw: &Gateway, email: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(gw.outbox()) else {
        return vec![];
    };
    let mut names: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "eml"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("read eml"))
        .filter(|raw| raw.contains(&format!("\r\nTo: {email}\r\n")))
        .collect()
}

/// The code of the newest sign-in mail to `email` in the outbox.
pub fn latest_code(gw: &Gateway, email: &str) -> String {
    outbox_mails(gw, email)
        .pop()
        .and_then(|raw| {
            raw.split("\r\n")
                .map(str::trim)
                .find(|l| l.len() == 6 && l.bytes().all(|b| b.is_ascii_digit()))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no sign-in mail with a code to {email}"))
}

/// Seconds since the Unix epoch (a TOTP code changes every 30 of them).
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A 6-digit code that is none of `secret`'s TOTP codes valid around now (the previous, the
/// current and the next time step).
pub fn wrong_totp(secret: &str) -> String {
    let now = now_s();
    let valid: Vec<String> = [now - 30, now, now + 30]
        .iter()
        .map(|t| twofactor::code_at(secret, *t).expect("code"))
        .collect();
    (0..1_000_000u32)
        .map(|n| format!("{n:06}"))
        .find(|c| !valid.contains(c))
        .expect("a wrong code")
}

/// The `security` object of `GET /api/account/security`, after checking the answer is `ok`.
pub async fn security(b: &mut Browser) -> Value {
    b.get("/api/account/security").await.ok_json()["security"].clone()
}

/// Asks to turn two-factor on (`{"twoFactorEnabled": true}`, no code): the answer, checked
/// `ok`. When off, it starts an enrolment whose pending secret is `security.totpSecret`.
pub async fn request_two_factor(b: &mut Browser) -> Value {
    two_factor_without_code(b, true).await.ok_json()
}

/// Sends `{"twoFactorEnabled": enabled}` with no code. The answer, unchecked.
pub async fn two_factor_without_code(b: &mut Browser, enabled: bool) -> Reply {
    b.post(
        "/api/account/security",
        &json!({ "twoFactorEnabled": enabled }),
    )
    .await
}

/// Sends `{"twoFactorEnabled": enabled, "twoFactorCode": code}`: confirms a pending enrolment
/// (`true`) or turns two-factor off (`false`). The answer, unchecked.
pub async fn two_factor_with_code(b: &mut Browser, enabled: bool, code: &str) -> Reply {
    b.post(
        "/api/account/security",
        &json!({"twoFactorEnabled": enabled, "twoFactorCode": code}),
    )
    .await
}

/// The recovery codes of the answer that confirmed an enrolment.
pub fn recovery_codes(v: &Value) -> Vec<String> {
    v["recoveryCodes"]
        .as_array()
        .expect("recoveryCodes")
        .iter()
        .map(|c| c.as_str().expect("code").to_string())
        .collect()
}
