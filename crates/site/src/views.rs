//! JSON renderings of stored records in the spec's field names (§2.1, §2.2), shared by the
//! admin commands and the account API so both always agree.

use serde_json::{json, Value};

use gateway_core::domain::Lot;
use gateway_core::storage::{KeyRecord, UserRecord};
use gateway_core::util::{iso, iso_opt};

/// Spec §2.1 key metadata. Never includes the hash or any secret.
pub fn key_json(k: &KeyRecord) -> Value {
    json!({
        "id": k.id,
        "name": k.name,
        "status": if k.revoked { "revoked" } else { "active" },
        "keyPrefix": k.key_prefix,
        "keySuffix": k.key_suffix,
        "scopes": k.scopes,
        "limitMode": k.limit_mode.as_str(),
        "customInputTokensPerMinute": k.custom_input_tpm,
        "customOutputTokensPerMinute": k.custom_output_tpm,
        "customRequestsPerMinute": k.custom_rpm,
        "modelAllowlist": k.model_allowlist,
        "maxInputTokensPerRequest": k.max_input_tokens,
        "maxOutputTokensPerRequest": k.max_output_tokens,
        "createdAt": iso(k.created_at),
        "lastUsedAt": iso_opt(k.last_used_at),
        "revokedAt": iso_opt(k.revoked_at),
    })
}

/// Spec §2.2 user profile fields (plus email, which the owner may see).
pub fn user_json(u: &UserRecord) -> Value {
    json!({
        "id": u.id,
        "email": u.email,
        "createdAt": iso(u.created_at),
        "updatedAt": iso(u.updated_at),
        "lastLoginAt": iso_opt(u.last_login_at),
        "twoFactorEnabled": u.two_factor_enabled,
        "quotaTier": u.manual_tier.as_str(),
        "quotaUnlimited": u.unlimited,
        "suspended": u.suspended,
    })
}

/// A quota lot as shown to its owner and operators.
pub fn lot_json(l: &Lot) -> Value {
    json!({
        "id": l.id,
        "userId": l.user_id,
        "type": l.kind.as_str(),
        "amount": l.amount,
        "remaining": l.remaining,
        "tier": l.tier.map(|t| t.as_str()),
        "source": l.source,
        "createdAt": iso(l.created_at),
        "expiresAt": iso(l.expires_at),
    })
}
