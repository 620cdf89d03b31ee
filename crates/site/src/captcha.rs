//! Captcha verification against a Turnstile-compatible `siteverify` endpoint
//! (`auth.captcha_verify_url`): a form POST of `secret`, `response` and `remoteip`, answered
//! with JSON whose `success` says whether the token was good.

use std::sync::OnceLock;
use std::time::Duration;

use gateway_core::secrets::Secret;

/// The verifier gets this long; a slow or unreachable one fails the captcha rather than holding
/// the sign-in open.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a captcha did not pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptchaError {
    /// Required, but no secret (`GATEWAY_CAPTCHA_SECRET`) or no verify URL: `captcha_not_configured`.
    NotConfigured,
    /// The verifier said no, or could not be asked: `captcha_failed`.
    Failed,
}

fn client() -> Option<&'static reqwest::Client> {
    static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(VERIFY_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| log::error!("cannot build the captcha client: {e}"))
                .ok()
        })
        .as_ref()
}

/// Asks the verifier about `token`. `remote_ip` is passed on when known so the verifier can
/// tie the token to the solving client.
pub async fn verify(
    verify_url: &str,
    secret: Option<&Secret>,
    token: &str,
    remote_ip: Option<&str>,
) -> Result<(), CaptchaError> {
    let secret = secret.ok_or(CaptchaError::NotConfigured)?;
    if verify_url.is_empty() {
        return Err(CaptchaError::NotConfigured);
    }
    let secret = std::str::from_utf8(secret.expose()).map_err(|_| CaptchaError::NotConfigured)?;
    let client = client().ok_or(CaptchaError::Failed)?;
    let mut form = vec![("secret", secret), ("response", token)];
    if let Some(ip) = remote_ip {
        form.push(("remoteip", ip));
    }
    let resp = client
        .post(verify_url)
        .form(&form)
        .send()
        .await
        .map_err(|e| {
            log::warn!("captcha verifier unreachable: {}", e.without_url());
            CaptchaError::Failed
        })?;
    if !resp.status().is_success() {
        log::warn!("captcha verifier answered {}", resp.status());
        return Err(CaptchaError::Failed);
    }
    let body: serde_json::Value = resp.json().await.map_err(|e| {
        log::warn!("captcha verifier sent no JSON: {}", e.without_url());
        CaptchaError::Failed
    })?;
    if body.get("success").and_then(serde_json::Value::as_bool) == Some(true) {
        Ok(())
    } else {
        Err(CaptchaError::Failed)
    }
}
