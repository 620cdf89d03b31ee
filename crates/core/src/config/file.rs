//! The configuration file exactly as it is written on disk (CONTRACT §2).
//!
//! Every struct denies unknown fields so a typo is an error naming the key instead of a silently
//! ignored setting. Nothing here is validated beyond TOML types: `super::Config::from_file`
//! turns these structs into the validated internal config.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerFile,
    #[serde(default)]
    pub storage: StorageFile,
    #[serde(default)]
    pub secrets: SecretsFile,
    #[serde(default)]
    pub mail: MailFile,
    #[serde(default)]
    pub auth: AuthFile,
    #[serde(default)]
    pub keys: KeysFile,
    #[serde(default)]
    pub quota: QuotaFile,
    #[serde(default)]
    pub providers: Vec<ProviderFile>,
    #[serde(default)]
    pub models: Vec<ModelFile>,
    #[serde(default)]
    pub routing: RoutingFile,
    #[serde(default)]
    pub tools: ToolsFile,
    #[serde(default)]
    pub payment: PaymentFile,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default)]
    pub content: ContentFile,
    #[serde(default)]
    pub telemetry: TelemetryFile,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServerFile {
    pub api_listen: Option<String>,
    pub site_listen: Option<String>,
    pub site_origin: Option<String>,
    /// Prometheus metrics; empty or absent: no admin listener.
    pub admin_listen: Option<String>,
    /// Largest request body the developer API accepts, in bytes (413 beyond).
    pub max_body_bytes: Option<u64>,
    /// Worker threads per Pingora service.
    pub threads: Option<usize>,
    /// Seconds in-flight requests get to finish after SIGTERM.
    pub shutdown_drain_seconds: Option<u64>,
    /// One JSON line per developer request on stderr (default true).
    pub access_log: Option<bool>,
    /// Unix socket through which a new process takes the listeners over in a graceful upgrade
    /// (default `<secrets.dir>/upgrade.sock`).
    pub upgrade_sock: Option<String>,
    /// Pid file (default `<secrets.dir>/gateway.pid`).
    pub pid_file: Option<String>,
    /// Connection and request-size limits of both listeners (`[server.limits]`).
    #[serde(default)]
    pub limits: EdgeLimitsFile,
}

