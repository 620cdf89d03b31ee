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

fn decode(s: &str) -> String {
    // `+` is a space in form encoding; a value starting with `sk-` is what matters here.
    percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// True when the query carries a sensitive parameter name or any value beginning `sk-`.
pub fn has_sensitive_param(query: &str) -> bool {
    query.split('&').filter(|p| !p.is_empty()).any(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(name).trim().to_ascii_lowercase();
        let value = decode(value);
        SENSITIVE_NAMES.contains(&name.as_str()) || value.trim_start().starts_with("sk-")
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
    }
}
