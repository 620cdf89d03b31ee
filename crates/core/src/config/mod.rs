//! Validated configuration.
//!
//! `file.rs` mirrors the TOML on disk; this module turns it into a [`Config`] whose every value
//! has been checked once, so the request path never re-validates. Each section has a module of
//! its own holding its validated type and its checks; this one reads the text and calls them in
//! file order. Errors name the file, the key and the problem
//! (`conf/gateway.toml: providers[0].style: ...`).

mod auth;
mod base_url;
mod check;
mod cloud;
mod content;
pub mod file;
mod keys;
mod limits;
mod mail;
mod models;
mod payment;
mod providers;
mod quota;
pub mod reload;
mod routing;
mod secrets;
mod server;
mod storage;
mod telemetry;
mod tools;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use auth::AuthConfig;
use check::Checker;
pub use check::ConfigError;
pub use cloud::{AwsCredentials, ServiceAccount, StyleAccess, VertexAccess, GOOGLE_TOKEN_URL};
pub use content::ContentConfig;
use file::FileConfig;
pub use keys::KeysConfig;
pub use limits::LimitsConfig;
pub use mail::{MailConfig, MailTransport};
pub use models::{Deployment, Model};
pub use payment::{catalogue_package, Package, PaymentConfig, CATALOGUE};
pub use providers::{Provider, ProviderCa};
pub use quota::{QuotaConfig, TierLimits};
pub use routing::RoutingConfig;
pub use secrets::SecretsConfig;
pub use server::{EdgeLimits, ServerConfig};
pub use storage::{RedisOutage, StorageConfig};
pub use telemetry::{OtlpProtocol, TelemetryConfig};
pub use tools::ToolsConfig;

/// The whole validated configuration. Built once per load; shared read-only behind an
/// `ArcSwap` so a reload is one atomic pointer swap.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub secrets: SecretsConfig,
    pub mail: MailConfig,
    pub auth: AuthConfig,
    pub keys: KeysConfig,
    pub quota: QuotaConfig,
    pub providers: BTreeMap<String, Arc<Provider>>,
    /// In file order, for `GET /v1/models`.
    pub models: Vec<Arc<Model>>,
    pub models_by_id: BTreeMap<String, Arc<Model>>,
    pub routing: RoutingConfig,
    pub tools: ToolsConfig,
    pub payment: PaymentConfig,
    pub limits: LimitsConfig,
    pub content: ContentConfig,
    pub telemetry: TelemetryConfig,
    /// The top-level tables the file writes out (`server`, `providers`, `payment`, …); empty
    /// for a partial config read by [`Config::from_str`]. A reload that would lose one of them
    /// is refused (`reload`): a file cut short at a section boundary is valid TOML.
    pub sections: BTreeSet<String>,
}

