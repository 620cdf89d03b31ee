//! Webhook items: each is claimed under its bank transaction id, then matched to an order code
//! or a personal code in the same transaction (see the parent module's doc).

use super::codes::Candidates;
use super::orders::{self, grant_for_order, insert_order, OrderRecord, OrderRow, OrderStatus};
use super::{i, u, PaymentStore, Tx};
use crate::domain::{Lot, LotKind};
use crate::storage::{StoreError, StoreResult};
use crate::util::{new_id, now_ms};

/// A webhook item that passed the schema check.
#[derive(Debug, Clone)]
pub struct IncomingItem {
    pub transaction_id: String,
    /// `IN` for money received; anything else is ignored.
    pub kind: String,
    pub amount_vnd: i64,
    pub description: String,
    pub bank: String,
    /// The bank's `YYYY-MM-DD HH:MM:SS`, kept as sent.
    pub date: String,
    /// The item exactly as received (re-serialised JSON), for audit.
    pub raw: String,
}

/// How matched payments are turned into lots, from `[payment]` at processing time.
#[derive(Debug, Clone)]
pub struct MatchRules {
    pub lot_days: u64,
    /// The largest amount an item may carry (`[payment] max_webhook_amount_vnd`); an `IN`
    /// amount above it or not positive is `amount_mismatch`, and nothing is stored.
    pub max_amount_vnd: i64,
    /// Price of personal-code top-ups; `None` or 0 leaves such transfers `unmatched`.
    pub token_price_vnd_per_million: Option<u64>,
}

/// The result status of one webhook item (CONTRACT §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemStatus {
    Matched,
    Duplicate,
    AmountMismatch,
    Unmatched,
    Ignored,
}

impl ItemStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ItemStatus::Matched => "matched",
            ItemStatus::Duplicate => "duplicate",
            ItemStatus::AmountMismatch => "amount_mismatch",
            ItemStatus::Unmatched => "unmatched",
            ItemStatus::Ignored => "ignored",
        }
    }
}

/// What became of one item.
#[derive(Debug, Clone)]
pub struct ItemOutcome {
    pub status: ItemStatus,
    pub payment_code: Option<String>,
    pub order_id: Option<String>,
    pub user_id: Option<String>,
    pub lot: Option<Lot>,
}

impl ItemOutcome {
    fn plain(status: ItemStatus) -> ItemOutcome {
        ItemOutcome {
            status,
            payment_code: None,
            order_id: None,
            user_id: None,
            lot: None,
        }
    }
}

pub(crate) mod sql {
    queries! {
        /// The idempotency claim: a second delivery of the id fails on the primary key.
        CLAIM = "INSERT INTO payment_transactions (transaction_id, status, kind, amount_vnd, \
             description, bank, transferred_at, raw, received_at) \
             VALUES ($1, 'processing', $2, $3, $4, $5, $6, $7, $8)";
        RECORD_OUTCOME = "UPDATE payment_transactions SET status = $1, payment_code = $2, \
             order_id = $3, user_id = $4, lot_id = $5 WHERE transaction_id = $6";
        EXPIRE_ORDER =
            "UPDATE payment_orders SET status = 'expired' WHERE id = $1 AND status = 'pending'";
        PAY_ORDER = "UPDATE payment_orders SET status = 'paid', paid_at = $1, \
             transaction_id = $2 WHERE id = $3 AND status = 'pending'";
        USER_BY_PERSONAL_CODE -> String = "SELECT id FROM users WHERE payment_code = $1";
    }
}

impl PaymentStore<'_> {
    /// Processes one webhook item in its own transaction (see the module doc). `candidates` are
    /// the codes found in its description. An amount outside `1..=rules.max_amount_vnd` stores
    /// nothing and is answered with CONTRACT §3's statuses: `amount_mismatch` for an `IN`
    /// item (no order or price can match it), `ignored` for any other. An `Err` means nothing
    /// was stored.
    pub async fn process_item(
        &self,
        item: &IncomingItem,
        candidates: &Candidates,
        rules: &MatchRules,
    ) -> StoreResult<ItemOutcome> {
        // Nothing is stored of an amount no bank sends: it could only be a forged or broken
        // notification, and amounts near the integer limits would overflow what they buy.
        if !amount_in_range(item, rules) {
            return Ok(ItemOutcome::plain(if item.kind == "IN" {
                ItemStatus::AmountMismatch
            } else {
                ItemStatus::Ignored
            }));
        }
        let now = now_ms();
        let mut tx = self.db.pool.begin().await?;
        // The claim comes first: it is the idempotency check, and as a write it also makes
        // SQLite take its write lock at once. On Postgres a concurrent insert of the same id
        // waits here until the first commits, then fails as a duplicate.
        let inserted = sqlx::query(sql::CLAIM)
            .bind(&item.transaction_id)
            .bind(&item.kind)
            .bind(item.amount_vnd)
            .bind(&item.description)
            .bind(&item.bank)
            .bind(&item.date)
            .bind(&item.raw)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from_sqlx);
        match inserted {
            Ok(_) => {}
            Err(StoreError::Conflict(_)) => {
                drop(tx);
                let first = self.transaction(&item.transaction_id).await?;
                return Ok(ItemOutcome {
                    status: ItemStatus::Duplicate,
                    payment_code: first.as_ref().and_then(|t| t.payment_code.clone()),
                    order_id: first.as_ref().and_then(|t| t.order_id.clone()),
                    user_id: None,
                    lot: None,
                });
            }
            Err(e) => return Err(e),
        }

        let outcome = if item.kind != "IN" {
            ItemOutcome::plain(ItemStatus::Ignored)
        } else {
            resolve(&mut tx, item, candidates, rules, now).await?
        };

        sqlx::query(sql::RECORD_OUTCOME)
            .bind(outcome.status.as_str())
            .bind(&outcome.payment_code)
            .bind(&outcome.order_id)
            .bind(&outcome.user_id)
            .bind(outcome.lot.as_ref().map(|l| l.id.clone()))
            .bind(&item.transaction_id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(outcome)
    }
}

