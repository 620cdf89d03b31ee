//! API key material: generation and the peppered hash that is the only thing stored.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::util::random_base62;

/// Length of the random body after `sk-`: 40 base62 characters, about 238 bits.
const BODY_LEN: usize = 40;

/// A freshly generated key: the raw secret (shown once) and its displayable parts.
pub struct GeneratedKey {
    pub secret: String,
    pub prefix: String,
    pub suffix: String,
}

pub fn generate() -> GeneratedKey {
    let secret = format!("sk-{}", random_base62(BODY_LEN));
    let prefix = secret[..7].to_string();
    let suffix = secret[secret.len() - 4..].to_string();
    GeneratedKey {
        secret,
        prefix,
        suffix,
    }
}

/// HMAC-SHA256(pepper, key) in hex. Fast by design: keys carry ~238 random bits, so a slow KDF
/// would add latency to every request without adding security; the pepper keeps a stolen
/// database useless on its own.
pub fn hash(pepper: &[u8], key: &str) -> String {
    KeyHasher::new(pepper)
        .map(|h| h.hash(key))
        .unwrap_or_default()
}

/// [`hash`] with the pepper's HMAC state computed once. Keying an HMAC hashes the padded key
/// twice (inner and outer pad), half of the four SHA-256 blocks a key's hash takes; the
/// developer API hashes the presented key on every request, so it keeps one of these.
#[derive(Clone)]
pub struct KeyHasher(Hmac<Sha256>);

impl KeyHasher {
    /// `None` never happens for HMAC, which accepts keys of any length; the type allows it.
    pub fn new(pepper: &[u8]) -> Option<KeyHasher> {
        <Hmac<Sha256> as hmac::digest::KeyInit>::new_from_slice(pepper)
            .ok()
            .map(KeyHasher)
    }

    pub fn hash(&self, key: &str) -> String {
        let mut mac = self.0.clone();
        mac.update(key.as_bytes());
        // Into a stack buffer first: `hex::encode` collects a `String` one `char` at a time,
        // which cost more than the HMAC itself on every request.
        let mut out = [0u8; 64];
        match hex::encode_to_slice(mac.finalize().into_bytes(), &mut out) {
            Ok(()) => String::from_utf8(out.to_vec()).unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyHasher(<keyed>)")
    }
}

/// Cheap shape check before hashing: `sk-` and a plausible body. Anything else is not a key.
pub fn looks_like_key(candidate: &str) -> bool {
    candidate.len() >= 3 + 20
        && candidate.len() <= 200
        && candidate.starts_with("sk-")
        && candidate[3..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_documented_shape() {
        let k = generate();
        assert!(k.secret.starts_with("sk-"));
        assert_eq!(k.secret.len(), 43);
        assert!(k.secret[3..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert!(k.secret.starts_with(&k.prefix) && k.secret.ends_with(&k.suffix));
        assert!(looks_like_key(&k.secret));
        assert_ne!(generate().secret, k.secret);
    }

    #[test]
    fn hash_depends_on_pepper() {
        assert_ne!(hash(b"a", "sk-x"), hash(b"b", "sk-x"));
        assert_eq!(hash(b"a", "sk-x").len(), 64);
    }

    #[test]
    fn hash_is_lowercase_hex_of_the_hmac() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            hash(b"Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_kept_hasher_gives_every_key_its_own_hash() {
        let hasher = KeyHasher::new(b"Jefe").expect("HMAC takes any key");
        let expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        assert_eq!(hasher.hash("what do ya want for nothing?"), expected);
        // The keyed state is not consumed or changed by a hash.
        assert_eq!(hasher.hash("sk-other"), hash(b"Jefe", "sk-other"));
        assert_eq!(hasher.hash("what do ya want for nothing?"), expected);
    }
}