impl Config {
    /// Reads and validates the file at `path` (see [`Config::from_file_text`]).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Config::from_file_text(path, &text)
    }

    /// Validates the whole text of the config file at `path`: its settings, and that it is a
    /// complete config. A file that is empty, or that names no provider or no model, or lacks
    /// `[server]` or `[storage]`, is refused: such a file is almost always one caught while
    /// being written (an editor's truncate-then-write) or cut short, and taking it live would
    /// make every model disappear.
    pub fn from_file_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let c = Checker {
            file: path.display().to_string(),
        };
        if text.trim().is_empty() {
            return Err(c.err(
                "",
                "the file is empty; a config needs [server], [storage], [[providers]] and \
                 [[models]]",
            ));
        }
        let mut config = Config::from_str(path, text)?;
        // Parsed once more as a bare table only to see which sections are written out: the
        // typed structs fill absent sections with defaults.
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| c.err("", e.message().trim().to_string()))?;
        for section in ["server", "storage"] {
            if !table.contains_key(section) {
                return Err(c.err(
                    section,
                    format!("missing: a config needs a [{section}] section"),
                ));
            }
        }
        if config.providers.is_empty() {
            return Err(c.err(
                "providers",
                "missing: a config needs at least one [[providers]]",
            ));
        }
        if config.models.is_empty() {
            return Err(c.err("models", "missing: a config needs at least one [[models]]"));
        }
        config.sections = table.keys().cloned().collect();
        Ok(config)
    }

    /// Validates the settings in TOML text as if it were the file at `path`; unlike
    /// [`Config::from_file_text`] it accepts a partial config (defaults fill the rest).
    pub fn from_str(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let c = Checker {
            file: path.display().to_string(),
        };
        let line_of = |e: &toml::de::Error| {
            e.span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default()
        };
        let de = toml::Deserializer::parse(text)
            .map_err(|e| c.err("", format!("{}{}", e.message().trim(), line_of(&e))))?;
        // serde_path_to_error names the key that failed, e.g. `server.api_listen`.
        let parsed: FileConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let key = if key == "." { String::new() } else { key };
            c.err(
                key,
                format!("{}{}", inner.message().trim(), line_of(&inner)),
            )
        })?;
        Config::validate(&c, path, parsed)
    }

    fn validate(c: &Checker, path: &Path, f: FileConfig) -> Result<Config, ConfigError> {
        let secrets_dir = f.secrets.dir.clone().unwrap_or_else(|| "data".into());
        let server = server::validate(c, f.server, &secrets_dir)?;
        let secrets = secrets::validate(f.secrets);
        let storage = storage::validate(c, f.storage, &secrets.dir)?;
        let mail = mail::validate(c, f.mail)?;
        let auth = auth::validate(f.auth);
        let keys = keys::validate(f.keys);
        let quota = quota::validate(c, f.quota)?;
        let providers = providers::validate(c, &f.providers)?;
        let models = models::validate(c, &f.models, &providers)?;
        let routing = routing::validate(c, f.routing)?;
        let tools = tools::validate(c, f.tools, &providers)?;
        let payment = payment::validate(c, f.payment)?;
        let limits = limits::validate(f.limits);
        let content = content::validate(f.content);
        let telemetry = telemetry::validate(c, f.telemetry)?;

        Ok(Config {
            path: path.to_path_buf(),
            server,
            storage,
            secrets,
            mail,
            auth,
            keys,
            quota,
            providers,
            models: models.in_order,
            models_by_id: models.by_id,
            routing,
            tools,
            payment,
            limits,
            content,
            telemetry,
            sections: BTreeSet::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::Tier;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(Path::new("test.toml"), text)
    }

    #[test]
    fn redis_cluster_nodes_exclude_redis_url() {
        let c = load(
            "[storage]\nredis_cluster_nodes = [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]\n",
        )
        .expect("cluster");
        assert_eq!(
            c.storage.redis_target(),
            Some(crate::quota::redis_conn::RedisTarget::Cluster(vec![
                "redis://10.0.0.1:7000".into(),
                "redis://10.0.0.2:7000".into()
            ]))
        );
        let both = load(
            "[storage]\nredis_url = \"redis://127.0.0.1:6379\"\nredis_cluster_nodes = [\"redis://10.0.0.1:7000\"]\n",
        )
        .unwrap_err();
        assert_eq!(both.key, "storage.redis_cluster_nodes");
        assert!(both.message.contains("not both"), "{both}");
        let bad = load("[storage]\nredis_cluster_nodes = [\"10.0.0.1:7000\"]\n").unwrap_err();
        assert_eq!(bad.key, "storage.redis_cluster_nodes");
        assert_eq!(load("").expect("defaults").storage.redis_target(), None);
    }

    #[test]
    fn empty_file_gets_defaults() {
        let c = load("").expect("defaults");
        assert_eq!(c.server.api_listen, "127.0.0.1:8080");
        assert_eq!(c.quota.default_tier, Tier::Beginner);
        assert!(c.models.is_empty());
    }

    #[test]
    fn a_file_must_be_a_complete_config() {
        let file = |text: &str| Config::from_file_text(Path::new("gw.toml"), text);
        let complete = "[server]\n[storage]\n[[providers]]\nname = \"p\"\nstyle = \"openai\"\n\
                        base_url = \"http://127.0.0.1:1\"\n[[models]]\nid = \"m\"\nprovider = \"p\"\n";
        assert!(file(complete).is_ok());
        let e = file(" \n\n").unwrap_err();
        assert_eq!(e.to_string().split(':').next(), Some("gw.toml"));
        assert!(e.message.contains("empty"), "{e}");
        let no_models = &complete[..complete.find("[[models]]").unwrap()];
        assert_eq!(file(no_models).unwrap_err().key, "models");
        let no_providers = complete.replace("[[providers]]", "[[nothing]]");
        assert!(file(&no_providers).is_err());
        let no_storage = complete.replace("[storage]\n", "");
        assert_eq!(file(&no_storage).unwrap_err().key, "storage");
        let cut = &complete[..complete.find("openai").unwrap()];
        assert!(file(cut).is_err(), "a value cut mid-string does not parse");
    }

    /// The default origin is the site's listen address, less an IPv6 zone id a URL cannot
    /// carry; one written in `site_origin` is refused there.
    #[test]
    fn default_site_origin_leaves_a_zone_id_out() {
        let c = load("[server]\nsite_listen = \"[fe80::1%2]:18081\"\n").expect("scoped listen");
        assert_eq!(c.server.site_origin, "http://[fe80::1]:18081");
        let e = load("[server]\nsite_origin = \"http://[fe80::1%2]:18081\"\n").unwrap_err();
        assert_eq!(e.key, "server.site_origin");
    }

    #[test]
    fn unknown_key_is_named() {
        let e = load("[server]\napi_lisen = \"x\"\n").unwrap_err();
        assert_eq!(e.file, "test.toml");
        assert!(e.message.contains("api_lisen"), "{e}");
    }

    #[test]
    fn bad_style_names_the_key() {
        let e = load("[[providers]]\nname=\"a\"\nstyle=\"x\"\nbase_url=\"http://127.0.0.1:1\"\n")
            .unwrap_err();
        assert_eq!(e.key, "providers[0].style");
    }

    #[test]
    fn outage_settings_default_and_are_validated() {
        let c = load("").unwrap();
        assert_eq!(c.storage.redis_timeout, Duration::from_millis(50));
        assert_eq!(c.storage.redis_outage, RedisOutage::Local);
        assert_eq!(c.storage.database_timeout, Duration::from_millis(2000));
        let c = load(
            "[storage]\nredis_timeout_ms = 20\nredis_outage = \"refuse\"\ndatabase_timeout_ms = 500\n",
        )
        .unwrap();
        assert_eq!(c.storage.redis_timeout, Duration::from_millis(20));
        assert_eq!(c.storage.redis_outage, RedisOutage::Refuse);
        assert_eq!(c.storage.database_timeout, Duration::from_millis(500));
        for (text, key) in [
            ("redis_timeout_ms = 0", "storage.redis_timeout_ms"),
            ("redis_outage = \"ignore\"", "storage.redis_outage"),
            ("database_timeout_ms = 5", "storage.database_timeout_ms"),
        ] {
            let e = load(&format!("[storage]\n{text}\n")).unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
    }

    #[test]
    fn model_needs_known_provider() {
        let e = load("[[models]]\nid=\"m\"\nprovider=\"nope\"\n").unwrap_err();
        assert_eq!(e.key, "models[0].provider");
    }

    fn provider_with(extra: &str) -> Result<Config, ConfigError> {
        load(&format!(
            "[[providers]]\nname=\"a\"\nstyle=\"openai\"\nbase_url=\"http://127.0.0.1:1\"\n{extra}\n"
        ))
    }

    #[test]
    fn health_and_timeout_settings_have_defaults() {
        let c = provider_with("").expect("defaults");
        let p = &c.providers["a"];
        assert_eq!(p.eject_after_failures, 3);
        assert_eq!(p.cooldown, Duration::from_secs(30));
        assert_eq!(p.max_cooldown, Duration::from_secs(300));
        assert_eq!(p.connect_timeout, Duration::from_secs(5));
        assert_eq!(p.first_byte_timeout, Duration::from_secs(120));
        assert_eq!(p.idle_timeout, Duration::from_secs(120));
        assert_eq!(c.routing.max_attempts, 3);
        assert_eq!(c.routing.failover_deadline, Duration::from_secs(30));
        // A long base ejection raises the default cap with it.
        let c = provider_with("cooldown_seconds = 600").expect("long cooldown");
        assert_eq!(c.providers["a"].max_cooldown, Duration::from_secs(600));
    }

    #[test]
    fn health_and_timeout_settings_are_validated_by_key() {
        for (extra, key) in [
            (
                "eject_after_failures = 0",
                "providers[0].eject_after_failures",
            ),
            (
                "eject_after_failures = 101",
                "providers[0].eject_after_failures",
            ),
            ("cooldown_seconds = 0", "providers[0].cooldown_seconds"),
            (
                "cooldown_seconds = 60\nmax_cooldown_seconds = 30",
                "providers[0].max_cooldown_seconds",
            ),
            ("connect_timeout_ms = 0", "providers[0].connect_timeout_ms"),
            (
                "first_byte_timeout_ms = 0",
                "providers[0].first_byte_timeout_ms",
            ),
            ("idle_timeout_ms = 86400001", "providers[0].idle_timeout_ms"),
        ] {
            let e = provider_with(extra).unwrap_err();
            assert_eq!(e.key, key, "{extra}: {e}");
        }
        let e = load("[routing]\nmax_attempts = 0\n").unwrap_err();
        assert_eq!(e.key, "routing.max_attempts");
        let e = load("[routing]\nfailover_deadline_ms = 0\n").unwrap_err();
        assert_eq!(e.key, "routing.failover_deadline_ms");
        let e = load("[routing]\nmax_atempts = 2\n").unwrap_err();
        assert!(e.message.contains("max_atempts"), "{e}");
    }
}
