//! Small shared helpers: clock, timestamps, random identifiers.

use rand::Rng;
use std::time::{SystemTime, UNIX_EPOCH};

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Milliseconds since the Unix epoch: the unit every stored timestamp uses, so both databases
/// compare and index them as plain integers.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// ISO 8601 / RFC 3339 UTC rendering with millisecond precision, e.g. `2026-11-22T13:05:00.123Z`.
pub fn iso(ms: i64) -> String {
    let nanos = (ms as i128) * 1_000_000;
    match time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        Err(_) => "1970-01-01T00:00:00.000Z".to_string(),
    }
}

/// `iso` for optional timestamps, as JSON (`null` when absent).
pub fn iso_opt(ms: Option<i64>) -> serde_json::Value {
    ms.map(|m| serde_json::Value::String(iso(m)))
        .unwrap_or(serde_json::Value::Null)
}

/// `n` characters of base62 from the OS-seeded CSPRNG.
pub fn random_base62(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| BASE62[rng.random_range(0..BASE62.len())] as char)
        .collect()
}

/// A resource id such as `usr_3fK…`: prefix, underscore, 20 base62 characters (~119 bits).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_base62(20))
}

/// True when `id` has the shape `new_id(prefix)` produces; malformed ids are rejected before any
/// lookup.
pub fn is_valid_id(prefix: &str, id: &str) -> bool {
    match id.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')) {
        Some(body) => body.len() == 20 && body.bytes().all(|b| b.is_ascii_alphanumeric()),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_format() {
        assert_eq!(iso(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn ids() {
        let id = new_id("key");
        assert!(is_valid_id("key", &id));
        assert!(!is_valid_id("usr", &id));
        assert!(!is_valid_id("key", "key_short"));
        assert!(!is_valid_id("key", "key_aaaaaaaaaaaaaaaaaaa!"));
    }
}
