//! Check 1: finding the API key in a request. Style A sends `Authorization: Bearer`, style B
//! `x-api-key`; both are accepted everywhere (CONTRACT §3).

use gateway_core::apikey::KeyHasher;
use http::HeaderName;
use pingora_http::RequestHeader;
use subtle::ConstantTimeEq;

static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The last key presented on one connection and its peppered hash. A client sends the same
/// key with every request of a kept-alive connection, so the HMAC is computed once per
/// connection and key instead of once per request. Kept in the connection's own Pingora
/// context (`HttpPersistentSettings`), never shared with another connection; the key is
/// compared in constant time.
#[derive(Default)]
pub struct KeyMemo {
    key: String,
    hash: String,
}

impl KeyMemo {
    /// The hash of `key`: the one remembered when the connection presented this key before.
    pub fn hash(&mut self, hasher: &KeyHasher, key: &str) -> &str {
        let same = !self.hash.is_empty()
            && self.key.len() == key.len()
            && bool::from(self.key.as_bytes().ct_eq(key.as_bytes()));
        if !same {
            self.hash = hasher.hash(key);
            self.key.clear();
            self.key.push_str(key);
        }
        &self.hash
    }
}

/// What the request offered as a credential.
#[derive(Debug, PartialEq, Eq)]
pub enum Presented<'a> {
    /// Nothing that looks like an `sk-` key: `missing_api_key`.
    Missing,
    /// An `sk-…` candidate, to be verified against the key cache.
    Key(&'a str),
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

pub fn presented_key(req: &RequestHeader) -> Presented<'_> {
    let from_bearer = req
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer)
        .filter(|k| k.starts_with("sk-"));
    // Looked up only without a bearer key, by a name built at compile time (a `&str` name is
    // parsed on every lookup).
    let from_x_api_key = || {
        req.headers
            .get(&X_API_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| k.starts_with("sk-"))
    };
    match from_bearer.or_else(from_x_api_key) {
        Some(k) => Presented::Key(k),
        None => Presented::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memo_reuses_a_hash_only_for_the_same_key() {
        let hasher = KeyHasher::new(b"pepper").expect("hasher");
        let mut memo = KeyMemo::default();
        let a = "sk-aaaaaaaaaaaaaaaaaaaaaaaa";
        let b = "sk-bbbbbbbbbbbbbbbbbbbbbbbb";
        assert_eq!(memo.hash(&hasher, a), hasher.hash(a));
        assert_eq!(memo.hash(&hasher, a), hasher.hash(a));
        // Another key on the same connection is hashed afresh, then remembered.
        assert_eq!(memo.hash(&hasher, b), hasher.hash(b));
        assert_eq!(
            memo.hash(&hasher, "sk-bbbbbbbbbbbbbbbbbbbbbbbbX"),
            hasher.hash("sk-bbbbbbbbbbbbbbbbbbbbbbbbX")
        );
        assert_eq!(memo.hash(&hasher, a), hasher.hash(a));
    }

    fn req(headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        for (k, v) in headers {
            r.insert_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn finds_keys() {
        assert_eq!(presented_key(&req(&[])), Presented::Missing);
        assert_eq!(
            presented_key(&req(&[("authorization", "Bearer sk-abc")])),
            Presented::Key("sk-abc")
        );
        assert_eq!(
            presented_key(&req(&[("authorization", "bearer  sk-abc ")])),
            Presented::Key("sk-abc")
        );
        assert_eq!(
            presented_key(&req(&[("x-api-key", "sk-xyz")])),
            Presented::Key("sk-xyz")
        );
        assert_eq!(
            presented_key(&req(&[("authorization", "Basic abc")])),
            Presented::Missing
        );
        assert_eq!(
            presented_key(&req(&[
                ("authorization", "Bearer nope"),
                ("x-api-key", "sk-1")
            ])),
            Presented::Key("sk-1")
        );
    }
}
