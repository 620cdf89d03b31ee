//! `GET {base_url}/ready` (CONTRACT §1): whether this instance can serve, for load balancers
//! and orchestrators. `/health` says the process is alive and touches nothing; `/ready` asks
//! the database (and Redis, when configured) to answer within [`DEADLINE`].

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;

use gateway_core::state::AppState;

/// How long each dependency gets to answer. Short: a probe that hangs is as bad as a failure,
/// and probes come every few seconds.
pub const DEADLINE: Duration = Duration::from_secs(2);

/// Probes every dependency at once on the storage runtime (which owns the pools) and answers
/// 200 `{"ok":true}` or 503 `{"ok":false,"failing":["database","redis"]}`.
pub async fn probe(state: &AppState) -> (u16, Bytes) {
    let db = state.db.clone();
    let quota = state.quota.clone();
    let failing = state
        .on_storage(async move {
            let database = async {
                let ping = sqlx::query("SELECT 1").execute(&db.pool);
                match tokio::time::timeout(DEADLINE, ping).await {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => {
                        log::warn!("ready: database: {e}");
                        Some("database")
                    }
                    Err(_) => {
                        log::warn!("ready: database did not answer within {DEADLINE:?}");
                        Some("database")
                    }
                }
            };
            let redis = async {
                match tokio::time::timeout(DEADLINE, quota.ping()).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => {
                        log::warn!("ready: redis: {e}");
                        Some("redis")
                    }
                    Err(_) => {
                        log::warn!("ready: redis did not answer within {DEADLINE:?}");
                        Some("redis")
                    }
                }
            };
            let (d, r) = tokio::join!(database, redis);
            [d, r].into_iter().flatten().collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|| vec!["storage_runtime"]);
    if failing.is_empty() {
        (200, Bytes::from_static(b"{\"ok\":true}"))
    } else {
        let body = json!({ "ok": false, "failing": failing }).to_string();
        (503, Bytes::from(body))
    }
}
