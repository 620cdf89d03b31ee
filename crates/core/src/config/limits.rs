//! `[limits]`: the account site's own rate limits.

use super::file::LimitsFile;

#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub request_code_per_hour: u32,
}

pub(super) fn validate(f: LimitsFile) -> LimitsConfig {
    LimitsConfig {
        request_code_per_hour: f.request_code_per_hour.unwrap_or(5).max(1),
    }
}
