//! Operator usage reports (`gateway usage report`): requests and tokens summed per UTC day,
//! model or account over a range of whole days, read from the hourly rollup that every usage
//! batch keeps in step with its events (so a report never scans raw events).

use sqlx::Row;

use super::usage::UsageTotals;
use super::{Db, StoreResult};

/// What a report's rows are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Days since the Unix epoch (UTC), as decimal text.
    Day,
    Model,
    /// The account's email (its id when the account is gone).
    User,
}

pub struct ReportStore<'a> {
    pub(super) db: &'a Db,
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl ReportStore<'_> {
    /// Sums for Unix hours `from_hour..until_hour` (end excluded), optionally of one account,
    /// one row per group, in no particular order.
    pub async fn usage(
        &self,
        grouping: Grouping,
        from_hour: i64,
        until_hour: i64,
        user_id: Option<&str>,
    ) -> StoreResult<Vec<(String, UsageTotals)>> {
        let (group, select) = match grouping {
            // Text on both databases, so one reader serves every grouping.
            Grouping::Day => ("r.hour / 24", "CAST(r.hour / 24 AS TEXT)"),
            Grouping::Model => ("r.model", "r.model"),
            Grouping::User => ("r.user_id, u.email", "COALESCE(u.email, r.user_id)"),
        };
        let account = if user_id.is_some() {
            " AND r.user_id = $3"
        } else {
            ""
        };
        let sql = format!(
            "SELECT {select} AS k, CAST(SUM(r.requests) AS BIGINT) AS requests, \
             CAST(SUM(r.input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(r.output_tokens) AS BIGINT) AS output_tokens, \
             CAST(SUM(r.total_tokens) AS BIGINT) AS total_tokens \
             FROM usage_rollup r LEFT JOIN users u ON u.id = r.user_id \
             WHERE r.hour >= $1 AND r.hour < $2{account} GROUP BY {group}"
        );
        let mut query = sqlx::query(&sql).bind(from_hour).bind(until_hour);
        if let Some(id) = user_id {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&self.db.pool).await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>("k")?,
                    UsageTotals {
                        requests: u(r.try_get("requests")?),
                        input_tokens: u(r.try_get("input_tokens")?),
                        output_tokens: u(r.try_get("output_tokens")?),
                        total_tokens: u(r.try_get("total_tokens")?),
                    },
                ))
            })
            .collect()
    }
}
