//! `/security`: the account's two-factor setting (CONTRACT §3).
//!
//! Enrolment takes two requests, so a mis-scanned secret never locks anyone out:
//! `{twoFactorEnabled:true}` starts (or restarts) it and shows a new secret once;
//! `{twoFactorEnabled:true, twoFactorCode}` with a code of that secret turns two-factor on and
//! shows the ten recovery codes once. `{twoFactorEnabled:false, twoFactorCode}` turns it off
//! with a TOTP or recovery code (a pending enrolment is dropped without one).
//! `{regenerateRecoveryCodes:true, twoFactorCode}` replaces the recovery codes with ten new
//! ones (shown once) while two-factor stays on, so a user who used or lost some need not turn
//! two-factor off and enrol again.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use super::load_user;
use crate::authkey::AuthKey;
use crate::error::{Failing, SiteError};
use crate::extract::{Member, Mutation, Session};
use crate::reply::Reply;
use crate::twofactor::{self, budget, recovery, SeedKey, TwoFactorSetup};
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::{TwoFactorState, UserRecord};
use gateway_core::util::now_ms;

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct SecurityState<'a> {
    two_factor_enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    two_factor_pending: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recovery_codes_left: Option<usize>,
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
    recovery_codes: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    csrf_token: Option<&'a str>,
}

fn answer(security: SecurityState<'_>, recovery_codes: Option<&[String]>) -> Response {
    Reply(SecurityAnswer {
        ok: true,
        security,
        recovery_codes,
        csrf_token: None,
    })
    .into_response()
}

/// `{twoFactorEnabled: on}` and nothing else.
fn plain(on: bool) -> Response {
    answer(
        SecurityState {
            two_factor_enabled: on,
            ..SecurityState::default()
        },
        None,
    )
}

async fn two_factor_state(state: &AppState, user_id: &str) -> Result<TwoFactorState, SiteError> {
    state
        .db
        .auth()
        .two_factor(user_id)
        .await
        .or_fail(SiteError::SecurityQueryFailed)?
        .ok_or(SiteError::Unauthorized)
}

/// `GET /security`: `{twoFactorEnabled, twoFactorPending, recoveryCodesLeft}` (the last while
/// two-factor is on) and the CSRF token.
pub(super) async fn security(
    State(state): State<SharedState>,
    Member(Session(session)): Member<Session>,
) -> Result<Response, SiteError> {
    let tfa = two_factor_state(&state, &session.user_id).await?;
    let left = if tfa.enabled {
        let unused = state
            .db
            .auth()
            .unused_recovery_codes(&session.user_id)
            .await
            .or_fail(SiteError::SecurityQueryFailed)?;
        Some(unused.len())
    } else {
        None
    };
    Ok(Reply(SecurityAnswer {
        ok: true,
        security: SecurityState {
            two_factor_enabled: tfa.enabled,
            two_factor_pending: Some(!tfa.enabled && tfa.pending.is_some()),
            recovery_codes_left: left,
            ..SecurityState::default()
        },
        recovery_codes: None,
        csrf_token: Some(&session.csrf_token),
    })
    .into_response())
}

/// The body's `twoFactorCode`: `None` when absent, null or blank; `invalid_body` when it is not
/// a string.
fn code_field(body: &Value) -> Result<Option<&str>, SiteError> {
    match body.get("twoFactorCode") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim()).filter(|s| !s.is_empty())),
        Some(_) => Err(SiteError::InvalidBody),
    }
}

/// `POST /security {twoFactorEnabled, twoFactorCode?}` or `{regenerateRecoveryCodes: true,
/// twoFactorCode}`; any other body is `invalid_body`.
pub(super) async fn post_security(
    State(state): State<SharedState>,
    Member(Mutation { session, body }): Member<Mutation>,
) -> Result<Response, SiteError> {
    match body.get("regenerateRecoveryCodes") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            let code = code_field(&body)?;
            let user = load_user(&state, &session.user_id, SiteError::SecurityQueryFailed).await?;
            let tfa = two_factor_state(&state, &user.id).await?;
            if !tfa.enabled {
                // No recovery codes exist while two-factor is off.
                return Err(SiteError::InvalidBody);
            }
            return regenerate(&state, &user, tfa.secret.as_deref(), code).await;
        }
        Some(_) => return Err(SiteError::InvalidBody),
    }
    let enable = body
        .get("twoFactorEnabled")
        .and_then(Value::as_bool)
        .ok_or(SiteError::InvalidBody)?;
    let code = code_field(&body)?;
    let user = load_user(&state, &session.user_id, SiteError::SecurityQueryFailed).await?;
    let tfa = two_factor_state(&state, &user.id).await?;
    match (enable, tfa.enabled, code) {
        // Asking for what is already in force changes nothing and shows no secret.
        (true, true, _) => Ok(plain(true)),
        (true, false, None) => start(&state, &user).await,
        (true, false, Some(code)) => confirm(&state, &user, tfa.pending.as_deref(), code).await,
        (false, true, code) => turn_off(&state, &user, tfa.secret.as_deref(), code).await,
        (false, false, _) => {
            if tfa.pending.is_some() {
                state
                    .db
                    .auth()
                    .cancel_enrolment(&user.id, now_ms())
                    .await
                    .or_fail(SiteError::SecurityUpdateFailed)?;
            }
            Ok(plain(false))
        }
    }
}

