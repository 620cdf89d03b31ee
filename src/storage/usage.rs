//! Usage events: the exact record of every developer request.

use super::quota::{Breakdown, QuotaStore};
use super::{Db, StoreResult};

/// One settled request, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEvent {
    pub id: String,
    pub user_id: String,
    pub key_id: String,
    pub model: String,
    pub endpoint: String,
    pub reasoning_effort: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_tokens: u64,
    pub status: u16,
    pub latency_ms: u64,
    pub ttfb_ms: Option<u64>,
    /// How the numbers were obtained: `provider`, `counted`, plus why (`client_disconnect`, …).
    pub settlement: String,
    pub deployment: Option<String>,
    pub error_code: Option<String>,
    pub created_at: i64,
    /// How the settlement was paid; written with the event in one transaction so balances
    /// always add up to the recorded usage.
    pub breakdown: Option<Breakdown>,
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub struct UsageStore<'a> {
    pub(super) db: &'a Db,
}

impl UsageStore<'_> {
    /// Inserts a batch in one transaction: one fsync for many requests.
    pub async fn insert_batch(&self, events: &[UsageEvent]) -> StoreResult<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.pool.begin().await?;
        for e in events {
            sqlx::query(
                "INSERT INTO usage_events (id, user_id, key_id, model, endpoint, reasoning_effort, \
                 input_tokens, output_tokens, total_tokens, cached_tokens, status, latency_ms, \
                 ttfb_ms, settlement, deployment, error_code, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(&e.id)
            .bind(&e.user_id)
            .bind(&e.key_id)
            .bind(&e.model)
            .bind(&e.endpoint)
            .bind(&e.reasoning_effort)
            .bind(i(e.input_tokens))
            .bind(i(e.output_tokens))
            .bind(i(e.input_tokens.saturating_add(e.output_tokens)))
            .bind(i(e.cached_tokens))
            .bind(e.status as i64)
            .bind(i(e.latency_ms))
            .bind(e.ttfb_ms.map(i))
            .bind(&e.settlement)
            .bind(&e.deployment)
            .bind(&e.error_code)
            .bind(e.created_at)
            .execute(&mut *tx)
            .await?;
            if let Some(b) = &e.breakdown {
                QuotaStore::apply_tx(&mut tx, b).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn count_for_user(&self, user_id: &str) -> StoreResult<i64> {
        use sqlx::Row;
        let row = sqlx::query(
            "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM usage_events WHERE user_id = $1",
        )
        .bind(user_id)
        .fetch_one(&self.db.pool)
        .await?;
        Ok(row.try_get("n")?)
    }
}
