//! The site error surface: `{ok:false, code}` with the CONTRACT's HTTP statuses. Storage causes
//! are logged where they happen and never sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteError {
    NotFound,
    /// Any code of spec §7 (site side), mapped to its status by `status_for`.
    Code(&'static str),
}

/// CONTRACT §3: the status of each site error code.
pub fn status_for(code: &str) -> StatusCode {
    match code {
        "unauthorized" | "two_factor_code_required" => StatusCode::UNAUTHORIZED,
        "invalid_origin"
        | "invalid_csrf"
        | "private_beta_only"
        | "blocked_domain"
        | "advanced_keys_disabled" => StatusCode::FORBIDDEN,
        "not_found" => StatusCode::NOT_FOUND,
        "active_key_limit_reached" | "too_many_pending_payment_orders" | "order_not_pending" => {
            StatusCode::CONFLICT
        }
        "rate_limited" | "too_many_attempts" => StatusCode::TOO_MANY_REQUESTS,
        c if c.ends_with("_not_configured") => StatusCode::SERVICE_UNAVAILABLE,
        c if c.ends_with("_failed") && c != "captcha_failed" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl SiteError {
    pub fn code(self) -> &'static str {
        match self {
            SiteError::NotFound => "not_found",
            SiteError::Code(c) => c,
        }
    }
}

impl IntoResponse for SiteError {
    fn into_response(self) -> Response {
        let code = self.code();
        let body = serde_json::json!({ "ok": false, "code": code }).to_string();
        let mut resp = (status_for(code), body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        assert_eq!(status_for("invalid_email"), StatusCode::BAD_REQUEST);
        assert_eq!(status_for("captcha_failed"), StatusCode::BAD_REQUEST);
        assert_eq!(status_for("unauthorized"), StatusCode::UNAUTHORIZED);
        assert_eq!(status_for("invalid_csrf"), StatusCode::FORBIDDEN);
        assert_eq!(status_for("active_key_limit_reached"), StatusCode::CONFLICT);
        assert_eq!(
            status_for("too_many_attempts"),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            status_for("email_not_configured"),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            status_for("key_creation_failed"),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(status_for("code_expired"), StatusCode::BAD_REQUEST);
    }
}
