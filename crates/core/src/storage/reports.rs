//! Operator usage reports (`gateway usage report`): requests, tokens and charged quota summed
//! per UTC day, model or account over a range of whole days, read from the hourly rollup that
//! every usage batch keeps in step with its events (so a report never scans raw events). Each
//! group comes split by model, so the caller can price it at each model's provider price.

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

row! {
    /// One group's sums of one model.
    struct GroupRow {
        k: String,
        model: String,
        requests: i64,
        input_tokens: i64,
        output_tokens: i64,
        total_tokens: i64,
        cached_tokens: i64,
        quota_charged: i64,
    }
}

impl GroupRow {
    fn into_group(self) -> GroupUsage {
        let totals = UsageTotals::from_sums([
            self.requests,
            self.input_tokens,
            self.output_tokens,
            self.total_tokens,
            self.cached_tokens,
            self.quota_charged,
        ]);
        GroupUsage {
            group: self.k,
            model: self.model,
            totals,
        }
    }
}

/// One group's usage of one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupUsage {
    pub group: String,
    pub model: String,
    pub totals: UsageTotals,
}

/// The report statement: `$select` (text on both databases, so one row struct serves every
/// grouping) grouped by `$group` and model, over hours `$1..$2`, then `$account` (empty, or the
/// filter on `$3`). Rows from before charges were recorded count their total as charged and
/// none of their input as cached.
macro_rules! report {
    ($select:literal, $group:literal, $account:literal) => {
        concat!(
            "SELECT ",
            $select,
            " AS k, r.model, CAST(SUM(r.requests) AS BIGINT) AS requests, \
             CAST(SUM(r.input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(r.output_tokens) AS BIGINT) AS output_tokens, \
             CAST(SUM(r.total_tokens) AS BIGINT) AS total_tokens, \
             CAST(SUM(COALESCE(r.cached_tokens, 0)) AS BIGINT) AS cached_tokens, \
             CAST(SUM(COALESCE(r.quota_charged, r.total_tokens)) AS BIGINT) AS quota_charged \
             FROM usage_rollup r LEFT JOIN users u ON u.id = r.user_id \
             WHERE r.hour >= $1 AND r.hour < $2",
            $account,
            " GROUP BY ",
            $group,
            ", r.model"
        )
    };
}

pub(crate) mod sql {
    queries! {
        BY_DAY -> super::GroupRow = report!("CAST(r.hour / 24 AS TEXT)", "r.hour / 24", "");
        BY_MODEL -> super::GroupRow = report!("r.model", "r.model", "");
        BY_USER -> super::GroupRow = report!("COALESCE(u.email, r.user_id)", "r.user_id, u.email", "");
        BY_DAY_OF_USER -> super::GroupRow =
            report!("CAST(r.hour / 24 AS TEXT)", "r.hour / 24", " AND r.user_id = $3");
        BY_MODEL_OF_USER -> super::GroupRow = report!("r.model", "r.model", " AND r.user_id = $3");
        BY_USER_OF_USER -> super::GroupRow = report!(
            "COALESCE(u.email, r.user_id)",
            "r.user_id, u.email",
            " AND r.user_id = $3"
        );
    }
}

impl ReportStore<'_> {
    /// Sums for Unix hours `from_hour..until_hour` (end excluded), optionally of one account,
    /// one row per group and model, in no particular order.
    pub async fn usage(
        &self,
        grouping: Grouping,
        from_hour: i64,
        until_hour: i64,
        user_id: Option<&str>,
    ) -> StoreResult<Vec<GroupUsage>> {
        let statement = match (grouping, user_id.is_some()) {
            (Grouping::Day, false) => sql::BY_DAY,
            (Grouping::Model, false) => sql::BY_MODEL,
            (Grouping::User, false) => sql::BY_USER,
            (Grouping::Day, true) => sql::BY_DAY_OF_USER,
            (Grouping::Model, true) => sql::BY_MODEL_OF_USER,
            (Grouping::User, true) => sql::BY_USER_OF_USER,
        };
        let mut query = sqlx::query_as::<_, GroupRow>(statement)
            .bind(from_hour)
            .bind(until_hour);
        if let Some(id) = user_id {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&self.db.pool).await?;
        Ok(rows.into_iter().map(GroupRow::into_group).collect())
    }
}
