//! `/api/auth`: website sign-in by emailed code or magic link (spec §4.2, CONTRACT §3).
//!
//! The flow: `request-code` checks the gates, stores a challenge (a 6-digit code and a 32-byte
//! link token, both only as keyed digests), mails both, and binds the challenge to the asking
//! browser with a signed OTP cookie (`challenge`). `verify-code` (that browser, with the code)
//! or `POST verify-link` (any browser, with the token) consumes the challenge once, asks for
//! the second factor when the account has two-factor on, creates the user on first sign-in and
//! starts a new session (`verify`, `link`). `GET verify-link` only shows a confirmation form,
//! so mail scanners that fetch links cannot use them up.
//!
//! No endpoint looks at whether an account exists before the emailed secret has been proven,
//! so answers and timing are the same for known and unknown addresses.

mod challenge;
mod gates;
mod link;
mod verify;

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use serde_json::Value;

use crate::authkey::AuthKey;
use crate::csrf::check_token;
use crate::error::{Failing, SiteError};
use crate::extract::{LenientJson, MaybeSession, SameOrigin};
use crate::hourly::WINDOW_MS as RATE_WINDOW_MS;
use crate::reply::{with_cookies, Done, Reply};
use crate::session::{clear_cookie, cookie_name, read_cookie, OTP_COOKIE, SESSION_COOKIE};
use gateway_core::state::SharedState;
use gateway_core::util::now_ms;

/// Wrong codes a challenge tolerates before every further try is `too_many_attempts`.
pub const MAX_ATTEMPTS: i64 = 5;
/// Expired challenges stay this long so a late resend can still reach them.
const CHALLENGE_GRACE: Duration = Duration::from_secs(3600);
/// Sign-in bodies are a few short fields.
const MAX_BODY: usize = 16 * 1024;

/// The `/api/auth` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/session", get(session))
        .route("/config", get(config))
        .route("/request-code", post(challenge::request_code))
        .route("/resend-code", post(challenge::resend_code))
        .route("/verify-code", post(verify::verify_code))
        .route(
            "/verify-link",
            get(link::confirmation_page).post(link::verify_link),
        )
        .route("/signout", post(signout))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A trimmed, non-empty string field of a JSON body.
fn str_field<'a>(v: &'a Value, name: &str) -> Option<&'a str> {
    v.get(name)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

// ---------------------------------------------------------------------------------------------
// GET /session, GET /config

/// `{user:{email}, expires, csrfToken}` when signed in, else `null` (and a stale cookie is
/// cleared).
async fn session(
    State(state): State<SharedState>,
    headers: HeaderMap,
    MaybeSession(session): MaybeSession,
) -> Response {
    if let Some(s) = session {
        return Reply(s.view()).into_response();
    }
    let cfg = state.config();
    let resp = Reply(Value::Null);
    if read_cookie(&headers, &cookie_name(&cfg, SESSION_COOKIE)).is_some() {
        with_cookies(resp, [clear_cookie(&cfg, SESSION_COOKIE)])
    } else {
        resp.into_response()
    }
}

/// Public sign-in settings for the panel.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SignInConfig {
    ok: bool,
    captcha_site_key: Option<String>,
    captcha_required: bool,
}

async fn config(State(state): State<SharedState>) -> Reply<SignInConfig> {
    let cfg = state.config();
    let key = &cfg.auth.captcha_site_key;
    Reply(SignInConfig {
        ok: true,
        captcha_site_key: (!key.is_empty()).then(|| key.clone()),
        captcha_required: cfg.auth.captcha_required,
    })
}

// ---------------------------------------------------------------------------------------------
// POST /signout

/// Ends the session server-side and clears both cookies. Needs the site's origin, and the
/// session's CSRF token when there is a session to end.
async fn signout(
    State(state): State<SharedState>,
    _: SameOrigin,
    MaybeSession(session): MaybeSession,
    headers: HeaderMap,
    LenientJson(body): LenientJson,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    if let Some(session) = session {
        let key = AuthKey::from_state(&state)?;
        check_token(&key, &session.id_hash, &headers, &body)?;
        state
            .db
            .auth()
            .delete_session(&session.id_hash)
            .await
            .or_fail(SiteError::AccountPersistenceFailed)?;
    }
    Ok(with_cookies(
        Reply(Done::OK),
        [
            clear_cookie(&cfg, SESSION_COOKIE),
            clear_cookie(&cfg, OTP_COOKIE),
        ],
    ))
}

// ---------------------------------------------------------------------------------------------
// Housekeeping

/// Deletes spent challenges, ended sessions and old counters every ten minutes, for as long as
/// the account service runs.
pub async fn purge_loop(state: SharedState) {
    let mut tick = tokio::time::interval(Duration::from_secs(600));
    loop {
        tick.tick().await;
        let cfg = state.config();
        let now = now_ms();
        let result = state
            .db
            .auth()
            .purge(
                now,
                now - ms(CHALLENGE_GRACE),
                now - ms(cfg.auth.session_idle),
                now - 2 * RATE_WINDOW_MS,
            )
            .await;
        if let Err(e) = result {
            log::warn!("sign-in housekeeping failed: {e}");
        }
    }
}
