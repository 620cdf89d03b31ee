//! The site's one error type: a variant per error code of the account service, each with its
//! HTTP status in [`SiteError::status`], rendered as `{ok:false, code}` by one `IntoResponse`.
//!
//! Storage causes never reach a client: [`Failing::or_fail`] logs the cause once, where it
//! happens, and answers with the area's `*_failed` code.

use std::fmt::Display;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Every error code the site answers with. The `Display` text is the code itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SiteError {
    // 400: the request itself is wrong.
    #[error("invalid_email")]
    InvalidEmail,
    #[error("invalid_code")]
    InvalidCode,
    #[error("invalid_link")]
    InvalidLink,
    #[error("invalid_body")]
    InvalidBody,
    #[error("invalid_key_id")]
    InvalidKeyId,
    #[error("invalid_package")]
    InvalidPackage,
    #[error("invalid_quota_type")]
    InvalidQuotaType,
    #[error("invalid_quantity")]
    InvalidQuantity,
    /// A custom order priced below `[payment] min_order_vnd`.
    #[error("order_below_minimum")]
    OrderBelowMinimum,
    #[error("invalid_text")]
    InvalidText,
    #[error("terms_required")]
    TermsRequired,
    #[error("captcha_required")]
    CaptchaRequired,
    #[error("captcha_failed")]
    CaptchaFailed,
    #[error("code_expired")]
    CodeExpired,
    #[error("link_expired")]
    LinkExpired,

    // 401: who is asking is not established.
    #[error("unauthorized")]
    Unauthorized,
    #[error("two_factor_code_required")]
    TwoFactorCodeRequired,

    // 403: established, and refused.
    #[error("invalid_origin")]
    InvalidOrigin,
    #[error("invalid_csrf")]
    InvalidCsrf,
    #[error("private_beta_only")]
    PrivateBetaOnly,
    #[error("blocked_domain")]
    BlockedDomain,
    #[error("advanced_keys_disabled")]
    AdvancedKeysDisabled,

    // 404
    #[error("not_found")]
    NotFound,

    // 409: the account's state does not allow it now.
    #[error("active_key_limit_reached")]
    ActiveKeyLimitReached,
    #[error("too_many_pending_payment_orders")]
    TooManyPendingPaymentOrders,
    #[error("order_not_pending")]
    OrderNotPending,

    // 429
    #[error("rate_limited")]
    RateLimited,
    #[error("too_many_attempts")]
    TooManyAttempts,

    // 503: the operator has not configured what this needs.
    #[error("auth_not_configured")]
    AuthNotConfigured,
    #[error("email_not_configured")]
    EmailNotConfigured,
    #[error("captcha_not_configured")]
    CaptchaNotConfigured,
    #[error("key_secret_not_configured")]
    KeySecretNotConfigured,
    #[error("price_not_configured")]
    PriceNotConfigured,

    // 500: the server failed; the cause is in the log.
    #[error("auth_challenge_failed")]
    AuthChallengeFailed,
    #[error("account_persistence_failed")]
    AccountPersistenceFailed,
    #[error("account_query_failed")]
    AccountQueryFailed,
    #[error("profile_query_failed")]
    ProfileQueryFailed,
    #[error("usage_query_failed")]
    UsageQueryFailed,
    #[error("security_query_failed")]
    SecurityQueryFailed,
    #[error("security_update_failed")]
    SecurityUpdateFailed,
    #[error("key_creation_failed")]
    KeyCreationFailed,
    #[error("key_revoke_failed")]
    KeyRevokeFailed,
    #[error("payment_query_failed")]
    PaymentQueryFailed,
    #[error("payment_order_failed")]
    PaymentOrderFailed,
}

