//! `/api/account`: the signed-in owner's profile, usage report, API keys and two-factor
//! setting (spec §4.3, CONTRACT §3).
//!
//! Every endpoint needs a web session (`unauthorized` without one; an API key is not a
//! credential here) and, while the private beta is closed, an address still on the allowlist
//! (`private_beta_only`). Mutations also need the site's origin and the session's CSRF token
//! (`csrf::require_mutation`). Every answer is `no-store`. Storage causes are logged here and
//! answered with the spec's `*_failed` code for the area.
//!
//! Keys: arbitrary creation is disabled. The only way to get a key is a rotation, which creates
//! the account's `Global key` and revokes the previous one in one transaction; the secret is in
//! that one response and nowhere else. Revocations reach this instance's key cache before the
//! answer leaves, so the very next developer request with the key fails; other instances see
//! them through the cache's change feed.

use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::map_response;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};

use super::auth::{beta_allows, json_response};
use super::csrf::require_mutation;
use super::error::SiteError;
use super::session::{require_session, SessionInfo};
use super::twofactor;
use crate::views::{key_json, lot_json, user_json};
use gateway_core::apikey;
use gateway_core::config::Config;
use gateway_core::domain::LimitMode;
use gateway_core::domain::Lot;
use gateway_core::quota::tiers;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::usage::{UsageReport, UsageTotals};
use gateway_core::storage::{KeyRecord, NewKey, StoreError, UserRecord};
use gateway_core::util::{is_valid_id, iso, iso_opt, now_ms};

/// Account bodies are a few short fields.
const MAX_BODY: usize = 16 * 1024;
/// `recentRequests` holds at most this many events.
pub const RECENT_LIMIT: u32 = 50;
/// Rotation and two-factor attempt counters use hour windows.
const WINDOW_MS: i64 = 3_600_000;
/// Codes a session may try per hour when turning two-factor off; each attempt counts, so a
/// stolen session cannot brute-force its way past the second factor.
const TWO_FACTOR_ATTEMPTS_PER_HOUR: i64 = 5;
/// The name every rotated key gets (CONTRACT §3).
pub const GLOBAL_KEY_NAME: &str = "Global key";
const MS_PER_DAY: i64 = 86_400_000;
const MS_PER_HOUR: i64 = 3_600_000;

/// The `/api/account` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route("/profile", get(profile))
        .route("/usage", get(usage))
        .route("/keys", get(list_keys).post(post_keys))
        .route("/keys/{id}", axum::routing::delete(delete_key))
        .route("/security", get(security).post(post_security))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(map_response(private_headers))
}

/// Every account answer is personal, errors and framework rejections included.
async fn private_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Origin, Cookie"));
    resp
}

fn ok(body: Value) -> Response {
    json_response(StatusCode::OK, &body)
}

