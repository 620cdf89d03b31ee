//! `[[providers]]`: upstream providers, their credentials, timeouts, health and TLS trust.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::base_url::parse_base_url;
use super::check::{Checker, ConfigError};
use super::cloud::StyleAccess;
use super::file::ProviderFile;
use crate::credential_mask::CredentialMask;
use crate::domain::{ProviderStyle, Wire};

/// One upstream provider, with its base URL already taken apart.
#[derive(Debug, Clone)]
pub struct Provider {
    pub name: String,
    pub style: ProviderStyle,
    pub tls: bool,
    pub host: String,
    /// `host` when it is an IP address, parsed once here: dialled without a name lookup.
    pub ip: Option<std::net::IpAddr>,
    pub port: u16,
    /// Path prefix of `base_url` without a trailing slash (often empty).
    pub base_path: String,
    /// `host` or `host:port` as sent in the `Host` header.
    pub host_header: String,
    /// The credential, read from the environment at load time; `None` sends no credential.
    pub api_key: Option<String>,
    pub api_key_env: Option<String>,
    /// The credential's encoded forms, made once per load, masked in the provider's error
    /// bodies before a client sees them.
    pub api_key_mask: CredentialMask,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub idle_timeout: Duration,
    /// Consecutive failures that eject one of its deployments.
    pub eject_after_failures: u32,
    /// A deployment's first ejection; repeated ejections double it up to `max_cooldown`.
    pub cooldown: Duration,
    /// The longest ejection, also the cap on the provider's `retry-after`.
    pub max_cooldown: Duration,
    /// Trust anchors from `ca_file`, loaded and checked at load time; `None`: the system's
    /// roots (which honour `SSL_CERT_FILE`).
    pub ca: Option<ProviderCa>,
    /// An OpenAI-style provider with its own `/v1/responses`; without it, Responses requests
    /// are translated to chat completions (`endpoints` in the config).
    pub serves_responses: bool,
    /// What the style needs beyond the base URL and the API key (cloud credentials, API
    /// versions, regions).
    pub access: StyleAccess,
}

impl Provider {
    /// True when the provider names a credential variable that was not set: its deployments
    /// are skipped (every request would be refused), and said so when nothing else is left.
    pub fn lacks_credential(&self) -> bool {
        match &self.access {
            StyleAccess::Bedrock { credentials, .. } => credentials.is_none(),
            _ => self.api_key_env.is_some() && self.api_key.is_none(),
        }
    }
}

/// The certificate authorities a provider's TLS certificate must chain to, and the file they
/// came from (it also keys the connection pool: a connection verified against one set of
/// anchors is never handed to a provider that trusts another).
#[derive(Debug, Clone)]
pub struct ProviderCa {
    pub file: String,
    pub certs: Arc<pingora_core::protocols::tls::CaType>,
}

/// Reads a PEM bundle of CA certificates; the error says what is wrong with the file.
fn load_ca_file(path: &str) -> Result<ProviderCa, String> {
    use pingora_core::utils::tls::WrappedX509;
    let text = std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}"))?;
    let mut certs = Vec::new();
    for item in rustls_pemfile::certs(&mut text.as_slice()) {
        let der = item.map_err(|e| format!("{path:?} is not a PEM certificate file: {e}"))?;
        // Parsed here so that a certificate the TLS layer cannot read fails the load, not a
        // request.
        x509_parser::parse_x509_certificate(&der)
            .map_err(|e| format!("{path:?} holds a certificate that cannot be parsed: {e}"))?;
        certs.push(WrappedX509::new(
            der.to_vec(),
            pingora_core::utils::tls::parse_x509,
        ));
    }
    if certs.is_empty() {
        return Err(format!("{path:?} holds no PEM certificate"));
    }
    Ok(ProviderCa {
        file: path.to_string(),
        certs: Arc::from(certs.into_boxed_slice()),
    })
}

