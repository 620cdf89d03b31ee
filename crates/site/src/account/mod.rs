//! `/api/account`: the signed-in owner's profile, usage report, API keys and two-factor
//! setting (spec §4.3, CONTRACT §3).
//!
//! Every endpoint takes a `Member<Session>` (reads) or `Member<Mutation>` (writes): a web
//! session (`unauthorized` without one; an API key is not a credential here), the site's origin
//! and the session's CSRF token for writes, and, while the private beta is closed, an address
//! still on the allowlist (`private_beta_only`). Storage causes are logged where they happen
//! and answered with the area's `*_failed` code.

mod keys;
mod security;
mod usage;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::Router;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Failing, SiteError};
use crate::extract::{Member, Session};
use crate::reply::Reply;
use crate::views::UserView;
use gateway_core::config::Config;
use gateway_core::domain::Lot;
use gateway_core::quota::tiers;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::UserRecord;
use gateway_core::util::now_ms;

pub use keys::GLOBAL_KEY_NAME;
pub use usage::{report_json, Period, RECENT_LIMIT};

/// Account bodies are a few short fields.
const MAX_BODY: usize = 16 * 1024;

/// The `/api/account` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/profile", get(profile))
        .route("/usage", get(usage::usage))
        .route("/keys", get(keys::list_keys).post(keys::post_keys))
        .route("/keys/{id}", delete(keys::delete_key))
        .route(
            "/security",
            get(security::security).post(security::post_security),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

/// The session's account; a session whose user is gone is `unauthorized`.
async fn load_user(
    state: &AppState,
    user_id: &str,
    failure: SiteError,
) -> Result<UserRecord, SiteError> {
    state
        .db
        .users()
        .get(user_id)
        .await
        .or_fail(failure)?
        .ok_or(SiteError::Unauthorized)
}

/// The spec §2.3 quota object and the account's unexpired lots, computed at `now`.
async fn quota(
    state: &AppState,
    cfg: &Config,
    user: &UserRecord,
    now: i64,
    failure: SiteError,
) -> Result<(Value, Vec<Lot>), SiteError> {
    let store = state.db.quota();
    let (spend, lots) =
        tokio::try_join!(store.spend(&user.id, now), store.lots(&user.id, now)).or_fail(failure)?;
    let status = tiers::status(&cfg.quota, user, &spend, &lots, now);
    Ok((status.to_json(&cfg.quota), lots))
}

#[derive(Serialize)]
struct Profile<'a> {
    ok: bool,
    user: UserView<'a>,
    quota: Value,
}

/// `GET /profile`: the account and its quota.
async fn profile(
    State(state): State<SharedState>,
    Member(Session(session)): Member<Session>,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let failure = SiteError::ProfileQueryFailed;
    let user = load_user(&state, &session.user_id, failure).await?;
    let (quota, _) = quota(&state, &cfg, &user, now_ms(), failure).await?;
    Ok(Reply(Profile {
        ok: true,
        user: UserView::from(&user),
        quota,
    })
    .into_response())
}
