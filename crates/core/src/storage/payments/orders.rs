//! Orders: created by an account (with a fresh code, within its limits), cancelled by it,
//! expired by time, paid by the webhook or by hand; and the account's personal code, which pays
//! for top-ups without an order.

use super::codes::{new_payment_code, CODE_ATTEMPTS, ORDER_CODE_LEN, PERSONAL_CODE_LEN};
use super::{i, u, PaymentStore, Tx};
use crate::domain::{Lot, LotKind, Tier};
use crate::storage::quota::{QuotaStore, HOUR_MS};
use crate::storage::{StoreError, StoreResult};
use crate::util::{new_id, now_ms};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    Pending,
    Paid,
    Expired,
    /// Withdrawn by its owner while pending; a transfer that arrives later is `unmatched`.
    Cancelled,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "pending",
            OrderStatus::Paid => "paid",
            OrderStatus::Expired => "expired",
            OrderStatus::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<OrderStatus> {
        match s {
            "pending" => Some(OrderStatus::Pending),
            "paid" => Some(OrderStatus::Paid),
            "expired" => Some(OrderStatus::Expired),
            "cancelled" => Some(OrderStatus::Cancelled),
            _ => None,
        }
    }
}

/// One order: what it buys (`kind`, `quantity`, `tier` for packages), what it costs, its code
/// and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRecord {
    pub id: String,
    pub user_id: String,
    pub package_id: Option<String>,
    pub kind: LotKind,
    pub quantity: u64,
    pub tier: Option<Tier>,
    pub amount_vnd: u64,
    /// The order's own code; `None` for top-ups, which came through `personal_code`.
    pub payment_code: Option<String>,
    pub personal_code: Option<String>,
    pub status: OrderStatus,
    pub created_at: i64,
    pub expires_at: i64,
    pub paid_at: Option<i64>,
    pub transaction_id: Option<String>,
    pub lot_id: Option<String>,
}

impl OrderRecord {
    /// The status a reader should see at `now`: a pending order past its expiry is expired even
    /// before a sweep has written it.
    pub fn status_at(&self, now: i64) -> OrderStatus {
        if self.status == OrderStatus::Pending && self.expires_at <= now {
            OrderStatus::Expired
        } else {
            self.status
        }
    }
}

/// What a new order buys and costs; the caller priced it.
#[derive(Debug, Clone)]
pub struct NewOrder {
    pub user_id: String,
    pub package_id: Option<String>,
    pub kind: LotKind,
    pub quantity: u64,
    pub tier: Option<Tier>,
    pub amount_vnd: u64,
}

/// The per-account limits an order must pass, read from `[payment]` at request time.
#[derive(Debug, Clone)]
pub struct OrderRules {
    pub code_prefix: String,
    pub ttl_ms: i64,
    pub max_pending: u32,
    pub per_hour: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("too many pending orders")]
    TooManyPending,
    #[error("too many orders in the last hour")]
    RateLimited,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why an order could not be cancelled.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    /// No such order, or it belongs to another account (the two read the same to the caller).
    #[error("no such order")]
    NotFound,
    /// The order is no longer pending (paid, expired or already cancelled); carries what it is.
    #[error("order is {}", .0.as_str())]
    NotPending(OrderStatus),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CancelError {
    fn from(e: sqlx::Error) -> Self {
        CancelError::Store(StoreError::from_sqlx(e))
    }
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        OrderError::Store(StoreError::from_sqlx(e))
    }
}

row! {
    /// A `payment_orders` row as stored.
    pub(super) struct OrderRow {
        id: String,
        user_id: String,
        package_id: Option<String>,
        kind: String,
        quantity: i64,
        tier: Option<String>,
        amount_vnd: i64,
        payment_code: Option<String>,
        personal_code: Option<String>,
        status: String,
        created_at: i64,
        expires_at: i64,
        paid_at: Option<i64>,
        transaction_id: Option<String>,
        lot_id: Option<String>,
    }
}

impl TryFrom<OrderRow> for OrderRecord {
    type Error = StoreError;

