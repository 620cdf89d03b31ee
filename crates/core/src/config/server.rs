//! `[server]` and `[server.limits]`: listeners, bodies, threads and client bounds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::base_url::parse_base_url;
use super::check::{Checker, ConfigError};
use super::file::{EdgeLimitsFile, ServerFile};

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

/// Validates `[server.limits]` against safe defaults.
fn edge_limits(
    c: &Checker,
    f: &EdgeLimitsFile,
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

fn check_listen(c: &Checker, key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse::<SocketAddr>().map_err(|_| {
        c.err(
            key,
            format!("must be an address like 127.0.0.1:8080, got {value:?}"),
        )
    })
}

/// `http://` and the site's listen address, without an IPv6 scope id (`%2`): a URL has no
/// place for one, and the origin names the site, not an interface.
fn default_site_origin(mut site_listen: SocketAddr) -> String {
    if let SocketAddr::V6(a) = &mut site_listen {
        a.set_scope_id(0);
    }
    format!("http://{site_listen}")
}

/// Validates `[server]`; `secrets_dir` places the upgrade socket and pid file by default.
pub(super) fn validate(
    c: &Checker,
    f: ServerFile,
    secrets_dir: &str,
) -> Result<ServerConfig, ConfigError> {
    let api_listen = f.api_listen.unwrap_or_else(|| "127.0.0.1:8080".into());
    check_listen(c, "server.api_listen", &api_listen)?;
    let site_listen = f.site_listen.unwrap_or_else(|| "127.0.0.1:8081".into());
    let site_addr = check_listen(c, "server.site_listen", &site_listen)?;
    let admin_listen = f.admin_listen.filter(|s| !s.is_empty());
    if let Some(a) = &admin_listen {
        check_listen(c, "server.admin_listen", a)?;
    }
    let site_origin = f
        .site_origin
        .unwrap_or_else(|| default_site_origin(site_addr))
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
    let max_body_bytes = f.max_body_bytes.unwrap_or(32 * 1024 * 1024);
    if max_body_bytes < 1024 {
        return Err(c.err("server.max_body_bytes", "must be at least 1024"));
    }
    // Default: one event loop per core for the developer API (and as many for the site).
    let threads = f
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().min(64)));
    if threads == 0 || threads > 256 {
        return Err(c.err("server.threads", "must be between 1 and 256"));
    }
    let limits = edge_limits(c, &f.limits, max_body_bytes)?;
    Ok(ServerConfig {
        limits,
        api_listen,
        site_listen,
        site_origin,
        site_secure,
        admin_listen,
        max_body_bytes,
        threads,
        shutdown_drain: Duration::from_secs(f.shutdown_drain_seconds.unwrap_or(10)),
        access_log: f.access_log.unwrap_or(true),
        upgrade_sock: PathBuf::from(
            f.upgrade_sock
                .unwrap_or_else(|| format!("{secrets_dir}/upgrade.sock")),
        ),
        pid_file: PathBuf::from(
            f.pid_file
                .unwrap_or_else(|| format!("{secrets_dir}/gateway.pid")),
        ),
    })
}
