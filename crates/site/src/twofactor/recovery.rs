//! Recovery codes: ten single-use codes handed out once when two-factor is confirmed, for the
//! day the authenticator is lost. Each stands in for one TOTP code at sign-in or when turning
//! two-factor off.
//!
//! A code is 10 characters from a 32-letter alphabet without look-alikes (`0`/`o`, `1`/`l`),
//! about 50 random bits, shown as `xxxxx-xxxxx`; case, spaces and dashes do not matter when it
//! is typed back. Only a keyed digest is stored (HMAC with the site key, bound to the user), so
//! a copy of the database does not reveal usable codes, and a presented code is compared
//! against each unused digest in constant time.

use rand::Rng;
use subtle::ConstantTimeEq;

use crate::authkey::AuthKey;

/// How many codes an enrolment hands out.
pub const COUNT: usize = 10;
const LEN: usize = 10;
const ALPHABET: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";

/// Fresh codes as shown to the user (`xxxxx-xxxxx`).
pub fn generate() -> Vec<String> {
    let mut rng = rand::rng();
    (0..COUNT)
        .map(|_| {
            let raw: String = (0..LEN)
                .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
                .collect();
            format!("{}-{}", &raw[..LEN / 2], &raw[LEN / 2..])
        })
        .collect()
}

/// The canonical form of a typed code (lowercase, no spaces or dashes), or `None` when it
/// cannot be a recovery code.
pub fn normalize(typed: &str) -> Option<String> {
    let code: String = typed
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    (code.len() == LEN && code.bytes().all(|b| ALPHABET.contains(&b))).then_some(code)
}

/// The stored digest of `code` (any typed form) for `user_id`.
pub fn digest(key: &AuthKey, user_id: &str, code: &str) -> Option<String> {
    let code = normalize(code)?;
    Some(key.digest("recovery", &format!("{user_id}:{code}")))
}

/// Which of `stored` (the user's unused digests) `digest` is. Every candidate is compared, in
/// constant time, so the time taken says nothing about which one matched.
pub fn find<'a>(stored: &'a [String], digest: &str) -> Option<&'a str> {
    let mut found = None;
    for candidate in stored {
        if bool::from(candidate.as_bytes().ct_eq(digest.as_bytes())) {
            found = Some(candidate.as_str());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_read_back_in_any_form() {
        let codes = generate();
        assert_eq!(codes.len(), COUNT);
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), COUNT);
        let key = AuthKey::new(b"k").expect("key");
        for c in &codes {
            assert_eq!(c.len(), LEN + 1, "{c}");
            let shouted = format!(" {} ", c.to_uppercase().replace('-', " "));
            assert_eq!(digest(&key, "usr_a", c), digest(&key, "usr_a", &shouted));
            assert_ne!(digest(&key, "usr_a", c), digest(&key, "usr_b", c));
        }
        assert_eq!(
            normalize("123456"),
            None,
            "a TOTP code is not a recovery code"
        );
        assert_eq!(
            normalize("abcde-fghi0"),
            None,
            "look-alikes are not in the alphabet"
        );
        let stored: Vec<String> = codes
            .iter()
            .filter_map(|c| digest(&key, "usr_a", c))
            .collect();
        let d = digest(&key, "usr_a", &codes[3]).expect("digest");
        assert_eq!(find(&stored, &d), Some(stored[3].as_str()));
        let other = digest(&key, "usr_b", &codes[3]).expect("digest");
        assert_eq!(find(&stored, &other), None);
    }
}