    /// Fails on a kind or status this build does not know (written by a newer one).
    fn try_from(r: OrderRow) -> StoreResult<OrderRecord> {
        let kind = LotKind::parse(&r.kind)
            .ok_or_else(|| StoreError::Invalid(format!("order with unknown kind {:?}", r.kind)))?;
        let status = OrderStatus::parse(&r.status).ok_or_else(|| {
            StoreError::Invalid(format!("order with unknown status {:?}", r.status))
        })?;
        Ok(OrderRecord {
            id: r.id,
            user_id: r.user_id,
            package_id: r.package_id,
            kind,
            quantity: u(r.quantity),
            tier: r.tier.as_deref().and_then(Tier::parse),
            amount_vnd: u(r.amount_vnd),
            payment_code: r.payment_code,
            personal_code: r.personal_code,
            status,
            created_at: r.created_at,
            expires_at: r.expires_at,
            paid_at: r.paid_at,
            transaction_id: r.transaction_id,
            lot_id: r.lot_id,
        })
    }
}

/// `SELECT` of an `OrderRow` followed by `$rest`.
macro_rules! select_order {
    ($rest:literal) => {
        concat!(
            "SELECT id, user_id, package_id, kind, quantity, tier, amount_vnd, payment_code, \
             personal_code, status, created_at, expires_at, paid_at, transaction_id, lot_id \
             FROM payment_orders ",
            $rest
        )
    };
}

pub(crate) mod sql {
    queries! {
        /// A no-op write: a row lock on Postgres, the write lock on SQLite.
        LOCK_USER = "UPDATE users SET updated_at = updated_at WHERE id = $1";
        COUNT_PENDING -> i64 = "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM payment_orders \
             WHERE user_id = $1 AND status = 'pending' AND expires_at > $2";
        COUNT_CREATED_SINCE -> i64 = "SELECT CAST(COUNT(*) AS BIGINT) AS n \
             FROM payment_orders \
             WHERE user_id = $1 AND created_at > $2 AND payment_code IS NOT NULL";
        INSERT = "INSERT INTO payment_orders (id, user_id, package_id, kind, quantity, tier, \
             amount_vnd, payment_code, personal_code, status, created_at, expires_at, paid_at, \
             transaction_id, lot_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";
        EXPIRE_DUE_OF_USER = "UPDATE payment_orders SET status = 'expired' \
             WHERE user_id = $1 AND status = 'pending' AND expires_at <= $2";
        OF_USER -> super::OrderRow =
            select_order!("WHERE user_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2");
        BY_ID -> super::OrderRow = select_order!("WHERE id = $1");
        BY_CODE -> super::OrderRow = select_order!("WHERE payment_code = $1");
        CANCEL = "UPDATE payment_orders SET status = 'cancelled' \
             WHERE id = $1 AND user_id = $2 AND status = 'pending' AND expires_at > $3 \
             AND payment_code IS NOT NULL";
        EXPIRE_DUE = "UPDATE payment_orders SET status = 'expired' \
             WHERE status = 'pending' AND expires_at <= $1";
        SET_PERSONAL_CODE =
            "UPDATE users SET payment_code = $1 WHERE id = $2 AND payment_code IS NULL";
        PERSONAL_CODE -> Option<String> = "SELECT payment_code FROM users WHERE id = $1";
        SET_LOT = "UPDATE payment_orders SET lot_id = $1 WHERE id = $2";
    }
}

