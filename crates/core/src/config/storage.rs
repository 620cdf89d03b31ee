//! `[storage]`: the database, Redis and the usage pipeline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::check::{Checker, ConfigError};
use super::file::StorageFile;

#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub database_url: String,
    pub redis_url: Option<String>,
    /// Seed nodes of a Redis Cluster (exclusive with `redis_url`); empty: none.
    pub redis_cluster_nodes: Vec<String>,
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
    /// How long the Responses ids and translated items an account was answered with are kept
    /// (`crate::response_items`).
    pub responses_retention: Duration,
}

impl StorageConfig {
    /// The Redis the quota engine shares state through; `None`: in-process limits.
    pub fn redis_target(&self) -> Option<crate::quota::redis_conn::RedisTarget> {
        use crate::quota::redis_conn::RedisTarget;
        match &self.redis_url {
            Some(url) => Some(RedisTarget::Single(url.clone())),
            None if !self.redis_cluster_nodes.is_empty() => {
                Some(RedisTarget::Cluster(self.redis_cluster_nodes.clone()))
            }
            None => None,
        }
    }
}

/// What the developer API does while Redis is unreachable (the circuit breaker is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisOutage {
    /// Serve with in-process limits and quota, loaded from the database; reconciled into Redis
    /// when it is back. Overspend is bounded (docs/operations.md, "Redis and database outages").
    Local,
    /// Answer 503 `quota_unavailable` until Redis is back.
    Refuse,
}

/// Validates `[storage]`; the usage journal defaults to a file in `secrets_dir`.
pub(super) fn validate(
    c: &Checker,
    f: StorageFile,
    secrets_dir: &Path,
) -> Result<StorageConfig, ConfigError> {
    let database_url = f
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
    let redis_url = f.redis_url.filter(|s| !s.is_empty());
    if let Some(r) = &redis_url {
        if !(r.starts_with("redis://") || r.starts_with("rediss://")) {
            return Err(c.err("storage.redis_url", "must start with redis:// or rediss://"));
        }
    }
    let redis_cluster_nodes = f.redis_cluster_nodes.unwrap_or_default();
    if let Some(bad) = redis_cluster_nodes
        .iter()
        .find(|n| !(n.starts_with("redis://") || n.starts_with("rediss://")))
    {
        return Err(c.err(
            "storage.redis_cluster_nodes",
            format!("each node must start with redis:// or rediss://, got {bad:?}"),
        ));
    }
    if redis_url.is_some() && !redis_cluster_nodes.is_empty() {
        return Err(c.err(
            "storage.redis_cluster_nodes",
            "set either redis_url (one Redis) or redis_cluster_nodes (a Redis Cluster), not both",
        ));
    }
    Ok(StorageConfig {
        database_url,
        redis_url,
        redis_cluster_nodes,
        // Large batches: every transaction costs fixed work (commit, WAL frames of the pages it
        // touched, rollup and balance rows) whatever its size, so fewer, larger batches cost
        // less CPU under load. The flush interval stays 200 ms, so
        // records lag no more.
        usage_batch_size: f.usage_batch_size.unwrap_or(5000).clamp(1, 10_000),
        usage_flush: Duration::from_millis(f.usage_flush_ms.unwrap_or(200).max(10)),
        redis_timeout: Duration::from_millis(match f.redis_timeout_ms {
            None => 50,
            Some(ms @ 1..=10_000) => ms,
            Some(_) => {
                return Err(c.err(
                    "storage.redis_timeout_ms",
                    "must be between 1 and 10000 milliseconds",
                ))
            }
        }),
        redis_outage: match f.redis_outage.as_deref().unwrap_or("local") {
            "local" => RedisOutage::Local,
            "refuse" => RedisOutage::Refuse,
            other => {
                return Err(c.err(
                    "storage.redis_outage",
                    format!("must be \"local\" or \"refuse\", got {other:?}"),
                ))
            }
        },
        database_timeout: Duration::from_millis(match f.database_timeout_ms {
            None => 2000,
            Some(ms @ 10..=600_000) => ms,
            Some(_) => {
                return Err(c.err(
                    "storage.database_timeout_ms",
                    "must be between 10 and 600000 milliseconds",
                ))
            }
        }),
        usage_journal: usage_journal(c, f.usage_journal.as_deref(), secrets_dir)?,
        responses_retention: Duration::from_secs(
            86_400
                * match f.responses_retention_days {
                    None => 30,
                    Some(days @ 1..=3650) => days,
                    Some(_) => {
                        return Err(c.err(
                            "storage.responses_retention_days",
                            "must be between 1 and 3650 days",
                        ))
                    }
                },
        ),
    })
}

/// `storage.usage_journal`: unset puts it beside the secrets, `""` turns it off.
fn usage_journal(
    c: &Checker,
    value: Option<&str>,
    secrets_dir: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    Ok(match value {
        None => Some(secrets_dir.join("usage.journal")),
        Some("") => None,
        Some(p) if p.ends_with('/') || Path::new(p).file_name().is_none() => {
            return Err(c.err(
                "storage.usage_journal",
                format!("must name a file (segments are <path>.<n>), got {p:?}"),
            ))
        }
        Some(p) => Some(PathBuf::from(p)),
    })
}
