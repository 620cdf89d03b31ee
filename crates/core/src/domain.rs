//! Words of the gateway's domain that every part uses: config, storage, quota and both
//! services speak them, so they live apart from each of those.

/// Normalizes an email for storage and lookup; `None` when it is not plausibly an address.
///
/// Only the common form is accepted: a dot-atom local part (no quoted strings, comments or
/// backslashes) and a host name of letters, digits and hyphens (no `[127.0.0.1]` literals),
/// which is also what the mailer must be able to address: an address that passed here and
/// failed there answered 500 instead of `invalid_email`.
pub fn normalize_email(raw: &str) -> Option<String> {
    let e = raw.trim().to_ascii_lowercase();
    if e.len() > 254 {
        return None;
    }
    let (local, domain) = e.split_once('@')?;
    let atext = |c: char| c.is_alphanumeric() || "!#$%&'*+/=?^_`{|}~-".contains(c);
    let local_ok = local.len() <= 64
        && local
            .split('.')
            .all(|part| !part.is_empty() && part.chars().all(atext));
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_alphanumeric() || c == '-')
    };
    let domain_ok = domain.split('.').count() >= 2 && domain.split('.').all(label_ok);
    let mailable = e.parse::<lettre::Address>().is_ok();
    (local_ok && domain_ok && mailable).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails() {
        assert_eq!(
            normalize_email(" A@Example.COM "),
            Some("a@example.com".into())
        );
        assert_eq!(normalize_email("nope"), None);
        assert_eq!(normalize_email("a@b"), None);
        assert_eq!(normalize_email("a b@c.d"), None);
        assert_eq!(normalize_email("@c.d"), None);
        for odd in [
            "a\"b@example.com",
            "a@[127.0.0.1]",
            "a..b@example.com",
            "a@-x.com",
            "a(c)@x.com",
            "a@x_y.com",
        ] {
            assert_eq!(normalize_email(odd), None, "{odd}");
        }
        assert_eq!(
            normalize_email("First.Last+tag@Sub.Example.com").as_deref(),
            Some("first.last+tag@sub.example.com")
        );
    }
}
