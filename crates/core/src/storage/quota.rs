//! Quota lots and hourly spend: the database record of every balance. Hot counters (in-process
//! or Redis) are rebuilt from here; settlements are written back here in the same transaction as
//! their usage event.

use std::collections::BTreeMap;

use super::{Db, StoreError, StoreResult};
use crate::domain::Tier;
use crate::domain::{Breakdown, Lot, LotKind, SpendBucket};
use crate::util::{new_id, now_ms};

pub const HOUR_MS: i64 = 3_600_000;
/// A rolling week of hourly buckets.
pub const WINDOW_HOURS: i64 = 168;

/// The oldest hour (Unix hours) inside the rolling week ending at `now` (Unix ms).
pub fn window_start_hour(now: i64) -> i64 {
    now / HOUR_MS - (WINDOW_HOURS - 1)
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

row! {
    /// A `quota_lots` row as stored.
    struct LotRow {
        id: String,
        user_id: String,
        kind: String,
        amount: i64,
        remaining: i64,
        tier: Option<String>,
        source: String,
        created_at: i64,
        expires_at: i64,
    }
}

impl From<LotRow> for Lot {
    fn from(r: LotRow) -> Lot {
        Lot {
            id: r.id,
            user_id: r.user_id,
            kind: LotKind::parse(&r.kind).unwrap_or(LotKind::Token),
            amount: u(r.amount),
            remaining: u(r.remaining),
            tier: r.tier.as_deref().and_then(Tier::parse),
            source: r.source,
            created_at: r.created_at,
            expires_at: r.expires_at,
        }
    }
}

row! {
    /// A `quota_spend` row without its account.
    struct SpendRow {
        hour: i64,
        allowance_tokens: i64,
        allowance_requests: i64,
        lot_tokens: i64,
        lot_requests: i64,
    }
}

impl From<SpendRow> for SpendBucket {
    fn from(r: SpendRow) -> SpendBucket {
        SpendBucket {
            hour: r.hour,
            allowance_tokens: u(r.allowance_tokens),
            allowance_requests: u(r.allowance_requests),
            lot_tokens: u(r.lot_tokens),
            lot_requests: u(r.lot_requests),
        }
    }
}

row! {
    /// Admissions of one key in one minute, as the usage events record them.
    struct AdmissionRow {
        key_id: String,
        limit_mode: String,
        minute: i64,
        requests: i64,
        input_tokens: i64,
        output_tokens: i64,
    }
}

/// What one key of an account was admitted in one minute (Unix minutes): its requests and raw
/// tokens, as its per-minute windows count them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteAdmissions {
    pub key_id: String,
    pub limit_mode: crate::domain::LimitMode,
    pub minute: i64,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// `SELECT` of a `LotRow` followed by `$rest`.
macro_rules! select_lot {
    ($rest:literal) => {
        concat!(
            "SELECT id, user_id, kind, amount, remaining, tier, source, created_at, expires_at \
             FROM quota_lots ",
            $rest
        )
    };
}

pub(crate) mod sql {
    queries! {
        INSERT_LOT = "INSERT INTO quota_lots (id, user_id, kind, amount, remaining, tier, \
             source, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
        /// Touches the account so every instance's change feed picks a new lot up.
        TOUCH_USER = "UPDATE users SET updated_at = $1 WHERE id = $2";
        LIVE_LOTS -> super::LotRow =
            select_lot!("WHERE user_id = $1 AND expires_at > $2 ORDER BY expires_at");
        SPEND -> super::SpendRow = "SELECT hour, allowance_tokens, allowance_requests, lot_tokens, \
             lot_requests FROM quota_spend WHERE user_id = $1 AND hour >= $2";
        LOTS_CREATED_SINCE -> super::LotRow = select_lot!("WHERE created_at >= $1 LIMIT 10000");
        /// Per key and minute since `$2`: one account's range of the events' key, so cheap.
        ADMISSIONS_SINCE -> super::AdmissionRow = "SELECT e.key_id AS key_id, \
             COALESCE(k.limit_mode, '') AS limit_mode, \
             CAST(e.created_at / 60000 AS BIGINT) AS minute, \
             CAST(COUNT(*) AS BIGINT) AS requests, \
             CAST(SUM(e.input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(e.output_tokens) AS BIGINT) AS output_tokens \
             FROM usage_events e LEFT JOIN api_keys k ON k.id = e.key_id \
             WHERE e.user_id = $1 AND e.created_at >= $2 \
             GROUP BY e.key_id, k.limit_mode, CAST(e.created_at / 60000 AS BIGINT)";
        DRAW_LOT = "UPDATE quota_lots SET remaining = \
             CASE WHEN remaining > $1 THEN remaining - $2 ELSE 0 END WHERE id = $3";
        ADD_SPEND = "INSERT INTO quota_spend (user_id, hour, allowance_tokens, \
             allowance_requests, lot_tokens, lot_requests) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (user_id, hour) DO UPDATE SET \
             allowance_tokens = quota_spend.allowance_tokens + excluded.allowance_tokens, \
             allowance_requests = quota_spend.allowance_requests + excluded.allowance_requests, \
             lot_tokens = quota_spend.lot_tokens + excluded.lot_tokens, \
             lot_requests = quota_spend.lot_requests + excluded.lot_requests";
    }
}

pub struct QuotaStore<'a> {
    pub(super) db: &'a Db,
}

