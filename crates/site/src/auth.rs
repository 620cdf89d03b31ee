//! `/api/auth`: website sign-in by emailed code or magic link (spec §4.2, CONTRACT §3).
//!
//! The flow: `request-code` checks the gates, stores a challenge (a 6-digit code and a 32-byte
//! link token, both only as keyed digests), mails both, and binds the challenge to the asking
//! browser with a signed OTP cookie. `verify-code` (that browser, with the code) or
//! `POST verify-link` (any browser, with the token) consumes the challenge once, asks for the
//! TOTP code when the account has two-factor on, creates the user on first sign-in and starts a
//! new session. `GET verify-link` only shows a confirmation form, so mail scanners that fetch
//! links cannot use them up.
//!
//! No endpoint looks at whether an account exists before the emailed secret has been proven,
//! so answers and timing are the same for known and unknown addresses.

use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use rand::Rng;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use super::captcha::{self, CaptchaError};
use super::csrf::{check_origin, check_token};
use super::error::SiteError;
use super::mail::{self, html_escape, MailError, SignInMail};
use super::session::{
    clear_cookie, current_session, end_session, is_token_shaped, persistence, random_token,
    read_cookie, set_cookie, start_session, AuthKey, SessionInfo, OTP_COOKIE, SESSION_COOKIE,
};
use super::twofactor;
use gateway_core::config::{AuthConfig, Config};
use gateway_core::domain::normalize_email;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::{ChallengeRecord, ChallengeSecrets, StoreError};
use gateway_core::util::{new_id, now_ms};

/// Wrong codes a challenge tolerates before every further try is `too_many_attempts`.
pub const MAX_ATTEMPTS: i64 = 5;
/// `limits.request_code_per_hour` is enforced over a sliding hour.
const RATE_WINDOW_MS: i64 = 3_600_000;
/// Expired challenges stay this long so a late resend can still reach them.
const CHALLENGE_GRACE: Duration = Duration::from_secs(3600);
/// Where a magic link lands after signing in.
const AFTER_SIGN_IN: &str = "/panel/keys";
/// Sign-in bodies are a few short fields.
const MAX_BODY: usize = 16 * 1024;

/// The `/api/auth` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/session", get(session))
        .route("/config", get(config))
        .route("/request-code", post(request_code))
        .route("/resend-code", post(resend_code))
        .route("/verify-code", post(verify_code))
        .route("/verify-link", get(verify_link_page).post(verify_link))
        .route("/signout", post(signout))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(map_response(private_headers))
}

/// Every auth answer is personal: never cached, and varying with the cookie and the origin
/// that the checks looked at.
async fn private_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Origin, Cookie"));
    resp
}

