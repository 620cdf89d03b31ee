//! What an attempt's answer says about its deployment: a failure of the deployment (which
//! counts toward its ejection), an answer about the request (proof of life), or success.

use std::time::Duration;

use crate::upstream::{UpstreamError, Wait};

/// A failure that says the deployment, not the request, is unwell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    Connect,
    Tls,
    Timeout(Wait),
    /// 5xx other than 529.
    ServerError,
    /// 529: the provider is overloaded.
    Overloaded,
    /// 429: the provider's account is rate limited.
    RateLimited,
    /// 401 or 403: the provider refused the gateway's credential.
    Credential,
    /// The connection failed while the answer was read.
    Broken,
}

impl Failure {
    /// The metrics label (`reason` of ejections, `outcome` of attempts).
    pub fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect_error",
            Failure::Tls => "tls_error",
            Failure::Timeout(_) => "timeout",
            Failure::ServerError => "server_error",
            Failure::Overloaded => "overloaded",
            Failure::RateLimited => "rate_limited",
            Failure::Credential => "credential_refused",
            Failure::Broken => "broken_connection",
        }
    }

    /// What the client is told when this was the last failure and no answer could be passed
    /// on (the provider's own answers, 5xx and 429, are passed on instead).
    pub fn describe(self) -> &'static str {
        match self {
            Failure::Connect | Failure::Broken => "the provider could not be reached",
            Failure::Tls => "the TLS handshake with the provider failed",
            Failure::Timeout(Wait::Connect) => "the provider did not accept a connection in time",
            Failure::Timeout(_) => "the provider did not answer in time",
            Failure::Credential => "the provider refused the gateway's credential",
            Failure::ServerError | Failure::Overloaded | Failure::RateLimited => {
                "the provider failed"
            }
        }
    }

    /// `None` for a request that could not be written at all (no provider is at fault).
    pub fn of_error(e: &UpstreamError) -> Option<Failure> {
        Some(match e {
            UpstreamError::Resolve(..) | UpstreamError::Connect(_) => Failure::Connect,
            UpstreamError::Tls(..) => Failure::Tls,
            UpstreamError::Timeout(wait) => Failure::Timeout(*wait),
            UpstreamError::Io(_) => Failure::Broken,
            UpstreamError::Request(_) => return None,
        })
    }
}

/// How a provider's answer counts for its deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// About the request (400, 404, 409, 413, 422, ...): the provider is well.
    RequestError,
    Failed(Failure),
}

impl Verdict {
    pub fn of_status(status: u16) -> Verdict {
        match status {
            401 | 403 => Verdict::Failed(Failure::Credential),
            429 => Verdict::Failed(Failure::RateLimited),
            529 => Verdict::Failed(Failure::Overloaded),
            500..=599 => Verdict::Failed(Failure::ServerError),
            400..=499 => Verdict::RequestError,
            _ => Verdict::Ok,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::RequestError => "request_error",
            Verdict::Failed(f) => f.label(),
        }
    }
}

/// The wait a 429 or 503 asks for: `retry-after-ms` (OpenAI) or `retry-after` in seconds.
/// A date or anything unreadable is no ask (the failure then counts like any other).
pub fn retry_after(status: u16, header: &crate::http1::Fields) -> Option<Duration> {
    if status != 429 && status != 503 {
        return None;
    }
    let number = |name: &str| -> Option<f64> {
        let v: f64 = header.get(name)?.to_str().ok()?.trim().parse().ok()?;
        (v.is_finite() && v > 0.0).then_some(v)
    };
    number("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| number("retry-after"))
        .map(|secs| Duration::from_secs_f64(secs.min(86_400.0)))
}