impl QuotaStore<'_> {
    /// Grants a lot. Runs inside the caller's transaction when given one (payments grant a lot
    /// in the same transaction that marks the order paid).
    pub async fn grant_lot_tx(
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        user_id: &str,
        kind: LotKind,
        amount: u64,
        days: u64,
        tier: Option<Tier>,
        source: &str,
    ) -> StoreResult<Lot> {
        if amount == 0 {
            return Err(StoreError::Invalid("lot amount must be positive".into()));
        }
        let now = now_ms();
        let lot = Lot {
            id: new_id("lot"),
            user_id: user_id.to_string(),
            kind,
            amount,
            remaining: amount,
            tier,
            source: source.to_string(),
            created_at: now,
            expires_at: now + i(days.min(36_500)) * 24 * HOUR_MS,
        };
        sqlx::query(sql::INSERT_LOT)
            .bind(&lot.id)
            .bind(&lot.user_id)
            .bind(kind.as_str())
            .bind(i(amount))
            .bind(i(amount))
            .bind(tier.map(|t| t.as_str()))
            .bind(&lot.source)
            .bind(lot.created_at)
            .bind(lot.expires_at)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::from_sqlx)?;
        sqlx::query(sql::TOUCH_USER)
            .bind(now)
            .bind(user_id)
            .execute(&mut **tx)
            .await?;
        Ok(lot)
    }

    pub async fn grant_lot(
        &self,
        user_id: &str,
        kind: LotKind,
        amount: u64,
        days: u64,
        tier: Option<Tier>,
        source: &str,
    ) -> StoreResult<Lot> {
        let mut tx = self.db.pool.begin().await?;
        let lot = Self::grant_lot_tx(&mut tx, user_id, kind, amount, days, tier, source).await?;
        tx.commit().await?;
        Ok(lot)
    }

    /// Lots not yet expired (used up ones included, for display).
    pub async fn lots(&self, user_id: &str, now: i64) -> StoreResult<Vec<Lot>> {
        let rows = sqlx::query_as::<_, LotRow>(sql::LIVE_LOTS)
            .bind(user_id)
            .bind(now)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(Lot::from).collect())
    }

    /// Spend buckets of the rolling week ending at `now`.
    pub async fn spend(&self, user_id: &str, now: i64) -> StoreResult<Vec<SpendBucket>> {
        let from = window_start_hour(now);
        let rows = sqlx::query_as::<_, SpendRow>(sql::SPEND)
            .bind(user_id)
            .bind(from)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(SpendBucket::from).collect())
    }

    /// The account's admissions since `since` (Unix ms) per key and minute, from its usage
    /// events (each event is one admitted request, dated at its admission). The in-process
    /// engine rebuilds its per-minute windows from them, so a restart or an upgrade does not
    /// reset a limit.
    pub async fn admissions_since(
        &self,
        user_id: &str,
        since: i64,
    ) -> StoreResult<Vec<MinuteAdmissions>> {
        let rows = sqlx::query_as::<_, AdmissionRow>(sql::ADMISSIONS_SINCE)
            .bind(user_id)
            .bind(since)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| MinuteAdmissions {
                limit_mode: crate::domain::LimitMode::parse(&r.limit_mode),
                key_id: r.key_id,
                minute: r.minute,
                requests: u(r.requests),
                input_tokens: u(r.input_tokens),
                output_tokens: u(r.output_tokens),
            })
            .collect())
    }

    /// Lots created at or after `since` (the change feed for hot balances).
    pub async fn lots_created_since(&self, since: i64) -> StoreResult<Vec<Lot>> {
        let rows = sqlx::query_as::<_, LotRow>(sql::LOTS_CREATED_SINCE)
            .bind(since)
            .fetch_all(&self.db.pool)
            .await?;
        Ok(rows.into_iter().map(Lot::from).collect())
    }

    /// Applies settlements' breakdowns inside the caller's transaction, summed first: one
    /// statement per lot and per (account, hour) however many requests the batch holds. Summing
    /// is exact: a lot's remaining amount is decremented with saturation at zero, and saturating
    /// subtraction of several amounts equals subtracting their sum. Rows are touched in sorted
    /// order so concurrent writers cannot deadlock each other.
    pub async fn apply_batch_tx(
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        breakdowns: &[&Breakdown],
    ) -> StoreResult<()> {
        // (user, hour) -> [allowance tokens, allowance requests, lot tokens, lot requests]
        let mut spend: BTreeMap<(&str, i64), [u64; 4]> = BTreeMap::new();
        let mut lots: BTreeMap<&str, u64> = BTreeMap::new();
        for b in breakdowns.iter().filter(|b| !b.is_empty()) {
            let s = spend
                .entry((b.user_id.as_str(), b.at_ms / HOUR_MS))
                .or_default();
            s[0] = s[0].saturating_add(b.allowance_tokens);
            s[1] = s[1].saturating_add(b.allowance_requests);
            for (id, kind, amount) in &b.lots {
                match kind {
                    LotKind::Token => s[2] = s[2].saturating_add(*amount),
                    LotKind::Request => s[3] = s[3].saturating_add(*amount),
                }
                let l = lots.entry(id.as_str()).or_default();
                *l = l.saturating_add(*amount);
            }
        }
        for (id, amount) in &lots {
            sqlx::query(sql::DRAW_LOT)
                .bind(i(*amount))
                .bind(i(*amount))
                .bind(*id)
                .execute(&mut **tx)
                .await?;
        }
        for ((user_id, hour), s) in &spend {
            sqlx::query(sql::ADD_SPEND)
                .bind(*user_id)
                .bind(*hour)
                .bind(i(s[0]))
                .bind(i(s[1]))
                .bind(i(s[2]))
                .bind(i(s[3]))
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }
}
