//! Stored records as the account API and the admin commands show them, in the spec's field
//! names (§2.1, §2.2), so both always agree. Each view is a `Serialize` struct borrowed from
//! its record; the `*_json` functions are for callers that assemble JSON themselves (the CLI).

use serde::Serialize;
use serde_json::Value;

use gateway_core::domain::Lot;
use gateway_core::storage::{KeyRecord, UserRecord};
use gateway_core::util::iso;

/// `Some(iso(ms))`: optional timestamps serialize as a string or `null`.
pub fn iso_opt(ms: Option<i64>) -> Option<String> {
    ms.map(iso)
}

/// `active` or `revoked`.
pub fn key_status(k: &KeyRecord) -> &'static str {
    if k.revoked {
        "revoked"
    } else {
        "active"
    }
}

/// Spec §2.1 key metadata. Never includes the hash or any secret.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyView<'a> {
    id: &'a str,
    name: &'a str,
    status: &'static str,
    /// The account's global key: the one a rotation replaces.
    global: bool,
    key_prefix: &'a str,
    key_suffix: &'a str,
    scopes: &'a [String],
    limit_mode: &'static str,
    custom_input_tokens_per_minute: Option<u64>,
    custom_output_tokens_per_minute: Option<u64>,
    custom_requests_per_minute: Option<u64>,
    model_allowlist: &'a [String],
    max_input_tokens_per_request: Option<u64>,
    max_output_tokens_per_request: Option<u64>,
    created_at: String,
    last_used_at: Option<String>,
    revoked_at: Option<String>,
}

impl<'a> From<&'a KeyRecord> for KeyView<'a> {
    fn from(k: &'a KeyRecord) -> KeyView<'a> {
        KeyView {
            id: &k.id,
            name: &k.name,
            status: key_status(k),
            global: k.is_global,
            key_prefix: &k.key_prefix,
            key_suffix: &k.key_suffix,
            scopes: &k.scopes,
            limit_mode: k.limit_mode.as_str(),
            custom_input_tokens_per_minute: k.custom_input_tpm,
            custom_output_tokens_per_minute: k.custom_output_tpm,
            custom_requests_per_minute: k.custom_rpm,
            model_allowlist: &k.model_allowlist,
            max_input_tokens_per_request: k.max_input_tokens,
            max_output_tokens_per_request: k.max_output_tokens,
            created_at: iso(k.created_at),
            last_used_at: iso_opt(k.last_used_at),
            revoked_at: iso_opt(k.revoked_at),
        }
    }
}

/// Spec §2.2 user profile fields (plus email, which the owner may see).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserView<'a> {
    id: &'a str,
    email: &'a str,
    created_at: String,
    updated_at: String,
    last_login_at: Option<String>,
    two_factor_enabled: bool,
    quota_tier: &'static str,
    quota_unlimited: bool,
    suspended: bool,
}

impl<'a> From<&'a UserRecord> for UserView<'a> {
    fn from(u: &'a UserRecord) -> UserView<'a> {
        UserView {
            id: &u.id,
            email: &u.email,
            created_at: iso(u.created_at),
            updated_at: iso(u.updated_at),
            last_login_at: iso_opt(u.last_login_at),
            two_factor_enabled: u.two_factor_enabled,
            quota_tier: u.manual_tier.as_str(),
            quota_unlimited: u.unlimited,
            suspended: u.suspended,
        }
    }
}

/// A quota lot as shown to its owner and operators.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LotView<'a> {
    id: &'a str,
    user_id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    amount: u64,
    remaining: u64,
    tier: Option<&'static str>,
    source: &'a str,
    created_at: String,
    expires_at: String,
}

impl<'a> From<&'a Lot> for LotView<'a> {
    fn from(l: &'a Lot) -> LotView<'a> {
        LotView {
            id: &l.id,
            user_id: &l.user_id,
            kind: l.kind.as_str(),
            amount: l.amount,
            remaining: l.remaining,
            tier: l.tier.map(|t| t.as_str()),
            source: &l.source,
            created_at: iso(l.created_at),
            expires_at: iso(l.expires_at),
        }
    }
}

/// Views of a list of records.
pub fn all<'a, R, V: From<&'a R>>(records: &'a [R]) -> Vec<V> {
    records.iter().map(V::from).collect()
}

/// A view as a JSON value, for callers that add fields of their own.
pub fn to_value(view: &impl Serialize) -> Value {
    serde_json::to_value(view).unwrap_or(Value::Null)
}

pub fn key_json(k: &KeyRecord) -> Value {
    to_value(&KeyView::from(k))
}

pub fn user_json(u: &UserRecord) -> Value {
    to_value(&UserView::from(u))
}

pub fn lot_json(l: &Lot) -> Value {
    to_value(&LotView::from(l))
}
