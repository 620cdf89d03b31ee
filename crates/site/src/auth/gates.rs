//! What a code request must pass besides the address gates (`access`): the captcha, when
//! required, and the per-address and per-client hourly limits.

use std::net::IpAddr;

use axum::http::HeaderMap;
use serde_json::Value;

use super::str_field;
use crate::authkey::AuthKey;
use crate::captcha::{self, CaptchaError};
use crate::error::{Failing, SiteError};
use crate::hourly;
use gateway_core::config::Config;
use gateway_core::state::AppState;

/// The client address the edge put in `x-gateway-client-ip` (never a client-sent header).
pub(super) fn client_ip(headers: &HeaderMap) -> Option<IpAddr> {
    headers
        .get("x-gateway-client-ip")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The rate-limit identity of an address: IPv4 as is, IPv6 by its /64, since one host usually
/// owns a whole /64.
fn rate_key_for_ip(ip: Option<IpAddr>) -> String {
    match ip {
        Some(IpAddr::V4(v4)) => v4.to_string(),
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        None => "unknown".to_string(),
    }
}

/// The captcha gate, when `auth.captcha_required`: `captcha_not_configured` (server side
/// missing), `captcha_required` (no token), `captcha_failed` (verifier said no).
pub(super) async fn check_captcha(
    state: &AppState,
    cfg: &Config,
    body: &Value,
    ip: Option<IpAddr>,
) -> Result<(), SiteError> {
    if !cfg.auth.captcha_required {
        return Ok(());
    }
    let secret = state.secrets.captcha_secret.as_ref();
    if secret.is_none() || cfg.auth.captcha_verify_url.is_empty() {
        return Err(SiteError::CaptchaNotConfigured);
    }
    let token = str_field(body, "captchaToken").ok_or(SiteError::CaptchaRequired)?;
    if token.len() > 4096 {
        return Err(SiteError::CaptchaFailed);
    }
    let ip = ip.map(|i| i.to_string());
    captcha::verify(&cfg.auth.captcha_verify_url, secret, token, ip.as_deref())
        .await
        .map_err(|e| match e {
            CaptchaError::NotConfigured => SiteError::CaptchaNotConfigured,
            CaptchaError::Failed => SiteError::CaptchaFailed,
        })
}

/// `rate_limited` when this address or this client has asked for more than
/// `limits.request_code_per_hour` codes in the last hour. Counters live in the database (keyed
/// digests, not addresses) so every instance shares them.
pub(super) async fn check_rate(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    email: &str,
    ip: Option<IpAddr>,
) -> Result<(), SiteError> {
    let limit = i64::from(cfg.limits.request_code_per_hour);
    let buckets = [
        format!("email:{}", key.digest("rate-email", email)),
        format!("ip:{}", key.digest("rate-ip", &rate_key_for_ip(ip))),
    ];
    let mut limited = false;
    for bucket in &buckets {
        // Both counters always move, so neither can be probed separately.
        limited |= hourly::over_limit(state, bucket, limit)
            .await
            .or_fail(SiteError::AuthChallengeFailed)?;
    }
    if limited {
        Err(SiteError::RateLimited)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_keys() {
        assert_eq!(rate_key_for_ip("10.1.2.3".parse().ok()), "10.1.2.3");
        assert_eq!(
            rate_key_for_ip("2001:db8:1:2:3:4:5:6".parse().ok()),
            "2001:db8:1:2::/64"
        );
        assert_eq!(rate_key_for_ip(None), "unknown");
    }
}
