//! Finding the operator's provider credential in a provider's answer, however it was written.
//!
//! A provider that quotes the credential back (in an error's message, an echoed request, a
//! debug field) rarely quotes it plainly only: it may be percent-encoded in a URL it reports,
//! JSON-escaped (`\u002d`, `\/`), base64-encoded on its own or inside a larger blob (a Basic
//! header, an encoded request), or printed as hex. The gateway masks every one of these forms
//! before a client sees the body.
//!
//! Two ideas keep this cheap and complete:
//! - Encodings that write each character on its own (percent, JSON and `\x` escapes, in any
//!   mix and either hex case) are undone in one pass over the body, giving a *decoded view*
//!   whose every byte knows where it came from; nothing needs enumerating per escaped subset.
//! - Encodings that mix characters (base64, hex) become fixed needles, made once when the
//!   config is loaded: base64 at each of the three byte alignments the key can have inside a
//!   larger encoded blob (only the characters that depend on the key alone), standard and
//!   URL-safe, and hex in both cases. Their own characters may arrive escaped too (`\/` in
//!   JSON, `%2B` in a URL), which the decoded view also undoes.
//!
//! All needles sit in one Aho-Corasick automaton that scans the body and, when it holds an
//! escape at all, its decoded view; each hit masks the source bytes it came from.

use std::borrow::Cow;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;

/// What replaces each masked span.
pub const MASK: &str = "***";

/// Credentials shorter than this are not masked: masking a two-letter test key would rewrite
/// ordinary words in the body.
pub const MIN_MASKED_LEN: usize = 8;

/// The encoded forms of one provider credential, built once per config load. The default masks
/// nothing (a provider without a credential).
#[derive(Clone, Default)]
pub struct CredentialMask {
    finder: Option<Arc<AhoCorasick>>,
}

impl std::fmt::Debug for CredentialMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The needles are the secret in other words: never printed.
        f.write_str(if self.finder.is_some() {
            "CredentialMask(active)"
        } else {
            "CredentialMask(none)"
        })
    }
}

impl CredentialMask {
    /// The mask of `secret`; an inactive one when there is none or it is too short to mask.
    pub fn new(secret: Option<&str>) -> CredentialMask {
        let Some(secret) = secret.filter(|s| s.len() >= MIN_MASKED_LEN) else {
            return CredentialMask::default();
        };
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(needles(secret.as_bytes()))
            .ok();
        CredentialMask {
            finder: finder.map(Arc::new),
        }
    }

    /// True when there is a credential to look for.
    pub fn is_active(&self) -> bool {
        self.finder.is_some()
    }

    /// `body` with every encoded occurrence of the credential replaced by [`MASK`]; borrowed
    /// as it is when there is none.
    pub fn mask<'a>(&self, body: &'a [u8]) -> Cow<'a, [u8]> {
        let Some(finder) = self.finder.as_deref() else {
            return Cow::Borrowed(body);
        };
        let mut spans: Vec<(usize, usize)> = finder
            .find_iter(body)
            .map(|m| (m.start(), m.end()))
            .collect();
        if let Some(view) = DecodedView::of(body) {
            spans.extend(
                finder
                    .find_iter(&view.bytes)
                    .map(|m| (view.source(m.start()), view.source(m.end()))),
            );
        }
        if spans.is_empty() {
            return Cow::Borrowed(body);
        }
        spans.sort_unstable();
        let mut out = Vec::with_capacity(body.len());
        let mut at = 0;
        for (start, end) in spans {
            if end <= at {
                continue;
            }
            if start >= at {
                out.extend_from_slice(&body[at..start]);
                out.extend_from_slice(MASK.as_bytes());
            }
            // An overlapping span only widens the masked one.
            at = end;
        }
        out.extend_from_slice(&body[at..]);
        Cow::Owned(out)
    }
}

