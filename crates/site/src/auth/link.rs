//! The magic link: `GET /verify-link` shows a confirmation form and never looks the token up;
//! `POST /verify-link` (from that form or the panel) signs in.

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::challenge::link_digest;
use super::verify::{second_factor, sign_in};
use super::{str_field, MAX_ATTEMPTS};
use crate::access::check_email_allowed;
use crate::authkey::AuthKey;
use crate::error::{Failing, SiteError};
use crate::extract::SameOrigin;
use crate::mail::html_escape;
use crate::reply::with_cookies;
use crate::session::is_token_shaped;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::ChallengeRecord;
use gateway_core::util::now_ms;

/// Where a magic link lands after signing in.
const AFTER_SIGN_IN: &str = "/panel/keys";

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `GET /verify-link`: a self-contained page whose only action is the POST back to this
/// service; the CSP forbids scripts, framing and posting anywhere else.
///
/// The referrer policy is `strict-origin`: referrers carry the origin alone, so the token in
/// the page's address never leaves in one, while the form's POST still carries
/// `Origin: <site_origin>`. Under `no-referrer` (or a `sandbox` CSP, or `rel=noreferrer` on the
/// form) browsers send `Origin: null` for a form POST, which the same-origin check refuses.
pub(super) async fn confirmation_page(RawQuery(query): RawQuery) -> Response {
    let Some(token) = query_param(query.as_deref(), "token").filter(|t| is_token_shaped(t)) else {
        return SiteError::InvalidLink.into_response();
    };
    let html = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Confirm sign-in</title>\
         <style>body{{font-family:sans-serif;max-width:28rem;margin:4rem auto;padding:0 1rem}}\
         input,button{{font-size:1rem;padding:.5rem}}label{{display:block;margin:1rem 0 .25rem}}</style>\
         </head><body><h1>Confirm sign-in</h1>\
         <p>Press the button to finish signing in on this device.</p>\
         <form method=\"post\" action=\"/api/auth/verify-link\">\
         <input type=\"hidden\" name=\"token\" value=\"{token}\">\
         <label for=\"tfa\">Two-factor code or recovery code (only if you turned it on)</label>\
         <input id=\"tfa\" name=\"twoFactorCode\" autocomplete=\"one-time-code\" maxlength=\"24\">\
         <p><button type=\"submit\">Sign in</button></p></form></body></html>\n",
        token = html_escape(&token)
    );
    let mut resp = (StatusCode::OK, html).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("strict-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `token` and `twoFactorCode` from a JSON body, a form body, or the query string, in that
/// order of preference.
fn link_fields(
    headers: &HeaderMap,
    query: Option<&str>,
    body: &Bytes,
) -> (Option<String>, Option<String>) {
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
    let json = if is_form {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(body).unwrap_or(serde_json::Value::Null)
    };
    let from_body = |name: &str| -> Option<String> {
        if is_form {
            query_param(std::str::from_utf8(body).ok(), name)
        } else {
            str_field(&json, name).map(str::to_string)
        }
    };
    let token = from_body("token").or_else(|| query_param(query, "token"));
    let tfa = from_body("twoFactorCode").or_else(|| query_param(query, "twoFactorCode"));
    (token, tfa)
}

/// `POST /verify-link`: checks, in order, the session secret, the origin, the token
/// (`invalid_link`, `link_expired`), the address gates, the second factor; then consumes the
/// challenge, signs in and redirects to the panel.
pub(super) async fn verify_link(
    State(state): State<SharedState>,
    key: AuthKey,
    _: SameOrigin,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let (token, tfa) = link_fields(&headers, query.as_deref(), &body);
    let token = token
        .filter(|t| is_token_shaped(t))
        .ok_or(SiteError::InvalidLink)?;
    let store = state.db.auth();
    let challenge = store
        .challenge_by_link(&link_digest(&key, &token))
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
        .filter(|c| c.consumed_at.is_none())
        .ok_or(SiteError::InvalidLink)?;
    if now_ms() >= challenge.link_expires_at {
        return Err(SiteError::LinkExpired);
    }
    check_email_allowed(&cfg.auth, &challenge.email)?;
    link_second_factor(&state, &challenge, tfa.as_deref()).await?;
    if !store
        .consume(&challenge.id, now_ms())
        .await
        .or_fail(SiteError::AuthChallengeFailed)?
    {
        return Err(SiteError::InvalidLink);
    }
    let (_, cookies) = sign_in(&state, &key, &cfg, &headers, &challenge.email).await?;
    let mut resp = StatusCode::SEE_OTHER.into_response();
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(AFTER_SIGN_IN));
    Ok(with_cookies(resp, cookies))
}

/// Two-factor for a link: every guess spends one of the challenge's attempts, so a leaked link
/// cannot be used to brute-force the second factor.
async fn link_second_factor(
    state: &AppState,
    challenge: &ChallengeRecord,
    code: Option<&str>,
) -> Result<(), SiteError> {
    if code.is_some()
        && !state
            .db
            .auth()
            .take_attempt(&challenge.id, MAX_ATTEMPTS, now_ms())
            .await
            .or_fail(SiteError::AuthChallengeFailed)?
    {
        return Err(SiteError::TooManyAttempts);
    }
    second_factor(state, &challenge.email, code).await
}
