//! Challenges: `POST /request-code` and `POST /resend-code` issue a 6-digit code and a link
//! token, store their keyed digests, mail both, and bind the challenge to the asking browser
//! with a signed OTP cookie.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use rand::Rng;
use serde::Serialize;
use serde_json::Value;

use super::gates::{check_captcha, check_rate, client_ip};
use super::{ms, str_field, CHALLENGE_GRACE};
use crate::access::check_email_allowed;
use crate::authkey::AuthKey;
use crate::error::{Failing, SiteError};
use crate::extract::{LenientJson, SameOrigin};
use crate::mail::{self, MailError, SignInMail};
use crate::reply::{with_cookies, Reply};
use crate::session::{cookie_name, random_token, read_cookie, set_cookie, OTP_COOKIE};
use gateway_core::config::Config;
use gateway_core::domain::normalize_email;
use gateway_core::state::SharedState;
use gateway_core::storage::ChallengeSecrets;
use gateway_core::util::{new_id, now_ms};

/// A new code and link token, in the clear only long enough to be mailed.
struct Issued {
    code: String,
    token: String,
    secrets: ChallengeSecrets,
}

pub(super) fn code_digest(key: &AuthKey, challenge_id: &str, code: &str) -> String {
    key.digest("code", &format!("{challenge_id}:{code}"))
}

pub(super) fn link_digest(key: &AuthKey, token: &str) -> String {
    key.digest("link", token)
}

/// Draws a uniform 6-digit code from the thread CSPRNG and a 32-byte link token.
fn issue(key: &AuthKey, cfg: &Config, challenge_id: &str, now: i64) -> Issued {
    let code = format!("{:06}", rand::rng().random_range(0..1_000_000u32));
    let token = random_token();
    let secrets = ChallengeSecrets {
        code_hash: code_digest(key, challenge_id, &code),
        link_hash: link_digest(key, &token),
        code_expires_at: now.saturating_add(ms(cfg.auth.code_ttl)),
        link_expires_at: now.saturating_add(ms(cfg.auth.link_ttl)),
    };
    Issued {
        code,
        token,
        secrets,
    }
}

/// Mails the code and link. Failure is `auth_challenge_failed`; the cause is logged.
async fn send_mail(cfg: &Config, email: &str, issued: &Issued) -> Result<(), SiteError> {
    let link = format!(
        "{}/api/auth/verify-link?token={}",
        cfg.server.site_origin, issued.token
    );
    let mail = SignInMail {
        to: email,
        code: &issued.code,
        link: &link,
        code_ttl: cfg.auth.code_ttl,
        link_ttl: cfg.auth.link_ttl,
    };
    mail::send_sign_in(&cfg.mail, &mail)
        .await
        .map_err(|e| match e {
            MailError::NotConfigured => SiteError::EmailNotConfigured,
            e => {
                log::error!("sign-in mail not sent: {e}");
                SiteError::AuthChallengeFailed
            }
        })
}

/// The OTP cookie: the challenge id and its signature, so a browser can only present a
/// challenge this server issued to it.
fn otp_cookie(key: &AuthKey, cfg: &Config, challenge_id: &str) -> HeaderValue {
    let value = format!("{challenge_id}.{}", key.sign("otp", challenge_id));
    let max_age = cfg.auth.code_ttl.max(cfg.auth.link_ttl) + CHALLENGE_GRACE;
    set_cookie(cfg, OTP_COOKIE, &value, max_age)
}

/// The challenge id of the request's OTP cookie, when its signature is good.
pub(super) fn otp_challenge_id(key: &AuthKey, cfg: &Config, headers: &HeaderMap) -> Option<String> {
    let raw = read_cookie(headers, &cookie_name(cfg, OTP_COOKIE))?;
    let (id, sig) = raw.split_once('.')?;
    key.verify("otp", id, sig).then(|| id.to_string())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChallengeAnswer<'a> {
    ok: bool,
    email: &'a str,
    expires_in: u64,
    requires_code: bool,
}

