//! Orders, webhook transactions and payment settings as the panel and operators see them.

use serde::Serialize;
use serde_json::Value;

use super::catalogue::package;
use super::vietqr::{transfer, Transfer};
use crate::views::{iso_opt, to_value};
use gateway_core::config::PaymentConfig;
use gateway_core::storage::payments::{OrderRecord, OrderStatus, TransactionRecord};
use gateway_core::util::iso;

/// Public payment settings for the panel: where to transfer, how codes look. No secrets.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentSettings<'a> {
    provider: &'a str,
    bank: &'a str,
    bank_bin: &'a str,
    account_number: &'a str,
    account_name: &'a str,
    code_prefix: &'a str,
    order_ttl_seconds: u64,
    max_pending_orders: u32,
    lot_days: u64,
}

impl<'a> From<&'a PaymentConfig> for PaymentSettings<'a> {
    fn from(cfg: &'a PaymentConfig) -> PaymentSettings<'a> {
        PaymentSettings {
            provider: &cfg.webhook_provider,
            bank: &cfg.bank_bin,
            bank_bin: &cfg.bank_bin,
            account_number: &cfg.account_number,
            account_name: &cfg.account_name,
            code_prefix: &cfg.code_prefix,
            order_ttl_seconds: cfg.order_ttl.as_secs(),
            max_pending_orders: cfg.max_pending_orders,
            lot_days: cfg.lot_days,
        }
    }
}

/// An order as its owner and operators see it. Pending orders carry their transfer
/// instructions, so the panel can show them again.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderView<'a> {
    id: &'a str,
    payment_status: &'static str,
    payment_code: Option<&'a str>,
    amount: u64,
    currency: &'static str,
    order_type: &'static str,
    package_id: Option<&'a str>,
    package_name: Option<&'static str>,
    quota_type: &'static str,
    quantity: u64,
    tier: Option<&'static str>,
    created_at: String,
    expires_at: Option<String>,
    paid_at: Option<String>,
    transaction_id: Option<&'a str>,
    lot_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    transfer: Option<Transfer<'a>>,
}

impl<'a> OrderView<'a> {
    pub fn new(o: &'a OrderRecord, cfg: &'a PaymentConfig, now: i64) -> OrderView<'a> {
        let status = o.status_at(now);
        let kind = if o.package_id.is_some() {
            "package"
        } else if o.personal_code.is_some() {
            "topup"
        } else {
            "custom"
        };
        let code = o.payment_code.as_deref().or(o.personal_code.as_deref());
        OrderView {
            id: &o.id,
            payment_status: status.as_str(),
            payment_code: code,
            amount: o.amount_vnd,
            currency: "VND",
            order_type: kind,
            package_id: o.package_id.as_deref(),
            package_name: o.package_id.as_deref().and_then(package).map(|p| p.name),
            quota_type: o.kind.as_str(),
            quantity: o.quantity,
            tier: o.tier.map(|t| t.as_str()),
            created_at: iso(o.created_at),
            expires_at: (kind != "topup").then(|| iso(o.expires_at)),
            paid_at: iso_opt(o.paid_at),
            transaction_id: o.transaction_id.as_deref(),
            lot_id: o.lot_id.as_deref(),
            transfer: match (status, code) {
                (OrderStatus::Pending, Some(code)) => Some(transfer(cfg, code, o.amount_vnd)),
                _ => None,
            },
        }
    }
}

/// [`OrderView`] as JSON, for the admin commands.
pub fn order_json(o: &OrderRecord, cfg: &PaymentConfig, now: i64) -> Value {
    to_value(&OrderView::new(o, cfg, now))
}

/// A stored webhook transaction for operators (`gateway payment list`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TransactionView<'a> {
    #[serde(rename = "transactionID")]
    transaction_id: &'a str,
    status: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    amount: i64,
    description: &'a str,
    bank: &'a str,
    date: &'a str,
    payment_code: Option<&'a str>,
    order_id: Option<&'a str>,
    user_id: Option<&'a str>,
    lot_id: Option<&'a str>,
    received_at: String,
    resolved_at: Option<String>,
    /// The notification item as received: JSON when it parses, else its text.
    raw: Value,
}

impl<'a> From<&'a TransactionRecord> for TransactionView<'a> {
    fn from(t: &'a TransactionRecord) -> TransactionView<'a> {
        TransactionView {
            transaction_id: &t.transaction_id,
            status: &t.status,
            kind: &t.kind,
            amount: t.amount_vnd,
            description: &t.description,
            bank: &t.bank,
            date: &t.transferred_at,
            payment_code: t.payment_code.as_deref(),
            order_id: t.order_id.as_deref(),
            user_id: t.user_id.as_deref(),
            lot_id: t.lot_id.as_deref(),
            received_at: iso(t.received_at),
            resolved_at: iso_opt(t.resolved_at),
            raw: serde_json::from_str(&t.raw).unwrap_or_else(|_| Value::String(t.raw.clone())),
        }
    }
}

pub fn transaction_json(t: &TransactionRecord) -> Value {
    to_value(&TransactionView::from(t))
}