/// Every fixed form of `key` the automaton looks for (the escaped forms are undone by the
/// decoded view instead).
fn needles(key: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![key.to_vec()];
    // Form encoding writes a space as `+` (`%20` is undone by the decoded view).
    if key.contains(&b' ') {
        out.push(
            key.iter()
                .map(|&b| if b == b' ' { b'+' } else { b })
                .collect(),
        );
    }
    for align in 0..3 {
        let core = base64_core(key, align);
        out.push(core.clone());
        out.push(
            core.iter()
                .map(|&c| match c {
                    b'+' => b'-',
                    b'/' => b'_',
                    c => c,
                })
                .collect(),
        );
    }
    let lower = hex::encode(key);
    out.push(lower.to_ascii_uppercase().into_bytes());
    out.push(lower.into_bytes());
    out.sort();
    out.dedup();
    out
}

/// The base64 characters (standard alphabet) that encode `key` alone when it starts `align`
/// bytes into a 3-byte group of a larger blob: the characters that also carry bits of the
/// neighbouring bytes are left off, so the needle is found whatever surrounds the key.
fn base64_core(key: &[u8], align: usize) -> Vec<u8> {
    let mut padded = vec![0u8; align];
    padded.extend_from_slice(key);
    let encoded = STANDARD_NO_PAD.encode(&padded).into_bytes();
    // Character i covers bits 6i..6i+6 of the blob; the key's bits are 8·align..8·(align+len).
    let first = (8 * align).div_ceil(6);
    let last = 8 * padded.len() / 6;
    encoded
        .get(first..last)
        .map(<[u8]>::to_vec)
        .unwrap_or_default()
}

/// The body with its character escapes undone, and where each of its bytes came from.
struct DecodedView {
    bytes: Vec<u8>,
    /// After each escape: (index in `bytes` of the byte following it, index in the body of the
    /// byte following it). Between two entries the view and the body advance together.
    marks: Vec<(usize, usize)>,
}

impl DecodedView {
    /// The view of `body`, or `None` when it holds no escape (the body is then its own view).
    fn of(body: &[u8]) -> Option<DecodedView> {
        memchr::memchr2(b'%', b'\\', body)?;
        let mut bytes = Vec::with_capacity(body.len());
        let mut marks = Vec::new();
        let mut i = 0;
        while i < body.len() {
            match unescape(&body[i..]) {
                Some((byte, len)) => {
                    bytes.push(byte);
                    i += len;
                    marks.push((bytes.len(), i));
                }
                None => {
                    bytes.push(body[i]);
                    i += 1;
                }
            }
        }
        if marks.is_empty() {
            return None;
        }
        Some(DecodedView { bytes, marks })
    }

    /// The body index of view index `at` (`at` may be the view's length: the body's end).
    fn source(&self, at: usize) -> usize {
        let k = self.marks.partition_point(|&(view, _)| view <= at);
        match k.checked_sub(1).and_then(|k| self.marks.get(k)) {
            Some(&(view, body)) => body + (at - view),
            None => at,
        }
    }
}

/// The ASCII byte an escape at the start of `s` stands for, and the escape's length: `%hh`,
/// `\u00hh` (JSON, JavaScript), `\xhh` and `\/`.
fn unescape(s: &[u8]) -> Option<(u8, usize)> {
    match s {
        [b'%', h, l, ..] => Some((hex_byte(*h, *l)?, 3)),
        [b'\\', b'u', a, b, h, l, ..] if hex_byte(*a, *b) == Some(0) => {
            Some((hex_byte(*h, *l).filter(u8::is_ascii)?, 6))
        }
        [b'\\', b'x', h, l, ..] => Some((hex_byte(*h, *l).filter(u8::is_ascii)?, 4)),
        [b'\\', b'/', ..] => Some((b'/', 2)),
        _ => None,
    }
}

