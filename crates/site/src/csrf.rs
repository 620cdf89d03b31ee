//! CSRF tokens: a signed-in mutation must carry its session's token in the `x-csrf-token`
//! header or the JSON field `csrfToken` (CONTRACT §3). The token is an HMAC of the session's
//! id digest, so it needs no storage and dies with the session.

use axum::http::HeaderMap;
use serde_json::Value;

use crate::authkey::AuthKey;
use crate::error::SiteError;

pub const CSRF_HEADER: &str = "x-csrf-token";

/// The CSRF token of the session whose id digest is `session_id_hash`.
pub fn token_for(key: &AuthKey, session_id_hash: &str) -> String {
    key.sign("csrf", session_id_hash)
}

/// `invalid_csrf` (403) unless the header or the body's `csrfToken` carries the token of the
/// session whose id digest is `session_id_hash`.
pub fn check_token(
    key: &AuthKey,
    session_id_hash: &str,
    headers: &HeaderMap,
    body: &Value,
) -> Result<(), SiteError> {
    let sent = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| body.get("csrfToken").and_then(Value::as_str));
    match sent {
        Some(token) if key.verify("csrf", session_id_hash, token) => Ok(()),
        _ => Err(SiteError::InvalidCsrf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_token_bound_to_session() {
        let key = AuthKey::new(b"k").expect("key");
        let mine = token_for(&key, "h1");
        let other = token_for(&key, "h2");
        let none = HeaderMap::new();
        let good = serde_json::json!({ "csrfToken": mine });
        assert!(check_token(&key, "h1", &none, &good).is_ok());
        let bad = serde_json::json!({ "csrfToken": other });
        assert!(check_token(&key, "h1", &none, &bad).is_err());
        assert!(check_token(&key, "h1", &none, &Value::Null).is_err());
        let mut header = HeaderMap::new();
        header.insert(CSRF_HEADER, mine.parse().expect("header"));
        assert!(check_token(&key, "h1", &header, &Value::Null).is_ok());
    }
}
