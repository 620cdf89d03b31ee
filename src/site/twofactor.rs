//! Two-factor sign-in with TOTP (RFC 6238: SHA-1, 6 digits, 30-second steps), as authenticator
//! apps expect. The secret is stored base32 in `users.totp_secret`; `users.two_factor_enabled`
//! turns the check on. The account API's security endpoint uses `generate` to turn it on and
//! `verify` to turn it off; sign-in uses `verify`.

use totp_rs::{Algorithm, Secret, TOTP};

/// Shown in authenticator apps next to the account.
pub const ISSUER: &str = "Gateway";

const DIGITS: usize = 6;
const STEP_SECONDS: u64 = 30;
/// One step either way absorbs clock drift between the phone and the server.
const SKEW: u8 = 1;

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

/// True when `code` is six digits and the current code (±1 step) of `secret_b32`. Constant-time
/// comparison; a malformed secret never verifies.
pub fn verify(secret_b32: &str, code: &str) -> bool {
    let code = code.trim();
    if code.len() != DIGITS || !code.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    totp(secret_b32, "")
        .and_then(|t| t.check_current(code).ok())
        .unwrap_or(false)
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
        assert!(verify(&s.secret, &code));
        let wrong = format!(
            "{:06}",
            (code.parse::<u32>().expect("digits") + 1) % 1_000_000
        );
        assert!(!verify(&s.secret, &wrong));
        assert!(!verify(&s.secret, "12345"));
        assert!(!verify("not base32!", &code));
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
