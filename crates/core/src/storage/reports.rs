//! Operator usage reports (`gateway usage report`): requests and tokens summed per UTC day,
//! model or account over a range of whole days, read from the hourly rollup that every usage
//! batch keeps in step with its events (so a report never scans raw events).

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

row! {
    /// One group's sums.
    struct GroupRow {
        k: String,
        requests: i64,
        input_tokens: i64,
        output_tokens: i64,
        total_tokens: i64,
    }
}

impl GroupRow {
    fn into_group(self) -> (String, UsageTotals) {
        let totals = UsageTotals {
            requests: u(self.requests),
            input_tokens: u(self.input_tokens),
            output_tokens: u(self.output_tokens),
            total_tokens: u(self.total_tokens),
        };
        (self.k, totals)
    }
}

/// The report statement: `$select` (text on both databases, so one row struct serves every
/// grouping) grouped by `$group`, over hours `$1..$2`, then `$account` (empty, or the filter
/// on `$3`).
macro_rules! report {
    ($select:literal, $group:literal, $account:literal) => {
        concat!(
            "SELECT ",
            $select,
            " AS k, CAST(SUM(r.requests) AS BIGINT) AS requests, \
             CAST(SUM(r.input_tokens) AS BIGINT) AS input_tokens, \
             CAST(SUM(r.output_tokens) AS BIGINT) AS output_tokens, \
             CAST(SUM(r.total_tokens) AS BIGINT) AS total_tokens \
             FROM usage_rollup r LEFT JOIN users u ON u.id = r.user_id \
             WHERE r.hour >= $1 AND r.hour < $2",
            $account,
            " GROUP BY ",
            $group
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
    /// one row per group, in no particular order.
    pub async fn usage(
        &self,
        grouping: Grouping,
        from_hour: i64,
        until_hour: i64,
        user_id: Option<&str>,
    ) -> StoreResult<Vec<(String, UsageTotals)>> {
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
