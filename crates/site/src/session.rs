//! Web sessions: the signing key, cookies, and the signed-in user of a request.
//!
//! A session id is 32 random bytes sent only in an `HttpOnly` cookie; the database keeps its
//! HMAC digest, so a leaked table cannot be replayed. Every sign-in makes a new id (no
//! fixation). A session ends at its absolute expiry (`auth.session_ttl`), after
//! `auth.session_idle` without a request, or at signout.
//!
//! Handlers do not call this module to find the user: the `Session`, `MaybeSession` and
//! `Mutation` extractors (`extract`) do.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;
use serde::Serialize;

use crate::authkey::AuthKey;
use crate::csrf::token_for;
use crate::error::{Failing, SiteError};
use gateway_core::config::Config;
use gateway_core::state::AppState;
use gateway_core::storage::SessionRecord;
use gateway_core::util::{iso, now_ms};

/// Base name of the session cookie; `__Host-` is prefixed when the site is https.
pub const SESSION_COOKIE: &str = "gw_session";
/// Base name of the cookie that binds a pending sign-in challenge to the browser that asked.
pub const OTP_COOKIE: &str = "gw_otp";

/// Activity is written back at most this often, so reading a session is usually one SELECT.
const TOUCH_EVERY_MS: i64 = 60_000;

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
    pub fn view(&self) -> SessionView<'_> {
        SessionView {
            user: UserEmail { email: &self.email },
            expires: self.expires(),
            csrf_token: Some(&self.csrf_token),
        }
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

/// A session as the browser may see it; the sign-in answer leaves the CSRF token out.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionView<'a> {
    pub user: UserEmail<'a>,
    pub expires: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csrf_token: Option<&'a str>,
}

#[derive(Serialize)]
pub struct UserEmail<'a> {
    pub email: &'a str,
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
    let rec = store
        .session(&id_hash)
        .await
        .or_fail(SiteError::AccountPersistenceFailed)?;
    let Some(rec) = rec else { return Ok(None) };
    let now = now_ms();
    if now >= effective_expiry(&cfg, rec.expires_at, rec.last_seen_at) {
        store
            .delete_session(&id_hash)
            .await
            .or_fail(SiteError::AccountPersistenceFailed)?;
        return Ok(None);
    }
    let mut seen = rec.last_seen_at;
    if now - rec.last_seen_at >= TOUCH_EVERY_MS {
        store
            .touch_session(&id_hash, now)
            .await
            .or_fail(SiteError::AccountPersistenceFailed)?;
        seen = now;
    }
    Ok(Some(SessionInfo::from_record(&key, &rec, &cfg, seen)))
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
        .or_fail(SiteError::AccountPersistenceFailed)?;
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
            .or_fail(SiteError::AccountPersistenceFailed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
