//! Sealing TOTP seeds at rest: XChaCha20-Poly1305 under a key derived from the session
//! secret, with the user's id as associated data.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::XChaCha20Poly1305;
use hkdf::Hkdf;
use sha2::Sha256;

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

/// True when a stored seed is sealed (false: a plaintext seed waiting to be sealed).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(SEALED_V1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twofactor::generate;

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
}
