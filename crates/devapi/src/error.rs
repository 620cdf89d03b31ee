//! The developer-API error surface: one enum, one status/code mapping, one renderer of the
//! spec's `{error:{message,type,code}}` shape. Internal causes are logged where they happen and
//! never put in a message.

use bytes::Bytes;

/// Every error the developer API answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    NotFound,
    EndpointNotEnabled,
    SensitiveQueryParam,
    KeySecretNotConfigured,
    MissingApiKey,
    InvalidApiKey,
    AccountSuspended,
    InsufficientScope,
    ModelNotAllowed(String),
    MaxInputTokensExceeded {
        estimated: u64,
        limit: u64,
    },
    MaxOutputTokensExceeded {
        requested: u64,
        limit: u64,
    },
    ContextWindowExceeded {
        total: u64,
        limit: u64,
    },
    InsufficientQuota,
    RateLimited {
        retry_after_secs: u64,
        what: &'static str,
    },
    RoutingUnavailable,
    /// A provider refused the operator's credential (its 401 or 403): the gateway's fault, not
    /// the developer's key's.
    ProviderAuthFailed,
    /// 503: the balance store (Redis under `redis_outage = "refuse"`, or the database) did not
    /// answer within its deadline; retrying shortly may succeed.
    QuotaUnavailable,
    /// `routing_unavailable` with the reason: the deployments tried failed without an answer
    /// to pass on, or none could be tried (no credential, none serving the endpoint).
    RouteFailed(String),
    ServerError,
    /// 400 for malformed requests: missing `model`, non-JSON body, bad field.
    InvalidRequest {
        code: &'static str,
        message: String,
    },
    /// 400 for a bad value of one field, named in the error's `param` as OpenAI names it.
    InvalidParam {
        code: &'static str,
        param: &'static str,
        message: String,
    },
    /// `previous_response_id` names no response of this account (OpenAI's own answer).
    PreviousResponseNotFound(String),
    /// An input item references an id that is no item of this account (OpenAI's own answer:
    /// 404, `param: "input"`, no code).
    ItemNotFound(String),
    /// `conversation` names no conversation of this account: the gateway serves no
    /// `/v1/conversations`, so it never names one.
    ConversationNotFound(String),
    PayloadTooLarge,
    /// The process-wide budget of request-body bytes in flight is spent (503).
    ServerBusy,
    MethodNotAllowed,
    UnknownModel(String),
}

impl ApiError {
    pub fn status(&self) -> u16 {
        match self {
            ApiError::NotFound
            | ApiError::EndpointNotEnabled
            | ApiError::UnknownModel(_)
            | ApiError::ItemNotFound(_)
            | ApiError::ConversationNotFound(_) => 404,
            ApiError::SensitiveQueryParam
            | ApiError::MaxInputTokensExceeded { .. }
            | ApiError::MaxOutputTokensExceeded { .. }
            | ApiError::ContextWindowExceeded { .. }
            | ApiError::InvalidRequest { .. }
            | ApiError::InvalidParam { .. }
            | ApiError::PreviousResponseNotFound(_) => 400,
            ApiError::KeySecretNotConfigured
            | ApiError::ServerBusy
            | ApiError::QuotaUnavailable => 503,
            ApiError::MissingApiKey | ApiError::InvalidApiKey => 401,
            ApiError::AccountSuspended
            | ApiError::InsufficientScope
            | ApiError::ModelNotAllowed(_) => 403,
            ApiError::InsufficientQuota | ApiError::RateLimited { .. } => 429,
            ApiError::RoutingUnavailable
            | ApiError::ProviderAuthFailed
            | ApiError::RouteFailed(_) => 502,
            ApiError::ServerError => 500,
            ApiError::PayloadTooLarge => 413,
            ApiError::MethodNotAllowed => 405,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::NotFound => "not_found",
            ApiError::EndpointNotEnabled => "endpoint_not_enabled",
            ApiError::SensitiveQueryParam => "sensitive_query_param",
            ApiError::KeySecretNotConfigured => "key_secret_not_configured",
            ApiError::MissingApiKey => "missing_api_key",
            ApiError::InvalidApiKey => "invalid_api_key",
            ApiError::AccountSuspended => "account_suspended",
            ApiError::InsufficientScope => "insufficient_scope",
            ApiError::ModelNotAllowed(_) => "model_not_allowed",
            ApiError::MaxInputTokensExceeded { .. } => "max_input_tokens_exceeded",
            ApiError::MaxOutputTokensExceeded { .. } => "max_output_tokens_exceeded",
            ApiError::ContextWindowExceeded { .. } => "context_window_exceeded",
            ApiError::InsufficientQuota => "insufficient_quota",
            ApiError::RateLimited { .. } => "rate_limit_exceeded",
            ApiError::RoutingUnavailable | ApiError::RouteFailed(_) => "routing_unavailable",
            ApiError::ProviderAuthFailed => "provider_auth_failed",
            ApiError::QuotaUnavailable => "quota_unavailable",
            ApiError::ServerError => "server_error",
            ApiError::InvalidRequest { code, .. } | ApiError::InvalidParam { code, .. } => code,
            ApiError::PreviousResponseNotFound(_) => "previous_response_not_found",
            ApiError::ItemNotFound(_) => "item_not_found",
            ApiError::ConversationNotFound(_) => "conversation_not_found",
            ApiError::PayloadTooLarge => "request_too_large",
            ApiError::ServerBusy => "server_busy",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::UnknownModel(_) => "model_not_found",
        }
    }

