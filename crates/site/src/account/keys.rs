//! `/keys`: the account's API keys.
//!
//! Arbitrary creation is disabled. The only way to get a key is a rotation, which creates the
//! account's `Global key` and revokes the previous one in one transaction; the secret is in
//! that one response and nowhere else. Revocations reach this instance's key cache before the
//! answer leaves, so the very next developer request with the key fails; other instances see
//! them through the cache's change feed.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use super::{load_user, quota};
use crate::error::{Failing, SiteError};
use crate::extract::{Member, Mutation, Session};
use crate::hourly;
use crate::reply::Reply;
use crate::session::SessionInfo;
use crate::views::{self, key_status, KeyView};
use gateway_core::apikey;
use gateway_core::domain::LimitMode;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::{NewKey, StoreError};
use gateway_core::util::{is_valid_id, now_ms};

/// The name every rotated key gets (CONTRACT §3).
pub const GLOBAL_KEY_NAME: &str = "Global key";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyList<'a> {
    ok: bool,
    keys: Vec<KeyView<'a>>,
    quota: Value,
    csrf_token: &'a str,
}

/// `GET /keys`: the account's keys (metadata only), its quota and the CSRF token.
pub(super) async fn list_keys(
    State(state): State<SharedState>,
    Member(Session(session)): Member<Session>,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let failure = SiteError::AccountQueryFailed;
    let user = load_user(&state, &session.user_id, failure).await?;
    let (keys, (quota, _)) = tokio::try_join!(
        async {
            state
                .db
                .keys()
                .list_for_user(&user.id)
                .await
                .or_fail(failure)
        },
        quota(&state, &cfg, &user, now_ms(), failure),
    )?;
    Ok(Reply(KeyList {
        ok: true,
        keys: views::all(&keys),
        quota,
        csrf_token: &session.csrf_token,
    })
    .into_response())
}

/// What a `POST /keys` body asks for.
#[derive(Debug, PartialEq, Eq)]
enum KeyAction<'a> {
    Rotate,
    Revoke(&'a str),
    /// A `revokeId` that is not a string.
    BadRevokeId,
    /// Anything else: arbitrary key creation, which is disabled.
    Other,
}

fn key_action(body: &Value) -> KeyAction<'_> {
    match body.get("revokeId") {
        Some(Value::String(id)) => return KeyAction::Revoke(id),
        Some(Value::Null) | None => {}
        Some(_) => return KeyAction::BadRevokeId,
    }
    if body.get("rotate") == Some(&Value::Bool(true)) {
        KeyAction::Rotate
    } else {
        KeyAction::Other
    }
}

/// `POST /keys`: `{rotate:true}` or `{revokeId}`; anything else is `advanced_keys_disabled`.
pub(super) async fn post_keys(
    State(state): State<SharedState>,
    Member(Mutation { session, body }): Member<Mutation>,
) -> Result<Response, SiteError> {
    match key_action(&body) {
        KeyAction::Rotate => rotate(&state, &session).await,
        KeyAction::Revoke(id) => revoke(&state, &session, id).await,
        KeyAction::BadRevokeId => Err(SiteError::InvalidKeyId),
        KeyAction::Other => Err(SiteError::AdvancedKeysDisabled),
    }
}

/// `DELETE /keys/{id}`: the same as `{revokeId: id}`.
pub(super) async fn delete_key(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Member(Mutation { session, .. }): Member<Mutation>,
) -> Result<Response, SiteError> {
    revoke(&state, &session, &id).await
}

#[derive(Serialize)]
struct KeyBrief<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    status: &'static str,
}

#[derive(Serialize)]
struct Rotated<'a> {
    ok: bool,
    key: KeyBrief<'a>,
    secret: &'a str,
}

#[derive(Serialize)]
struct Revoked<'a> {
    ok: bool,
    key: KeyBrief<'a>,
}

/// Creates the account's new `Global key` and revokes the one it replaces, after the checks in
/// this order: key pepper configured (`key_secret_not_configured`), rotations in the last hour
/// (`rate_limited`), active keys afterwards (`active_key_limit_reached`).
async fn rotate(state: &AppState, session: &SessionInfo) -> Result<Response, SiteError> {
    let cfg = state.config();
    let hasher = state
        .key_hasher
        .as_ref()
        .ok_or(SiteError::KeySecretNotConfigured)?;
    let bucket = format!("rotate:{}", session.user_id);
    if hourly::over_limit(state, &bucket, i64::from(cfg.keys.rotations_per_hour))
        .await
        .or_fail(SiteError::AccountPersistenceFailed)?
    {
        return Err(SiteError::RateLimited);
    }
    let generated = apikey::generate();
    let new = NewKey {
        user_id: session.user_id.clone(),
        name: GLOBAL_KEY_NAME.to_string(),
        key_hash: hasher.hash(&generated.secret),
        key_prefix: generated.prefix,
        key_suffix: generated.suffix,
        scopes: vec!["*".to_string()],
        limit_mode: LimitMode::AccountPool,
        custom_input_tpm: None,
        custom_output_tpm: None,
        custom_rpm: None,
        model_allowlist: Vec::new(),
        max_input_tokens: None,
        max_output_tokens: None,
        is_global: true,
    };
    let rotation = state
        .db
        .keys()
        .rotate_global_limited(&new, i64::from(cfg.keys.max_active_per_account))
        .await
        .or_fail(SiteError::KeyCreationFailed)?
        .ok_or(SiteError::ActiveKeyLimitReached)?;
    for old in rotation.revoked {
        state.identity.apply_key(old);
    }
    let key = rotation.key;
    Ok(Reply(Rotated {
        ok: true,
        key: KeyBrief {
            id: &key.id,
            name: Some(&key.name),
            status: key_status(&key),
        },
        secret: &generated.secret,
    })
    .into_response())
}

/// Revokes one of the account's keys: `invalid_key_id` for a malformed id, `not_found` for an
/// id that is not the account's (another account's key looks exactly like a missing one).
/// Revoking an already revoked key answers the same success again.
async fn revoke(state: &AppState, session: &SessionInfo, id: &str) -> Result<Response, SiteError> {
    if !is_valid_id("key", id) {
        return Err(SiteError::InvalidKeyId);
    }
    let key = match state.db.keys().revoke(id, &session.user_id).await {
        Ok(k) => k,
        Err(StoreError::NotFound) => return Err(SiteError::NotFound),
        Err(e) => return Err(SiteError::KeyRevokeFailed.logged(e)),
    };
    let id = key.id.clone();
    state.identity.apply_key(key);
    Ok(Reply(Revoked {
        ok: true,
        key: KeyBrief {
            id: &id,
            name: None,
            status: "revoked",
        },
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_actions() {
        assert_eq!(key_action(&json!({"rotate": true})), KeyAction::Rotate);
        assert_eq!(
            key_action(&json!({"revokeId": "key_x", "rotate": true})),
            KeyAction::Revoke("key_x")
        );
        assert_eq!(key_action(&json!({"revokeId": 7})), KeyAction::BadRevokeId);
        assert_eq!(key_action(&json!({"rotate": "yes"})), KeyAction::Other);
        assert_eq!(key_action(&json!({"name": "mine"})), KeyAction::Other);
        assert_eq!(key_action(&Value::Null), KeyAction::Other);
    }
}