fn hex_byte(h: u8, l: u8) -> Option<u8> {
    let digit = |c: u8| (c as char).to_digit(16);
    u8::try_from(digit(h)? * 16 + digit(l)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    const KEY: &str = "sk-proj/Echo+Key 7~x.Q_9";

    fn masked(mask: &CredentialMask, body: &str) -> String {
        String::from_utf8(mask.mask(body.as_bytes()).into_owned()).unwrap()
    }

    fn pct(s: &str, upper: bool, all: bool) -> String {
        s.bytes()
            .map(|b| {
                if !all && b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else if upper {
                    format!("%{b:02X}")
                } else {
                    format!("%{b:02x}")
                }
            })
            .collect()
    }

    #[test]
    fn every_encoding_is_masked() {
        let mask = CredentialMask::new(Some(KEY));
        let json_u = |upper: bool| -> String {
            KEY.chars()
                .map(|c| match c {
                    c if c.is_ascii_alphanumeric() => c.to_string(),
                    c if upper => format!("\\u{:04X}", c as u32),
                    c => format!("\\u{:04x}", c as u32),
                })
                .collect()
        };
        let mut forms = vec![
            KEY.to_string(),
            pct(KEY, true, false),
            pct(KEY, false, false),
            pct(KEY, true, true),
            KEY.replace(' ', "+")
                .replace('/', "%2F")
                .replace('~', "%7e"),
            json_u(true),
            json_u(false),
            KEY.replace('/', "\\/"),
            KEY.replace('-', "\\x2d"),
            hex::encode(KEY),
            hex::encode_upper(KEY),
        ];
        for prefix in ["", "u", "us", "user:", "{\"api_key\":\""] {
            let blob = format!("{prefix}{KEY}\"}}");
            let std = STANDARD_NO_PAD.encode(&blob);
            forms.push(std.clone());
            forms.push(std.replace('/', "\\/"));
            forms.push(std.replace('+', "%2B").replace('/', "%2f"));
            forms.push(URL_SAFE_NO_PAD.encode(&blob));
        }
        for form in forms {
            let body = format!("{{\"error\":{{\"message\":\"bad key [{form}] here\"}}}}");
            let out = masked(&mask, &body);
            assert!(!out.contains(&form), "{form} survived: {out}");
            assert!(
                out.starts_with("{\"error\":{\"message\":\"bad key [") && out.contains("***"),
                "{out}"
            );
            assert!(out.ends_with("] here\"}}"), "{form}: {out}");
        }
    }

    #[test]
    fn plain_echoes_become_one_mask_each() {
        let mask = CredentialMask::new(Some("sk-operator-123"));
        let body = "key sk-operator-123 has no access; sk%2Doperator%2d123.";
        assert_eq!(masked(&mask, body), "key *** has no access; ***.");
    }

    #[test]
    fn bodies_without_the_key_are_borrowed_unchanged() {
        let mask = CredentialMask::new(Some("sk-operator-123"));
        for body in [
            "",
            "no key here",
            "100% sure \\u00e9 \\/ %zz %4",
            "\\u00",
            "%",
        ] {
            assert!(
                matches!(mask.mask(body.as_bytes()), Cow::Borrowed(_)),
                "{body}"
            );
        }
        for inactive in [CredentialMask::new(None), CredentialMask::new(Some("sk-"))] {
            assert!(!inactive.is_active());
            assert!(matches!(inactive.mask(b"sk- sk-"), Cow::Borrowed(_)));
        }
        assert_eq!(format!("{:?}", mask), "CredentialMask(active)");
    }

    #[test]
    fn a_literal_key_after_a_stray_escape_is_still_found() {
        // `%ab` would decode to one byte and hide the key's first two characters from the view.
        let mask = CredentialMask::new(Some("abcdef0123456789"));
        assert_eq!(masked(&mask, "100%abcdef0123456789!"), "100%***!");
    }

    #[test]
    fn views_map_back_to_the_body() {
        let body = b"a%41b\\u0042c\\/d";
        let view = DecodedView::of(body).unwrap();
        assert_eq!(view.bytes, b"aAbBc/d");
        let sources: Vec<usize> = (0..=view.bytes.len()).map(|i| view.source(i)).collect();
        assert_eq!(sources, [0, 1, 4, 5, 11, 12, 14, 15]);
    }
}