    /// The error `type` in the vocabulary of the client's style, so SDKs and clients that
    /// branch on it see their provider's own types.
    ///
    /// OpenAI (style A) calls every refusal of the request itself, a missing model or route
    /// included, `invalid_request_error`, a spent quota `insufficient_quota` and its own
    /// failures `server_error`. Anthropic (style B) has a type per status:
    /// `invalid_request_error` (400, 405), `authentication_error` (401), `permission_error`
    /// (403), `not_found_error` (404), `request_too_large` (413), `rate_limit_error` (429, a
    /// spent quota included), `api_error` (500, 502) and `overloaded_error` for a gateway that
    /// is momentarily full (503 `server_busy`, `quota_unavailable`).
    pub fn kind(&self, style_b: bool) -> &'static str {
        let status = self.status();
        match (status, style_b) {
            (401, _) => "authentication_error",
            (403, _) => "permission_error",
            (429, false) if matches!(self, ApiError::InsufficientQuota) => "insufficient_quota",
            (429, _) => "rate_limit_error",
            (500.., false) => "server_error",
            (404, true) => "not_found_error",
            (413, true) => "request_too_large",
            (503, true) if matches!(self, ApiError::ServerBusy | ApiError::QuotaUnavailable) => {
                "overloaded_error"
            }
            (500.., true) => "api_error",
            _ => "invalid_request_error",
        }
    }

    pub fn message(&self) -> String {
        match self {
            ApiError::NotFound => "Not found.".into(),
            ApiError::EndpointNotEnabled => "This endpoint is not enabled.".into(),
            ApiError::SensitiveQueryParam => {
                "Credentials must not be sent in the query string; use the Authorization header."
                    .into()
            }
            ApiError::KeySecretNotConfigured => "API key verification is not configured.".into(),
            ApiError::MissingApiKey => "No API key supplied. Send `Authorization: Bearer sk-...` or `x-api-key: sk-...`.".into(),
            ApiError::InvalidApiKey => "Invalid or revoked API key.".into(),
            ApiError::AccountSuspended => "This account is suspended.".into(),
            ApiError::InsufficientScope => "This API key's scopes do not cover this endpoint.".into(),
            ApiError::ModelNotAllowed(m) => format!("This API key may not use model {m:?}."),
            ApiError::MaxInputTokensExceeded { estimated, limit } => format!(
                "Estimated input of {estimated} tokens exceeds the limit of {limit} tokens."
            ),
            ApiError::MaxOutputTokensExceeded { requested, limit } => format!(
                "Requested output of {requested} tokens exceeds the limit of {limit} tokens."
            ),
            ApiError::ContextWindowExceeded { total, limit } => format!(
                "Input plus requested output ({total} tokens) exceeds the model's context window of {limit} tokens."
            ),
            ApiError::InsufficientQuota => "Your token or request quota is exhausted.".into(),
            ApiError::RateLimited {
                retry_after_secs,
                what,
            } => format!("Rate limit exceeded for {what}; retry after {retry_after_secs} s."),
            ApiError::RoutingUnavailable => "The model route is temporarily unavailable.".into(),
            ApiError::ProviderAuthFailed => "The provider refused the gateway's own credential for this model. Your API key is fine; the operator has to fix the provider credential.".into(),
            ApiError::QuotaUnavailable => {
                "Quota accounting is temporarily unavailable; retry shortly.".into()
            }
            ApiError::RouteFailed(why) => {
                format!("The model route is temporarily unavailable: {why}.")
            }
            ApiError::ServerError => "The request could not be completed.".into(),
            ApiError::InvalidRequest { message, .. } | ApiError::InvalidParam { message, .. } => {
                message.clone()
            }
            ApiError::PreviousResponseNotFound(id) => {
                format!("Previous response with id '{}' not found.", shown(id))
            }
            ApiError::ItemNotFound(id) => format!("Item with id '{}' not found.", shown(id)),
            ApiError::ConversationNotFound(id) => {
                format!("Conversation with id '{}' not found.", shown(id))
            }
            ApiError::PayloadTooLarge => "Request body too large.".into(),
            ApiError::ServerBusy => {
                "The server is receiving as many request bodies as it can hold; retry shortly."
                    .into()
            }
            ApiError::MethodNotAllowed => "Method not allowed for this endpoint.".into(),
            ApiError::UnknownModel(m) => format!("The model {m:?} does not exist."),
        }
    }

    /// The field an error is about, as OpenAI names it in `param`.
    fn param(&self) -> Option<&'static str> {
        match self {
            ApiError::InvalidParam { param, .. } => Some(param),
            ApiError::PreviousResponseNotFound(_) => Some("previous_response_id"),
            ApiError::ItemNotFound(_) => Some("input"),
            ApiError::ConversationNotFound(_) => Some("conversation"),
            _ => None,
        }
    }

    /// The `code` the body carries: OpenAI answers an unknown item or conversation with none
    /// (`null`); the access log still names it ([`code`](Self::code)).
    fn wire_code(&self) -> Option<&'static str> {
        match self {
            ApiError::ItemNotFound(_) | ApiError::ConversationNotFound(_) => None,
            _ => Some(self.code()),
        }
    }

    /// The JSON body; `anthropic_shape` (style B) adds the top-level `"type":"error"` and takes
    /// Anthropic's error types.
    pub fn body(&self, anthropic_shape: bool) -> Bytes {
        let mut inner = serde_json::json!({
            "message": self.message(),
            "type": self.kind(anthropic_shape),
            "code": self.wire_code(),
        });
        if let (Some(param), Some(obj)) = (self.param(), inner.as_object_mut()) {
            obj.insert("param".into(), param.into());
        }
        let v = if anthropic_shape {
            serde_json::json!({"type": "error", "error": inner})
        } else {
            serde_json::json!({ "error": inner })
        };
        Bytes::from(v.to_string())
    }

    pub fn invalid(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest {
            code,
            message: message.into(),
        }
    }
}