/// A JSON answer with the site's content type and `no-store`.
pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut resp = (status, body.to_string()).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn with_cookies(mut resp: Response, cookies: impl IntoIterator<Item = HeaderValue>) -> Response {
    for c in cookies {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    resp
}

/// The body as JSON; anything unparsable reads as `null`, whose fields are all absent, so the
/// field checks answer with their own codes.
fn parse_json(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// A trimmed, non-empty string field.
fn str_field<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The client address the edge put in `x-gateway-client-ip` (never a client-sent header).
fn client_ip(headers: &HeaderMap) -> Option<IpAddr> {
    headers
        .get("x-gateway-client-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The rate-limit identity of an address: IPv4 as is, IPv6 by its /64, since one host usually
/// owns a whole /64.
fn rate_key_for_ip(ip: Option<IpAddr>) -> String {
    match ip {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        None => "unknown".to_string(),
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn challenge_failed(e: StoreError) -> SiteError {
    log::error!("sign-in storage failed: {e}");
    SiteError::Code("auth_challenge_failed")
}

// ---------------------------------------------------------------------------------------------
// GET /session, GET /config

/// `{user:{email}, expires, csrfToken}` when signed in, else `null` (and a stale cookie is
/// cleared).
async fn session(State(state): State<SharedState>, headers: HeaderMap) -> Response {
    match current_session(&state, &headers).await {
        Ok(Some(s)) => json_response(StatusCode::OK, &s.to_json()),
        Ok(None) => {
            let cfg = state.config();
            let resp = json_response(StatusCode::OK, &Value::Null);
            if read_cookie(&headers, &super::session::cookie_name(&cfg, SESSION_COOKIE)).is_some() {
                with_cookies(resp, [clear_cookie(&cfg, SESSION_COOKIE)])
            } else {
                resp
            }
        }
        Err(e) => e.into_response(),
    }
}

/// Public sign-in settings for the panel.
async fn config(State(state): State<SharedState>) -> Response {
    let cfg = state.config();
    let key = &cfg.auth.captcha_site_key;
    json_response(
        StatusCode::OK,
        &json!({
            "ok": true,
            "captchaSiteKey": if key.is_empty() { Value::Null } else { Value::String(key.clone()) },
            "captchaRequired": cfg.auth.captcha_required,
        }),
    )
}

// ---------------------------------------------------------------------------------------------
// Gates

/// `blocked_domain` for a blocked domain or any subdomain of one; `private_beta_only` when the
/// beta is closed and neither the address nor `@domain` is on the allowlist.
fn check_email_allowed(auth: &AuthConfig, email: &str) -> Result<(), SiteError> {
    let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or("");
    let blocked = auth.blocked_domains.iter().any(|b| {
        domain == b
            || domain
                .strip_suffix(b.as_str())
                .is_some_and(|rest| rest.ends_with('.'))
    });
    if blocked {
        return Err(SiteError::Code("blocked_domain"));
    }
    if !beta_allows(auth, email) {
        return Err(SiteError::Code("private_beta_only"));
    }
    Ok(())
}

/// False only when the private beta is closed and neither the address nor its `@domain` is on
/// the allowlist. The account API asks again on every request, so an address taken off the
/// list loses access without waiting for its session to end.
pub(crate) fn beta_allows(auth: &AuthConfig, email: &str) -> bool {
    let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or("");
    !auth.private_beta
        || auth
            .beta_allowlist
            .iter()
            .any(|a| a == email || a.strip_prefix('@') == Some(domain))
}

/// The captcha gate, when `auth.captcha_required`: `captcha_not_configured` (server side
/// missing), `captcha_required` (no token), `captcha_failed` (verifier said no).
async fn check_captcha(
    state: &AppState,
    cfg: &Config,
    body: &Value,
    ip: Option<IpAddr>,
) -> Result<(), SiteError> {
    if !cfg.auth.captcha_required {
        return Ok(());
    }
    let secret = state.secrets.captcha_secret.as_ref();
    if secret.is_none() || cfg.auth.captcha_verify_url.is_empty() {
        return Err(SiteError::Code("captcha_not_configured"));
    }
    let token = str_field(body, "captchaToken").ok_or(SiteError::Code("captcha_required"))?;
    if token.len() > 4096 {
        return Err(SiteError::Code("captcha_failed"));
    }
    let ip = ip.map(|i| i.to_string());
    captcha::verify(&cfg.auth.captcha_verify_url, secret, token, ip.as_deref())
        .await
        .map_err(|e| match e {
            CaptchaError::NotConfigured => SiteError::Code("captcha_not_configured"),
            CaptchaError::Failed => SiteError::Code("captcha_failed"),
        })
}

/// `rate_limited` when this address or this client has asked for more than
/// `limits.request_code_per_hour` codes in the last hour. Counters live in the database (keyed
/// digests, not addresses) so every instance shares them.
async fn check_rate(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    email: &str,
    ip: Option<IpAddr>,
) -> Result<(), SiteError> {
    let limit = i64::from(cfg.limits.request_code_per_hour);
    let now = now_ms();
    let buckets = [
        format!("email:{}", key.digest("rate-email", email)),
        format!("ip:{}", key.digest("rate-ip", &rate_key_for_ip(ip))),
    ];
    let mut limited = false;
    for bucket in &buckets {
        // Both counters always move, so neither can be probed separately.
        limited |= over_limit(state, bucket, now, limit).await?;
    }
    if limited {
        Err(SiteError::Code("rate_limited"))
    } else {
        Ok(())
    }
}

/// Sliding-hour estimate from two fixed windows: the previous window's count weighted by how
/// much of it still overlaps the last hour, plus the current window's.
async fn over_limit(
    state: &AppState,
    bucket: &str,
    now: i64,
    limit: i64,
) -> Result<bool, SiteError> {
    let store = state.db.auth();
    let start = now - now.rem_euclid(RATE_WINDOW_MS);
    let current = store.hit(bucket, start).await.map_err(challenge_failed)?;
    let previous = store
        .hits(bucket, start - RATE_WINDOW_MS)
        .await
        .map_err(challenge_failed)?;
    let overlap = RATE_WINDOW_MS - (now - start);
    Ok(previous * overlap / RATE_WINDOW_MS + current > limit)
}

// ---------------------------------------------------------------------------------------------
// Challenges

/// A new code and link token, in the clear only long enough to be mailed.
struct Issued {
    code: String,
    token: String,
    secrets: ChallengeSecrets,
}

fn code_digest(key: &AuthKey, challenge_id: &str, code: &str) -> String {
    key.digest("code", &format!("{challenge_id}:{code}"))
}

fn link_digest(key: &AuthKey, token: &str) -> String {
    key.digest("link", token)
}

/// Draws a uniform 6-digit code from the thread CSPRNG and a 32-byte link token.
fn issue(key: &AuthKey, cfg: &Config, challenge_id: &str, now: i64) -> Issued {
    let code = format!("{:06}", rand::rng().random_range(0..1_000_000u32));
    let token = random_token();
    let secrets = ChallengeSecrets {
        code_hash: code_digest(key, challenge_id, &code),
        link_hash: link_digest(key, &token),
        code_expires_at: now.saturating_add(ms(cfg.auth.code_ttl)),
        link_expires_at: now.saturating_add(ms(cfg.auth.link_ttl)),
    };
    Issued {
        code,
        token,
        secrets,
    }
}

/// Mails the code and link. Failure is `auth_challenge_failed`; the cause is logged.
async fn send_mail(cfg: &Config, email: &str, issued: &Issued) -> Result<(), SiteError> {
    let link = format!(
        "{}/api/auth/verify-link?token={}",
        cfg.server.site_origin, issued.token
    );
    let mail = SignInMail {
        to: email,
        code: &issued.code,
        link: &link,
        code_ttl: cfg.auth.code_ttl,
        link_ttl: cfg.auth.link_ttl,
    };
    mail::send_sign_in(&cfg.mail, &mail)
        .await
        .map_err(|e| match e {
            MailError::NotConfigured => SiteError::Code("email_not_configured"),
            e => {
                log::error!("sign-in mail not sent: {e}");
                SiteError::Code("auth_challenge_failed")
            }
        })
}

/// The OTP cookie: the challenge id and its signature, so a browser can only present a
/// challenge this server issued to it.
fn otp_cookie(key: &AuthKey, cfg: &Config, challenge_id: &str) -> HeaderValue {
    let value = format!("{challenge_id}.{}", key.sign("otp", challenge_id));
    let max_age = cfg.auth.code_ttl.max(cfg.auth.link_ttl) + CHALLENGE_GRACE;
    set_cookie(cfg, OTP_COOKIE, &value, max_age)
}

/// The challenge id of the request's OTP cookie, when its signature is good.
fn otp_challenge_id(key: &AuthKey, cfg: &Config, headers: &HeaderMap) -> Option<String> {
    let raw = read_cookie(headers, &super::session::cookie_name(cfg, OTP_COOKIE))?;
    let (id, sig) = raw.split_once('.')?;
    key.verify("otp", id, sig).then(|| id.to_string())
}

/// `{ok, email, expiresIn, requiresCode}` plus the (refreshed) OTP cookie.
fn challenge_answer(key: &AuthKey, cfg: &Config, challenge_id: &str, email: &str) -> Response {
    let body = json!({
        "ok": true,
        "email": email,
        "expiresIn": cfg.auth.code_ttl.as_secs(),
        "requiresCode": true,
    });
    with_cookies(
        json_response(StatusCode::OK, &body),
        [otp_cookie(key, cfg, challenge_id)],
    )
}

/// The checks every code request shares, after its own parsing: configuration, origin.
fn common_preconditions(
    state: &AppState,
    cfg: &Config,
    headers: &HeaderMap,
) -> Result<AuthKey, SiteError> {
    let key = AuthKey::from_state(state)?;
    check_origin(cfg, headers)?;
    if cfg.mail.transport.is_none() {
        return Err(SiteError::Code("email_not_configured"));
    }
    Ok(key)
}

// ---------------------------------------------------------------------------------------------
// POST /request-code, POST /resend-code

async fn request_code(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let key = common_preconditions(&state, &cfg, &headers)?;
    let body = parse_json(&body);
    if body.get("acceptedTerms") != Some(&Value::Bool(true)) {
        return Err(SiteError::Code("terms_required"));
    }
    let email = str_field(&body, "email")
        .and_then(normalize_email)
        .ok_or(SiteError::Code("invalid_email"))?;
    check_email_allowed(&cfg.auth, &email)?;
    let ip = client_ip(&headers);
    check_captcha(&state, &cfg, &body, ip).await?;
    check_rate(&state, &key, &cfg, &email, ip).await?;

    let id = new_id("chl");
    let now = now_ms();
    let issued = issue(&key, &cfg, &id, now);
    state
        .db
        .auth()
        .create_challenge(&id, &email, &issued.secrets, now)
        .await
        .map_err(challenge_failed)?;
    send_mail(&cfg, &email, &issued).await?;
    Ok(challenge_answer(&key, &cfg, &id, &email))
}

/// A new code and link for this browser's pending challenge; the old ones stop working.
async fn resend_code(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let key = common_preconditions(&state, &cfg, &headers)?;
    let body = parse_json(&body);
    let store = state.db.auth();
    let id = otp_challenge_id(&key, &cfg, &headers).ok_or(SiteError::Code("invalid_code"))?;
    let challenge = store
        .challenge(&id)
        .await
        .map_err(challenge_failed)?
        .filter(|c| c.consumed_at.is_none())
        .ok_or(SiteError::Code("invalid_code"))?;
    check_email_allowed(&cfg.auth, &challenge.email)?;
    let ip = client_ip(&headers);
    check_captcha(&state, &cfg, &body, ip).await?;
    check_rate(&state, &key, &cfg, &challenge.email, ip).await?;

    let now = now_ms();
    let issued = issue(&key, &cfg, &id, now);
    if !store
        .replace_secrets(&id, &issued.secrets, now)
        .await
        .map_err(challenge_failed)?
    {
        return Err(SiteError::Code("invalid_code"));
    }
    send_mail(&cfg, &challenge.email, &issued).await?;
    Ok(challenge_answer(&key, &cfg, &id, &challenge.email))
}

// ---------------------------------------------------------------------------------------------
// POST /verify-code

/// Six digits; spaces a person may have typed are ignored.
fn clean_code(raw: &str) -> Option<String> {
    let code: String = raw.chars().filter(|c| !c.is_whitespace()).collect();
    (code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit())).then_some(code)
}

async fn verify_code(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let key = AuthKey::from_state(&state)?;
    check_origin(&cfg, &headers)?;
    let body = parse_json(&body);
    let email = str_field(&body, "email")
        .and_then(normalize_email)
        .ok_or(SiteError::Code("invalid_email"))?;
    let challenge = pending_code_challenge(&state, &key, &cfg, &headers, &email).await?;
    let store = state.db.auth();
    // The attempt is taken before comparing, so parallel guesses cannot exceed the limit.
    if !store
        .take_attempt(&challenge.id, MAX_ATTEMPTS, now_ms())
        .await
        .map_err(challenge_failed)?
    {
        return Err(SiteError::Code("too_many_attempts"));
    }
    let matches = str_field(&body, "code")
        .and_then(clean_code)
        .map(|c| code_digest(&key, &challenge.id, &c))
        .is_some_and(|d| bool::from(d.as_bytes().ct_eq(challenge.code_hash.as_bytes())));
    if !matches {
        return Err(SiteError::Code("invalid_code"));
    }
    check_email_allowed(&cfg.auth, &email)?;
    second_factor(&state, &email, str_field(&body, "twoFactorCode")).await?;
    if !store
        .consume(&challenge.id, now_ms())
        .await
        .map_err(challenge_failed)?
    {
        return Err(SiteError::Code("invalid_code"));
    }
    let (session, cookies) = sign_in(&state, &key, &cfg, &headers, &email).await?;
    let body = json!({
        "ok": true,
        "session": { "user": { "email": session.email }, "expires": session.expires() },
    });
    Ok(with_cookies(json_response(StatusCode::OK, &body), cookies))
}

/// The unused, unexpired challenge of this browser's OTP cookie for `email`: `invalid_code`
/// when there is none (or it is for another address), `too_many_attempts` when its tries are
/// spent, `code_expired` when its code is too old.
async fn pending_code_challenge(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    headers: &HeaderMap,
    email: &str,
) -> Result<ChallengeRecord, SiteError> {
    let id = otp_challenge_id(key, cfg, headers).ok_or(SiteError::Code("invalid_code"))?;
    let challenge = state
        .db
        .auth()
        .challenge(&id)
        .await
        .map_err(challenge_failed)?
        .filter(|c| c.consumed_at.is_none())
        .filter(|c| bool::from(c.email.as_bytes().ct_eq(email.as_bytes())))
        .ok_or(SiteError::Code("invalid_code"))?;
    if challenge.attempts >= MAX_ATTEMPTS {
        return Err(SiteError::Code("too_many_attempts"));
    }
    if now_ms() >= challenge.code_expires_at {
        return Err(SiteError::Code("code_expired"));
    }
    Ok(challenge)
}

/// Two-factor, checked only after the emailed secret is proven (so it reveals nothing to anyone
/// without the mailbox): `two_factor_code_required` (401) without a code, `invalid_code` for a
/// wrong one.
async fn second_factor(state: &AppState, email: &str, code: Option<&str>) -> Result<(), SiteError> {
    let user = state
        .db
        .users()
        .find_by_email(email)
        .await
        .map_err(persistence)?;
    let Some(user) = user.filter(|u| u.two_factor_enabled) else {
        return Ok(());
    };
    let code = code.ok_or(SiteError::Code("two_factor_code_required"))?;
    let Some(secret) = user.totp_secret.as_deref() else {
        log::error!("user {} has two-factor on but no secret", user.id);
        return Err(SiteError::Code("invalid_code"));
    };
    let key = twofactor::SeedKey::from_state(state)?;
    if twofactor::accept(&state.db, &key, &user.id, secret, code)
        .await
        .map_err(persistence)?
    {
        Ok(())
    } else {
        Err(SiteError::Code("invalid_code"))
    }
}

/// Creates the user on first sign-in, replaces any session this browser had with a new one,
/// and records the login. Returns the session and the cookies to set (session on, OTP off).
async fn sign_in(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    headers: &HeaderMap,
    email: &str,
) -> Result<(SessionInfo, [HeaderValue; 2]), SiteError> {
    let user = state
        .db
        .users()
        .find_or_create(email, cfg.quota.default_tier)
        .await
        .map_err(persistence)?;
    end_session(state, key, cfg, headers).await?;
    let (session, cookie) = start_session(state, key, cfg, &user.id, &user.email).await?;
    state
        .db
        .auth()
        .record_login(&user.id, now_ms())
        .await
        .map_err(persistence)?;
    Ok((session, [cookie, clear_cookie(cfg, OTP_COOKIE)]))
}

// ---------------------------------------------------------------------------------------------
// GET and POST /verify-link

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The confirmation page. It never looks the token up, let alone consumes it.
async fn verify_link_page(RawQuery(query): RawQuery) -> Response {
    match query_param(query.as_deref(), "token").filter(|t| is_token_shaped(t)) {
        Some(token) => confirmation_page(&token),
        None => SiteError::Code("invalid_link").into_response(),
    }
}

/// A self-contained page whose only action is the POST back to this service; the CSP forbids
/// scripts, framing and posting anywhere else, and no referrer leaks the token.
fn confirmation_page(token: &str) -> Response {
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Confirm sign-in</title>\
         <style>body{{font-family:sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}}\
         input,button{{font-size:1rem;padding:.5rem}}label{{display:block;margin:1rem 0 .25rem}}</style>\
         </head><body><h1>Confirm sign-in</h1>\
         <p>Press the button to finish signing in on this device.</p>\
         <form method=\"post\" action=\"/api/auth/verify-link\">\
         <input type=\"hidden\" name=\"token\" value=\"{token}\">\
         <label for=\"tfa\">Two-factor code (only if you turned it on)</label>\
         <input id=\"tfa\" name=\"twoFactorCode\" inputmode=\"numeric\" autocomplete=\"one-time-code\" \
         pattern=\"[0-9]{{6}}\" maxlength=\"6\">\
         <p><button type=\"submit\">Sign in</button></p></form></body></html>\n",
        token = html_escape(token)
    );
    let mut resp = (StatusCode::OK, html).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `token` and `twoFactorCode` from a JSON body, a form body, or the query string, in that
/// order of preference.
fn link_fields(
    headers: &HeaderMap,
    query: Option<&str>,
    body: &Bytes,
) -> (Option<String>, Option<String>) {
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    let from_body = |name: &str| -> Option<String> {
        if is_form {
            let text = std::str::from_utf8(body).ok();
            query_param(text, name)
        } else {
            str_field(&parse_json(body), name).map(str::to_string)
        }
    };
    let token = from_body("token").or_else(|| query_param(query, "token"));
    let tfa = from_body("twoFactorCode").or_else(|| query_param(query, "twoFactorCode"));
    (token, tfa)
}

async fn verify_link(
    State(state): State<SharedState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let key = AuthKey::from_state(&state)?;
    check_origin(&cfg, &headers)?;
    let (token, tfa) = link_fields(&headers, query.as_deref(), &body);
    let token = token
        .filter(|t| is_token_shaped(t))
        .ok_or(SiteError::Code("invalid_link"))?;
    let store = state.db.auth();
    let challenge = store
        .challenge_by_link(&link_digest(&key, &token))
        .await
        .map_err(challenge_failed)?
        .filter(|c| c.consumed_at.is_none())
        .ok_or(SiteError::Code("invalid_link"))?;
    if now_ms() >= challenge.link_expires_at {
        return Err(SiteError::Code("link_expired"));
    }
    check_email_allowed(&cfg.auth, &challenge.email)?;
    link_second_factor(&state, &challenge, tfa.as_deref()).await?;
    if !store
        .consume(&challenge.id, now_ms())
        .await
        .map_err(challenge_failed)?
    {
        return Err(SiteError::Code("invalid_link"));
    }
    let (_, cookies) = sign_in(&state, &key, &cfg, &headers, &challenge.email).await?;
    let mut resp = StatusCode::SEE_OTHER.into_response();
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(AFTER_SIGN_IN));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(with_cookies(resp, cookies))
}

/// Two-factor for a link: every TOTP guess spends one of the challenge's attempts, so a leaked
/// link cannot be used to brute-force the second factor.
async fn link_second_factor(
    state: &AppState,
    challenge: &ChallengeRecord,
    code: Option<&str>,
) -> Result<(), SiteError> {
    if code.is_some()
        && !state
            .db
            .auth()
            .take_attempt(&challenge.id, MAX_ATTEMPTS, now_ms())
            .await
            .map_err(challenge_failed)?
    {
        return Err(SiteError::Code("too_many_attempts"));
    }
    second_factor(state, &challenge.email, code).await
}

// ---------------------------------------------------------------------------------------------
// POST /signout

/// Ends the session server-side and clears both cookies. Needs the site's origin, and the
/// session's CSRF token when there is a session to end.
async fn signout(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    check_origin(&cfg, &headers)?;
    if let Some(session) = current_session(&state, &headers).await? {
        let key = AuthKey::from_state(&state)?;
        check_token(&key, &session, &headers, Some(&parse_json(&body)))?;
        state
            .db
            .auth()
            .delete_session(&session.id_hash)
            .await
            .map_err(persistence)?;
    }
    let resp = json_response(StatusCode::OK, &json!({ "ok": true }));
    Ok(with_cookies(
        resp,
        [
            clear_cookie(&cfg, SESSION_COOKIE),
            clear_cookie(&cfg, OTP_COOKIE),
        ],
    ))
}

// ---------------------------------------------------------------------------------------------
// Housekeeping

/// Deletes spent challenges, ended sessions and old counters every ten minutes, for as long as
/// the account service runs.
pub async fn purge_loop(state: SharedState) {
    let mut tick = tokio::time::interval(Duration::from_secs(600));
    loop {
        tick.tick().await;
        let cfg = state.config();
        let now = now_ms();
        let result = state
            .db
            .auth()
            .purge(
                now,
                now - ms(CHALLENGE_GRACE),
                now - ms(cfg.auth.session_idle),
                now - 2 * RATE_WINDOW_MS,
            )
            .await;
        if let Err(e) = result {
            log::warn!("sign-in housekeeping failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn auth(extra: &str) -> AuthConfig {
        Config::from_str(Path::new("t.toml"), &format!("[auth]\n{extra}"))
            .expect("config")
            .auth
    }

    #[test]
    fn domain_gates() {
        let a = auth("blocked_domains = [\"Spam.example\"]");
        assert_eq!(
            check_email_allowed(&a, "x@spam.example"),
            Err(SiteError::Code("blocked_domain"))
        );
        assert_eq!(
            check_email_allowed(&a, "x@mx.spam.example"),
            Err(SiteError::Code("blocked_domain"))
        );
        assert!(check_email_allowed(&a, "x@notspam.example").is_ok());

        let b =
            auth("private_beta = true\nbeta_allowlist = [\"Vip@example.com\", \"@team.example\"]");
        assert!(check_email_allowed(&b, "vip@example.com").is_ok());
        assert!(check_email_allowed(&b, "anyone@team.example").is_ok());
        assert_eq!(
            check_email_allowed(&b, "other@example.com"),
            Err(SiteError::Code("private_beta_only"))
        );
        assert_eq!(
            check_email_allowed(&b, "x@sub.team.example"),
            Err(SiteError::Code("private_beta_only"))
        );
    }

    #[test]
    fn codes_and_addresses() {
        assert_eq!(clean_code(" 012 345 ").as_deref(), Some("012345"));
        assert_eq!(clean_code("12345"), None);
        assert_eq!(clean_code("12345a"), None);
        assert_eq!(rate_key_for_ip("10.1.2.3".parse().ok()), "10.1.2.3");
        assert_eq!(
            rate_key_for_ip("2001:db8:1:2:3:4:5:6".parse().ok()),
            "2001:db8:1:2::/64"
        );
        assert_eq!(rate_key_for_ip(None), "unknown");
    }

    #[test]
    fn issued_codes_are_six_digits_and_hashed_per_challenge() {
        let key = AuthKey::new(b"k").expect("key");
        let cfg = Config::from_str(Path::new("t.toml"), "").expect("config");
        let a = issue(&key, &cfg, "chl_a", 0);
        assert_eq!(a.code.len(), 6);
        assert!(a.code.bytes().all(|b| b.is_ascii_digit()));
        assert!(is_token_shaped(&a.token));
        assert_ne!(
            code_digest(&key, "chl_a", "000000"),
            code_digest(&key, "chl_b", "000000")
        );
        assert!(!a.secrets.code_hash.contains(&a.code));
    }
}