impl SiteError {
    /// The HTTP status of each code (CONTRACT §3).
    pub fn status(self) -> StatusCode {
        use SiteError::*;
        match self {
            InvalidEmail | InvalidCode | InvalidLink | InvalidBody | InvalidKeyId
            | InvalidPackage | InvalidQuotaType | InvalidQuantity | OrderBelowMinimum
            | InvalidText | TermsRequired | CaptchaRequired | CaptchaFailed | CodeExpired
            | LinkExpired => StatusCode::BAD_REQUEST,
            Unauthorized | TwoFactorCodeRequired => StatusCode::UNAUTHORIZED,
            InvalidOrigin | InvalidCsrf | PrivateBetaOnly | BlockedDomain
            | AdvancedKeysDisabled => StatusCode::FORBIDDEN,
            NotFound => StatusCode::NOT_FOUND,
            ActiveKeyLimitReached | TooManyPendingPaymentOrders | OrderNotPending => {
                StatusCode::CONFLICT
            }
            RateLimited | TooManyAttempts => StatusCode::TOO_MANY_REQUESTS,
            AuthNotConfigured
            | EmailNotConfigured
            | CaptchaNotConfigured
            | KeySecretNotConfigured
            | PriceNotConfigured => StatusCode::SERVICE_UNAVAILABLE,
            AuthChallengeFailed
            | AccountPersistenceFailed
            | AccountQueryFailed
            | ProfileQueryFailed
            | UsageQueryFailed
            | SecurityQueryFailed
            | SecurityUpdateFailed
            | KeyCreationFailed
            | KeyRevokeFailed
            | PaymentQueryFailed
            | PaymentOrderFailed => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code as sent in `{ok:false, code}`.
    pub fn code(self) -> String {
        self.to_string()
    }

    /// Logs `cause` (it stays server-side) and returns this error: the one place a failure of
    /// the account service is logged.
    pub fn logged(self, cause: impl Display) -> SiteError {
        log::error!("account storage failed ({self}): {cause}");
        self
    }
}

/// `{ok:false, code}`: the only error shape the site sends.
#[derive(Serialize)]
struct ErrorBody {
    ok: bool,
    code: SiteErrorCode,
}

/// Serializes a [`SiteError`] as its code.
struct SiteErrorCode(SiteError);

impl Serialize for SiteErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl IntoResponse for SiteError {
    fn into_response(self) -> Response {
        let mut resp = crate::reply::json(
            self.status(),
            &ErrorBody {
                ok: false,
                code: SiteErrorCode(self),
            },
        );
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}

/// Turns a storage (or other internal) failure into the area's `*_failed` code, logging the
/// cause once.
pub trait Failing<T> {
    fn or_fail(self, code: SiteError) -> Result<T, SiteError>;
}

impl<T, E: Display> Failing<T> for Result<T, E> {
    fn or_fail(self, code: SiteError) -> Result<T, SiteError> {
        self.map_err(|e| code.logged(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        use SiteError::*;
        let cases = [
            (InvalidEmail, 400),
            (CaptchaFailed, 400),
            (PriceNotConfigured, 503),
            (Unauthorized, 401),
            (TwoFactorCodeRequired, 401),
            (InvalidCsrf, 403),
            (NotFound, 404),
            (ActiveKeyLimitReached, 409),
            (OrderNotPending, 409),
            (TooManyAttempts, 429),
            (EmailNotConfigured, 503),
            (KeyCreationFailed, 500),
            (CodeExpired, 400),
        ];
        for (e, status) in cases {
            assert_eq!(e.status().as_u16(), status, "{e}");
        }
        assert_eq!(
            TooManyPendingPaymentOrders.code(),
            "too_many_pending_payment_orders"
        );
    }

    /// The naming rule the contract states (`*_not_configured` 503, `*_failed` 500 except
    /// `captcha_failed`) holds for every variant.
    #[test]
    fn suffixes_agree_with_statuses() {
        use SiteError::*;
        for e in [
            AuthNotConfigured,
            EmailNotConfigured,
            CaptchaNotConfigured,
            KeySecretNotConfigured,
            PriceNotConfigured,
        ] {
            assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE, "{e}");
            assert!(e.code().ends_with("_not_configured"));
        }
        for e in [
            AuthChallengeFailed,
            AccountPersistenceFailed,
            AccountQueryFailed,
            ProfileQueryFailed,
            UsageQueryFailed,
            SecurityQueryFailed,
            SecurityUpdateFailed,
            KeyCreationFailed,
            KeyRevokeFailed,
            PaymentQueryFailed,
            PaymentOrderFailed,
        ] {
            assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR, "{e}");
            assert!(e.code().ends_with("_failed"));
        }
    }
}
