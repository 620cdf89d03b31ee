//! Validated configuration.
//!
//! `file.rs` mirrors the TOML on disk; this module turns it into a [`Config`] whose every value
//! has been checked once, so the request path never re-validates. Errors name the file, the key
//! and the problem (`conf/gateway.toml: providers[0].style: ...`).

pub mod file;
pub mod reload;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::domain::{ProviderStyle, Tier};
use file::FileConfig;

/// A configuration problem: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub api_listen: String,
    pub site_listen: String,
    /// Public origin of the site without a trailing slash, e.g. `https://gw.example.com`.
    pub site_origin: String,
    /// True when `site_origin` is https: cookies get `Secure` and the `__Host-` prefix.
    pub site_secure: bool,
    pub admin_listen: Option<String>,
    pub max_body_bytes: u64,
    pub threads: usize,
    pub shutdown_drain: Duration,
    pub access_log: bool,
    pub upgrade_sock: PathBuf,
    pub pid_file: PathBuf,
    pub limits: EdgeLimits,
}

/// `[server.limits]`: bounds on what a client can hold of either listener. Read at start
/// (like the listen addresses): a change needs a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeLimits {
    /// The whole request head (request line and headers) must arrive within this time of the
    /// connection's start or of its first byte after an idle keep-alive; not reset by each byte.
    pub header_timeout: Duration,
    /// A kept-alive connection with no request started is closed after this long.
    pub idle_timeout: Duration,
    /// A request body may pause this long at most, and gets this long before its average
    /// rate has to reach `body_min_rate`.
    pub body_timeout: Duration,
    /// Bytes per second a request body has to average after `body_timeout`.
    pub body_min_rate: u64,
    /// Largest request head (request line and headers) in bytes; larger ones get 431.
    pub max_header_bytes: usize,
    /// Open client connections over both listeners together.
    pub max_connections: usize,
    /// Open client connections from one address over both listeners together.
    pub max_connections_per_address: usize,
    /// Request-body bytes the developer API holds at once over all requests; a request
    /// beyond it gets 503 `server_busy`.
    pub max_body_bytes_in_flight: u64,
}

#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub database_url: String,
    pub redis_url: Option<String>,
    pub usage_batch_size: usize,
    pub usage_flush: Duration,
    /// Deadline of one Redis call, including the wait for a connection.
    pub redis_timeout: Duration,
    pub redis_outage: RedisOutage,
    /// Deadline of database work a request waits for (key and balance loads) and of a pool
    /// acquire anywhere.
    pub database_timeout: Duration,
    /// Segment path prefix of the usage journal; `None`: off.
    pub usage_journal: Option<PathBuf>,
}

/// What the developer API does while Redis is unreachable (the circuit breaker is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisOutage {
    /// Serve with in-process limits and quota, loaded from the database; reconciled into Redis
    /// when it is back. Overspend is bounded (README, "Redis outages").
    Local,
    /// Answer 503 `quota_unavailable` until Redis is back.
    Refuse,
}

#[derive(Debug, Clone)]
pub struct SecretsConfig {
    pub dev_generate: bool,
    pub dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailTransport {
    Smtp { url: String },
    File { dir: PathBuf },
    Log,
}

#[derive(Debug, Clone)]
pub struct MailConfig {
    /// `None`: no transport configured, sign-in answers `email_not_configured`.
    pub transport: Option<MailTransport>,
    pub from: String,
}

#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub private_beta: bool,
    /// Lowercased emails and `@domain` entries.
    pub beta_allowlist: Vec<String>,
    /// Lowercased domains without `@`.
    pub blocked_domains: Vec<String>,
    pub captcha_required: bool,
    pub captcha_verify_url: String,
    pub captcha_site_key: String,
    pub code_ttl: Duration,
    pub link_ttl: Duration,
    pub session_ttl: Duration,
    pub session_idle: Duration,
}

