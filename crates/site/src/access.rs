//! Who may use the site at all: the blocked domains and the private beta's allowlist
//! (`[auth]`). Sign-in asks before issuing a code and again before a session starts; the
//! account and payment APIs ask on every request (the `Member` extractor), so an address taken
//! off the list loses access without waiting for its session to end.

use gateway_core::config::AuthConfig;

use crate::error::SiteError;

fn domain_of(email: &str) -> &str {
    email.rsplit_once('@').map(|(_, d)| d).unwrap_or("")
}

/// `blocked_domain` for a blocked domain or any subdomain of one; `private_beta_only` when the
/// beta is closed and neither the address nor `@domain` is on the allowlist.
pub fn check_email_allowed(auth: &AuthConfig, email: &str) -> Result<(), SiteError> {
    let domain = domain_of(email);
    let blocked = auth.blocked_domains.iter().any(|b| {
        domain == b
            || domain
                .strip_suffix(b.as_str())
                .is_some_and(|rest| rest.ends_with('.'))
    });
    if blocked {
        return Err(SiteError::BlockedDomain);
    }
    check_beta(auth, email)
}

/// `private_beta_only` only when the private beta is closed and neither the address nor its
/// `@domain` is on the allowlist.
pub fn check_beta(auth: &AuthConfig, email: &str) -> Result<(), SiteError> {
    let domain = domain_of(email);
    let allowed = !auth.private_beta
        || auth
            .beta_allowlist
            .iter()
            .any(|a| a == email || a.strip_prefix('@') == Some(domain));
    if allowed {
        Ok(())
    } else {
        Err(SiteError::PrivateBetaOnly)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::config::Config;
    use std::path::Path;

    fn auth(extra: &str) -> AuthConfig {
        Config::from_str(Path::new("t.toml"), &format!("[auth]\n{extra}"))
            .expect("config")
            .auth
    }

    #[test]
    fn domain_gates() {
        let a = auth("blocked_domains = [\"Spam.example\"]");
        assert_eq!(
            check_email_allowed(&a, "x@spam.example"),
            Err(SiteError::BlockedDomain)
        );
        assert_eq!(
            check_email_allowed(&a, "x@mx.spam.example"),
            Err(SiteError::BlockedDomain)
        );
        assert!(check_email_allowed(&a, "x@notspam.example").is_ok());

        let b =
            auth("private_beta = true\nbeta_allowlist = [\"Vip@example.com\", \"@team.example\"]");
        assert!(check_email_allowed(&b, "vip@example.com").is_ok());
        assert!(check_email_allowed(&b, "anyone@team.example").is_ok());
        assert_eq!(
            check_email_allowed(&b, "other@example.com"),
            Err(SiteError::PrivateBetaOnly)
        );
        assert_eq!(
            check_email_allowed(&b, "x@sub.team.example"),
            Err(SiteError::PrivateBetaOnly)
        );
    }
}
