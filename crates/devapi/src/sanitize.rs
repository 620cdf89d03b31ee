//! What of a provider's answer a client may see.
//!
//! A provider answers the operator's account, not the developer: its cookies, organization and
//! project ids, rate-limit state, server software and any custom `x-*` header describe that
//! account and its infrastructure. So the client's header is built from an allowlist (content
//! headers, `retry-after`, the provider's request id under a name of its own), never from a
//! deny-list that a new provider header would slip past. The gateway adds its own `x-request-id`
//! and `x-ratelimit-*` itself.
//!
//! A provider 401 or 403 means the operator's credential is wrong or lacks access: passed on as
//! it is, it would tell the developer that *their* key is bad (and may quote the operator's
//! key). It becomes a 502 of its own ([`ApiError::ProviderAuthFailed`]) whose message says
//! nothing of the provider's. Every other provider error keeps its status and body, with any
//! echo of the provider credential masked, in whatever encoding it came
//! ([`gateway_core::credential_mask`]).

use std::borrow::Cow;

use bytes::Bytes;
use gateway_core::credential_mask::CredentialMask;
use http::HeaderName;

use crate::error::ApiError;
use gateway_core::config::Provider;
use gateway_core::domain::ProviderStyle;

/// The provider's request id, as the client sees it: the gateway's own `x-request-id` names the
/// client's request, so the provider's (`x-request-id` at OpenAI and Azure, `request-id` at
/// Anthropic, `x-amzn-requestid` at Bedrock) is passed on under this name.
pub const PROVIDER_REQUEST_ID: HeaderName = HeaderName::from_static("x-provider-request-id");

/// The name a provider response header is passed to the client under, or `None` when it stays
/// behind. Framing headers (`content-length`, `transfer-encoding`) are the gateway's own and
/// are set by the caller.
pub fn client_header_name(name: &[u8]) -> Option<HeaderName> {
    use http::header;
    const PASSED: [HeaderName; 7] = [
        header::CONTENT_TYPE,
        header::CONTENT_ENCODING,
        header::CONTENT_LANGUAGE,
        header::CONTENT_DISPOSITION,
        header::CACHE_CONTROL,
        header::RETRY_AFTER,
        header::VARY,
    ];
    // The name as the provider sent it, in any case.
    let is = |known: &str| name.eq_ignore_ascii_case(known.as_bytes());
    if let Some(passed) = PASSED.iter().find(|p| is(p.as_str())) {
        return Some(passed.clone());
    }
    ["x-request-id", "request-id", "x-amzn-requestid"]
        .into_iter()
        .any(is)
        .then_some(PROVIDER_REQUEST_ID)
}

/// True for a provider status that speaks of the operator's credential, not the client's
/// request.
pub fn refuses_operator(status: u16) -> bool {
    matches!(status, 401 | 403)
}

/// The error the client gets for a provider 401/403. The provider's message is logged (with its
/// credential masked) for the operator and never sent.
pub fn operator_refused(
    provider: &Provider,
    status: u16,
    body: &[u8],
    secret: &CredentialMask,
) -> ApiError {
    let body = secret.mask(body);
    let text = String::from_utf8_lossy(&body);
    let text: String = text.chars().take(300).collect();
    let check = match provider.style {
        ProviderStyle::Bedrock => "the AWS credentials in the environment and their access",
        ProviderStyle::VertexAnthropic => "its credentials_file and the account's access",
        _ => "its api_key_env",
    };
    log::error!(
        "provider {} refused the gateway's credential ({status}): {text}; check {check}",
        provider.name
    );
    ApiError::ProviderAuthFailed
}

/// `body` with every echo of the credential `secret` masks replaced by `***`. Runs on provider
/// error bodies only, which are held whole before they are sent.
pub fn mask_credential(body: Bytes, secret: &CredentialMask) -> Bytes {
    match secret.mask(&body) {
        Cow::Borrowed(_) => body,
        Cow::Owned(masked) => Bytes::from(masked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowlisted_headers_pass() {
        let pass = |n: &str| client_header_name(n.as_bytes());
        for kept in [
            "content-type",
            "content-encoding",
            "cache-control",
            "retry-after",
        ] {
            assert_eq!(pass(kept).as_ref().map(HeaderName::as_str), Some(kept));
        }
        assert_eq!(pass("x-request-id"), Some(PROVIDER_REQUEST_ID));
        assert_eq!(pass("request-id"), Some(PROVIDER_REQUEST_ID));
        assert_eq!(pass("x-amzn-requestid"), Some(PROVIDER_REQUEST_ID));
        // Names come as the provider sent them: any case passes under the lower-case name.
        assert_eq!(pass("Content-Type"), Some(http::header::CONTENT_TYPE));
        assert_eq!(pass("X-Request-Id"), Some(PROVIDER_REQUEST_ID));
        assert_eq!(pass("content-typo"), None);
        for dropped in [
            "www-authenticate",
            "server",
            "set-cookie",
            "openai-organization",
            "openai-processing-ms",
            "anthropic-organization-id",
            "x-ratelimit-limit-requests",
            "anthropic-ratelimit-tokens-limit",
            "x-envoy-upstream-service-time",
            "cf-ray",
            "content-length",
            "transfer-encoding",
            "connection",
        ] {
            assert_eq!(pass(dropped), None, "{dropped}");
        }
    }

    #[test]
    fn echoed_credentials_are_masked() {
        let body = Bytes::from_static(
            b"{\"error\":{\"message\":\"key sk-operator-123 has no access; sk-operator-123\"}}",
        );
        let mask = |s: Option<&str>| mask_credential(body.clone(), &CredentialMask::new(s));
        let out = mask(Some("sk-operator-123"));
        assert_eq!(
            &out[..],
            b"{\"error\":{\"message\":\"key *** has no access; ***\"}}"
        );
        assert_eq!(mask(Some("absent-secret")), body);
        assert_eq!(mask(Some("sk-")), body);
        assert_eq!(mask(None), body);
        assert!(refuses_operator(401) && refuses_operator(403) && !refuses_operator(429));
    }
}