/// `[server.limits]`: what one client may hold of the listeners, as a public edge bounds it.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EdgeLimitsFile {
    pub header_timeout_seconds: Option<u64>,
    pub idle_timeout_seconds: Option<u64>,
    pub body_timeout_seconds: Option<u64>,
    pub body_min_rate_bytes: Option<u64>,
    pub max_header_bytes: Option<u64>,
    pub max_connections: Option<u64>,
    pub max_connections_per_address: Option<u64>,
    pub max_body_bytes_in_flight: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct StorageFile {
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
    /// The seed nodes of a Redis Cluster, instead of `redis_url`.
    pub redis_cluster_nodes: Option<Vec<String>>,
    /// Usage events are written in batches of at most this many rows (default 5,000).
    pub usage_batch_size: Option<usize>,
    /// ... or at least this often, in milliseconds (default 200).
    pub usage_flush_ms: Option<u64>,
    /// Deadline of one Redis call, waiting for a connection included (default 50).
    pub redis_timeout_ms: Option<u64>,
    /// While Redis is unreachable: "local" (in-process limits and quota) or "refuse" (503).
    pub redis_outage: Option<String>,
    /// Deadline of database work on the request path and of a pool acquire (default 2000).
    pub database_timeout_ms: Option<u64>,
    /// The crash-safety journal of usage events (default `<secrets.dir>/usage.journal`; empty
    /// turns it off). Processes may share it: each writes its own segments.
    pub usage_journal: Option<String>,
    /// Days the Responses ids and translated items an account was answered with are kept
    /// (default 30, OpenAI's own retention).
    pub responses_retention_days: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SecretsFile {
    pub dev_generate: Option<bool>,
    /// Where generated development secrets are kept (default `data`).
    pub dir: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MailFile {
    pub transport: Option<String>,
    pub smtp_url: Option<String>,
    pub from: Option<String>,
    pub outbox_dir: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthFile {
    pub private_beta: Option<bool>,
    pub beta_allowlist: Option<Vec<String>>,
    pub blocked_domains: Option<Vec<String>>,
    pub captcha_required: Option<bool>,
    pub captcha_verify_url: Option<String>,
    pub captcha_site_key: Option<String>,
    pub code_ttl_seconds: Option<u64>,
    pub link_ttl_seconds: Option<u64>,
    pub session_ttl_hours: Option<u64>,
    pub session_idle_hours: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct KeysFile {
    pub max_active_per_account: Option<u32>,
    pub rotations_per_hour: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct QuotaFile {
    pub default_tier: Option<String>,
    #[serde(default)]
    pub tiers: BTreeMap<String, TierFile>,
    /// Rolling-week token usage from which each tier is reached (usage tier).
    #[serde(default)]
    pub usage_thresholds: BTreeMap<String, u64>,
    /// Seconds after which an unsettled reservation is released by the reaper.
    pub reservation_timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct TierFile {
    pub weekly_tokens: Option<u64>,
    pub weekly_requests: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub input_tokens_per_minute: Option<u64>,
    pub output_tokens_per_minute: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderFile {
    pub name: String,
    pub style: String,
    pub base_url: String,
    pub api_key_env: Option<String>,
    /// Time to open a connection (TCP; TLS gets five seconds more).
    pub connect_timeout_ms: Option<u64>,
    /// Time from the request written to the answer's header.
    pub first_byte_timeout_ms: Option<u64>,
    /// Longest silence between two chunks of an answer's body.
    pub idle_timeout_ms: Option<u64>,
    /// Consecutive failures that eject a deployment from the rotation.
    pub eject_after_failures: Option<u32>,
    /// Seconds of a deployment's first ejection; each repeated ejection doubles it.
    pub cooldown_seconds: Option<u64>,
    /// PEM file of the certificate authorities trusted for this (https) provider, in place of
    /// the system's roots (or `SSL_CERT_FILE`).
    pub ca_file: Option<String>,
    /// The longest ejection, also the cap on a provider's `retry-after`.
    pub max_cooldown_seconds: Option<u64>,
    /// The endpoints the provider serves itself (`chat`, `responses`, `messages`); the
    /// others of its style's clients are served by translation. Default: all of its style.
    pub endpoints: Option<Vec<String>>,
    /// `azure`: the `api-version` sent (a date, or `v1` for the v1 path family); `gemini`:
    /// the API version in the path (`v1beta` by default).
    pub api_version: Option<String>,
    /// `bedrock` and `vertex-anthropic`: the cloud region the requests go to.
    pub region: Option<String>,
    /// `vertex-anthropic`: the Google Cloud project (default: the key file's `project_id`).
    pub project: Option<String>,
    /// `vertex-anthropic`: the service-account key file access tokens are minted from.
    pub credentials_file: Option<String>,
    /// `vertex-anthropic`: the OAuth token endpoint (default: the key file's `token_uri`).
    pub token_url: Option<String>,
}

/// `[telemetry]`: OpenTelemetry traces, exported over OTLP. Absent or `otlp_endpoint = ""`:
/// off.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TelemetryFile {
    /// The collector's base URL; spans go to `{otlp_endpoint}/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` (default) or `http/json`.
    pub protocol: Option<String>,
    /// The share of traces started here that are sampled (0.0..=1.0); a client's sampled
    /// flag is followed. Reloaded live.
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
    /// The environment variable holding the collector's headers (`k1=v1,k2=v2`); default
    /// `GATEWAY_OTLP_HEADERS`. Credentials never go in the file.
    pub headers_env: Option<String>,
    /// Opt-in: spans carry the sizes of prompts and answers (bytes), never their text.
    pub capture_sizes: Option<bool>,
}

/// `[routing]`: how far one request may fail over.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RoutingFile {
    /// Deployments tried per request, the first included.
    pub max_attempts: Option<u32>,
    /// No further deployment is tried once this long has passed since the first attempt.
    pub failover_deadline_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    pub id: String,
    pub provider: Option<String>,
    pub upstream_model: Option<String>,
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    /// A request asking for more output than `max_output_tokens` is sent with the limit
    /// instead of refused (default: refused).
    pub clamp_output_tokens: Option<bool>,
    /// Output tokens reserved when a request names none (default: max_output_tokens or 4096).
    pub default_output_tokens: Option<u64>,
    /// Quota tokens charged per input, output and cached input token (see `pricing`).
    pub input_weight: Option<f64>,
    pub output_weight: Option<f64>,
    pub cached_input_weight: Option<f64>,
    /// The provider's prices, for the operator's cost report only.
    pub price: Option<crate::pricing::PriceFile>,
    /// Several deployments balanced by weight; alternative to `provider`.
    #[serde(default)]
    pub deployments: Vec<DeploymentFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentFile {
    pub provider: String,
    pub upstream_model: Option<String>,
    pub weight: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ToolsFile {
    pub search_provider: Option<String>,
    pub web_fetch_provider: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PaymentFile {
    pub webhook_provider: Option<String>,
    pub code_prefix: Option<String>,
    pub max_pending_orders: Option<u32>,
    pub order_ttl_minutes: Option<u64>,
    /// Overrides `order_ttl_minutes` with a finer unit (tests, short-lived checkout flows).
    pub order_ttl_seconds: Option<u64>,
    pub lot_days: Option<u64>,
    pub token_price_vnd_per_million: Option<u64>,
    pub request_price_vnd_per_thousand: Option<u64>,
    /// Largest amount a webhook item may carry; larger ones are refused (`amount_mismatch`).
    pub max_webhook_amount_vnd: Option<u64>,
    pub bank_bin: Option<String>,
    pub account_number: Option<String>,
    pub account_name: Option<String>,
    pub orders_per_hour: Option<u32>,
    /// Custom orders priced below this many VND are refused (default 10000; 0: no minimum).
    pub min_order_vnd: Option<u64>,
    /// `[payment.packages.<id>]`: the operator's amounts for the fixed catalogue's packages.
    #[serde(default)]
    pub packages: BTreeMap<String, PackageFile>,
}

/// `[payment.packages.<id>]`: one catalogue package as the operator prices it.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PackageFile {
    pub amount_vnd: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    pub request_code_per_hour: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ContentFile {
    /// Markdown file served by `GET /api/content/tos`.
    pub tos_path: Option<String>,
}
