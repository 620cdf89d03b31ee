//! Small shared helpers: clock, timestamps, random identifiers.

use rand::distr::Alphanumeric;
use rand::Rng;
use std::time::{SystemTime, UNIX_EPOCH};

/// The hasher of the in-memory maps on the request path (identity cache, quota accounts,
/// routing, upstream pool): foldhash, seeded per process. Their keys are ids the gateway made,
/// configured names or outputs of a secret-keyed hash, never text a client picks freely, so
/// std's slower, flood-resistant SipHash buys nothing there.
pub type FastHash = foldhash::quality::RandomState;

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Creates `dir` and any missing parents with mode 0700: the data directory holds the
/// database, secrets, journal and pid file, none of them for other local users. A directory
/// that exists is left as the operator set it. The error names the directory.
pub fn create_private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

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
    let mut s = String::with_capacity(n);
    push_random_base62(&mut s, n);
    s
}

/// Uniform over the 62 alphanumerics: `Alphanumeric` draws 6 bits and rejects the two values
/// past 61, one `u32` per character, against a `random_range` multiply-and-reject per
/// character before (ids are made for every request).
fn push_random_base62(s: &mut String, n: usize) {
    let rng = rand::rng();
    s.extend(rng.sample_iter(Alphanumeric).take(n).map(char::from));
}

/// A resource id such as `usr_3fK…`: prefix, underscore, 20 base62 characters (~119 bits).
/// Built in one allocation: request ids are made for every request.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 21);
    id.push_str(prefix);
    id.push('_');
    push_random_base62(&mut id, 20);
    id
}

/// Like [`new_id`], but the first 8 of the 20 characters are the creation time (base62 ms, in
/// the alphabet's ASCII order, so ids sort by time) and 12 are random (~71 bits). Usage events
/// get these, so their ids sort like the events. (Until migration 0008 the usage table was
/// keyed by id alone, and this put each batch at the table's right edge; it is now keyed by
/// account and time, and the id only breaks ties.)
pub fn new_time_ordered_id(prefix: &str) -> String {
    let mut ms = now_ms().max(0) as u64;
    let mut stamp = [b'0'; 8];
    for slot in stamp.iter_mut().rev() {
        *slot = BASE62[(ms % 62) as usize];
        ms /= 62;
    }
    let mut id = String::with_capacity(prefix.len() + 21);
    id.push_str(prefix);
    id.push('_');
    id.push_str(std::str::from_utf8(&stamp).unwrap_or("00000000"));
    push_random_base62(&mut id, 12);
    id
}

/// True when `id` has the shape `new_id(prefix)` produces; malformed ids are rejected before any
/// lookup.
pub fn is_valid_id(prefix: &str, id: &str) -> bool {
    match id.strip_prefix(prefix).and_then(|r| r.strip_prefix('_')) {
        Some(body) => body.len() == 20 && body.bytes().all(|b| b.is_ascii_alphanumeric()),
        None => false,
    }
}

/// For `#[serde(default, deserialize_with = "present")]`: a field that is there, `null`
/// included. `Option` alone reads `null` as absent; readers that must agree with a JSON tree's
/// lookups (where `null` is `Some(Null)`) tell the two apart.
pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    #[test]
    fn time_ordered_ids_sort_by_creation_and_keep_the_id_shape() {
        let a = super::new_time_ordered_id("evt");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = super::new_time_ordered_id("evt");
        assert!(a < b, "{a} {b}");
        assert!(super::is_valid_id("evt", &a), "{a}");
        assert_ne!(a[12..], b[12..]);
    }

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

    /// Every length comes out exact, and 620,000 characters fall on each of the 62 within 500
    /// of the 10,000 a uniform draw gives (five standard deviations).
    #[test]
    fn random_base62_is_uniform_over_the_alphabet() {
        for n in 0..=41 {
            assert_eq!(random_base62(n).len(), n);
        }
        let mut counts = [0u32; 128];
        for _ in 0..31_000 {
            for b in random_base62(20).bytes() {
                counts[usize::from(b)] += 1;
            }
        }
        for (c, &n) in counts.iter().enumerate() {
            if BASE62.contains(&(c as u8)) {
                assert!(
                    (9_500..=10_500).contains(&n),
                    "{} drawn {n} times",
                    c as u8 as char
                );
            } else {
                assert_eq!(n, 0, "{c} is not base62");
            }
        }
    }
}
