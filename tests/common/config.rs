//! Config the tests add to the harness's: TOML blocks (sign-in limits, quota tiers) and
//! builders of [`Options`].

use super::{Gateway, Mock, Options};

/// Generous sign-in limits (a thousand code requests an hour), so only the tests that mean to
/// meet a limit do.
pub const ROOMY_SIGN_IN: &str = "\n[limits]\nrequest_code_per_hour = 1000\n";

/// A `[quota.tiers.<name>]` block with the given weekly allowance (0: none) and no per-minute
/// caps.
pub fn uncapped_tier(name: &str, weekly_tokens: u64, weekly_requests: u64) -> String {
    format!(
        "
[quota.tiers.{name}]
weekly_tokens = {weekly_tokens}
weekly_requests = {weekly_requests}
requests_per_minute = 0
input_tokens_per_minute = 0
output_tokens_per_minute = 0
"
    )
}

/// Only lots pay (no weekly allowance, no per-minute caps) and a reservation times out after
/// 5 s: a `lot grant` sets the balance exactly.
pub fn lots_only() -> String {
    format!(
        "\n[quota]\nreservation_timeout_seconds = 5\n{}",
        uncapped_tier("beginner", 0, 0)
    )
}

impl Options {
    /// The default options with `extra_toml` appended to the config.
    pub fn with_toml(extra_toml: impl Into<String>) -> Options {
        Options {
            extra_toml: extra_toml.into(),
            ..Options::default()
        }
    }

    /// These options on the test Redis under a fresh key prefix when `GATEWAY_TEST_REDIS` is
    /// set; unchanged (the in-process quota engine) otherwise.
    pub fn on_test_redis(mut self) -> Options {
        if let Ok(url) = std::env::var("GATEWAY_TEST_REDIS") {
            self.redis_url = Some(url);
            self.env.push((
                "GATEWAY_REDIS_PREFIX".into(),
                format!("test:{}:", gateway_core::util::random_base62(12)),
            ));
        }
        self
    }
}

/// A fresh mock provider and a gateway on it with `extra_toml` appended to the config.
pub fn start_with_toml(extra_toml: &str) -> (Mock, Gateway) {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::with_toml(extra_toml));
    (mock, gw)
}
