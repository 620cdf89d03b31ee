//! `POST /verify-code`, and what every successful sign-in shares: the second factor and the
//! start of a new session.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde::Serialize;
use subtle::ConstantTimeEq;

use super::challenge::{code_digest, otp_challenge_id};
use super::{str_field, MAX_ATTEMPTS};
use crate::access::check_email_allowed;
use crate::authkey::AuthKey;
use crate::error::{Failing, SiteError};
use crate::extract::{LenientJson, SameOrigin};
use crate::reply::{with_cookies, Reply};
use crate::session::OTP_COOKIE;
use crate::session::{clear_cookie, end_session, start_session, SessionInfo, SessionView};
use crate::twofactor;
use gateway_core::config::Config;
use gateway_core::domain::normalize_email;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::ChallengeRecord;
use gateway_core::util::now_ms;

/// Six digits; spaces a person may have typed are ignored.
fn clean_code(raw: &str) -> Option<String> {
    let code: String = raw.chars().filter(|c| !c.is_whitespace()).collect();
    (code.len() == 6 && code.bytes().all(|b| b.is_ascii_digit())).then_some(code)
}

#[derive(Serialize)]
struct SignedIn<'a> {
    ok: bool,
    session: SessionView<'a>,
}

/// Checks, in order: the session secret, the origin, the address, this browser's challenge
/// (`invalid_code`, `too_many_attempts`, `code_expired`), an attempt, the code, the address
/// gates again, the second factor; then consumes the challenge and signs in.
pub(super) async fn verify_code(
    State(state): State<SharedState>,
    key: AuthKey,
    _: SameOrigin,
    headers: HeaderMap,
    LenientJson(body): LenientJson,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let email = str_field(&body, "email")
        .and_then(normalize_email)
        .ok_or(SiteError::InvalidEmail)?;
    let challenge = pending_code_challenge(&state, &key, &cfg, &headers, &email).await?;
    let store = state.db.auth();
    // The attempt is taken before comparing, so parallel guesses cannot exceed the limit.
    if !store
        .take_attempt(&challenge.id, MAX_ATTEMPTS, now_ms())
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
    {
        return Err(SiteError::TooManyAttempts);
    }
    let matches = str_field(&body, "code")
        .and_then(clean_code)
        .map(|c| code_digest(&key, &challenge.id, &c))
        .is_some_and(|d| bool::from(d.as_bytes().ct_eq(challenge.code_hash.as_bytes())));
    if !matches {
        return Err(SiteError::InvalidCode);
    }
    check_email_allowed(&cfg.auth, &email)?;
    second_factor(&state, &email, str_field(&body, "twoFactorCode")).await?;
    if !store
        .consume(&challenge.id, now_ms())
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
    {
        return Err(SiteError::InvalidCode);
    }
    let (session, cookies) = sign_in(&state, &key, &cfg, &headers, &email).await?;
    let mut view = session.view();
    view.csrf_token = None;
    Ok(with_cookies(
        Reply(SignedIn {
            ok: true,
            session: view,
        }),
        cookies,
    ))
}

/// The unused, unexpired challenge of this browser's OTP cookie for `email`: `invalid_code`
/// when there is none (or it is for another address), `too_many_attempts` when its tries are
/// spent, `code_expired` when its code is too old.
async fn pending_code_challenge(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    headers: &HeaderMap,
    email: &str,
) -> Result<ChallengeRecord, SiteError> {
    let id = otp_challenge_id(key, cfg, headers).ok_or(SiteError::InvalidCode)?;
    let challenge = state
        .db
        .auth()
        .challenge(&id)
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
        .filter(|c| c.consumed_at.is_none())
        .filter(|c| bool::from(c.email.as_bytes().ct_eq(email.as_bytes())))
        .ok_or(SiteError::InvalidCode)?;
    if challenge.attempts >= MAX_ATTEMPTS {
        return Err(SiteError::TooManyAttempts);
    }
    if now_ms() >= challenge.code_expires_at {
        return Err(SiteError::CodeExpired);
    }
    Ok(challenge)
}

/// Two-factor, checked only after the emailed secret is proven (so it reveals nothing to anyone
/// without the mailbox): `two_factor_code_required` (401) without a code, `too_many_attempts`
/// when the account's wrong codes are spent ([`twofactor::budget`]), `invalid_code` for a
/// wrong, used or replayed one. A TOTP code or an unused recovery code will do.
pub(super) async fn second_factor(
    state: &AppState,
    email: &str,
    code: Option<&str>,
) -> Result<(), SiteError> {
    let user = state
        .db
        .users()
        .find_by_email(email)
        .await
        .or_fail(SiteError::AccountPersistenceFailed)?;
    let Some(user) = user.filter(|u| u.two_factor_enabled) else {
        return Ok(());
    };
    let code = code.ok_or(SiteError::TwoFactorCodeRequired)?;
    let Some(secret) = user.totp_secret.as_deref() else {
        log::error!("user {} has two-factor on but no secret", user.id);
        return Err(SiteError::InvalidCode);
    };
    let seed_key = twofactor::SeedKey::from_state(state)?;
    let auth_key = AuthKey::from_state(state)?;
    let guess = twofactor::budget::take(state, &user.id).await?;
    if twofactor::accept_second_factor(&state.db, &seed_key, &auth_key, &user.id, secret, code)
        .await
        .or_fail(SiteError::AccountPersistenceFailed)?
    {
        guess.give_back(state).await;
        Ok(())
    } else {
        Err(SiteError::InvalidCode)
    }
}

/// Creates the user on first sign-in, replaces any session this browser had with a new one,
/// and records the login. Returns the session and the cookies to set (session on, OTP off).
pub(super) async fn sign_in(
    state: &AppState,
    key: &AuthKey,
    cfg: &Config,
    headers: &HeaderMap,
    email: &str,
) -> Result<(SessionInfo, [HeaderValue; 2]), SiteError> {
    let user = state
        .db
        .users()
        .find_or_create(email, cfg.quota.default_tier)
        .await
        .or_fail(SiteError::AccountPersistenceFailed)?;
    end_session(state, key, cfg, headers).await?;
    let (session, cookie) = start_session(state, key, cfg, &user.id, &user.email).await?;
    state
        .db
        .auth()
        .record_login(&user.id, now_ms())
        .await
        .or_fail(SiteError::AccountPersistenceFailed)?;
    Ok((session, [cookie, clear_cookie(cfg, OTP_COOKIE)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_six_digits() {
        assert_eq!(clean_code(" 012 345 ").as_deref(), Some("012345"));
        assert_eq!(clean_code("12345"), None);
        assert_eq!(clean_code("12345a"), None);
    }
}