#[derive(Debug, Clone)]
pub struct KeysConfig {
    pub max_active_per_account: u32,
    pub rotations_per_hour: u32,
}

/// Allowances and default per-minute limits of one tier. `0` means "no cap" for the weekly
/// request allowance and for per-minute limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierLimits {
    pub weekly_tokens: u64,
    pub weekly_requests: u64,
    pub requests_per_minute: u64,
    pub input_tokens_per_minute: u64,
    pub output_tokens_per_minute: u64,
}

#[derive(Debug, Clone)]
pub struct QuotaConfig {
    pub default_tier: Tier,
    /// Indexed by `Tier::index()`.
    pub tiers: [TierLimits; 4],
    /// Rolling-week token usage at which each tier is reached, ascending.
    pub usage_thresholds: Vec<(Tier, u64)>,
    pub reservation_timeout: Duration,
}

impl QuotaConfig {
    pub fn limits(&self, tier: Tier) -> &TierLimits {
        &self.tiers[tier.index()]
    }
}

/// One upstream provider, with its base URL already taken apart.
#[derive(Debug, Clone)]
pub struct Provider {
    pub name: String,
    pub style: ProviderStyle,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix of `base_url` without a trailing slash (often empty).
    pub base_path: String,
    /// `host` or `host:port` as sent in the `Host` header.
    pub host_header: String,
    /// The credential, read from the environment at load time; `None` sends no credential.
    pub api_key: Option<String>,
    pub api_key_env: Option<String>,
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
}