pub(super) fn validate(
    c: &Checker,
    f: &[ProviderFile],
) -> Result<BTreeMap<String, Arc<Provider>>, ConfigError> {
    let mut providers = BTreeMap::new();
    for (i, p) in f.iter().enumerate() {
        let key = |k: &str| format!("providers[{i}].{k}");
        if p.name.is_empty() {
            return Err(c.err(key("name"), "must not be empty"));
        }
        if providers.contains_key(&p.name) {
            return Err(c.err(key("name"), format!("duplicate provider {:?}", p.name)));
        }
        let Some(style) = ProviderStyle::parse(&p.style) else {
            let names: Vec<&str> = ProviderStyle::ALL.iter().map(|s| s.as_str()).collect();
            return Err(c.err(
                key("style"),
                format!("must be one of {names:?}, got {:?}", p.style),
            ));
        };
        let access = super::cloud::validate(c, i, style, p)?;
        let (tls, host, port, base_path) =
            parse_base_url(&p.base_url).map_err(|e| c.err(key("base_url"), e))?;
        let default_port = if tls { 443 } else { 80 };
        // An IPv6 address is written in brackets in a `Host` header, with or without a port.
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let host_header = if port == default_port {
            bracketed
        } else {
            format!("{bracketed}:{port}")
        };
        let ca = match p.ca_file.as_deref().filter(|f| !f.is_empty()) {
            None => None,
            Some(_) if !tls => {
                return Err(c.err(key("ca_file"), "is only used with an https base_url"))
            }
            Some(file) => Some(load_ca_file(file).map_err(|e| c.err(key("ca_file"), e))?),
        };
        // Timeouts: at least a millisecond, at most a day (a typo of a few zeros is an
        // error, not a request that hangs for weeks).
        let millis = |k: &str, v: Option<u64>, default: u64| match v.unwrap_or(default) {
            ms @ 1..=86_400_000 => Ok(Duration::from_millis(ms)),
            _ => Err(c.err(key(k), "must be between 1 and 86400000 (one day)")),
        };
        let eject_after_failures = p.eject_after_failures.unwrap_or(3);
        if !(1..=100).contains(&eject_after_failures) {
            return Err(c.err(key("eject_after_failures"), "must be between 1 and 100"));
        }
        let cooldown = p.cooldown_seconds.unwrap_or(30);
        if !(1..=86_400).contains(&cooldown) {
            return Err(c.err(key("cooldown_seconds"), "must be between 1 and 86400"));
        }
        let max_cooldown = p.max_cooldown_seconds.unwrap_or(300.max(cooldown));
        if max_cooldown < cooldown || max_cooldown > 86_400 {
            return Err(c.err(
                key("max_cooldown_seconds"),
                format!("must be between cooldown_seconds ({cooldown}) and 86400"),
            ));
        }
        let serves_responses = provider_endpoints(style, p.endpoints.as_deref())
            .map_err(|e| c.err(key("endpoints"), e))?;
        let api_key_env = p.api_key_env.clone().filter(|s| !s.is_empty());
        let api_key = api_key_env
            .as_deref()
            .and_then(|v| std::env::var(v).ok())
            .filter(|v| !v.is_empty())
            .inspect(|key| crate::logging::never_print(key));
        // Bedrock sends the session token (never the secret key): that is what an answer
        // could quote back.
        let mask_secret = match &access {
            StyleAccess::Bedrock {
                credentials: Some(c),
                ..
            } => c.session_token.as_deref(),
            _ => api_key.as_deref(),
        };
        providers.insert(
            p.name.clone(),
            Arc::new(Provider {
                name: p.name.clone(),
                style,
                tls,
                ip: host.parse().ok(),
                host,
                port,
                base_path,
                host_header,
                api_key_mask: CredentialMask::new(mask_secret),
                api_key,
                api_key_env,
                connect_timeout: millis("connect_timeout_ms", p.connect_timeout_ms, 5_000)?,
                first_byte_timeout: millis(
                    "first_byte_timeout_ms",
                    p.first_byte_timeout_ms,
                    120_000,
                )?,
                idle_timeout: millis("idle_timeout_ms", p.idle_timeout_ms, 120_000)?,
                eject_after_failures,
                cooldown: Duration::from_secs(cooldown),
                max_cooldown: Duration::from_secs(max_cooldown),
                ca,
                serves_responses,
                access,
            }),
        );
    }
    Ok(providers)
}

