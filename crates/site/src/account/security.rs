//! `/security`: the account's two-factor setting.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use super::load_user;
use crate::error::{Failing, SiteError};
use crate::extract::{Member, Mutation, Session};
use crate::hourly;
use crate::reply::Reply;
use crate::twofactor;
use gateway_core::state::SharedState;
use gateway_core::util::now_ms;

/// Codes a session may try per hour when turning two-factor off; each attempt counts, so a
/// stolen session cannot brute-force its way past the second factor.
const TWO_FACTOR_ATTEMPTS_PER_HOUR: i64 = 5;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecurityState<'a> {
    two_factor_enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    totp_secret: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    otpauth_url: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecurityAnswer<'a> {
    ok: bool,
    security: SecurityState<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    csrf_token: Option<&'a str>,
}

fn answer(enabled: bool, setup: Option<&twofactor::TwoFactorSetup>) -> Response {
    Reply(SecurityAnswer {
        ok: true,
        security: SecurityState {
            two_factor_enabled: enabled,
            totp_secret: setup.map(|s| s.secret.as_str()),
            otpauth_url: setup.map(|s| s.otpauth_url.as_str()),
        },
        csrf_token: None,
    })
    .into_response()
}

/// `GET /security`: whether two-factor is on, and the CSRF token.
pub(super) async fn security(
    State(state): State<SharedState>,
    Member(Session(session)): Member<Session>,
) -> Result<Response, SiteError> {
    let user = load_user(&state, &session.user_id, SiteError::SecurityQueryFailed).await?;
    Ok(Reply(SecurityAnswer {
        ok: true,
        security: SecurityState {
            two_factor_enabled: user.two_factor_enabled,
            totp_secret: None,
            otpauth_url: None,
        },
        csrf_token: Some(&session.csrf_token),
    })
    .into_response())
}

/// `{twoFactorEnabled:true}` turns two-factor on with a fresh secret, returned once as
/// `totpSecret` and `otpauthUrl`; asking again while it is on changes nothing and shows no
/// secret. `{twoFactorEnabled:false, twoFactorCode}` turns it off when the code is valid
/// (`two_factor_code_required` without one, `invalid_code` for a wrong one,
/// `too_many_attempts` after five tries in an hour). Any other body is `invalid_body`.
pub(super) async fn post_security(
    State(state): State<SharedState>,
    Member(Mutation { session, body }): Member<Mutation>,
) -> Result<Response, SiteError> {
    let enable = body
        .get("twoFactorEnabled")
        .and_then(Value::as_bool)
        .ok_or(SiteError::InvalidBody)?;
    let user = load_user(&state, &session.user_id, SiteError::SecurityQueryFailed).await?;
    let auth = state.db.auth();
    let failure = SiteError::SecurityUpdateFailed;
    match (enable, user.two_factor_enabled) {
        (true, false) => {
            let setup = twofactor::generate(&user.email);
            let sealed = twofactor::SeedKey::from_state(&state)?
                .seal(&user.id, &setup.secret)
                .ok_or_else(|| failure.logged("seed sealing failed"))?;
            let changed = auth
                .set_two_factor_if(&user.id, false, Some(&sealed), now_ms())
                .await
                .or_fail(failure)?;
            if !changed {
                // A concurrent request turned it on first; its answer carries the secret.
                return Ok(answer(true, None));
            }
            Ok(answer(true, Some(&setup)))
        }
        (false, true) => {
            let code = body
                .get("twoFactorCode")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .ok_or(SiteError::TwoFactorCodeRequired)?;
            let bucket = format!("tfa-off:{}", user.id);
            if hourly::over_limit(&state, &bucket, TWO_FACTOR_ATTEMPTS_PER_HOUR)
                .await
                .or_fail(failure)?
            {
                return Err(SiteError::TooManyAttempts);
            }
            let valid = match user.totp_secret.as_deref() {
                Some(stored) => {
                    let key = twofactor::SeedKey::from_state(&state)?;
                    twofactor::accept(&state.db, &key, &user.id, stored, code)
                        .await
                        .or_fail(failure)?
                }
                None => false,
            };
            if !valid {
                return Err(SiteError::InvalidCode);
            }
            auth.set_two_factor_if(&user.id, true, None, now_ms())
                .await
                .or_fail(failure)?;
            Ok(answer(false, None))
        }
        (on, _) => Ok(answer(on, None)),
    }
}
