//! Payments by bank transfer: orders, the webhook's transactions and the manual-credit audit
//! trail (spec §2.5-§2.7, §4.4; CONTRACT §3).
//!
//! Money moves exactly once. Every webhook item is first inserted under its bank transaction id
//! (the primary key), so a resent or concurrently delivered item fails that insert and is a
//! `duplicate`; the order update (`pending` -> `paid`, guarded by its current status), the lot
//! grant and the transaction row commit together or not at all. A storage failure leaves
//! nothing behind, so the sender's retry starts from scratch.
//!
//! Payment codes are the configured prefix plus characters from an alphabet without look-alikes
//! (no 0/O/1/I/L), drawn from the CSPRNG. Order codes have `ORDER_CODE_LEN` characters after
//! the prefix and personal codes `PERSONAL_CODE_LEN`, so a description is scanned with one
//! fixed window per kind, whatever the bank glued around the code.

use rand::Rng;
use sqlx::Row;

use super::quota::QuotaStore;

use super::{Db, StoreError, StoreResult};
use crate::domain::Tier;
use crate::domain::{Lot, LotKind};
use crate::util::{new_id, now_ms};

/// Characters of a payment code after its prefix: uppercase letters and digits that cannot be
/// misread when typed into a banking app (no 0/O, 1/I/L).
pub const CODE_ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";
/// Characters after the prefix of an order's code (31^8, about 8.5e11 codes).
pub const ORDER_CODE_LEN: usize = 8;
/// Characters after the prefix of a personal code; longer than order codes so the two kinds
/// never read as each other.
pub const PERSONAL_CODE_LEN: usize = 10;
/// Codes are redrawn this many times on a unique-constraint collision before giving up.
const CODE_ATTEMPTS: usize = 6;
/// At most this many candidate codes are looked up per description.
const MAX_CANDIDATES: usize = 8;
const HOUR_MS: i64 = 3_600_000;

/// A fresh code: `prefix` plus `len` characters of `CODE_ALPHABET` from the thread CSPRNG.
pub fn new_payment_code(prefix: &str, len: usize) -> String {
    let mut rng = rand::rng();
    let mut code = String::with_capacity(prefix.len() + len);
    code.push_str(prefix);
    for _ in 0..len {
        code.push(CODE_ALPHABET[rng.random_range(0..CODE_ALPHABET.len())] as char);
    }
    code
}

/// Codes a transfer description may carry, in the order they appear.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidates {
    pub orders: Vec<String>,
    pub personal: Vec<String>,
}

/// Finds every `prefix` occurrence (case-insensitively) and reads the fixed-length window after
/// it as an order code and as a personal code, when the window is all code characters. Banks
/// add references, names and punctuation around the code, sometimes without a space, so no
/// word boundary is required on either side.
pub fn find_codes(description: &str, prefix: &str) -> Candidates {
    let text: Vec<u8> = description
        .bytes()
        .map(|b| b.to_ascii_uppercase())
        .collect();
    let prefix = prefix.as_bytes();
    let mut out = Candidates::default();
    if prefix.is_empty() || text.len() < prefix.len() {
        return out;
    }
    let window = |start: usize, len: usize| -> Option<String> {
        let w = text.get(start..start + len)?;
        w.iter().all(|b| CODE_ALPHABET.contains(b)).then(|| {
            format!(
                "{}{}",
                String::from_utf8_lossy(prefix),
                String::from_utf8_lossy(w)
            )
        })
    };
    for at in 0..=(text.len() - prefix.len()) {
        if &text[at..at + prefix.len()] != prefix {
            continue;
        }
        let body = at + prefix.len();
        if let Some(code) = window(body, ORDER_CODE_LEN) {
            if out.orders.len() < MAX_CANDIDATES && !out.orders.contains(&code) {
                out.orders.push(code);
            }
        }
        if let Some(code) = window(body, PERSONAL_CODE_LEN) {
            if out.personal.len() < MAX_CANDIDATES && !out.personal.contains(&code) {
                out.personal.push(code);
            }
        }
    }
    out
}

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

