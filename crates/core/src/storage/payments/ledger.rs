//! The stored webhook transactions and their manual reconciliation: an operator credits an
//! `unmatched` or `amount_mismatch` transaction to an order, with an audit row saying who,
//! when and why.

use super::orders::{grant_for_order, OrderRecord, OrderStatus};
use super::PaymentStore;
use crate::domain::Lot;
use crate::storage::{StoreError, StoreResult};
use crate::util::{new_id, now_ms};

/// A stored webhook transaction. `status` is the item's result, or `credited` once an operator
/// reconciled it by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionRecord {
    pub transaction_id: String,
    pub status: String,
    pub kind: String,
    pub amount_vnd: i64,
    pub description: String,
    pub bank: String,
    pub transferred_at: String,
    pub payment_code: Option<String>,
    pub order_id: Option<String>,
    pub user_id: Option<String>,
    pub lot_id: Option<String>,
    pub raw: String,
    pub received_at: i64,
    pub resolved_at: Option<i64>,
}

/// Transaction statuses an operator may credit by hand.
pub const CREDITABLE: [&str; 2] = ["unmatched", "amount_mismatch"];
/// The stored status of a transaction credited by hand.
pub const CREDITED: &str = "credited";

#[derive(Debug, thiserror::Error)]
pub enum CreditError {
    #[error("no transaction with id {0:?}")]
    UnknownTransaction(String),
    #[error("no order with id {0:?}")]
    UnknownOrder(String),
    #[error("order {order} is already paid (by transaction {by})")]
    OrderAlreadyPaid { order: String, by: String },
    #[error(
        "transaction {transaction} is {status}; only unmatched or amount_mismatch transactions \
         can be credited"
    )]
    NotCreditable { transaction: String, status: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CreditError {
    fn from(e: sqlx::Error) -> Self {
        CreditError::Store(StoreError::from_sqlx(e))
    }
}

/// The result of a manual credit.
#[derive(Debug, Clone)]
pub struct Credit {
    pub order: OrderRecord,
    pub transaction: TransactionRecord,
    pub lot: Lot,
    pub audit_id: String,
}

row! {
    /// A `payment_transactions` row as stored.
    struct TransactionRow {
        transaction_id: String,
        status: String,
        kind: String,
        amount_vnd: i64,
        description: String,
        bank: String,
        transferred_at: String,
        payment_code: Option<String>,
        order_id: Option<String>,
        user_id: Option<String>,
        lot_id: Option<String>,
        raw: String,
        received_at: i64,
        resolved_at: Option<i64>,
    }
}

impl From<TransactionRow> for TransactionRecord {
    fn from(r: TransactionRow) -> TransactionRecord {
        TransactionRecord {
            transaction_id: r.transaction_id,
            status: r.status,
            kind: r.kind,
            amount_vnd: r.amount_vnd,
            description: r.description,
            bank: r.bank,
            transferred_at: r.transferred_at,
            payment_code: r.payment_code,
            order_id: r.order_id,
            user_id: r.user_id,
            lot_id: r.lot_id,
            raw: r.raw,
            received_at: r.received_at,
            resolved_at: r.resolved_at,
        }
    }
}

/// `SELECT` of a `TransactionRow` followed by `$rest`.
macro_rules! select_transaction {
    ($rest:literal) => {
        concat!(
            "SELECT transaction_id, status, kind, amount_vnd, description, bank, \
             transferred_at, payment_code, order_id, user_id, lot_id, raw, received_at, \
             resolved_at FROM payment_transactions ",
            $rest
        )
    };
}

pub(crate) mod sql {
    queries! {
        BY_ID -> super::TransactionRow = select_transaction!("WHERE transaction_id = $1");
        CLAIM_FOR_CREDIT = "UPDATE payment_transactions SET status = $1, order_id = $2, \
             user_id = $3, resolved_at = $4 WHERE transaction_id = $5 AND status = $6";
        PAY_ORDER = "UPDATE payment_orders SET status = 'paid', paid_at = $1, \
             transaction_id = $2 WHERE id = $3 AND status <> 'paid'";
        SET_LOT = "UPDATE payment_transactions SET lot_id = $1 WHERE transaction_id = $2";
        AUDIT_CREDIT = "INSERT INTO payment_audit (id, action, transaction_id, order_id, actor, \
             reason, previous_transaction_status, previous_order_status, lot_id, created_at) \
             VALUES ($1, 'credit', $2, $3, $4, $5, $6, $7, $8, $9)";
    }
}

/// Transactions whose status is any of `statuses` (`$1..$statuses`), newest first, at most
/// `$statuses+1`.
fn with_statuses_sql(statuses: usize) -> String {
    let marks: Vec<String> = (1..=statuses).map(|n| format!("${n}")).collect();
    format!(
        concat!(
            select_transaction!("WHERE status IN ({}) "),
            "ORDER BY received_at DESC, transaction_id LIMIT ${}"
        ),
        marks.join(", "),
        statuses + 1
    )
}

/// The statements built per call, at one and at two statuses (as `CREDITABLE` asks).
#[cfg(test)]
pub(super) fn built_statements() -> Vec<(
    String,
    String,
    Option<&'static [crate::storage::check::Column]>,
)> {
    use crate::storage::check::Shape;
    [1, CREDITABLE.len()]
        .into_iter()
        .map(|n| {
            (
                format!("WITH_STATUSES({n})"),
                with_statuses_sql(n),
                Some(<TransactionRow as Shape>::COLUMNS),
            )
        })
        .collect()
}

impl PaymentStore<'_> {
    pub async fn transaction(&self, id: &str) -> StoreResult<Option<TransactionRecord>> {
        let row = sqlx::query_as::<_, TransactionRow>(sql::BY_ID)
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        Ok(row.map(TransactionRecord::from))
    }

    /// Transactions with any of `statuses`, newest first.
    pub async fn transactions(
        &self,
        statuses: &[&str],
        limit: i64,
    ) -> StoreResult<Vec<TransactionRecord>> {
        if statuses.is_empty() {
            return Ok(vec![]);
        }
        let sql = with_statuses_sql(statuses.len());
        let mut q = sqlx::query_as::<_, TransactionRow>(&sql);
        for s in statuses {
            q = q.bind(*s);
        }
        let rows = q.bind(limit).fetch_all(&self.db.pool).await?;
        Ok(rows.into_iter().map(TransactionRecord::from).collect())
    }

    /// Credits an `unmatched` or `amount_mismatch` transaction to an order that is not paid:
    /// the order becomes `paid`, its lot is granted, the transaction becomes `credited`, and an
    /// audit row records who, when and why, all in one transaction. Both status changes are
    /// guarded, so two operators crediting at once cannot grant twice.
    pub async fn credit(
        &self,
        transaction_id: &str,
        order_id: &str,
        actor: &str,
        reason: &str,
        lot_days: u64,
    ) -> Result<Credit, CreditError> {
        let before = self
            .transaction(transaction_id)
            .await?
            .ok_or_else(|| CreditError::UnknownTransaction(transaction_id.to_string()))?;
        if !CREDITABLE.contains(&before.status.as_str()) {
            return Err(CreditError::NotCreditable {
                transaction: transaction_id.to_string(),
                status: before.status,
            });
        }
        let order = self
            .order(order_id)
            .await?
            .ok_or_else(|| CreditError::UnknownOrder(order_id.to_string()))?;
        if order.status == OrderStatus::Paid {
            return Err(already_paid(&order));
        }

        let now = now_ms();
        let mut tx = self.db.pool.begin().await?;
        let claimed = sqlx::query(sql::CLAIM_FOR_CREDIT)
            .bind(CREDITED)
            .bind(&order.id)
            .bind(&order.user_id)
            .bind(now)
            .bind(transaction_id)
            .bind(&before.status)
            .execute(&mut *tx)
            .await?;
        if claimed.rows_affected() == 0 {
            drop(tx);
            let status = self
                .transaction(transaction_id)
                .await?
                .map(|t| t.status)
                .unwrap_or_default();
            return Err(CreditError::NotCreditable {
                transaction: transaction_id.to_string(),
                status,
            });
        }
        let paid = sqlx::query(sql::PAY_ORDER)
            .bind(now)
            .bind(transaction_id)
            .bind(&order.id)
            .execute(&mut *tx)
            .await?;
        if paid.rows_affected() == 0 {
            drop(tx);
            let now_order = self.order(order_id).await?.unwrap_or(order);
            return Err(already_paid(&now_order));
        }
        let lot = grant_for_order(&mut tx, &order, lot_days).await?;
        sqlx::query(sql::SET_LOT)
            .bind(&lot.id)
            .bind(transaction_id)
            .execute(&mut *tx)
            .await?;
        let audit_id = new_id("aud");
        sqlx::query(sql::AUDIT_CREDIT)
            .bind(&audit_id)
            .bind(transaction_id)
            .bind(&order.id)
            .bind(actor)
            .bind(reason)
            .bind(&before.status)
            .bind(order.status.as_str())
            .bind(&lot.id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;

        let order = self.order(order_id).await?.ok_or(StoreError::NotFound)?;
        let transaction = self
            .transaction(transaction_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        Ok(Credit {
            order,
            transaction,
            lot,
            audit_id,
        })
    }
}

fn already_paid(order: &OrderRecord) -> CreditError {
    CreditError::OrderAlreadyPaid {
        order: order.id.clone(),
        by: order
            .transaction_id
            .clone()
            .unwrap_or_else(|| "unknown".into()),
    }
}
