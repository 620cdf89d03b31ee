//! Check 2: credentials must never travel in the query string, where proxies, logs and browser
//! history keep them (CONTRACT §3 lists the names).

use percent_encoding::percent_decode_str;

const SENSITIVE_NAMES: [&str; 11] = [
    "key",
    "api_key",
    "api-key",
    "apikey",
    "x-api-key",
    "token",
    "access_token",
    "auth",
    "authorization",
    "secret",
    "session",
];

/// How many rounds of percent-decoding are undone: a credential encoded twice (`%2573k-`)
/// reaches a backend that decodes twice as `sk-`. Past this many rounds the query is refused
/// anyway (see [`decode`]).
const DECODE_ROUNDS: usize = 4;

/// The text after undoing form encoding until it stops changing; `None` when it still changes
/// after [`DECODE_ROUNDS`] rounds (nobody encodes an honest parameter five times).
fn decode(s: &str) -> Option<String> {
    // `+` is a space in form encoding; a value starting with `sk-` is what matters here.
    let mut text = s.replace('+', " ");
    for _ in 0..DECODE_ROUNDS {
        let next = percent_decode_str(&text).decode_utf8_lossy().into_owned();
        if next == text {
            return Some(text);
        }
        text = next;
    }
    None
}

/// Whether a parameter name is, or is built on, a sensitive name: `key`, `key[]`,
/// `api_key[0]`, `api.key`, `auth.token` (frameworks read brackets and dots as nesting).
fn sensitive_name(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    if SENSITIVE_NAMES.contains(&name.as_str()) {
        return true;
    }
    let parts = || {
        name.split(['.', '[', ']'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
    };
    // Each nested part alone, and the parts joined as one name (`api.key` is `api_key`).
    let joined: Vec<&str> = parts().collect();
    parts().any(|p| SENSITIVE_NAMES.contains(&p))
        || ["_", "-", ""]
            .iter()
            .any(|sep| SENSITIVE_NAMES.contains(&joined.join(sep).as_str()))
}

/// True when the query carries a sensitive parameter name or any value beginning `sk-`.
/// Parameters are split on `&` and on `;` (which some servers also treat as a separator).
pub fn has_sensitive_param(query: &str) -> bool {
    query
        .split(['&', ';'])
        .filter(|p| !p.is_empty())
        .any(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(name), Some(value)) = (decode(name), decode(value)) else {
                return true;
            };
            sensitive_name(&name)
                || value.trim_start().starts_with("sk-")
                || name.trim_start().starts_with("sk-")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values() {
        assert!(has_sensitive_param("key=abc"));
        assert!(has_sensitive_param("a=1&API_KEY=x"));
        assert!(has_sensitive_param("x-api-key"));
        assert!(has_sensitive_param("foo=sk-abc"));
        assert!(has_sensitive_param("foo=%73k-abc"));
        assert!(has_sensitive_param("%6Bey=1"));
        assert!(has_sensitive_param("Session=1"));
        assert!(!has_sensitive_param("limit=10&after=abc"));
        assert!(!has_sensitive_param(""));
        assert!(!has_sensitive_param("monkey=1&tokens=2"));
        for smuggled in [
            "a=1;key=sk-abc",
            "key[]=1",
            "api_key[0]=1",
            "api.key=1",
            "auth.token=1",
            "x=%2573k-abc",
            "x=%252573k-abc",
            "%256Bey=1",
            "sk-abc",
        ] {
            assert!(has_sensitive_param(smuggled), "{smuggled}");
        }
        assert!(!has_sensitive_param(
            "monkey=1;tokens=2&keyboard[]=3&a.b=%2541"
        ));
    }
}
