//! Payments by bank transfer: orders, the webhook's transactions and the manual-credit audit
//! trail (spec §2.5-§2.7, §4.4; CONTRACT §3).
//!
//! Money moves exactly once. Every webhook item is first inserted under its bank transaction id
//! (the primary key), so a resent or concurrently delivered item fails that insert and is a
//! `duplicate`; the order update (`pending` -> `paid`, guarded by its current status), the lot
//! grant and the transaction row commit together or not at all. A storage failure leaves
//! nothing behind, so the sender's retry starts from scratch.
//!
//! - `codes`: payment codes and finding them in a transfer description;
//! - `orders`: orders an account creates, cancels and pays, and its personal code;
//! - `webhook`: one webhook item, matched to an order or a personal code;
//! - `ledger`: stored transactions and their manual reconciliation.

mod codes;
mod ledger;
mod orders;
mod webhook;

pub use codes::{
    find_codes, new_payment_code, Candidates, CODE_ALPHABET, ORDER_CODE_LEN, PERSONAL_CODE_LEN,
};
pub use ledger::{Credit, CreditError, TransactionRecord, CREDITABLE, CREDITED};
pub use orders::{CancelError, NewOrder, OrderError, OrderRecord, OrderRules, OrderStatus};
pub use webhook::{amount_in_range, IncomingItem, ItemOutcome, ItemStatus, MatchRules};

use super::Db;

pub struct PaymentStore<'a> {
    pub(super) db: &'a Db,
}

type Tx<'c> = sqlx::Transaction<'c, sqlx::Any>;

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Every statement of the payment stores, for `storage::check`.
#[cfg(test)]
pub(crate) const STATEMENTS: [&[super::check::Query]; 3] =
    [orders::sql::ALL, webhook::sql::ALL, ledger::sql::ALL];

/// The statements built per call, for `storage::check`.
#[cfg(test)]
pub(crate) fn built_statements() -> Vec<(String, String, Option<&'static [super::check::Column]>)> {
    ledger::built_statements()
}