/// A client's id as an error message repeats it: at most 128 characters.
pub(crate) fn shown(id: &str) -> &str {
    match id.char_indices().nth(128) {
        Some((at, _)) => &id[..at],
        None => id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let b = ApiError::MissingApiKey.body(false);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["error"]["code"], "missing_api_key");
        assert_eq!(v["error"]["type"], "authentication_error");
        let b = ApiError::MissingApiKey.body(true);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["code"], "missing_api_key");
    }

    /// Every error's type in each style, against the types OpenAI and Anthropic answer with.
    #[test]
    fn types_per_style() {
        let all = [
            ApiError::NotFound,
            ApiError::EndpointNotEnabled,
            ApiError::SensitiveQueryParam,
            ApiError::KeySecretNotConfigured,
            ApiError::MissingApiKey,
            ApiError::InvalidApiKey,
            ApiError::AccountSuspended,
            ApiError::InsufficientScope,
            ApiError::ModelNotAllowed("m".into()),
            ApiError::MaxInputTokensExceeded {
                estimated: 2,
                limit: 1,
            },
            ApiError::MaxOutputTokensExceeded {
                requested: 2,
                limit: 1,
            },
            ApiError::ContextWindowExceeded { total: 2, limit: 1 },
            ApiError::InsufficientQuota,
            ApiError::RateLimited {
                retry_after_secs: 1,
                what: "requests",
            },
            ApiError::RoutingUnavailable,
            ApiError::ProviderAuthFailed,
            ApiError::QuotaUnavailable,
            ApiError::RouteFailed("x".into()),
            ApiError::ServerError,
            ApiError::invalid("invalid_json", "x"),
            ApiError::PayloadTooLarge,
            ApiError::ServerBusy,
            ApiError::MethodNotAllowed,
            ApiError::UnknownModel("m".into()),
        ];
        let types: Vec<(&str, &str, &str)> = all
            .iter()
            .map(|e| (e.code(), e.kind(false), e.kind(true)))
            .collect();
        let expected = [
            ("not_found", "invalid_request_error", "not_found_error"),
            (
                "endpoint_not_enabled",
                "invalid_request_error",
                "not_found_error",
            ),
            (
                "sensitive_query_param",
                "invalid_request_error",
                "invalid_request_error",
            ),
            ("key_secret_not_configured", "server_error", "api_error"),
            (
                "missing_api_key",
                "authentication_error",
                "authentication_error",
            ),
            (
                "invalid_api_key",
                "authentication_error",
                "authentication_error",
            ),
            ("account_suspended", "permission_error", "permission_error"),
            ("insufficient_scope", "permission_error", "permission_error"),
            ("model_not_allowed", "permission_error", "permission_error"),
            (
                "max_input_tokens_exceeded",
                "invalid_request_error",
                "invalid_request_error",
            ),
            (
                "max_output_tokens_exceeded",
                "invalid_request_error",
                "invalid_request_error",
            ),
            (
                "context_window_exceeded",
                "invalid_request_error",
                "invalid_request_error",
            ),
            (
                "insufficient_quota",
                "insufficient_quota",
                "rate_limit_error",
            ),
            (
                "rate_limit_exceeded",
                "rate_limit_error",
                "rate_limit_error",
            ),
            ("routing_unavailable", "server_error", "api_error"),
            ("provider_auth_failed", "server_error", "api_error"),
            ("quota_unavailable", "server_error", "overloaded_error"),
            ("routing_unavailable", "server_error", "api_error"),
            ("server_error", "server_error", "api_error"),
            (
                "invalid_json",
                "invalid_request_error",
                "invalid_request_error",
            ),
            (
                "request_too_large",
                "invalid_request_error",
                "request_too_large",
            ),
            ("server_busy", "server_error", "overloaded_error"),
            (
                "method_not_allowed",
                "invalid_request_error",
                "invalid_request_error",
            ),
            (
                "model_not_found",
                "invalid_request_error",
                "not_found_error",
            ),
        ];
        assert_eq!(types, expected);
    }

    /// Unknown ids are answered as OpenAI answers them.
    #[test]
    fn unknown_ids_in_openai_words() {
        let body =
            |e: ApiError| -> serde_json::Value { serde_json::from_slice(&e.body(false)).unwrap() };
        let e = ApiError::PreviousResponseNotFound("resp_1".into());
        assert_eq!(e.status(), 400);
        assert_eq!(
            body(e),
            serde_json::json!({"error": {"message": "Previous response with id 'resp_1' not found.",
                "type": "invalid_request_error", "param": "previous_response_id",
                "code": "previous_response_not_found"}})
        );
        let e = ApiError::ItemNotFound("msg_1".into());
        assert_eq!((e.status(), e.code()), (404, "item_not_found"));
        assert_eq!(
            body(e),
            serde_json::json!({"error": {"message": "Item with id 'msg_1' not found.",
                "type": "invalid_request_error", "param": "input", "code": null}})
        );
        let long = "x".repeat(1000);
        let v = body(ApiError::ConversationNotFound(long));
        assert_eq!(v["error"]["param"], "conversation");
        assert!(v["error"]["message"].as_str().unwrap().len() < 200);
    }

    #[test]
    fn statuses() {
        assert_eq!(ApiError::KeySecretNotConfigured.status(), 503);
        assert_eq!(ApiError::RoutingUnavailable.status(), 502);
        assert_eq!(ApiError::EndpointNotEnabled.status(), 404);
        assert_eq!(ApiError::SensitiveQueryParam.status(), 400);
    }
}