/// Whether the item's amount is one a bank could send for a payment: from 1 to the configured
/// largest.
pub fn amount_in_range(item: &IncomingItem, rules: &MatchRules) -> bool {
    (1..=rules.max_amount_vnd).contains(&item.amount_vnd)
}

/// Decides an `IN` item inside its transaction: an order code first (the first one in the
/// description that names an order), then a personal code.
///
/// - pending order, amount at least the order's: `matched`, order `paid`, lot granted. Paying
///   more than asked still buys the order (the surplus stays on record in the transaction).
/// - pending order, less than its amount: `amount_mismatch`; the order stays pending.
/// - order already paid, cancelled by its owner, or expired (also when it expires at this
///   moment): `unmatched` with the order named, for an operator to refund or `payment credit`.
/// - personal code: tokens at the configured price, floor; `unmatched` when no price is set or
///   the amount buys nothing.
async fn resolve(
    tx: &mut Tx<'_>,
    item: &IncomingItem,
    candidates: &Candidates,
    rules: &MatchRules,
    now: i64,
) -> StoreResult<ItemOutcome> {
    for code in &candidates.orders {
        let row = sqlx::query_as::<_, OrderRow>(orders::sql::BY_CODE)
            .bind(code)
            .fetch_optional(&mut **tx)
            .await?;
        let Some(row) = row else { continue };
        let order = OrderRecord::try_from(row)?;
        let mut out = ItemOutcome {
            status: ItemStatus::Unmatched,
            payment_code: Some(code.clone()),
            order_id: Some(order.id.clone()),
            user_id: Some(order.user_id.clone()),
            lot: None,
        };
        match order.status_at(now) {
            OrderStatus::Paid | OrderStatus::Cancelled => {}
            OrderStatus::Expired => {
                if order.status == OrderStatus::Pending {
                    sqlx::query(sql::EXPIRE_ORDER)
                        .bind(&order.id)
                        .execute(&mut **tx)
                        .await?;
                }
            }
            OrderStatus::Pending if item.amount_vnd < i(order.amount_vnd) => {
                out.status = ItemStatus::AmountMismatch;
            }
            OrderStatus::Pending => {
                let paid = sqlx::query(sql::PAY_ORDER)
                    .bind(now)
                    .bind(&item.transaction_id)
                    .bind(&order.id)
                    .execute(&mut **tx)
                    .await?;
                // Zero rows: another transfer paid it a moment ago; this one stays unmatched.
                if paid.rows_affected() == 1 {
                    out.lot = Some(grant_for_order(tx, &order, rules.lot_days).await?);
                    out.status = ItemStatus::Matched;
                }
            }
        }
        return Ok(out);
    }

    for code in &candidates.personal {
        let user_id: Option<String> = sqlx::query_scalar(sql::USER_BY_PERSONAL_CODE)
            .bind(code)
            .fetch_optional(&mut **tx)
            .await?;
        let Some(user_id) = user_id else { continue };
        let mut out = ItemOutcome {
            status: ItemStatus::Unmatched,
            payment_code: Some(code.clone()),
            order_id: None,
            user_id: Some(user_id.clone()),
            lot: None,
        };
        let tokens = match rules.token_price_vnd_per_million {
            Some(price) if price > 0 && item.amount_vnd > 0 => {
                let t = u128::from(u(item.amount_vnd)) * 1_000_000 / u128::from(price);
                u64::try_from(t).unwrap_or(u64::MAX).min(i64::MAX as u64)
            }
            _ => 0,
        };
        if tokens == 0 {
            return Ok(out);
        }
        // A top-up is recorded as an order paid on arrival, so it shows in the account's
        // history and names its lot like any purchase.
        let order = OrderRecord {
            id: new_id("ord"),
            user_id: user_id.clone(),
            package_id: None,
            kind: LotKind::Token,
            quantity: tokens,
            tier: None,
            amount_vnd: u(item.amount_vnd),
            payment_code: None,
            personal_code: Some(code.clone()),
            status: OrderStatus::Paid,
            created_at: now,
            expires_at: now,
            paid_at: Some(now),
            transaction_id: Some(item.transaction_id.clone()),
            lot_id: None,
        };
        insert_order(tx, &order).await?;
        out.lot = Some(grant_for_order(tx, &order, rules.lot_days).await?);
        out.order_id = Some(order.id);
        out.status = ItemStatus::Matched;
        return Ok(out);
    }

    Ok(ItemOutcome::plain(ItemStatus::Unmatched))
}
