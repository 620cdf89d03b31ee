//! `[auth]`: who may sign in, captcha, and how long codes, links and sessions last.

use std::time::Duration;

use super::file::AuthFile;

#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub private_beta: bool,
    /// Lowercased emails and `@domain` entries.
    pub beta_allowlist: Vec<String>,
    /// Lowercased domains without `@`.
    pub blocked_domains: Vec<String>,
    pub captcha_required: bool,
    pub captcha_verify_url: String,
    pub captcha_site_key: String,
    pub code_ttl: Duration,
    pub link_ttl: Duration,
    pub session_ttl: Duration,
    pub session_idle: Duration,
}

pub(super) fn validate(f: AuthFile) -> AuthConfig {
    let lower = |v: Option<Vec<String>>| -> Vec<String> {
        v.unwrap_or_default()
            .into_iter()
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let captcha_required = f.captcha_required.unwrap_or(false);
    AuthConfig {
        private_beta: f.private_beta.unwrap_or(false),
        beta_allowlist: lower(f.beta_allowlist),
        blocked_domains: lower(f.blocked_domains)
            .into_iter()
            .map(|d| d.trim_start_matches('@').to_string())
            .collect(),
        captcha_required,
        captcha_verify_url: f.captcha_verify_url.unwrap_or_default(),
        captcha_site_key: f.captcha_site_key.unwrap_or_default(),
        code_ttl: Duration::from_secs(f.code_ttl_seconds.unwrap_or(600).max(1)),
        link_ttl: Duration::from_secs(f.link_ttl_seconds.unwrap_or(900).max(1)),
        session_ttl: Duration::from_secs(3600 * f.session_ttl_hours.unwrap_or(720).max(1)),
        session_idle: Duration::from_secs(3600 * f.session_idle_hours.unwrap_or(168).max(1)),
    }
}
