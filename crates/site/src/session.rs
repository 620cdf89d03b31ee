//! Web sessions: the signing key, cookies, and the signed-in user of a request.
//!
//! A session id is 32 random bytes sent only in an `HttpOnly` cookie; the database keeps its
//! HMAC digest, so a leaked table cannot be replayed. Every sign-in makes a new id (no
//! fixation). A session ends at its absolute expiry (`auth.session_ttl`), after
//! `auth.session_idle` without a request, or at signout.
//!
//! The account API reuses this module: `current_session` / `require_session` to find the
//! signed-in user, and `csrf::require_mutation` for its POST/DELETE endpoints.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::error::SiteError;
use gateway_core::config::Config;
use gateway_core::state::AppState;
use gateway_core::storage::SessionRecord;
use gateway_core::util::{iso, now_ms};

type HmacSha256 = Hmac<Sha256>;

/// Base name of the session cookie; `__Host-` is prefixed when the site is https.
pub const SESSION_COOKIE: &str = "gw_session";
/// Base name of the cookie that binds a pending sign-in challenge to the browser that asked.
pub const OTP_COOKIE: &str = "gw_otp";

/// Activity is written back at most this often, so reading a session is usually one SELECT.
const TOUCH_EVERY_MS: i64 = 60_000;

/// The HMAC key derived from `GATEWAY_SESSION_SECRET`. Every digest and signature names its
/// purpose, so a value made for one use (say a CSRF token) is never valid for another.
#[derive(Clone)]
pub struct AuthKey(HmacSha256);

impl AuthKey {
    pub fn new(secret: &[u8]) -> Option<AuthKey> {
        HmacSha256::new_from_slice(secret).ok().map(AuthKey)
    }

    /// The process's key, or `auth_not_configured` when no session secret is set.
    pub fn from_state(state: &AppState) -> Result<AuthKey, SiteError> {
        state
            .secrets
            .session_secret
            .as_ref()
            .and_then(|s| AuthKey::new(s.expose()))
            .ok_or(SiteError::Code("auth_not_configured"))
    }

    fn mac(&self, purpose: &str, value: &str) -> [u8; 32] {
        let mut m = self.0.clone();
        m.update(purpose.as_bytes());
        m.update(&[0]);
        m.update(value.as_bytes());
        m.finalize().into_bytes().into()
    }

    /// Hex digest used as a database lookup key for a secret value (code, token, session id).
    pub fn digest(&self, purpose: &str, value: &str) -> String {
        hex::encode(self.mac(purpose, value))
    }

    /// A URL-safe signature of `value`, for tokens handed to the browser.
    pub fn sign(&self, purpose: &str, value: &str) -> String {
        URL_SAFE_NO_PAD.encode(self.mac(purpose, value))
    }

    /// Constant-time check of a `sign` result.
    pub fn verify(&self, purpose: &str, value: &str, signature: &str) -> bool {
        let expected = self.sign(purpose, value);
        expected.as_bytes().ct_eq(signature.as_bytes()).into()
    }
}

/// The CSRF token of the session whose id digest is `session_id_hash`.
pub fn token_for(key: &AuthKey, session_id_hash: &str) -> String {
    key.sign("csrf", session_id_hash)
}

/// The signed-in user of a request.
#[derive(Clone)]
pub struct SessionInfo {
    pub user_id: String,
    pub email: String,
    /// When the session ends if unused: the earlier of the absolute and the idle limit.
    pub expires_ms: i64,
    /// The CSRF token mutations of this session must carry.
    pub csrf_token: String,
    pub(crate) id_hash: String,
}

impl std::fmt::Debug for SessionInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionInfo")
            .field("user_id", &self.user_id)
            .field("expires_ms", &self.expires_ms)
            .finish_non_exhaustive()
    }
}

impl SessionInfo {
    pub fn expires(&self) -> String {
        iso(self.expires_ms)
    }

    /// `{user:{email}, expires, csrfToken}`: the body of `GET /api/auth/session`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "user": { "email": self.email },
            "expires": self.expires(),
            "csrfToken": self.csrf_token,
        })
    }

    fn from_record(key: &AuthKey, rec: &SessionRecord, cfg: &Config, seen: i64) -> SessionInfo {
        SessionInfo {
            user_id: rec.user_id.clone(),
            email: rec.email.clone(),
            expires_ms: effective_expiry(cfg, rec.expires_at, seen),
            csrf_token: token_for(key, &rec.id_hash),
            id_hash: rec.id_hash.clone(),
        }
    }
}

fn effective_expiry(cfg: &Config, absolute: i64, last_seen: i64) -> i64 {
    absolute.min(last_seen.saturating_add(ms(cfg.auth.session_idle)))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The cookie name in force: `__Host-` prefixed on https sites, so the cookie can only be set by
/// this exact origin, over TLS, for the whole site.
pub fn cookie_name(cfg: &Config, base: &str) -> String {
    if cfg.server.site_secure {
        format!("__Host-{base}")
    } else {
        base.to_string()
    }
}

/// A `Set-Cookie` value: `HttpOnly; SameSite=Lax; Path=/`, plus `Secure` on https sites.
pub fn set_cookie(cfg: &Config, base: &str, value: &str, max_age: Duration) -> HeaderValue {
    let secure = if cfg.server.site_secure {
        "; Secure"
    } else {
        ""
    };
    let text = format!(
        "{}={value}; Max-Age={}; Path=/; HttpOnly; SameSite=Lax{secure}",
        cookie_name(cfg, base),
        max_age.as_secs()
    );
    // Names and values are base64url and digits only, so this cannot fail; fall back to an
    // expiring cookie rather than panic.
    HeaderValue::from_str(&text).unwrap_or_else(|_| clear_cookie(cfg, base))
}

/// A `Set-Cookie` value that deletes the cookie.
pub fn clear_cookie(cfg: &Config, base: &str) -> HeaderValue {
    let text = format!(
        "{}=; Max-Age=0; Path=/; HttpOnly; SameSite=Lax{}",
        cookie_name(cfg, base),
        if cfg.server.site_secure {
            "; Secure"
        } else {
            ""
        }
    );
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static("gw_session=; Max-Age=0"))
}