impl PaymentStore<'_> {
    /// Creates a pending order with a fresh unique code, unless the account already has
    /// `max_pending` live pending orders (`TooManyPending`) or created `per_hour` orders in the
    /// last hour (`RateLimited`). The account row is locked first, so concurrent requests of
    /// one account (on any instance) are checked one after the other.
    pub async fn create_order(
        &self,
        new: &NewOrder,
        rules: &OrderRules,
    ) -> Result<OrderRecord, OrderError> {
        for _ in 0..CODE_ATTEMPTS {
            let code = new_payment_code(&rules.code_prefix, ORDER_CODE_LEN);
            match self.try_create_order(new, rules, &code).await {
                Err(OrderError::Store(StoreError::Conflict(_))) => continue,
                other => return other,
            }
        }
        Err(StoreError::Invalid("no unique payment code after several draws".into()).into())
    }

    async fn try_create_order(
        &self,
        new: &NewOrder,
        rules: &OrderRules,
        code: &str,
    ) -> Result<OrderRecord, OrderError> {
        let now = now_ms();
        let mut tx = self.db.pool.begin().await?;
        let locked = sqlx::query(sql::LOCK_USER)
            .bind(&new.user_id)
            .execute(&mut *tx)
            .await?;
        if locked.rows_affected() == 0 {
            return Err(StoreError::NotFound.into());
        }
        let pending = count(&mut tx, sql::COUNT_PENDING, &new.user_id, now).await?;
        if pending >= i64::from(rules.max_pending) {
            return Err(OrderError::TooManyPending);
        }
        let recent = count(
            &mut tx,
            sql::COUNT_CREATED_SINCE,
            &new.user_id,
            now - HOUR_MS,
        )
        .await?;
        if recent >= i64::from(rules.per_hour) {
            return Err(OrderError::RateLimited);
        }
        let order = OrderRecord {
            id: new_id("ord"),
            user_id: new.user_id.clone(),
            package_id: new.package_id.clone(),
            kind: new.kind,
            quantity: new.quantity,
            tier: new.tier,
            amount_vnd: new.amount_vnd,
            payment_code: Some(code.to_string()),
            personal_code: None,
            status: OrderStatus::Pending,
            created_at: now,
            expires_at: now.saturating_add(rules.ttl_ms),
            paid_at: None,
            transaction_id: None,
            lot_id: None,
        };
        insert_order(&mut tx, &order).await?;
        tx.commit().await?;
        Ok(order)
    }

    /// The account's orders, newest first (at most `limit`), after expiring its overdue ones.
    pub async fn orders_for_user(
        &self,
        user_id: &str,
        now: i64,
        limit: i64,
    ) -> StoreResult<Vec<OrderRecord>> {
        sqlx::query(sql::EXPIRE_DUE_OF_USER)
            .bind(user_id)
            .bind(now)
            .execute(&self.db.pool)
            .await?;
        let rows = sqlx::query_as::<_, OrderRow>(sql::OF_USER)
            .bind(user_id)
            .bind(limit)
            .fetch_all(&self.db.pool)
            .await?;
        rows.into_iter().map(OrderRecord::try_from).collect()
    }

    pub async fn order(&self, id: &str) -> StoreResult<Option<OrderRecord>> {
        let row = sqlx::query_as::<_, OrderRow>(sql::BY_ID)
            .bind(id)
            .fetch_optional(&self.db.pool)
            .await?;
        row.map(OrderRecord::try_from).transpose()
    }

    /// Cancels `user_id`'s order `id` if it is still pending at `now`. The status change is
    /// guarded by the current status in one statement, so a webhook that pays the order at the
    /// same moment either runs first (the cancel then finds it `paid`) or after (it then finds
    /// the order `cancelled` and records the transfer as `unmatched`); money is never both kept
    /// by a cancelled order and granted.
    pub async fn cancel_order(
        &self,
        user_id: &str,
        id: &str,
        now: i64,
    ) -> Result<OrderRecord, CancelError> {
        let cancelled = sqlx::query(sql::CANCEL)
            .bind(id)
            .bind(user_id)
            .bind(now)
            .execute(&self.db.pool)
            .await?;
        let order = self
            .order(id)
            .await?
            .filter(|o| o.user_id == user_id)
            .ok_or(CancelError::NotFound)?;
        if cancelled.rows_affected() == 1 {
            Ok(order)
        } else {
            Err(CancelError::NotPending(order.status_at(now)))
        }
    }

    /// Marks every overdue pending order expired (the background sweep); returns how many.
    pub async fn expire_due(&self, now: i64) -> StoreResult<u64> {
        let r = sqlx::query(sql::EXPIRE_DUE)
            .bind(now)
            .execute(&self.db.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// The account's personal payment code (spec §2.7), drawn on first need. Two concurrent
    /// first calls agree: only the write that finds the column still empty wins.
    pub async fn personal_code(&self, user_id: &str, prefix: &str) -> StoreResult<String> {
        if let Some(code) = self.stored_personal_code(user_id).await? {
            return Ok(code);
        }
        for _ in 0..CODE_ATTEMPTS {
            let code = new_payment_code(prefix, PERSONAL_CODE_LEN);
            let r = sqlx::query(sql::SET_PERSONAL_CODE)
                .bind(&code)
                .bind(user_id)
                .execute(&self.db.pool)
                .await
                .map_err(StoreError::from_sqlx);
            match r {
                Ok(r) if r.rows_affected() == 1 => return Ok(code),
                Ok(_) => {
                    return self
                        .stored_personal_code(user_id)
                        .await?
                        .ok_or(StoreError::NotFound)
                }
                Err(StoreError::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Invalid(
            "no unique personal code after several draws".into(),
        ))
    }

    async fn stored_personal_code(&self, user_id: &str) -> StoreResult<Option<String>> {
        let code: Option<Option<String>> = sqlx::query_scalar(sql::PERSONAL_CODE)
            .bind(user_id)
            .fetch_optional(&self.db.pool)
            .await?;
        code.ok_or(StoreError::NotFound)
    }
}

/// Runs one of the order-count statements (`$1` the account, `$2` a time).
async fn count(
    tx: &mut Tx<'_>,
    statement: &'static str,
    user_id: &str,
    at: i64,
) -> StoreResult<i64> {
    Ok(sqlx::query_scalar(statement)
        .bind(user_id)
        .bind(at)
        .fetch_one(&mut **tx)
        .await?)
}

pub(super) async fn insert_order(tx: &mut Tx<'_>, o: &OrderRecord) -> StoreResult<()> {
    sqlx::query(sql::INSERT)
        .bind(&o.id)
        .bind(&o.user_id)
        .bind(&o.package_id)
        .bind(o.kind.as_str())
        .bind(i(o.quantity))
        .bind(o.tier.map(|t| t.as_str()))
        .bind(i(o.amount_vnd))
        .bind(&o.payment_code)
        .bind(&o.personal_code)
        .bind(o.status.as_str())
        .bind(o.created_at)
        .bind(o.expires_at)
        .bind(o.paid_at)
        .bind(&o.transaction_id)
        .bind(&o.lot_id)
        .execute(&mut **tx)
        .await
        .map_err(StoreError::from_sqlx)?;
    Ok(())
}

/// Grants the lot an order buys (a package's lot carries its tier, which is what sets the
/// account's entitlement tier) and records it on the order.
pub(super) async fn grant_for_order(
    tx: &mut Tx<'_>,
    order: &OrderRecord,
    lot_days: u64,
) -> StoreResult<Lot> {
    let lot = QuotaStore::grant_lot_tx(
        tx,
        &order.user_id,
        order.kind,
        order.quantity,
        lot_days,
        order.tier,
        &format!("payment:{}", order.id),
    )
    .await?;
    sqlx::query(sql::SET_LOT)
        .bind(&lot.id)
        .bind(&order.id)
        .execute(&mut **tx)
        .await?;
    Ok(lot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_orders_read_expired_after_their_time() {
        let o = OrderRecord {
            id: "ord_x".into(),
            user_id: "usr_x".into(),
            package_id: None,
            kind: LotKind::Token,
            quantity: 1,
            tier: None,
            amount_vnd: 1,
            payment_code: Some("GWAAAAAAAA".into()),
            personal_code: None,
            status: OrderStatus::Pending,
            created_at: 0,
            expires_at: 100,
            paid_at: None,
            transaction_id: None,
            lot_id: None,
        };
        assert_eq!(o.status_at(99), OrderStatus::Pending);
        assert_eq!(o.status_at(100), OrderStatus::Expired);
    }
}
