//! Two-factor sign-in with TOTP (RFC 6238: SHA-1, 6 digits, 30-second steps), as authenticator
//! apps expect, and single-use recovery codes (`recovery`). `users.two_factor_enabled` turns
//! the check on.
//!
//! Enrolment has two steps so a mis-scanned secret never locks anyone out: the account API's
//! security endpoint `generate`s a seed and keeps it pending (`users.totp_pending_secret`);
//! only a code of that seed (`verify`) turns two-factor on, and that answer carries the
//! recovery codes, once. Sign-in and turning it off take either kind of code
//! ([`accept_second_factor`]).
//!
//! Every code compared spends a guess of the account's one budget of wrong codes
//! ([`budget`]), whichever request sends it.
//!
//! Seeds are stored sealed (see [`SeedKey`]): a copy of the database alone does not let anyone
//! compute codes. Each accepted code's time step is remembered (`users.totp_last_step`), and a
//! code is accepted only for a later step, so a code seen over a shoulder or in a log cannot be
//! used a second time (RFC 6238 §5.2).

pub mod budget;
pub mod recovery;
mod seal;

pub use seal::{is_sealed, seal_plaintext_seeds, SeedKey, SEALED_V1};

use subtle::ConstantTimeEq;
use totp_rs::{Algorithm, Secret, TOTP};

use crate::authkey::AuthKey;
use gateway_core::storage::{Db, StoreResult};
use gateway_core::util::now_ms;

/// Shown in authenticator apps next to the account.
pub const ISSUER: &str = "Gateway";

const DIGITS: usize = 6;
const STEP_SECONDS: u64 = 30;
/// One step either way absorbs clock drift between the phone and the server.
const SKEW: u8 = 1;

/// Checks `code` for a user whose stored seed is `stored`: the code must be current (±1 step)
/// and of a later step than any code accepted before for this user. False for a wrong, stale or
/// reused code.
pub async fn accept(
    db: &Db,
    key: &SeedKey,
    user_id: &str,
    stored: &str,
    code: &str,
) -> StoreResult<bool> {
    let Some(seed) = key.open(user_id, stored) else {
        log::error!(
            "user {user_id}: two-factor seed does not open (was GATEWAY_SESSION_SECRET changed? \
             `gateway user reset-2fa` turns it off)"
        );
        return Ok(false);
    };
    match verify(&seed, code, unix_now()) {
        Some(step) => db.auth().claim_totp_step(user_id, step as i64).await,
        None => Ok(false),
    }
}

/// Seconds since the Unix epoch, the clock TOTP codes are computed on.
pub fn unix_now() -> u64 {
    u64::try_from(now_ms() / 1000).unwrap_or(0)
}

/// Checks `code` as the second factor of a user with two-factor on whose stored seed is
/// `stored`: six digits are a TOTP code ([`accept`]: current, each time step once); anything
/// else is tried as one of the user's unused recovery codes, which it then uses up. False for a
/// wrong, stale or already used code.
pub async fn accept_second_factor(
    db: &Db,
    seed_key: &SeedKey,
    auth_key: &AuthKey,
    user_id: &str,
    stored: &str,
    code: &str,
) -> StoreResult<bool> {
    let code = code.trim();
    if code.len() == DIGITS && code.bytes().all(|b| b.is_ascii_digit()) {
        return accept(db, seed_key, user_id, stored, code).await;
    }
    let Some(digest) = recovery::digest(auth_key, user_id, code) else {
        return Ok(false);
    };
    let auth = db.auth();
    let unused = auth.unused_recovery_codes(user_id).await?;
    match recovery::find(&unused, &digest) {
        Some(found) => auth.use_recovery_code(user_id, found, now_ms()).await,
        None => Ok(false),
    }
}

/// A new secret and its `otpauth://` URL (for a QR code), returned once when an enrolment
/// starts.
#[derive(Clone)]
pub struct TwoFactorSetup {
    /// Base32, no padding: what people type by hand (stored sealed).
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
    fn rfc6238_vector() {
        // RFC 6238 appendix B, SHA-1, T = 59 s: 94287082 (8 digits) -> last 6 digits.
        let secret = Secret::Raw(b"12345678901234567890".to_vec())
            .to_encoded()
            .to_string();
        assert_eq!(code_at(&secret, 59).as_deref(), Some("287082"));
    }
}