/// The body as JSON; anything unparsable reads as `null`, so each endpoint answers its own code.
fn parse_json(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// Logs a storage failure and answers with `code`; the cause never leaves the server.
fn failed(code: &'static str) -> impl Fn(StoreError) -> SiteError {
    move |e| {
        log::error!("account storage failed ({code}): {e}");
        SiteError::Code(code)
    }
}

// ---------------------------------------------------------------------------------------------
// Gates

/// `private_beta_only` when the beta is closed and the signed-in address is no longer on the
/// allowlist.
fn beta_gate(cfg: &Config, session: &SessionInfo) -> Result<(), SiteError> {
    if beta_allows(&cfg.auth, &session.email) {
        Ok(())
    } else {
        Err(SiteError::Code("private_beta_only"))
    }
}

/// Reads: a session and the beta gate.
async fn reader(state: &AppState, headers: &HeaderMap) -> Result<SessionInfo, SiteError> {
    let session = require_session(state, headers).await?;
    beta_gate(&state.config(), &session)?;
    Ok(session)
}

/// Mutations: origin, session, CSRF token, then the beta gate.
async fn writer(
    state: &AppState,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Result<SessionInfo, SiteError> {
    let session = require_mutation(state, headers, body).await?;
    beta_gate(&state.config(), &session)?;
    Ok(session)
}

/// The session's account; a session whose user is gone is `unauthorized`.
async fn load_user(
    state: &AppState,
    user_id: &str,
    code: &'static str,
) -> Result<UserRecord, SiteError> {
    state
        .db
        .users()
        .get(user_id)
        .await
        .map_err(failed(code))?
        .ok_or(SiteError::Code("unauthorized"))
}

/// The spec §2.3 quota object and the account's unexpired lots, computed at `now`.
async fn quota(
    state: &AppState,
    cfg: &Config,
    user: &UserRecord,
    now: i64,
    code: &'static str,
) -> Result<(Value, Vec<Lot>), SiteError> {
    let store = state.db.quota();
    let (spend, lots) = tokio::try_join!(store.spend(&user.id, now), store.lots(&user.id, now))
        .map_err(failed(code))?;
    let status = tiers::status(&cfg.quota, user, &spend, &lots, now);
    Ok((status.to_json(&cfg.quota), lots))
}

/// Sliding-hour estimate over two fixed windows of a database counter (shared by every
/// instance): adds one hit to `bucket` and reports whether it went over `limit`.
async fn over_hourly_limit(state: &AppState, bucket: &str, limit: i64) -> Result<bool, StoreError> {
    let now = now_ms();
    let store = state.db.auth();
    let start = now - now.rem_euclid(WINDOW_MS);
    let current = store.hit(bucket, start).await?;
    let previous = store.hits(bucket, start - WINDOW_MS).await?;
    let overlap = WINDOW_MS - (now - start);
    Ok(previous * overlap / WINDOW_MS + current > limit)
}

// ---------------------------------------------------------------------------------------------
// GET /profile

async fn profile(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, SiteError> {
    let session = reader(&state, &headers).await?;
    let cfg = state.config();
    let user = load_user(&state, &session.user_id, "profile_query_failed").await?;
    let (quota, _) = quota(&state, &cfg, &user, now_ms(), "profile_query_failed").await?;
    Ok(ok(
        json!({ "ok": true, "user": user_json(&user), "quota": quota }),
    ))
}

// ---------------------------------------------------------------------------------------------
// GET /usage

/// The report windows of spec §8; anything else is `7d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Hour,
    Day,
    Week,
    Month,
}

impl Period {
    pub fn parse(raw: Option<&str>) -> Period {
        match raw {
            Some("1h") => Period::Hour,
            Some("24h") => Period::Day,
            Some("30d") => Period::Month,
            _ => Period::Week,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Period::Hour => "1h",
            Period::Day => "24h",
            Period::Week => "7d",
            Period::Month => "30d",
        }
    }

    pub fn millis(self) -> i64 {
        let hour = 3_600_000;
        match self {
            Period::Hour => hour,
            Period::Day => 24 * hour,
            Period::Week => 7 * 24 * hour,
            Period::Month => 30 * 24 * hour,
        }
    }
}

fn totals_json(t: &UsageTotals) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("requests".into(), t.requests.into());
    m.insert("inputTokens".into(), t.input_tokens.into());
    m.insert("outputTokens".into(), t.output_tokens.into());
    m.insert("totalTokens".into(), t.total_tokens.into());
    m.insert("cachedTokens".into(), t.cached_tokens.into());
    m.insert("quotaCharged".into(), t.quota_charged.into());
    m
}

/// `YYYY-MM-DD` of a day number (days since the Unix epoch, UTC).
fn day_string(day: i64) -> String {
    iso(day.saturating_mul(MS_PER_DAY))
        .chars()
        .take(10)
        .collect()
}

/// `summary`, `daily` (every UTC day from the one `from` falls in to today, ascending, zeros
/// included so charts need no gap filling), `hourly` when the report has hours (every UTC hour
/// from the one `from` falls in to the current one, the same way; windows of a day or less),
/// `recentRequests`, `byModel` (most quota charged first). Every total carries the raw token
/// counts and `quotaCharged`, the quota tokens they cost at their models' weights.
pub fn report_json(report: &UsageReport, from: i64, now: i64) -> serde_json::Map<String, Value> {
    let summary = report.summary();
    let mut days: std::collections::BTreeMap<i64, UsageTotals> = (from.div_euclid(MS_PER_DAY)
        ..=now.div_euclid(MS_PER_DAY))
        .map(|d| (d, UsageTotals::default()))
        .collect();
    for (day, t) in &report.daily {
        days.entry(*day).or_default().add(t);
    }
    let daily: Vec<Value> = days
        .iter()
        .map(|(day, t)| {
            let mut m = serde_json::Map::new();
            m.insert("day".into(), day_string(*day).into());
            m.extend(totals_json(t));
            Value::Object(m)
        })
        .collect();
    let hourly: Option<Vec<Value>> = report.hourly.as_ref().map(|stored| {
        (from.div_euclid(MS_PER_HOUR)..=now.div_euclid(MS_PER_HOUR))
            .map(|hour| {
                let mut m = serde_json::Map::new();
                m.insert("hour".into(), iso(hour.saturating_mul(MS_PER_HOUR)).into());
                m.extend(totals_json(
                    stored.get(&hour).unwrap_or(&UsageTotals::default()),
                ));
                Value::Object(m)
            })
            .collect()
    });
    let mut by_model: Vec<(&str, &UsageTotals)> = report
        .by_model
        .iter()
        .map(|(m, t)| (m.as_str(), t))
        .collect();
    by_model.sort_by(|a, b| {
        b.1.quota_charged
            .cmp(&a.1.quota_charged)
            .then(b.1.total_tokens.cmp(&a.1.total_tokens))
            .then(b.1.requests.cmp(&a.1.requests))
            .then(a.0.cmp(b.0))
    });
    let by_model: Vec<Value> = by_model
        .iter()
        .map(|(model, t)| {
            let mut m = serde_json::Map::new();
            m.insert("model".into(), (*model).into());
            m.extend(totals_json(t));
            Value::Object(m)
        })
        .collect();
    let recent: Vec<Value> = report
        .recent
        .iter()
        .map(|e| {
            json!({
                "id": e.id,
                "model": e.model,
                "reasoningEffort": e.reasoning_effort,
                "inputTokens": e.input_tokens,
                "outputTokens": e.output_tokens,
                "totalTokens": e.total_tokens,
                "cachedTokens": e.cached_tokens,
                "quotaCharged": e.quota_charged,
                "createdAt": iso(e.created_at),
            })
        })
        .collect();
    let mut summary_json = totals_json(&summary);
    summary_json.insert("lastApiCall".into(), iso_opt(report.last_call));
    let mut out = serde_json::Map::new();
    out.insert("summary".into(), Value::Object(summary_json));
    out.insert("daily".into(), Value::Array(daily));
    if let Some(hourly) = hourly {
        out.insert("hourly".into(), Value::Array(hourly));
    }
    out.insert("recentRequests".into(), Value::Array(recent));
    out.insert("byModel".into(), Value::Array(by_model));
    out
}

async fn usage(
    State(state): State<SharedState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, SiteError> {
    let session = reader(&state, &headers).await?;
    let cfg = state.config();
    let period = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "period")
        .map(|(_, v)| v.into_owned());
    let period = Period::parse(period.as_deref());
    let now = now_ms();
    let from = now - period.millis();
    let user = load_user(&state, &session.user_id, "usage_query_failed").await?;
    let ((quota, lots), report) = tokio::try_join!(
        quota(&state, &cfg, &user, now, "usage_query_failed"),
        async {
            state
                .db
                .usage()
                .report(&user.id, from, now, RECENT_LIMIT)
                .await
                .map_err(failed("usage_query_failed"))
        },
    )?;
    let mut body = serde_json::Map::new();
    body.insert("ok".into(), true.into());
    body.insert("period".into(), period.as_str().into());
    body.insert("startsAt".into(), iso(from).into());
    body.insert("quota".into(), quota);
    body.insert(
        "quotaLots".into(),
        Value::Array(lots.iter().map(lot_json).collect()),
    );
    body.extend(report_json(&report, from, now));
    body.insert("models".into(), models_json(&cfg));
    Ok(ok(Value::Object(body)))
}

/// The configured models with their quota weights (what one input, output and cached input
/// token of each costs in quota tokens), in file order: the usage page's price list.
fn models_json(cfg: &gateway_core::config::Config) -> Value {
    cfg.models
        .iter()
        .map(|m| {
            let (input, output, cached_input) = m.weights.as_f64();
            json!({
                "id": m.id,
                "inputWeight": input,
                "outputWeight": output,
                "cachedInputWeight": cached_input,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// GET /keys

async fn list_keys(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, SiteError> {
    let session = reader(&state, &headers).await?;
    let cfg = state.config();
    let user = load_user(&state, &session.user_id, "account_query_failed").await?;
    let (keys, (quota, _)) = tokio::try_join!(
        async {
            state
                .db
                .keys()
                .list_for_user(&user.id)
                .await
                .map_err(failed("account_query_failed"))
        },
        quota(&state, &cfg, &user, now_ms(), "account_query_failed"),
    )?;
    let keys: Vec<Value> = keys.iter().map(key_json).collect();
    Ok(ok(json!({
        "ok": true,
        "keys": keys,
        "quota": quota,
        "csrfToken": session.csrf_token,
    })))
}

// ---------------------------------------------------------------------------------------------
// POST /keys, DELETE /keys/{id}

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

async fn post_keys(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let body = parse_json(&body);
    let session = writer(&state, &headers, Some(&body)).await?;
    match key_action(&body) {
        KeyAction::Rotate => rotate(&state, &session).await,
        KeyAction::Revoke(id) => revoke(&state, &session, id).await,
        KeyAction::BadRevokeId => Err(SiteError::Code("invalid_key_id")),
        KeyAction::Other => Err(SiteError::Code("advanced_keys_disabled")),
    }
}

async fn delete_key(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, SiteError> {
    let session = writer(&state, &headers, None).await?;
    revoke(&state, &session, &id).await
}

/// Creates the account's new `Global key` and revokes the one it replaces, after the checks in
/// this order: key pepper configured (`key_secret_not_configured`), rotations in the last hour
/// (`rate_limited`), active keys afterwards (`active_key_limit_reached`).
async fn rotate(state: &AppState, session: &SessionInfo) -> Result<Response, SiteError> {
    let cfg = state.config();
    let hasher = state
        .key_hasher
        .as_ref()
        .ok_or(SiteError::Code("key_secret_not_configured"))?;
    let bucket = format!("rotate:{}", session.user_id);
    if over_hourly_limit(state, &bucket, i64::from(cfg.keys.rotations_per_hour))
        .await
        .map_err(failed("account_persistence_failed"))?
    {
        return Err(SiteError::Code("rate_limited"));
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
        .map_err(failed("key_creation_failed"))?
        .ok_or(SiteError::Code("active_key_limit_reached"))?;
    for old in rotation.revoked {
        state.identity.apply_key(old);
    }
    let key = rotation.key;
    Ok(ok(json!({
        "ok": true,
        "key": { "id": key.id, "name": key.name, "status": status_str(&key) },
        "secret": generated.secret,
    })))
}

fn status_str(k: &KeyRecord) -> &'static str {
    if k.revoked {
        "revoked"
    } else {
        "active"
    }
}

/// Revokes one of the account's keys: `invalid_key_id` for a malformed id, `not_found` for an
/// id that is not the account's (another account's key looks exactly like a missing one).
/// Revoking an already revoked key answers the same success again.
async fn revoke(state: &AppState, session: &SessionInfo, id: &str) -> Result<Response, SiteError> {
    if !is_valid_id("key", id) {
        return Err(SiteError::Code("invalid_key_id"));
    }
    let key = match state.db.keys().revoke(id, &session.user_id).await {
        Ok(k) => k,
        Err(StoreError::NotFound) => return Err(SiteError::Code("not_found")),
        Err(e) => return Err(failed("key_revoke_failed")(e)),
    };
    let id = key.id.clone();
    state.identity.apply_key(key);
    Ok(ok(
        json!({ "ok": true, "key": { "id": id, "status": "revoked" } }),
    ))
}

// ---------------------------------------------------------------------------------------------
// GET and POST /security

async fn security(
    State(state): State<SharedState>,
    headers: HeaderMap,
) -> Result<Response, SiteError> {
    let session = reader(&state, &headers).await?;
    let user = load_user(&state, &session.user_id, "security_query_failed").await?;
    Ok(ok(json!({
        "ok": true,
        "security": { "twoFactorEnabled": user.two_factor_enabled },
        "csrfToken": session.csrf_token,
    })))
}

/// `{twoFactorEnabled:true}` turns two-factor on with a fresh secret, returned once as
/// `totpSecret` and `otpauthUrl`; asking again while it is on changes nothing and shows no
/// secret. `{twoFactorEnabled:false, twoFactorCode}` turns it off when the code is valid
/// (`two_factor_code_required` without one, `invalid_code` for a wrong one,
/// `too_many_attempts` after five tries in an hour). Any other body is `invalid_body`.
async fn post_security(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let body = parse_json(&body);
    let session = writer(&state, &headers, Some(&body)).await?;
    let enable = body
        .get("twoFactorEnabled")
        .and_then(Value::as_bool)
        .ok_or(SiteError::Code("invalid_body"))?;
    let user = load_user(&state, &session.user_id, "security_query_failed").await?;
    let auth = state.db.auth();
    let update_failed = failed("security_update_failed");
    match (enable, user.two_factor_enabled) {
        (true, false) => {
            let setup = twofactor::generate(&user.email);
            let sealed = twofactor::SeedKey::from_state(&state)?
                .seal(&user.id, &setup.secret)
                .ok_or_else(|| update_failed(StoreError::Invalid("seed sealing failed".into())))?;
            let changed = auth
                .set_two_factor_if(&user.id, false, Some(&sealed), now_ms())
                .await
                .map_err(&update_failed)?;
            if !changed {
                // A concurrent request turned it on first; its answer carries the secret.
                return Ok(security_answer(true, None));
            }
            Ok(security_answer(true, Some(&setup)))
        }
        (false, true) => {
            let code = body
                .get("twoFactorCode")
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .ok_or(SiteError::Code("two_factor_code_required"))?;
            let bucket = format!("tfa-off:{}", user.id);
            if over_hourly_limit(&state, &bucket, TWO_FACTOR_ATTEMPTS_PER_HOUR)
                .await
                .map_err(&update_failed)?
            {
                return Err(SiteError::Code("too_many_attempts"));
            }
            let valid = match user.totp_secret.as_deref() {
                Some(stored) => {
                    let key = twofactor::SeedKey::from_state(&state)?;
                    twofactor::accept(&state.db, &key, &user.id, stored, code)
                        .await
                        .map_err(&update_failed)?
                }
                None => false,
            };
            if !valid {
                return Err(SiteError::Code("invalid_code"));
            }
            auth.set_two_factor_if(&user.id, true, None, now_ms())
                .await
                .map_err(&update_failed)?;
            Ok(security_answer(false, None))
        }
        (on, _) => Ok(security_answer(on, None)),
    }
}

fn security_answer(enabled: bool, setup: Option<&twofactor::TwoFactorSetup>) -> Response {
    let mut security = json!({ "twoFactorEnabled": enabled });
    if let (Some(setup), Some(obj)) = (setup, security.as_object_mut()) {
        obj.insert("totpSecret".into(), setup.secret.clone().into());
        obj.insert("otpauthUrl".into(), setup.otpauth_url.clone().into());
    }
    ok(json!({ "ok": true, "security": security }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::storage::usage::RecentEvent;

    #[test]
    fn periods_default_to_a_week() {
        assert_eq!(Period::parse(Some("1h")), Period::Hour);
        assert_eq!(Period::parse(Some("24h")), Period::Day);
        assert_eq!(Period::parse(Some("30d")), Period::Month);
        assert_eq!(Period::parse(Some("7d")), Period::Week);
        assert_eq!(Period::parse(Some("90d")), Period::Week);
        assert_eq!(Period::parse(None), Period::Week);
        assert_eq!(Period::Month.millis(), 30 * MS_PER_DAY);
    }

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

    #[test]
    fn report_fills_days_and_ranks_models() {
        let day = 20_000i64;
        let from = day * MS_PER_DAY + 5 * 3_600_000;
        let now = (day + 2) * MS_PER_DAY + 60_000;
        let t = |r, i, o| UsageTotals {
            requests: r,
            input_tokens: i,
            output_tokens: o,
            total_tokens: i + o,
            cached_tokens: 0,
            quota_charged: 2 * (i + o),
        };
        let mut report = UsageReport::default();
        report.daily.insert(day, t(2, 11, 6));
        report.daily.insert(day + 2, t(2, 30, 11));
        report.by_model.insert("a".into(), t(2, 11, 6));
        report.by_model.insert("b".into(), t(2, 30, 11));
        report.recent.push(RecentEvent {
            id: "evt_1".into(),
            model: "b".into(),
            reasoning_effort: Some("low".into()),
            input_tokens: 15,
            output_tokens: 5,
            total_tokens: 20,
            cached_tokens: 3,
            quota_charged: 41,
            created_at: now - 1,
        });
        report.last_call = Some(now - 1);
        let v = Value::Object(report_json(&report, from, now));
        assert_eq!(
            v["summary"],
            json!({"requests": 4, "inputTokens": 41, "outputTokens": 17, "totalTokens": 58,
                   "cachedTokens": 0, "quotaCharged": 116, "lastApiCall": iso(now - 1)})
        );
        let days: Vec<&str> = v["daily"]
            .as_array()
            .expect("daily")
            .iter()
            .map(|d| d["day"].as_str().expect("day"))
            .collect();
        assert_eq!(days, vec!["2024-10-04", "2024-10-05", "2024-10-06"]);
        assert_eq!(v["daily"][1]["requests"], json!(0));
        assert_eq!(v["daily"][2]["totalTokens"], json!(41));
        assert_eq!(v["byModel"][0]["model"], json!("b"));
        assert_eq!(v["byModel"][1]["requests"], json!(2));
        assert_eq!(v["recentRequests"][0]["reasoningEffort"], json!("low"));
        assert_eq!(v["recentRequests"][0]["quotaCharged"], json!(41));
        assert_eq!(v["recentRequests"][0]["cachedTokens"], json!(3));
        assert_eq!(v["byModel"][0]["quotaCharged"], json!(82));
        assert!(
            v.get("hourly").is_none(),
            "no hours in a report without them"
        );

        // A day's window: one bucket per hour, the cut first hour included, zeros filled.
        let from = day * MS_PER_DAY + 5 * MS_PER_HOUR + 60_000;
        let now = from + MS_PER_DAY;
        let first = from.div_euclid(MS_PER_HOUR);
        report.hourly = Some(
            [(first, t(1, 5, 2)), (first + 24, t(3, 7, 1))]
                .into_iter()
                .collect(),
        );
        let v = Value::Object(report_json(&report, from, now));
        let hourly = v["hourly"].as_array().expect("hourly");
        assert_eq!(hourly.len(), 25);
        assert_eq!(hourly[0]["hour"], json!("2024-10-04T05:00:00.000Z"));
        assert_eq!(hourly[0]["requests"], json!(1));
        assert_eq!(hourly[1]["requests"], json!(0));
        assert_eq!(hourly[24]["hour"], json!("2024-10-05T05:00:00.000Z"));
        assert_eq!(hourly[24]["totalTokens"], json!(8));
    }
}
