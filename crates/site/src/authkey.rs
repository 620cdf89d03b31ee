//! The site's HMAC key, derived from `GATEWAY_SESSION_SECRET`: session-id digests, CSRF tokens,
//! sign-in code and link digests, the OTP cookie's signature and recovery-code digests all come
//! from it. Every digest and signature names its purpose, so a value made for one use (say a
//! CSRF token) is never valid for another.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::error::SiteError;
use gateway_core::state::{AppState, SharedState};

type HmacSha256 = Hmac<Sha256>;

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
            .ok_or(SiteError::AuthNotConfigured)
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

/// As an extractor: the key, or `auth_not_configured` before anything else is looked at.
impl FromRequestParts<SharedState> for AuthKey {
    type Rejection = SiteError;

    async fn from_request_parts(
        _parts: &mut Parts,
        state: &SharedState,
    ) -> Result<AuthKey, SiteError> {
        AuthKey::from_state(state)
    }
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
}