/// Checks a provider's `endpoints` and says whether it serves `/v1/responses` itself. An
/// OpenAI-style provider must serve chat completions (every translation to it goes there) and
/// may serve responses; an Anthropic-style one serves messages.
fn provider_endpoints(style: ProviderStyle, endpoints: Option<&[String]>) -> Result<bool, String> {
    let Some(list) = endpoints else {
        return Ok(style == ProviderStyle::OpenAi);
    };
    let allowed: &[&str] = match style.wire() {
        Wire::OpenAi => &["chat", "responses"],
        Wire::Anthropic => &["messages"],
        Wire::Gemini => {
            return Err(
                "is not used by a \"gemini\" provider: every endpoint is served by translation"
                    .into(),
            )
        }
    };
    for (n, e) in list.iter().enumerate() {
        if !allowed.contains(&e.as_str()) {
            return Err(format!(
                "{e:?} is not an endpoint of a {} provider (one of {allowed:?})",
                style.as_str()
            ));
        }
        if list.iter().take(n).any(|x| x == e) {
            return Err(format!("{e:?} is listed twice"));
        }
    }
    let required = allowed.first().copied().unwrap_or("chat");
    if !list.iter().any(|e| e == required) {
        return Err(format!(
            "must include {required:?}: every request to a {} provider is sent there",
            style.as_str()
        ));
    }
    Ok(list.iter().any(|e| e == "responses"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::Config;

    #[test]
    fn provider_endpoints_are_checked_against_the_style() {
        let provider = |style: &str, endpoints: &str| {
            Config::from_str(
                Path::new("test.toml"),
                &format!(
                    "[[providers]]\nname=\"a\"\nstyle=\"{style}\"\nbase_url=\"http://127.0.0.1:1\"\n{endpoints}\n"
                ),
            )
        };
        let serves = |style: &str, endpoints: &str| {
            provider(style, endpoints).unwrap().providers["a"].serves_responses
        };
        assert!(serves("openai", ""));
        assert!(serves("openai", "endpoints = [\"chat\", \"responses\"]"));
        assert!(!serves("openai", "endpoints = [\"chat\"]"));
        assert!(!serves("anthropic", ""));
        assert!(!serves("anthropic", "endpoints = [\"messages\"]"));
        for (style, bad) in [
            ("openai", "[\"responses\"]"),
            ("openai", "[]"),
            ("openai", "[\"chat\", \"chat\"]"),
            ("openai", "[\"chat\", \"messages\"]"),
            ("anthropic", "[\"messages\", \"chat\"]"),
            ("openai", "[\"Chat\"]"),
        ] {
            let e = provider(style, &format!("endpoints = {bad}")).unwrap_err();
            assert_eq!(e.key, "providers[0].endpoints", "{style} {bad}");
        }
    }

    /// A provider's `Host` header and address as taken from its base URL: an IPv6 address
    /// in brackets whether or not the port is the scheme's; an IP literal parsed once, a name
    /// left to be looked up.
    #[test]
    fn host_header_and_literal_address() {
        let load = |url: &str| {
            let c = Config::from_str(
                Path::new("test.toml"),
                &format!("[[providers]]\nname=\"a\"\nstyle=\"openai\"\nbase_url=\"{url}\"\n"),
            )
            .unwrap();
            let p = &c.providers["a"];
            (p.host_header.clone(), p.ip.map(|ip| ip.to_string()))
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(load("http://[::1]"), ("[::1]".into(), some("::1")));
        assert_eq!(
            load("http://[::1]:8080"),
            ("[::1]:8080".into(), some("::1"))
        );
        assert_eq!(
            load("https://10.0.0.1:443"),
            ("10.0.0.1".into(), some("10.0.0.1"))
        );
        assert_eq!(
            load("https://api.openai.com"),
            ("api.openai.com".into(), None)
        );
        assert_eq!(
            load("http://llm.internal:8000/v1"),
            ("llm.internal:8000".into(), None)
        );
    }

    #[test]
    fn cloud_styles_check_their_own_keys() {
        use super::super::cloud::StyleAccess;
        let load = |style: &str, keys: &str| {
            Config::from_str(
                Path::new("test.toml"),
                &format!(
                    "[[providers]]\nname=\"a\"\nstyle=\"{style}\"\nbase_url=\"http://127.0.0.1:1\"\n{keys}\n"
                ),
            )
        };
        let access =
            |style: &str, keys: &str| load(style, keys).unwrap().providers["a"].access.clone();
        assert!(matches!(
            access("azure", "api_version = \"2024-10-21\""),
            StyleAccess::Azure { api_version } if api_version == "2024-10-21"
        ));
        assert!(access("azure", "api_version = \"v1\"").azure_v1());
        assert!(matches!(
            access("gemini", ""),
            StyleAccess::Gemini { api_version } if api_version == "v1beta"
        ));
        assert!(matches!(
            access("bedrock", "region = \"us-east-1\""),
            StyleAccess::Bedrock { region, .. } if region == "us-east-1"
        ));
        for (style, keys, key) in [
            ("azure", "", "api_version"),
            ("azure", "api_version = \"yesterday\"", "api_version"),
            ("gemini", "api_version = \"v2\"", "api_version"),
            ("gemini", "endpoints = [\"chat\"]", "endpoints"),
            ("bedrock", "", "region"),
            ("bedrock", "region = \"us east\"", "region"),
            (
                "bedrock",
                "region = \"us-east-1\"\napi_key_env = \"K\"",
                "api_key_env",
            ),
            (
                "vertex-anthropic",
                "region = \"us-east5\"",
                "credentials_file",
            ),
            (
                "vertex-anthropic",
                "region = \"us-east5\"\ncredentials_file = \"/nonexistent/sa.json\"",
                "credentials_file",
            ),
            ("openai", "region = \"us-east-1\"", "region"),
            ("anthropic", "token_url = \"http://x\"", "token_url"),
            (
                "bedrock",
                "region = \"us-east-1\"\nproject = \"p\"",
                "project",
            ),
            ("palm", "", "style"),
        ] {
            let e = load(style, keys).unwrap_err();
            assert_eq!(e.key, format!("providers[0].{key}"), "{style} {keys}: {e}");
        }
    }
}
