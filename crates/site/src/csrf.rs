//! Cross-site request defences for every site mutation.
//!
//! Two independent checks (CONTRACT §3): the request must come from the site's own origin
//! (`Origin` equal to `server.site_origin`, or, when a browser sent no `Origin`,
//! `Sec-Fetch-Site: same-origin`), and a signed-in mutation must carry the session's CSRF token
//! in the `x-csrf-token` header or the JSON field `csrfToken`. The token is an HMAC of the
//! session's id digest, so it needs no storage and dies with the session.

use axum::http::HeaderMap;
use serde_json::Value;

use super::error::SiteError;
use super::session::{require_session, AuthKey, SessionInfo};
use gateway_core::config::Config;
use gateway_core::state::AppState;

pub const CSRF_HEADER: &str = "x-csrf-token";

/// Same-origin check: `invalid_origin` (403) unless the request provably comes from the site.
pub fn check_origin(cfg: &Config, headers: &HeaderMap) -> Result<(), SiteError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let ok = match header("origin") {
        Some(origin) => origin
            .trim_end_matches('/')
            .eq_ignore_ascii_case(&cfg.server.site_origin),
        None => header("sec-fetch-site").is_some_and(|v| v.eq_ignore_ascii_case("same-origin")),
    };
    if ok {
        Ok(())
    } else {
        Err(SiteError::Code("invalid_origin"))
    }
}

/// CSRF check for a signed-in mutation: `invalid_csrf` (403) unless the header or the body's
/// `csrfToken` carries this session's token.
pub fn check_token(
    key: &AuthKey,
    session: &SessionInfo,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Result<(), SiteError> {
    let sent = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            body.and_then(|b| b.get("csrfToken"))
                .and_then(Value::as_str)
        });
    match sent {
        Some(token) if key.verify("csrf", &session.id_hash, token) => Ok(()),
        _ => Err(SiteError::Code("invalid_csrf")),
    }
}

/// Everything a signed-in mutation needs, in order: same origin (`invalid_origin`), a session
/// (`unauthorized`), its CSRF token (`invalid_csrf`). Returns the session.
pub async fn require_mutation(
    state: &AppState,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Result<SessionInfo, SiteError> {
    check_origin(&state.config(), headers)?;
    let session = require_session(state, headers).await?;
    let key = AuthKey::from_state(state)?;
    check_token(&key, &session, headers, body)?;
    Ok(session)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::path::Path;

    fn cfg() -> Config {
        Config::from_str(
            Path::new("t.toml"),
            "[server]\nsite_origin = \"https://gw.example.com\"\n",
        )
        .expect("config")
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origin_rules() {
        let c = cfg();
        let ok = |h: &[(&'static str, &'static str)]| check_origin(&c, &headers(h)).is_ok();
        assert!(ok(&[("origin", "https://gw.example.com")]));
        assert!(ok(&[("origin", "HTTPS://GW.EXAMPLE.COM")]));
        assert!(!ok(&[("origin", "https://evil.example.com")]));
        assert!(!ok(&[("origin", "null")]));
        assert!(!ok(&[("origin", "http://gw.example.com")]));
        // A mismatching Origin is not rescued by Sec-Fetch-Site.
        assert!(!ok(&[
            ("origin", "https://evil.example.com"),
            ("sec-fetch-site", "same-origin")
        ]));
        assert!(ok(&[("sec-fetch-site", "same-origin")]));
        assert!(!ok(&[("sec-fetch-site", "cross-site")]));
        assert!(!ok(&[]));
    }

    #[test]
    fn csrf_token_bound_to_session() {
        use crate::session::token_for;
        let key = AuthKey::new(b"k").expect("key");
        let s = SessionInfo {
            user_id: "usr_x".into(),
            email: "a@b.c".into(),
            expires_ms: 0,
            csrf_token: token_for(&key, "h1"),
            id_hash: "h1".into(),
        };
        let other = token_for(&key, "h2");
        let good = serde_json::json!({"csrfToken": s.csrf_token});
        assert!(check_token(&key, &s, &HeaderMap::new(), Some(&good)).is_ok());
        let bad = serde_json::json!({"csrfToken": other});
        assert!(check_token(&key, &s, &HeaderMap::new(), Some(&bad)).is_err());
        assert!(check_token(&key, &s, &HeaderMap::new(), None).is_err());
    }
}
