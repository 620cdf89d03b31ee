//! Two-factor sign-in with TOTP (RFC 6238: SHA-1, 6 digits, 30-second steps), as authenticator
//! apps expect. `users.two_factor_enabled` turns the check on. The account API's security
//! endpoint uses `generate` to turn it on and `verify` to turn it off; sign-in uses `verify`.
//!
//! The seed is stored sealed in `users.totp_secret` (see [`SeedKey`]): a copy of the database
//! alone does not let anyone compute codes. Each accepted code's time step is remembered
//! (`users.totp_last_step`), and a code is accepted only for a later step, so a code seen over
//! a shoulder or in a log cannot be used a second time (RFC 6238 §5.2).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hkdf::Hkdf;
use sha2::Sha256;
use subtle::ConstantTimeEq;
use totp_rs::{Algorithm, Secret, TOTP};

/// Shown in authenticator apps next to the account.
pub const ISSUER: &str = "Gateway";

const DIGITS: usize = 6;
const STEP_SECONDS: u64 = 30;
/// One step either way absorbs clock drift between the phone and the server.
const SKEW: u8 = 1;

/// Prefix of a sealed seed: version 1 is XChaCha20-Poly1305, `v1.` + base64url(nonce ‖
/// ciphertext). A stored value without it is a plaintext seed from before sealing.
pub const SEALED_V1: &str = "v1.";
/// HKDF `info`: the seed key is its own key, unrelated to the session and CSRF MACs made from
/// the same secret.
const SEED_KEY_INFO: &[u8] = b"gateway totp seed key v1";
const NONCE_LEN: usize = 24;

/// The key that seals TOTP seeds at rest, derived (HKDF-SHA256) from `GATEWAY_SESSION_SECRET`.
/// The user's id is the associated data, so a sealed seed copied onto another account does not
/// open. Changing the session secret makes existing seeds unreadable: those users then need
/// `gateway user reset-2fa`.
pub struct SeedKey(XChaCha20Poly1305);

impl SeedKey {
    pub fn derive(session_secret: &[u8]) -> SeedKey {
        let mut key = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit (255 × 32), so expand cannot fail.
        let _ = Hkdf::<Sha256>::new(None, session_secret).expand(SEED_KEY_INFO, &mut key);
        SeedKey(XChaCha20Poly1305::new(&key.into()))
    }

    /// `seed_b32` sealed for `user_id`, as `users.totp_secret` stores it. `None` only if the
    /// cipher refuses (it does not for a seed's size).
    pub fn seal(&self, user_id: &str, seed_b32: &str) -> Option<String> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .0
            .encrypt(
                &nonce,
                Payload {
                    msg: seed_b32.as_bytes(),
                    aad: user_id.as_bytes(),
                },
            )
            .ok()?;
        let mut raw = nonce.to_vec();
        raw.extend_from_slice(&sealed);
        Some(format!("{SEALED_V1}{}", URL_SAFE_NO_PAD.encode(raw)))
    }

    /// The base32 seed of a stored value: opened when sealed, as is when it is a plaintext seed
    /// from before sealing. `None` when it does not open (another key, another user, altered).
    pub fn open(&self, user_id: &str, stored: &str) -> Option<String> {
        let Some(b64) = stored.strip_prefix(SEALED_V1) else {
            return Some(stored.to_string());
        };
        let raw = URL_SAFE_NO_PAD.decode(b64).ok()?;
        if raw.len() <= NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let seed = self
            .0
            .decrypt(
                nonce.into(),
                Payload {
                    msg: sealed,
                    aad: user_id.as_bytes(),
                },
            )
            .ok()?;
        String::from_utf8(seed).ok()
    }
}

impl SeedKey {
    /// The process's key, or `auth_not_configured` when no session secret is set.
    pub fn from_state(
        state: &gateway_core::state::AppState,
    ) -> Result<SeedKey, crate::error::SiteError> {
        state
            .secrets
            .session_secret
            .as_ref()
            .map(|s| SeedKey::derive(s.expose()))
            .ok_or(crate::error::SiteError::AuthNotConfigured)
    }
}

/// Seals every plaintext seed in the database (seeds stored before sealing existed). Run at
/// start; a plaintext seed written later (by an older instance) still verifies and is sealed
/// at the next start. Returns how many were sealed.
pub async fn seal_plaintext_seeds(
    db: &gateway_core::storage::Db,
    key: &SeedKey,
) -> gateway_core::storage::StoreResult<usize> {
    let auth = db.auth();
    let mut sealed = 0;
    for (user_id, seed) in auth.unsealed_totp_seeds(SEALED_V1).await? {
        let Some(new) = key.seal(&user_id, &seed) else {
            continue;
        };
        if auth.reseal_totp_seed(&user_id, &seed, &new).await? {
            sealed += 1;
        }
    }
    Ok(sealed)
}

/// Checks `code` for a user whose stored seed is `stored`: the code must be current (±1 step)
/// and of a later step than any code accepted before for this user. False for a wrong, stale or
/// reused code.
pub async fn accept(
    db: &gateway_core::storage::Db,
    key: &SeedKey,
    user_id: &str,
    stored: &str,
    code: &str,
) -> gateway_core::storage::StoreResult<bool> {
    let Some(seed) = key.open(user_id, stored) else {
        log::error!(
            "user {user_id}: two-factor seed does not open (was GATEWAY_SESSION_SECRET changed? \
             `gateway user reset-2fa` turns it off)"
        );
        return Ok(false);
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    match verify(&seed, code, now) {
        Some(step) => db.auth().claim_totp_step(user_id, step as i64).await,
        None => Ok(false),
    }
}

/// True when a stored seed is sealed (false: a plaintext seed waiting to be sealed).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(SEALED_V1)
}

