//! What one developer request leaves behind for its access line, metrics and rate-limit
//! headers: filled in as the request walks the phases, read by `accesslog` at the end.

use std::time::Instant;

use crate::route::Endpoint;
use gateway_core::identity::Identity;
use gateway_core::quota::RateView;

/// Per-request state, filled in as the request walks the phases; `logging` reads it.
pub struct RequestCtx {
    /// The connection's last presented key and its hash, carried to its next request.
    pub key_memo: Box<crate::auth::KeyMemo>,
    pub request_id: String,
    pub started: Instant,
    pub endpoint: Option<Endpoint>,
    pub model: Option<String>,
    /// The caller once its key is known (shared, not copied: the access line reads the ids).
    pub identity: Option<Identity>,
    pub status: u16,
    pub error_code: Option<&'static str>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub deployment: Option<String>,
    /// The key's per-minute windows once known, for the `x-ratelimit-*` headers.
    pub rate: RateView,
    /// Time to the first response byte, for forwarded requests.
    pub ttfb_ms: Option<u64>,
    /// The request's spans when telemetry is on (`None` otherwise: nothing to do).
    pub trace: Option<Box<crate::trace::RequestTrace>>,
}