/// `{ok, email, expiresIn, requiresCode}` plus the (refreshed) OTP cookie.
fn challenge_answer(key: &AuthKey, cfg: &Config, challenge_id: &str, email: &str) -> Response {
    let body = ChallengeAnswer {
        ok: true,
        email,
        expires_in: cfg.auth.code_ttl.as_secs(),
        requires_code: true,
    };
    with_cookies(Reply(body), [otp_cookie(key, cfg, challenge_id)])
}

/// Mail must be configured before a code can be asked for.
fn check_mail(cfg: &Config) -> Result<(), SiteError> {
    if cfg.mail.transport.is_none() {
        return Err(SiteError::EmailNotConfigured);
    }
    Ok(())
}

/// `POST /request-code`: checks, in order, the session secret, the origin, mail, the terms,
/// the address (shape, blocked domains, beta), the captcha and the hourly limits.
pub(super) async fn request_code(
    State(state): State<SharedState>,
    key: AuthKey,
    _: SameOrigin,
    headers: HeaderMap,
    LenientJson(body): LenientJson,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    check_mail(&cfg)?;
    if body.get("acceptedTerms") != Some(&Value::Bool(true)) {
        return Err(SiteError::TermsRequired);
    }
    let email = str_field(&body, "email")
        .and_then(normalize_email)
        .ok_or(SiteError::InvalidEmail)?;
    check_email_allowed(&cfg.auth, &email)?;
    let ip = client_ip(&headers);
    check_captcha(&state, &cfg, &body, ip).await?;
    check_rate(&state, &key, &cfg, &email, ip).await?;

    let id = new_id("chl");
    let now = now_ms();
    let issued = issue(&key, &cfg, &id, now);
    state
        .db
        .auth()
        .create_challenge(&id, &email, &issued.secrets, now)
        .await
        .or_fail(SiteError::AuthChallengeFailed)?;
    send_mail(&cfg, &email, &issued).await?;
    Ok(challenge_answer(&key, &cfg, &id, &email))
}

/// `POST /resend-code`: a new code and link for this browser's pending challenge; the old ones
/// stop working.
pub(super) async fn resend_code(
    State(state): State<SharedState>,
    key: AuthKey,
    _: SameOrigin,
    headers: HeaderMap,
    LenientJson(body): LenientJson,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    check_mail(&cfg)?;
    let store = state.db.auth();
    let id = otp_challenge_id(&key, &cfg, &headers).ok_or(SiteError::InvalidCode)?;
    let challenge = store
        .challenge(&id)
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
        .filter(|c| c.consumed_at.is_none())
        .ok_or(SiteError::InvalidCode)?;
    check_email_allowed(&cfg.auth, &challenge.email)?;
    let ip = client_ip(&headers);
    check_captcha(&state, &cfg, &body, ip).await?;
    check_rate(&state, &key, &cfg, &challenge.email, ip).await?;

    let now = now_ms();
    let issued = issue(&key, &cfg, &id, now);
    if !store
        .replace_secrets(&id, &issued.secrets, now)
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
    {
        return Err(SiteError::InvalidCode);
    }
    send_mail(&cfg, &challenge.email, &issued).await?;
    Ok(challenge_answer(&key, &cfg, &id, &challenge.email))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::is_token_shaped;
    use std::path::Path;

    #[test]
    fn issued_codes_are_six_digits_and_hashed_per_challenge() {
        let key = AuthKey::new(b"k").expect("key");
        let cfg = Config::from_str(Path::new("t.toml"), "").expect("config");
        let a = issue(&key, &cfg, "chl_a", 0);
        assert_eq!(a.code.len(), 6);
        assert!(a.code.bytes().all(|b| b.is_ascii_digit()));
        assert!(is_token_shaped(&a.token));
        assert_ne!(
            code_digest(&key, "chl_a", "000000"),
            code_digest(&key, "chl_b", "000000")
        );
        assert!(!a.secrets.code_hash.contains(&a.code));
    }
}