/// A new secret and its `otpauth://` URL (for a QR code), returned once when 2FA is turned on.
#[derive(Clone)]
pub struct TwoFactorSetup {
    /// Base32, no padding: what `users.totp_secret` stores and what people type by hand.
    pub secret: String,
    pub otpauth_url: String,
}

impl std::fmt::Debug for TwoFactorSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TwoFactorSetup(<redacted>)")
    }
}

fn totp(secret_b32: &str, account: &str) -> Option<TOTP> {
    let bytes = Secret::Encoded(secret_b32.to_string()).to_bytes().ok()?;
    // Labels may not contain ':' (the issuer separator).
    let account = account.replace(':', "");
    Some(TOTP::new_unchecked(
        Algorithm::SHA1,
        DIGITS,
        SKEW,
        STEP_SECONDS,
        bytes,
        Some(ISSUER.to_string()),
        account,
    ))
}

/// A fresh 160-bit secret (RFC 4226's recommended size) for `email`.
pub fn generate(email: &str) -> TwoFactorSetup {
    let secret = Secret::generate_secret().to_encoded().to_string();
    let otpauth_url = totp(&secret, email)
        .map(|t| t.get_url())
        .unwrap_or_default();
    TwoFactorSetup {
        secret,
        otpauth_url,
    }
}

/// The time step whose code `code` is, within one step either way of `unix_seconds`; `None`
/// when it is no such code (or not six digits, or the secret is malformed). Each candidate is
/// compared in constant time. The caller must still claim the step (single use).
pub fn verify(secret_b32: &str, code: &str, unix_seconds: u64) -> Option<u64> {
    let code = code.trim();
    if code.len() != DIGITS || !code.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let totp = totp(secret_b32, "")?;
    let now = unix_seconds / STEP_SECONDS;
    let mut matched = None;
    // Every candidate is computed and compared, so the time taken says nothing about which.
    for step in now.saturating_sub(SKEW as u64)..=now + SKEW as u64 {
        let candidate = totp.generate(step * STEP_SECONDS);
        if bool::from(candidate.as_bytes().ct_eq(code.as_bytes())) {
            matched = Some(step);
        }
    }
    matched
}

/// The code of `secret_b32` for Unix time `unix_seconds` (tests and tooling).
pub fn code_at(secret_b32: &str, unix_seconds: u64) -> Option<String> {
    totp(secret_b32, "").map(|t| t.generate(unix_seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secret_verifies_its_current_code() {
        let s = generate("a:b@example.com");
        assert!(
            s.otpauth_url.starts_with("otpauth://totp/Gateway:"),
            "{}",
            s.otpauth_url
        );
        assert!(s.otpauth_url.contains("secret="));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let code = code_at(&s.secret, now).expect("code");
        assert_eq!(verify(&s.secret, &code, now), Some(now / STEP_SECONDS));
        // The previous step's code is still accepted (clock drift), as its own step.
        let earlier = code_at(&s.secret, now - STEP_SECONDS).expect("code");
        if earlier != code {
            assert_eq!(
                verify(&s.secret, &earlier, now),
                Some(now / STEP_SECONDS - 1)
            );
        }
        assert_eq!(verify(&s.secret, &code, now + 3 * STEP_SECONDS), None);
        let wrong = format!(
            "{:06}",
            (code.parse::<u32>().expect("digits") + 1) % 1_000_000
        );
        assert_eq!(verify(&s.secret, &wrong, now), None);
        assert_eq!(verify(&s.secret, "12345", now), None);
        assert_eq!(verify("not base32!", &code, now), None);
    }

    #[test]
    fn seeds_are_sealed_per_user() {
        let key = SeedKey::derive(b"session secret");
        let seed = generate("a@example.com").secret;
        let sealed = key.seal("usr_a", &seed).expect("seal");
        assert!(is_sealed(&sealed));
        assert!(!sealed.contains(&seed));
        assert_ne!(
            key.seal("usr_a", &seed),
            Some(sealed.clone()),
            "fresh nonce"
        );
        assert_eq!(key.open("usr_a", &sealed).as_deref(), Some(seed.as_str()));
        assert_eq!(key.open("usr_b", &sealed), None, "bound to its user");
        assert_eq!(SeedKey::derive(b"other").open("usr_a", &sealed), None);
        let mut altered = sealed.clone();
        altered.pop();
        assert_eq!(key.open("usr_a", &altered), None);
        // A plaintext seed from before sealing still opens.
        assert!(!is_sealed(&seed));
        assert_eq!(key.open("usr_a", &seed).as_deref(), Some(seed.as_str()));
    }

    #[test]
    fn rfc6238_vector() {
        // RFC 6238 appendix B, SHA-1, T = 59 s: 94287082 (8 digits) -> last 6 digits.
        let secret = Secret::Raw(b"12345678901234567890".to_vec())
            .to_encoded()
            .to_string();
        assert_eq!(code_at(&secret, 59).as_deref(), Some("287082"));
    }
}