/// Starts an enrolment with a fresh secret, replacing any pending one, and shows it once.
async fn start(state: &AppState, user: &UserRecord) -> Result<Response, SiteError> {
    let failure = SiteError::SecurityUpdateFailed;
    let setup: TwoFactorSetup = twofactor::generate(&user.email);
    let sealed = SeedKey::from_state(state)?
        .seal(&user.id, &setup.secret)
        .ok_or_else(|| failure.logged("seed sealing failed"))?;
    let started = state
        .db
        .auth()
        .start_enrolment(&user.id, &sealed, now_ms())
        .await
        .or_fail(failure)?;
    if !started {
        // A concurrent confirmation turned it on first.
        return Ok(plain(true));
    }
    Ok(answer(
        SecurityState {
            two_factor_enabled: false,
            two_factor_pending: Some(true),
            totp_secret: Some(&setup.secret),
            otpauth_url: Some(&setup.otpauth_url),
            ..SecurityState::default()
        },
        None,
    ))
}

/// Confirms the pending enrolment with a code of its secret: `invalid_body` with nothing
/// pending, `too_many_attempts` when the account's wrong codes are spent ([`budget`]),
/// `invalid_code` for a wrong code. Shows the new recovery codes once.
async fn confirm(
    state: &AppState,
    user: &UserRecord,
    pending: Option<&str>,
    code: &str,
) -> Result<Response, SiteError> {
    let pending = pending.ok_or(SiteError::InvalidBody)?;
    let Some(seed) = SeedKey::from_state(state)?.open(&user.id, pending) else {
        log::error!("user {}: pending two-factor seed does not open", user.id);
        return Err(SiteError::InvalidCode);
    };
    let guess = budget::take(state, &user.id).await?;
    let step =
        twofactor::verify(&seed, code, twofactor::unix_now()).ok_or(SiteError::InvalidCode)?;
    guess.give_back(state).await;
    let key = AuthKey::from_state(state)?;
    let codes = recovery::generate();
    let hashes: Vec<String> = codes
        .iter()
        .filter_map(|c| recovery::digest(&key, &user.id, c))
        .collect();
    let confirmed = state
        .db
        .auth()
        .confirm_enrolment(
            &user.id,
            pending,
            i64::try_from(step).unwrap_or(i64::MAX),
            &hashes,
            now_ms(),
        )
        .await
        .or_fail(SiteError::SecurityUpdateFailed)?;
    if !confirmed {
        // The pending secret was replaced (or confirmed) meanwhile: this code was for another.
        return Err(SiteError::InvalidCode);
    }
    log::info!("user {}: two-factor turned on", user.id);
    Ok(answer(
        SecurityState {
            two_factor_enabled: true,
            ..SecurityState::default()
        },
        Some(&codes),
    ))
}

/// Checks a second factor for a change to two-factor itself: `two_factor_code_required`
/// without a code, `too_many_attempts` when the account's wrong codes are spent ([`budget`]),
/// `invalid_code` for a wrong one. A recovery code that passes is used up.
async fn second_factor(
    state: &AppState,
    user: &UserRecord,
    secret: Option<&str>,
    code: Option<&str>,
) -> Result<(), SiteError> {
    let failure = SiteError::SecurityUpdateFailed;
    let code = code.ok_or(SiteError::TwoFactorCodeRequired)?;
    let guess = budget::take(state, &user.id).await?;
    let valid = match secret {
        Some(stored) => twofactor::accept_second_factor(
            &state.db,
            &SeedKey::from_state(state)?,
            &AuthKey::from_state(state)?,
            &user.id,
            stored,
            code,
        )
        .await
        .or_fail(failure)?,
        None => false,
    };
    if !valid {
        return Err(SiteError::InvalidCode);
    }
    guess.give_back(state).await;
    Ok(())
}

/// Turns two-factor off with a TOTP or recovery code ([`second_factor`]).
async fn turn_off(
    state: &AppState,
    user: &UserRecord,
    secret: Option<&str>,
    code: Option<&str>,
) -> Result<Response, SiteError> {
    let failure = SiteError::SecurityUpdateFailed;
    second_factor(state, user, secret, code).await?;
    state
        .db
        .auth()
        .disable_two_factor(&user.id, now_ms())
        .await
        .or_fail(failure)?;
    log::info!("user {}: two-factor turned off", user.id);
    Ok(plain(false))
}

/// Replaces the recovery codes with ten new ones after a TOTP or recovery code
/// ([`second_factor`]); the old ones, used or not, stop working. Shows the new ones once.
async fn regenerate(
    state: &AppState,
    user: &UserRecord,
    secret: Option<&str>,
    code: Option<&str>,
) -> Result<Response, SiteError> {
    second_factor(state, user, secret, code).await?;
    let key = AuthKey::from_state(state)?;
    let codes = recovery::generate();
    let hashes: Vec<String> = codes
        .iter()
        .filter_map(|c| recovery::digest(&key, &user.id, c))
        .collect();
    let replaced = state
        .db
        .auth()
        .replace_recovery_codes(&user.id, &hashes, now_ms())
        .await
        .or_fail(SiteError::SecurityUpdateFailed)?;
    if !replaced {
        // Turned off meanwhile: there are no recovery codes to replace.
        return Err(SiteError::InvalidBody);
    }
    log::info!("user {}: recovery codes regenerated", user.id);
    Ok(answer(
        SecurityState {
            two_factor_enabled: true,
            recovery_codes_left: Some(codes.len()),
            ..SecurityState::default()
        },
        Some(&codes),
    ))
}