impl Provider {
    /// True when the provider names a credential variable that was not set: its deployments
    /// are skipped (every request would be refused), and said so when nothing else is left.
    pub fn lacks_credential(&self) -> bool {
        self.api_key_env.is_some() && self.api_key.is_none()
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

#[derive(Debug, Clone)]
pub struct Deployment {
    pub provider: Arc<Provider>,
    pub upstream_model: Arc<str>,
    pub weight: u32,
    /// `provider/upstream_model`: names the deployment in cool-downs, logs and usage events;
    /// built once here instead of on every request.
    pub label: Arc<str>,
}

impl Deployment {
    fn new(provider: Arc<Provider>, upstream_model: String, weight: u32) -> Self {
        let label = Arc::from(format!("{}/{}", provider.name, upstream_model));
        Deployment {
            provider,
            upstream_model: Arc::from(upstream_model),
            weight,
            label,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Model {
    pub id: String,
    pub deployments: Vec<Deployment>,
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub default_output_tokens: u64,
    /// What its tokens cost in quota.
    pub weights: crate::pricing::Weights,
    /// What its tokens cost the operator (`[models.price]`), when given.
    pub price: Option<crate::pricing::Price>,
}

impl Model {
    /// The style of the model's first deployment: what the model "is" for clients.
    pub fn style(&self) -> ProviderStyle {
        self.deployments
            .first()
            .map(|d| d.provider.style)
            .unwrap_or(ProviderStyle::OpenAi)
    }
}

/// `[routing]`: the bound on one request's failover.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    /// Deployments tried per request, the first included.
    pub max_attempts: usize,
    /// No further deployment is tried once this long has passed since the first attempt began.
    pub failover_deadline: Duration,
}

#[derive(Debug, Clone, Default)]
pub struct ToolsConfig {
    pub search: Option<Arc<Provider>>,
    pub web_fetch: Option<Arc<Provider>>,
}

#[derive(Debug, Clone)]
pub struct PaymentConfig {
    pub webhook_provider: String,
    pub code_prefix: String,
    pub max_pending_orders: u32,
    pub order_ttl: Duration,
    pub lot_days: u64,
    pub token_price_vnd_per_million: Option<u64>,
    pub request_price_vnd_per_thousand: Option<u64>,
    pub bank_bin: String,
    pub account_number: String,
    pub account_name: String,
    pub orders_per_hour: u32,
}

#[derive(Debug, Clone)]
pub struct LimitsConfig {
    pub request_code_per_hour: u32,
}

#[derive(Debug, Clone)]
pub struct ContentConfig {
    pub tos_path: Option<PathBuf>,
}

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
}

/// Collects errors with the file name so every message has the same shape.
struct Checker {
    file: String,
}

/// Validates `[server.limits]` against safe defaults.
fn edge_limits(
    c: &Checker,
    f: &file::EdgeLimitsFile,
    max_body_bytes: u64,
) -> Result<EdgeLimits, ConfigError> {
    let within = |key: &str, v: Option<u64>, default: u64, min: u64, max: u64| {
        let v = v.unwrap_or(default);
        if v < min || v > max {
            return Err(c.err(
                format!("server.limits.{key}"),
                format!("must be between {min} and {max}"),
            ));
        }
        Ok(v)
    };
    let secs = |key: &str, v: Option<u64>, default: u64| {
        within(key, v, default, 1, 3600).map(Duration::from_secs)
    };
    let limits = EdgeLimits {
        header_timeout: secs("header_timeout_seconds", f.header_timeout_seconds, 10)?,
        idle_timeout: secs("idle_timeout_seconds", f.idle_timeout_seconds, 60)?,
        body_timeout: secs("body_timeout_seconds", f.body_timeout_seconds, 30)?,
        body_min_rate: within(
            "body_min_rate_bytes",
            f.body_min_rate_bytes,
            16 * 1024,
            1,
            1 << 30,
        )?,
        max_header_bytes: within(
            "max_header_bytes",
            f.max_header_bytes,
            32 * 1024,
            1024,
            1024 * 1024,
        )? as usize,
        max_connections: within("max_connections", f.max_connections, 10_000, 1, 1_000_000)?
            as usize,
        max_connections_per_address: within(
            "max_connections_per_address",
            f.max_connections_per_address,
            256,
            1,
            1_000_000,
        )? as usize,
        max_body_bytes_in_flight: within(
            "max_body_bytes_in_flight",
            f.max_body_bytes_in_flight,
            (512 * 1024 * 1024).max(max_body_bytes),
            max_body_bytes,
            u64::MAX,
        )?,
    };
    if limits.max_connections_per_address > limits.max_connections {
        return Err(c.err(
            "server.limits.max_connections_per_address",
            "must not exceed server.limits.max_connections",
        ));
    }
    Ok(limits)
}

impl Checker {
    fn err(&self, key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Splits `http(s)://host[:port][/path]` into its parts.
fn parse_base_url(url: &str) -> Result<(bool, String, u16, String), String> {
    let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(format!("must start with http:// or https://, got {url:?}"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("needs a host (and no credentials), got {url:?}"));
    }
    let (host, port) = if let Some(stripped) = authority.strip_prefix('[') {
        let end = stripped
            .find(']')
            .ok_or_else(|| format!("bad IPv6 host in {url:?}"))?;
        let host = &stripped[..end];
        let after = &stripped[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| format!("bad port in {url:?}"))?,
            None if after.is_empty() => {
                if tls {
                    443
                } else {
                    80
                }
            }
            None => return Err(format!("bad host in {url:?}")),
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse().map_err(|_| format!("bad port in {url:?}"))?,
            ),
            None => (authority.to_string(), if tls { 443 } else { 80 }),
        }
    };
    if host.is_empty() || url.contains('?') || url.contains('#') {
        return Err(format!("must be a plain base URL, got {url:?}"));
    }
    Ok((tls, host, port, path.trim_end_matches('/').to_string()))
}

fn check_listen(c: &Checker, key: &str, value: &str) -> Result<(), ConfigError> {
    value
        .parse::<std::net::SocketAddr>()
        .map(|_| ())
        .map_err(|_| {
            c.err(
                key,
                format!("must be an address like 127.0.0.1:8080, got {value:?}"),
            )
        })
}

fn parse_tier(c: &Checker, key: &str, value: &str) -> Result<Tier, ConfigError> {
    Tier::parse(value).ok_or_else(|| {
        c.err(
            key,
            format!("unknown tier {value:?} (beginner, steady, persistent, tryharder)"),
        )
    })
}

fn default_tier_limits(tier: Tier) -> TierLimits {
    match tier {
        Tier::Beginner => TierLimits {
            weekly_tokens: 1_000_000,
            weekly_requests: 0,
            requests_per_minute: 60,
            input_tokens_per_minute: 200_000,
            output_tokens_per_minute: 50_000,
        },
        Tier::Steady => TierLimits {
            weekly_tokens: 10_000_000,
            weekly_requests: 0,
            requests_per_minute: 120,
            input_tokens_per_minute: 400_000,
            output_tokens_per_minute: 100_000,
        },
        Tier::Persistent => TierLimits {
            weekly_tokens: 50_000_000,
            weekly_requests: 0,
            requests_per_minute: 300,
            input_tokens_per_minute: 1_000_000,
            output_tokens_per_minute: 250_000,
        },
        Tier::Tryharder => TierLimits {
            weekly_tokens: 200_000_000,
            weekly_requests: 0,
            requests_per_minute: 600,
            input_tokens_per_minute: 2_000_000,
            output_tokens_per_minute: 500_000,
        },
    }
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
        let config = Config::from_str(path, text)?;
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
        // [server]
        let secrets_dir = f.secrets.dir.clone().unwrap_or_else(|| "data".into());
        let api_listen = f
            .server
            .api_listen
            .unwrap_or_else(|| "127.0.0.1:8080".into());
        check_listen(c, "server.api_listen", &api_listen)?;
        let site_listen = f
            .server
            .site_listen
            .unwrap_or_else(|| "127.0.0.1:8081".into());
        check_listen(c, "server.site_listen", &site_listen)?;
        let admin_listen = f.server.admin_listen.filter(|s| !s.is_empty());
        if let Some(a) = &admin_listen {
            check_listen(c, "server.admin_listen", a)?;
        }
        let site_origin = f
            .server
            .site_origin
            .unwrap_or_else(|| format!("http://{site_listen}"))
            .trim_end_matches('/')
            .to_string();
        let site_secure = match parse_base_url(&site_origin) {
            Ok((tls, _, _, path)) if path.is_empty() => tls,
            Ok(_) => {
                return Err(c.err(
                    "server.site_origin",
                    "must be an origin without a path, e.g. https://gw.example.com",
                ))
            }
            Err(e) => return Err(c.err("server.site_origin", e)),
        };
        let max_body_bytes = f.server.max_body_bytes.unwrap_or(32 * 1024 * 1024);
        if max_body_bytes < 1024 {
            return Err(c.err("server.max_body_bytes", "must be at least 1024"));
        }
        // Default: one event loop per core for the developer API (and as many for the site).
        let threads = f
            .server
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().min(64)));
        if threads == 0 || threads > 256 {
            return Err(c.err("server.threads", "must be between 1 and 256"));
        }
        let limits = edge_limits(c, &f.server.limits, max_body_bytes)?;
        let server = ServerConfig {
            limits,
            api_listen,
            site_listen,
            site_origin,
            site_secure,
            admin_listen,
            max_body_bytes,
            threads,
            shutdown_drain: Duration::from_secs(f.server.shutdown_drain_seconds.unwrap_or(10)),
            access_log: f.server.access_log.unwrap_or(true),
            upgrade_sock: PathBuf::from(
                f.server
                    .upgrade_sock
                    .unwrap_or_else(|| format!("{secrets_dir}/upgrade.sock")),
            ),
            pid_file: PathBuf::from(
                f.server
                    .pid_file
                    .unwrap_or_else(|| format!("{secrets_dir}/gateway.pid")),
            ),
        };

        // [storage]
        let database_url = f
            .storage
            .database_url
            .unwrap_or_else(|| "sqlite://data/gateway.db".into());
        if !(database_url.starts_with("sqlite:")
            || database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://"))
        {
            return Err(c.err(
                "storage.database_url",
                format!("must start with sqlite: or postgres://, got {database_url:?}"),
            ));
        }
        let redis_url = f.storage.redis_url.filter(|s| !s.is_empty());
        if let Some(r) = &redis_url {
            if !(r.starts_with("redis://") || r.starts_with("rediss://")) {
                return Err(c.err("storage.redis_url", "must start with redis:// or rediss://"));
            }
        }
        let mut storage = StorageConfig {
            database_url,
            redis_url,
            // Large batches: every transaction costs fixed work (commit, WAL frames of the pages it
            // touched, rollup and balance rows) whatever its size, so fewer, larger batches cost
            // less CPU under load. The flush interval stays 200 ms, so
            // records lag no more.
            usage_batch_size: f.storage.usage_batch_size.unwrap_or(5000).clamp(1, 10_000),
            usage_flush: Duration::from_millis(f.storage.usage_flush_ms.unwrap_or(200).max(10)),
            redis_timeout: Duration::from_millis(match f.storage.redis_timeout_ms {
                None => 50,
                Some(ms @ 1..=10_000) => ms,
                Some(_) => {
                    return Err(c.err(
                        "storage.redis_timeout_ms",
                        "must be between 1 and 10000 milliseconds",
                    ))
                }
            }),
            redis_outage: match f.storage.redis_outage.as_deref().unwrap_or("local") {
                "local" => RedisOutage::Local,
                "refuse" => RedisOutage::Refuse,
                other => {
                    return Err(c.err(
                        "storage.redis_outage",
                        format!("must be \"local\" or \"refuse\", got {other:?}"),
                    ))
                }
            },
            database_timeout: Duration::from_millis(match f.storage.database_timeout_ms {
                None => 2000,
                Some(ms @ 10..=600_000) => ms,
                Some(_) => {
                    return Err(c.err(
                        "storage.database_timeout_ms",
                        "must be between 10 and 600000 milliseconds",
                    ))
                }
            }),
            usage_journal: None,
        };

        // [secrets]
        let secrets = SecretsConfig {
            dev_generate: f.secrets.dev_generate.unwrap_or(false),
            dir: PathBuf::from(f.secrets.dir.unwrap_or_else(|| "data".into())),
        };
        storage.usage_journal = match f.storage.usage_journal.as_deref() {
            None => Some(secrets.dir.join("usage.journal")),
            Some("") => None,
            Some(p) if p.ends_with('/') || Path::new(p).file_name().is_none() => {
                return Err(c.err(
                    "storage.usage_journal",
                    format!("must name a file (segments are <path>.<n>), got {p:?}"),
                ))
            }
            Some(p) => Some(PathBuf::from(p)),
        };

        // [mail]
        let transport = match f.mail.transport.as_deref().unwrap_or("") {
            "" => None,
            "smtp" => {
                let url = f.mail.smtp_url.clone().unwrap_or_default();
                if !(url.starts_with("smtp://") || url.starts_with("smtps://")) {
                    return Err(c.err(
                        "mail.smtp_url",
                        "transport \"smtp\" needs smtp_url = \"smtp://host:port\" or smtps://",
                    ));
                }
                Some(MailTransport::Smtp { url })
            }
            "file" => Some(MailTransport::File {
                dir: PathBuf::from(
                    f.mail
                        .outbox_dir
                        .clone()
                        .unwrap_or_else(|| "data/outbox".into()),
                ),
            }),
            "log" => Some(MailTransport::Log),
            other => {
                return Err(c.err(
                    "mail.transport",
                    format!("must be \"smtp\", \"file\" or \"log\", got {other:?}"),
                ))
            }
        };
        let mail = MailConfig {
            transport,
            from: f
                .mail
                .from
                .unwrap_or_else(|| "Gateway <no-reply@localhost>".into()),
        };

        // [auth]
        let lower = |v: Option<Vec<String>>| -> Vec<String> {
            v.unwrap_or_default()
                .into_iter()
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let captcha_required = f.auth.captcha_required.unwrap_or(false);
        let auth = AuthConfig {
            private_beta: f.auth.private_beta.unwrap_or(false),
            beta_allowlist: lower(f.auth.beta_allowlist),
            blocked_domains: lower(f.auth.blocked_domains)
                .into_iter()
                .map(|d| d.trim_start_matches('@').to_string())
                .collect(),
            captcha_required,
            captcha_verify_url: f.auth.captcha_verify_url.unwrap_or_default(),
            captcha_site_key: f.auth.captcha_site_key.unwrap_or_default(),
            code_ttl: Duration::from_secs(f.auth.code_ttl_seconds.unwrap_or(600).max(1)),
            link_ttl: Duration::from_secs(f.auth.link_ttl_seconds.unwrap_or(900).max(1)),
            session_ttl: Duration::from_secs(3600 * f.auth.session_ttl_hours.unwrap_or(720).max(1)),
            session_idle: Duration::from_secs(
                3600 * f.auth.session_idle_hours.unwrap_or(168).max(1),
            ),
        };

        let keys = KeysConfig {
            max_active_per_account: f.keys.max_active_per_account.unwrap_or(5).max(1),
            rotations_per_hour: f.keys.rotations_per_hour.unwrap_or(10).max(1),
        };

        // [quota]
        let default_tier = parse_tier(
            c,
            "quota.default_tier",
            f.quota.default_tier.as_deref().unwrap_or("beginner"),
        )?;
        let mut tiers = Tier::ALL.map(default_tier_limits);
        for (name, t) in &f.quota.tiers {
            let tier = parse_tier(c, &format!("quota.tiers.{name}"), name)?;
            let d = default_tier_limits(tier);
            tiers[tier.index()] = TierLimits {
                weekly_tokens: t.weekly_tokens.unwrap_or(d.weekly_tokens),
                weekly_requests: t.weekly_requests.unwrap_or(0),
                requests_per_minute: t.requests_per_minute.unwrap_or(d.requests_per_minute),
                input_tokens_per_minute: t
                    .input_tokens_per_minute
                    .unwrap_or(d.input_tokens_per_minute),
                output_tokens_per_minute: t
                    .output_tokens_per_minute
                    .unwrap_or(d.output_tokens_per_minute),
            };
        }
        let mut usage_thresholds = Vec::new();
        for (name, v) in &f.quota.usage_thresholds {
            let tier = parse_tier(c, &format!("quota.usage_thresholds.{name}"), name)?;
            usage_thresholds.push((tier, *v));
        }
        if usage_thresholds.is_empty() {
            usage_thresholds = vec![
                (Tier::Steady, 5_000_000),
                (Tier::Persistent, 25_000_000),
                (Tier::Tryharder, 100_000_000),
            ];
        }
        usage_thresholds.sort();
        let quota = QuotaConfig {
            default_tier,
            tiers,
            usage_thresholds,
            reservation_timeout: Duration::from_secs(
                f.quota.reservation_timeout_seconds.unwrap_or(900).max(5),
            ),
        };

        // [[providers]]
        let mut providers = BTreeMap::new();
        for (i, p) in f.providers.iter().enumerate() {
            let key = |k: &str| format!("providers[{i}].{k}");
            if p.name.is_empty() {
                return Err(c.err(key("name"), "must not be empty"));
            }
            if providers.contains_key(&p.name) {
                return Err(c.err(key("name"), format!("duplicate provider {:?}", p.name)));
            }
            let style = match p.style.as_str() {
                "openai" => ProviderStyle::OpenAi,
                "anthropic" => ProviderStyle::Anthropic,
                other => {
                    return Err(c.err(
                        key("style"),
                        format!("must be \"openai\" or \"anthropic\", got {other:?}"),
                    ))
                }
            };
            let (tls, host, port, base_path) =
                parse_base_url(&p.base_url).map_err(|e| c.err(key("base_url"), e))?;
            let default_port = if tls { 443 } else { 80 };
            let host_header = if port == default_port {
                host.clone()
            } else if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
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
            let api_key_env = p.api_key_env.clone().filter(|s| !s.is_empty());
            let api_key = api_key_env
                .as_deref()
                .and_then(|v| std::env::var(v).ok())
                .filter(|v| !v.is_empty())
                .inspect(|key| crate::logging::never_print(key));
            providers.insert(
                p.name.clone(),
                Arc::new(Provider {
                    name: p.name.clone(),
                    style,
                    tls,
                    host,
                    port,
                    base_path,
                    host_header,
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
                }),
            );
        }

        // [[models]]
        let mut models = Vec::new();
        let mut models_by_id = BTreeMap::new();
        for (i, m) in f.models.iter().enumerate() {
            let key = |k: &str| format!("models[{i}].{k}");
            if m.id.is_empty() {
                return Err(c.err(key("id"), "must not be empty"));
            }
            if models_by_id.contains_key(&m.id) {
                return Err(c.err(key("id"), format!("duplicate model {:?}", m.id)));
            }
            let mut deployments = Vec::new();
            match (&m.provider, m.deployments.is_empty()) {
                (Some(p), true) => {
                    let provider = providers.get(p).cloned().ok_or_else(|| {
                        c.err(key("provider"), format!("no [[providers]] named {p:?}"))
                    })?;
                    deployments.push(Deployment::new(
                        provider,
                        m.upstream_model.clone().unwrap_or_else(|| m.id.clone()),
                        1,
                    ));
                }
                (None, false) => {
                    for (j, d) in m.deployments.iter().enumerate() {
                        let provider = providers.get(&d.provider).cloned().ok_or_else(|| {
                            c.err(
                                key(&format!("deployments[{j}].provider")),
                                format!("no [[providers]] named {:?}", d.provider),
                            )
                        })?;
                        let weight = d.weight.unwrap_or(1);
                        if weight == 0 {
                            return Err(c.err(
                                key(&format!("deployments[{j}].weight")),
                                "must be at least 1",
                            ));
                        }
                        deployments.push(Deployment::new(
                            provider,
                            d.upstream_model
                                .clone()
                                .or_else(|| m.upstream_model.clone())
                                .unwrap_or_else(|| m.id.clone()),
                            weight,
                        ));
                    }
                }
                (Some(_), false) => {
                    return Err(c.err(
                        key("provider"),
                        "set either provider or deployments, not both",
                    ))
                }
                (None, true) => return Err(c.err(key("provider"), "missing (or give deployments)")),
            }
            if let (Some(ctx), Some(out)) = (m.context_window, m.max_output_tokens) {
                if out > ctx {
                    return Err(c.err(key("max_output_tokens"), "must not exceed context_window"));
                }
            }
            let default_output_tokens = m
                .default_output_tokens
                .or(m.max_output_tokens)
                .unwrap_or(4096);
            let weights = crate::pricing::Weights::from_config(
                m.input_weight,
                m.output_weight,
                m.cached_input_weight,
            )
            .map_err(|(k, why)| c.err(key(k), why))?;
            let price = m
                .price
                .as_ref()
                .map(crate::pricing::Price::from_file)
                .transpose()
                .map_err(|(k, why)| c.err(key(k), why))?;
            let model = Arc::new(Model {
                id: m.id.clone(),
                deployments,
                context_window: m.context_window,
                max_output_tokens: m.max_output_tokens,
                default_output_tokens,
                weights,
                price,
            });
            models_by_id.insert(m.id.clone(), model.clone());
            models.push(model);
        }

        // [routing]
        let max_attempts = f.routing.max_attempts.unwrap_or(3);
        if !(1..=10).contains(&max_attempts) {
            return Err(c.err("routing.max_attempts", "must be between 1 and 10"));
        }
        let failover_deadline_ms = f.routing.failover_deadline_ms.unwrap_or(30_000);
        if !(1..=3_600_000).contains(&failover_deadline_ms) {
            return Err(c.err(
                "routing.failover_deadline_ms",
                "must be between 1 and 3600000 (one hour)",
            ));
        }
        let routing = RoutingConfig {
            max_attempts: max_attempts as usize,
            failover_deadline: Duration::from_millis(failover_deadline_ms),
        };

        // [tools]
        let tool = |k: &str, v: &Option<String>| -> Result<Option<Arc<Provider>>, ConfigError> {
            match v.as_deref().filter(|s| !s.is_empty()) {
                None => Ok(None),
                Some(name) => providers
                    .get(name)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| c.err(k, format!("no [[providers]] named {name:?}"))),
            }
        };
        let tools = ToolsConfig {
            search: tool("tools.search_provider", &f.tools.search_provider)?,
            web_fetch: tool("tools.web_fetch_provider", &f.tools.web_fetch_provider)?,
        };

        // [payment]
        let code_prefix = f.payment.code_prefix.unwrap_or_else(|| "GW".into());
        if code_prefix.is_empty()
            || code_prefix.len() > 8
            || !code_prefix
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit())
        {
            return Err(c.err(
                "payment.code_prefix",
                "must be 1 to 8 uppercase letters or digits",
            ));
        }
        let webhook_provider = f.payment.webhook_provider.unwrap_or_else(|| "sepay".into());
        if webhook_provider.is_empty()
            || !webhook_provider
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
        {
            return Err(c.err(
                "payment.webhook_provider",
                "must be letters, digits, - or _",
            ));
        }
        let payment = PaymentConfig {
            webhook_provider,
            code_prefix,
            max_pending_orders: f.payment.max_pending_orders.unwrap_or(3).max(1),
            order_ttl: match f.payment.order_ttl_seconds {
                Some(secs) => Duration::from_secs(secs.max(1)),
                None => Duration::from_secs(60 * f.payment.order_ttl_minutes.unwrap_or(60).max(1)),
            },
            lot_days: f.payment.lot_days.unwrap_or(30).max(1),
            token_price_vnd_per_million: f.payment.token_price_vnd_per_million,
            request_price_vnd_per_thousand: f.payment.request_price_vnd_per_thousand,
            bank_bin: f.payment.bank_bin.unwrap_or_default(),
            account_number: f.payment.account_number.unwrap_or_default(),
            account_name: f.payment.account_name.unwrap_or_default(),
            orders_per_hour: f.payment.orders_per_hour.unwrap_or(20).max(1),
        };

        let limits = LimitsConfig {
            request_code_per_hour: f.limits.request_code_per_hour.unwrap_or(5).max(1),
        };
        let content = ContentConfig {
            tos_path: f
                .content
                .tos_path
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        };

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
            models,
            models_by_id,
            routing,
            tools,
            payment,
            limits,
            content,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(Path::new("test.toml"), text)
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

    #[test]
    fn base_url_parts() {
        assert_eq!(
            parse_base_url("https://api.openai.com").unwrap(),
            (true, "api.openai.com".into(), 443, "".into())
        );
        assert_eq!(
            parse_base_url("http://127.0.0.1:9000/proxy/").unwrap(),
            (false, "127.0.0.1".into(), 9000, "/proxy".into())
        );
        assert!(parse_base_url("ftp://x").is_err());
        assert!(parse_base_url("http://u:p@x").is_err());
    }
}