/// The value of cookie `name` across all `Cookie` headers of the request.
pub fn read_cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// 32 CSPRNG bytes, base64url: session ids and magic-link tokens.
pub fn random_token() -> String {
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    URL_SAFE_NO_PAD.encode(raw)
}

/// True for strings `random_token` could have produced; anything else is rejected before a
/// database lookup.
pub fn is_token_shaped(s: &str) -> bool {
    s.len() == 43
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The digest of the session id in the request's cookie, if it carries a well-formed one.
fn cookie_id_hash(key: &AuthKey, cfg: &Config, headers: &HeaderMap) -> Option<String> {
    let id = read_cookie(headers, &cookie_name(cfg, SESSION_COOKIE))?;
    is_token_shaped(&id).then(|| key.digest("session", &id))
}

/// The signed-in user of this request, or `None` (no cookie, unknown, expired, idle, or no
/// session secret configured). Runs on every account request: one indexed SELECT, plus an
/// UPDATE at most once a minute to keep the idle clock honest.
pub async fn current_session(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<SessionInfo>, SiteError> {
    let Ok(key) = AuthKey::from_state(state) else {
        return Ok(None);
    };
    let cfg = state.config();
    let Some(id_hash) = cookie_id_hash(&key, &cfg, headers) else {
        return Ok(None);
    };
    let store = state.db.auth();
    let rec = store.session(&id_hash).await.map_err(persistence)?;
    let Some(rec) = rec else { return Ok(None) };
    let now = now_ms();
    if now >= effective_expiry(&cfg, rec.expires_at, rec.last_seen_at) {
        store.delete_session(&id_hash).await.map_err(persistence)?;
        return Ok(None);
    }
    let mut seen = rec.last_seen_at;
    if now - rec.last_seen_at >= TOUCH_EVERY_MS {
        store
            .touch_session(&id_hash, now)
            .await
            .map_err(persistence)?;
        seen = now;
    }
    Ok(Some(SessionInfo::from_record(&key, &rec, &cfg, seen)))
}

/// `current_session` for endpoints that need a user: `unauthorized` (401) without one.
pub async fn require_session(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<SessionInfo, SiteError> {
    current_session(state, headers)
        .await?
        .ok_or(SiteError::Code("unauthorized"))
}

/// Starts a new session for `user_id` and returns it with its `Set-Cookie` value. The caller
/// has already verified the sign-in.
pub(crate) async fn start_session(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    user_id: &str,
    email: &str,
) -> Result<(SessionInfo, HeaderValue), SiteError> {
    let id = random_token();
    let id_hash = key.digest("session", &id);
    let now = now_ms();
    let expires_at = now.saturating_add(ms(cfg.auth.session_ttl));
    state
        .db
        .auth()
        .create_session(&id_hash, user_id, now, expires_at)
        .await
        .map_err(persistence)?;
    let rec = SessionRecord {
        id_hash,
        user_id: user_id.to_string(),
        email: email.to_string(),
        created_at: now,
        expires_at,
        last_seen_at: now,
    };
    let info = SessionInfo::from_record(key, &rec, cfg, now);
    let cookie = set_cookie(cfg, SESSION_COOKIE, &id, cfg.auth.session_ttl);
    Ok((info, cookie))
}

/// Deletes the session named by the request's cookie, if any (a previous session replaced by a
/// new sign-in, or signout).
pub(crate) async fn end_session(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    headers: &HeaderMap,
) -> Result<(), SiteError> {
    if let Some(id_hash) = cookie_id_hash(key, cfg, headers) {
        state
            .db
            .auth()
            .delete_session(&id_hash)
            .await
            .map_err(persistence)?;
    }
    Ok(())
}

/// Logs a storage failure (the cause stays server-side) and answers with the spec's code.
pub(crate) fn persistence(e: gateway_core::storage::StoreError) -> SiteError {
    log::error!("account storage failed: {e}");
    SiteError::Code("account_persistence_failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_bound_to_purpose() {
        let k = AuthKey::new(b"secret").expect("key");
        let s = k.sign("csrf", "abc");
        assert!(k.verify("csrf", "abc", &s));
        assert!(!k.verify("otp", "abc", &s));
        assert!(!k.verify("csrf", "abd", &s));
        assert_ne!(k.digest("code", "1"), k.digest("link", "1"));
    }

    #[test]
    fn cookies_are_read_from_any_header() {
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; gw_session=xyz"),
        );
        h.append(header::COOKIE, HeaderValue::from_static("gw_otp=q"));
        assert_eq!(read_cookie(&h, "gw_session").as_deref(), Some("xyz"));
        assert_eq!(read_cookie(&h, "gw_otp").as_deref(), Some("q"));
        assert_eq!(read_cookie(&h, "gw"), None);
    }

    #[test]
    fn tokens_have_one_shape() {
        let t = random_token();
        assert!(is_token_shaped(&t), "{t}");
        assert!(!is_token_shaped("short"));
        assert!(!is_token_shaped(&format!("{}!", &t[..42])));
    }
}
