//! Payment codes: the configured prefix plus characters from an alphabet without look-alikes
//! (no 0/O/1/I/L), drawn from the CSPRNG. Order codes have `ORDER_CODE_LEN` characters after
//! the prefix and personal codes `PERSONAL_CODE_LEN`, so a description is scanned with one
//! fixed window per kind, whatever the bank glued around the code.

use rand::Rng;

/// Characters of a payment code after its prefix: uppercase letters and digits that cannot be
/// misread when typed into a banking app (no 0/O, 1/I/L).
pub const CODE_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
/// Characters after the prefix of an order's code (31^8, about 8.5e11 codes).
pub const ORDER_CODE_LEN: usize = 8;
/// Characters after the prefix of a personal code; longer than order codes so the two kinds
/// never read as each other.
pub const PERSONAL_CODE_LEN: usize = 10;
/// Codes are redrawn this many times on a unique-constraint collision before giving up.
pub(super) const CODE_ATTEMPTS: usize = 6;
/// At most this many candidate codes are looked up per description.
const MAX_CANDIDATES: usize = 8;

/// A fresh code: `prefix` plus `len` characters of `CODE_ALPHABET` from the thread CSPRNG.
pub fn new_payment_code(prefix: &str, len: usize) -> String {
    let mut rng = rand::rng();
    let mut code = String::with_capacity(prefix.len() + len);
    code.push_str(prefix);
    for _ in 0..len {
        code.push(CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())] as char);
    }
    code
}

/// Codes a transfer description may carry, in the order they appear.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidates {
    pub orders: Vec<String>,
    pub personal: Vec<String>,
}

/// Finds every `prefix` occurrence (case-insensitively) and reads the fixed-length window after
/// it as an order code and as a personal code, when the window is all code characters. Banks
/// add references, names and punctuation around the code, sometimes without a space, so no
/// word boundary is required on either side.
pub fn find_codes(description: &str, prefix: &str) -> Candidates {
    let text: Vec<u8> = description
        .bytes()
        .map(|b| b.to_ascii_uppercase())
        .collect();
    let prefix = prefix.as_bytes();
    let mut out = Candidates::default();
    if prefix.is_empty() || text.len() < prefix.len() {
        return out;
    }
    let window = |start: usize, len: usize| -> Option<String> {
        let w = text.get(start..start + len)?;
        w.iter().all(|b| CODE_ALPHABET.contains(b)).then(|| {
            format!(
                "{}{}",
                String::from_utf8_lossy(prefix),
                String::from_utf8_lossy(w)
            )
        })
    };
    for at in 0..=(text.len() - prefix.len()) {
        if &text[at..at + prefix.len()] != prefix {
            continue;
        }
        let body = at + prefix.len();
        if let Some(code) = window(body, ORDER_CODE_LEN) {
            if out.orders.len() < MAX_CANDIDATES && !out.orders.contains(&code) {
                out.orders.push(code);
            }
        }
        if let Some(code) = window(body, PERSONAL_CODE_LEN) {
            if out.personal.len() < MAX_CANDIDATES && !out.personal.contains(&code) {
                out.personal.push(code);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_use_the_unambiguous_alphabet() {
        for _ in 0..200 {
            let c = new_payment_code("GW", ORDER_CODE_LEN);
            assert_eq!(c.len(), 2 + ORDER_CODE_LEN);
            assert!(c.starts_with("GW"));
            assert!(!c[2..].contains(['0', 'O', '1', 'I', 'L']), "{c}");
            assert!(c[2..].bytes().all(|b| CODE_ALPHABET.contains(&b)));
        }
    }

    #[test]
    fn codes_are_found_in_noise() {
        let c = find_codes("CT DEN:12345 gwabc23456 chuyen tien FT2411", "GW");
        assert_eq!(c.orders, vec!["GWABC23456".to_string()]);
        assert!(c.personal.is_empty(), "window runs into a space");
        // Glued on both sides, lowercase, punctuation.
        let c = find_codes("MBVCB.123.xgwKQ2MXA3Zfoo.CT", "GW");
        assert_eq!(c.orders, vec!["GWKQ2MXA3Z".to_string()]);
        assert!(c.personal.is_empty(), "O is not a code character");
        // Characters outside the alphabet end a window.
        assert!(find_codes("GW0OIL1234", "GW").orders.is_empty());
        // A personal code also yields its first eight characters as an order candidate.
        let c = find_codes("nap tien GWABCDEFGHJK", "GW");
        assert_eq!(c.personal, vec!["GWABCDEFGHJK".to_string()]);
        assert_eq!(c.orders, vec!["GWABCDEFGH".to_string()]);
        assert!(find_codes("", "GW").orders.is_empty());
        assert!(find_codes("G", "GW").orders.is_empty());
    }
}