const ORDER_COLUMNS: &str = "id, user_id, package_id, kind, quantity, tier, amount_vnd, \
     payment_code, personal_code, status, created_at, expires_at, paid_at, transaction_id, lot_id";

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn order_from_row(row: &sqlx::any::AnyRow) -> StoreResult<OrderRecord> {
    let kind: String = row.try_get("kind")?;
    let tier: Option<String> = row.try_get("tier")?;
    let status: String = row.try_get("status")?;
    Ok(OrderRecord {
        id: row.try_get("id")?,
        user_id: row.try_get("user_id")?,
        package_id: row.try_get("package_id")?,
        kind: LotKind::parse(&kind)
            .ok_or_else(|| StoreError::Invalid(format!("order with unknown kind {kind:?}")))?,
        quantity: u(row.try_get("quantity")?),
        tier: tier.as_deref().and_then(Tier::parse),
        amount_vnd: u(row.try_get("amount_vnd")?),
        payment_code: row.try_get("payment_code")?,
        personal_code: row.try_get("personal_code")?,
        status: OrderStatus::parse(&status)
            .ok_or_else(|| StoreError::Invalid(format!("order with unknown status {status:?}")))?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        paid_at: row.try_get("paid_at")?,
        transaction_id: row.try_get("transaction_id")?,
        lot_id: row.try_get("lot_id")?,
    })
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

const TX_COLUMNS: &str = "transaction_id, status, kind, amount_vnd, description, bank, \
     transferred_at, payment_code, order_id, user_id, lot_id, raw, received_at, resolved_at";

fn tx_from_row(row: &sqlx::any::AnyRow) -> StoreResult<TransactionRecord> {
    Ok(TransactionRecord {
        transaction_id: row.try_get("transaction_id")?,
        status: row.try_get("status")?,
        kind: row.try_get("kind")?,
        amount_vnd: row.try_get("amount_vnd")?,
        description: row.try_get("description")?,
        bank: row.try_get("bank")?,
        transferred_at: row.try_get("transferred_at")?,
        payment_code: row.try_get("payment_code")?,
        order_id: row.try_get("order_id")?,
        user_id: row.try_get("user_id")?,
        lot_id: row.try_get("lot_id")?,
        raw: row.try_get("raw")?,
        received_at: row.try_get("received_at")?,
        resolved_at: row.try_get("resolved_at")?,
    })
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

pub struct PaymentStore<'a> {
    pub(super) db: &'a Db,
}

type Tx<'c> = sqlx::Transaction<'c, sqlx::Any>;

impl PaymentStore<'_> {
    // -----------------------------------------------------------------------------------------
    // Orders

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
        // A no-op write: a row lock on Postgres, the write lock on SQLite.
        let locked = sqlx::query("UPDATE users SET updated_at = updated_at WHERE id = $1")
            .bind(&new.user_id)
            .execute(&mut *tx)
            .await?;
        if locked.rows_affected() == 0 {
            return Err(StoreError::NotFound.into());
        }
        let pending = count(
            &mut tx,
            "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM payment_orders \
             WHERE user_id = $1 AND status = 'pending' AND expires_at > $2",
            &new.user_id,
            now,
        )
        .await?;
        if pending >= i64::from(rules.max_pending) {
            return Err(OrderError::TooManyPending);
        }
        let recent = count(
            &mut tx,
            "SELECT CAST(COUNT(*) AS BIGINT) AS n FROM payment_orders \
             WHERE user_id = $1 AND created_at > $2 AND payment_code IS NOT NULL",
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
        sqlx::query(
            "UPDATE payment_orders SET status = 'expired' \
             WHERE user_id = $1 AND status = 'pending' AND expires_at <= $2",
        )
        .bind(user_id)
        .bind(now)
        .execute(&self.db.pool)
        .await?;
        let rows = sqlx::query(&format!(
            "SELECT {ORDER_COLUMNS} FROM payment_orders WHERE user_id = $1 \
             ORDER BY created_at DESC, id DESC LIMIT $2"
        ))
        .bind(user_id)
        .bind(limit)
        .fetch_all(&self.db.pool)
        .await?;
        rows.iter().map(order_from_row).collect()
    }

    pub async fn order(&self, id: &str) -> StoreResult<Option<OrderRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {ORDER_COLUMNS} FROM payment_orders WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await?;
        row.as_ref().map(order_from_row).transpose()
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
        let cancelled = sqlx::query(
            "UPDATE payment_orders SET status = 'cancelled' \
             WHERE id = $1 AND user_id = $2 AND status = 'pending' AND expires_at > $3 \
             AND payment_code IS NOT NULL",
        )
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
        let r = sqlx::query(
            "UPDATE payment_orders SET status = 'expired' \
             WHERE status = 'pending' AND expires_at <= $1",
        )
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
            let r = sqlx::query(
                "UPDATE users SET payment_code = $1 WHERE id = $2 AND payment_code IS NULL",
            )
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
        let row = sqlx::query("SELECT payment_code FROM users WHERE id = $1")
            .bind(user_id)
            .fetch_optional(&self.db.pool)
            .await?;
        match row {
            None => Err(StoreError::NotFound),
            Some(r) => Ok(r.try_get::<Option<String>, _>("payment_code")?),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Webhook items

    /// Processes one webhook item in its own transaction (see the module doc). `candidates` are
    /// the codes found in its description. An `Err` means nothing was stored.
    pub async fn process_item(
        &self,
        item: &IncomingItem,
        candidates: &Candidates,
        rules: &MatchRules,
    ) -> StoreResult<ItemOutcome> {
        let now = now_ms();
        let mut tx = self.db.pool.begin().await?;
        // The claim comes first: it is the idempotency check, and as a write it also makes
        // SQLite take its write lock at once. On Postgres a concurrent insert of the same id
        // waits here until the first commits, then fails as a duplicate.
        let inserted = sqlx::query(
            "INSERT INTO payment_transactions (transaction_id, status, kind, amount_vnd, \
             description, bank, transferred_at, raw, received_at) \
             VALUES ($1, 'processing', $2, $3, $4, $5, $6, $7, $8)",
        )
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

        sqlx::query(
            "UPDATE payment_transactions SET status = $1, payment_code = $2, order_id = $3, \
             user_id = $4, lot_id = $5 WHERE transaction_id = $6",
        )
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

    pub async fn transaction(&self, id: &str) -> StoreResult<Option<TransactionRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {TX_COLUMNS} FROM payment_transactions WHERE transaction_id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.db.pool)
        .await?;
        row.as_ref().map(tx_from_row).transpose()
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
        let marks: Vec<String> = (1..=statuses.len()).map(|n| format!("${n}")).collect();
        let sql = format!(
            "SELECT {TX_COLUMNS} FROM payment_transactions WHERE status IN ({}) \
             ORDER BY received_at DESC, transaction_id LIMIT ${}",
            marks.join(", "),
            statuses.len() + 1
        );
        let mut q = sqlx::query(&sql);
        for s in statuses {
            q = q.bind(*s);
        }
        let rows = q.bind(limit).fetch_all(&self.db.pool).await?;
        rows.iter().map(tx_from_row).collect()
    }

    // -----------------------------------------------------------------------------------------
    // Manual reconciliation

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
        let claimed = sqlx::query(
            "UPDATE payment_transactions SET status = $1, order_id = $2, user_id = $3, \
             resolved_at = $4 WHERE transaction_id = $5 AND status = $6",
        )
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
        let paid = sqlx::query(
            "UPDATE payment_orders SET status = 'paid', paid_at = $1, transaction_id = $2 \
             WHERE id = $3 AND status <> 'paid'",
        )
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
        sqlx::query("UPDATE payment_transactions SET lot_id = $1 WHERE transaction_id = $2")
            .bind(&lot.id)
            .bind(transaction_id)
            .execute(&mut *tx)
            .await?;
        let audit_id = new_id("aud");
        sqlx::query(
            "INSERT INTO payment_audit (id, action, transaction_id, order_id, actor, reason, \
             previous_transaction_status, previous_order_status, lot_id, created_at) \
             VALUES ($1, 'credit', $2, $3, $4, $5, $6, $7, $8, $9)",
        )
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

async fn count(tx: &mut Tx<'_>, sql: &str, user_id: &str, at: i64) -> StoreResult<i64> {
    let row = sqlx::query(sql)
        .bind(user_id)
        .bind(at)
        .fetch_one(&mut **tx)
        .await?;
    Ok(row.try_get("n")?)
}

async fn insert_order(tx: &mut Tx<'_>, o: &OrderRecord) -> StoreResult<()> {
    sqlx::query(&format!(
        "INSERT INTO payment_orders ({ORDER_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
    ))
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
async fn grant_for_order(tx: &mut Tx<'_>, order: &OrderRecord, lot_days: u64) -> StoreResult<Lot> {
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
    sqlx::query("UPDATE payment_orders SET lot_id = $1 WHERE id = $2")
        .bind(&lot.id)
        .bind(&order.id)
        .execute(&mut **tx)
        .await?;
    Ok(lot)
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
        let row = sqlx::query(&format!(
            "SELECT {ORDER_COLUMNS} FROM payment_orders WHERE payment_code = $1"
        ))
        .bind(code)
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else { continue };
        let order = order_from_row(&row)?;
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
                    sqlx::query(
                        "UPDATE payment_orders SET status = 'expired' \
                         WHERE id = $1 AND status = 'pending'",
                    )
                    .bind(&order.id)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            OrderStatus::Pending if item.amount_vnd < i(order.amount_vnd) => {
                out.status = ItemStatus::AmountMismatch;
            }
            OrderStatus::Pending => {
                let paid = sqlx::query(
                    "UPDATE payment_orders SET status = 'paid', paid_at = $1, transaction_id = $2 \
                     WHERE id = $3 AND status = 'pending'",
                )
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
        let row = sqlx::query("SELECT id FROM users WHERE payment_code = $1")
            .bind(code)
            .fetch_optional(&mut **tx)
            .await?;
        let Some(row) = row else { continue };
        let user_id: String = row.try_get("id")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_use_the_unambiguous_alphabet() {
        for _ in 0..200 {
            let c = new_payment_code("GW", ORDER_CODE_LEN);
            assert_eq!(c.len(), 2 + ORDER_CODE_LEN);
            assert!(c.starts_with("GW"));
            assert!(!c[2..].contains(['0', 'O', '1', 'I', 'L']), "{c}");
            assert!(c[2..].bytes().all(|b| CODE_ALPHABET.contains(&b)));
        }
    }

    #[test]
    fn codes_are_found_in_noise() {
        let c = find_codes("CT DEN:12345 gwabc23456 chuyen tien FT2411", "GW");
        assert_eq!(c.orders, vec!["GWABC23456".to_string()]);
        assert!(c.personal.is_empty(), "window runs into a space");
        // Glued on both sides, lowercase, punctuation.
        let c = find_codes("MBVCB.123.xgwKQ2MXA3Zfoo.CT", "GW");
        assert_eq!(c.orders, vec!["GWKQ2MXA3Z".to_string()]);
        assert!(c.personal.is_empty(), "O is not a code character");
        // Characters outside the alphabet end a window.
        assert!(find_codes("GW0OIL1234", "GW").orders.is_empty());
        // A personal code also yields its first eight characters as an order candidate.
        let c = find_codes("nap tien GWABCDEFGHJK", "GW");
        assert_eq!(c.personal, vec!["GWABCDEFGHJK".to_string()]);
        assert_eq!(c.orders, vec!["GWABCDEFGH".to_string()]);
        assert!(find_codes("", "GW").orders.is_empty());
        assert!(find_codes("G", "GW").orders.is_empty());
    }

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
