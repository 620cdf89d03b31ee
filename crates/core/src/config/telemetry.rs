//! `[telemetry]`: where the gateway's OpenTelemetry spans go and how many are kept.

use super::check::{Checker, ConfigError};
use super::file::TelemetryFile;

/// The wire format spans are exported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    HttpProtobuf,
    HttpJson,
    Grpc,
}

/// `[telemetry]`, validated. `endpoint: None` is telemetry off: no tracer is built and the
/// request path does nothing for it.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Where spans are sent, or `None`: off. Over HTTP the collector's traces URL
    /// (`{otlp_endpoint}/v1/traces`); over gRPC the base URL itself (the service path is gRPC's).
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    /// Root sampling ratio (0.0..=1.0); the only telemetry setting a reload changes.
    pub sample_ratio: f64,
    pub service_name: String,
    /// The environment variable the collector's headers are read from.
    pub headers_env: String,
    /// Spans carry prompt and answer sizes (bytes).
    pub capture_sizes: bool,
}

impl TelemetryConfig {
    /// The same settings with another sample ratio: what a reload may change.
    pub fn with_ratio(&self, sample_ratio: f64) -> TelemetryConfig {
        TelemetryConfig {
            sample_ratio,
            ..self.clone()
        }
    }
}

pub(super) fn validate(c: &Checker, f: TelemetryFile) -> Result<TelemetryConfig, ConfigError> {
    let protocol = match f.protocol.as_deref().unwrap_or("http/protobuf") {
        "http/protobuf" => OtlpProtocol::HttpProtobuf,
        "http/json" => OtlpProtocol::HttpJson,
        "grpc" => OtlpProtocol::Grpc,
        other => {
            return Err(c.err(
                "telemetry.protocol",
                format!(
                    "unknown protocol {other:?}; use \"http/protobuf\", \"http/json\" or \"grpc\""
                ),
            ))
        }
    };
    let endpoint = match f.otlp_endpoint.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(url) => {
            let base = url.trim_end_matches('/');
            let host = base
                .strip_prefix("http://")
                .or_else(|| base.strip_prefix("https://"));
            if !host.is_some_and(|h| !h.is_empty() && !h.contains(char::is_whitespace)) {
                return Err(c.err(
                    "telemetry.otlp_endpoint",
                    "must be an http:// or https:// URL, e.g. \"http://127.0.0.1:4318\"",
                ));
            }
            Some(match protocol {
                OtlpProtocol::Grpc => base.to_string(),
                OtlpProtocol::HttpProtobuf | OtlpProtocol::HttpJson => format!("{base}/v1/traces"),
            })
        }
    };
    let sample_ratio = f.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(c.err("telemetry.sample_ratio", "must be between 0.0 and 1.0"));
    }
    let service_name = f.service_name.unwrap_or_else(|| "llm-gateway".into());
    if service_name.trim().is_empty() {
        return Err(c.err("telemetry.service_name", "must not be empty"));
    }
    let headers_env = f
        .headers_env
        .unwrap_or_else(|| "GATEWAY_OTLP_HEADERS".into());
    if headers_env.is_empty()
        || !headers_env
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(c.err(
            "telemetry.headers_env",
            "must name an environment variable (letters, digits, _)",
        ));
    }
    Ok(TelemetryConfig {
        endpoint,
        protocol,
        sample_ratio,
        service_name,
        headers_env,
        capture_sizes: f.capture_sizes.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(Path::new("t.toml"), &format!("[telemetry]\n{text}\n"))
    }

    #[test]
    fn off_by_default_and_validated_by_key() {
        let off = Config::from_str(Path::new("t.toml"), "").expect("defaults");
        assert_eq!(off.telemetry.endpoint, None);
        assert_eq!(
            load("otlp_endpoint = \"\"").unwrap().telemetry.endpoint,
            None
        );
        let on = load("otlp_endpoint = \"http://127.0.0.1:4318/\"\nsample_ratio = 0.25").unwrap();
        assert_eq!(
            on.telemetry.endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(on.telemetry.sample_ratio, 0.25);
        assert_eq!(on.telemetry.service_name, "llm-gateway");
        assert_eq!(on.telemetry.headers_env, "GATEWAY_OTLP_HEADERS");
        assert!(!on.telemetry.capture_sizes);
        for (text, key) in [
            (
                "otlp_endpoint = \"127.0.0.1:4318\"",
                "telemetry.otlp_endpoint",
            ),
            ("protocol = \"thrift\"", "telemetry.protocol"),
            ("sample_ratio = 1.5", "telemetry.sample_ratio"),
            ("service_name = \" \"", "telemetry.service_name"),
            ("headers_env = \"A-B\"", "telemetry.headers_env"),
        ] {
            let e = load(text).unwrap_err();
            assert_eq!(e.key, key, "{text}: {e}");
        }
        assert!(load("protocol = \"thrift\"")
            .unwrap_err()
            .message
            .contains("grpc"));
        let grpc = load("otlp_endpoint = \"http://127.0.0.1:4317/\"\nprotocol = \"grpc\"").unwrap();
        assert_eq!(grpc.telemetry.protocol, OtlpProtocol::Grpc);
        assert_eq!(
            grpc.telemetry.endpoint.as_deref(),
            Some("http://127.0.0.1:4317")
        );
        assert!(load("headers = \"x\"")
            .unwrap_err()
            .message
            .contains("headers"));
    }
}
