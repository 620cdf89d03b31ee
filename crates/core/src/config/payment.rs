//! `[payment]`: bank transfers, order codes and prices, and the package catalogue with the
//! operator's amounts.

use std::time::Duration;

use super::check::{Checker, ConfigError};
use super::file::PaymentFile;
use crate::domain::Tier;

/// One package of the fixed catalogue: what it grants is fixed, its price is the operator's
/// (`[payment.packages.<id>] amount_vnd`, by default the catalogue's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Package {
    pub id: &'static str,
    pub name: &'static str,
    pub tier: Tier,
    pub tokens: u64,
    pub amount_vnd: u64,
}

/// The catalogue as shipped (the product's fixed packages and their default amounts).
pub const CATALOGUE: [Package; 3] = [
    Package {
        id: "steady-100m",
        name: "Steady 100M",
        tier: Tier::Steady,
        tokens: 100_000_000,
        amount_vnd: 85_000,
    },
    Package {
        id: "persistent-1b",
        name: "Persistent 1B",
        tier: Tier::Persistent,
        tokens: 1_000_000_000,
        amount_vnd: 240_000,
    },
    Package {
        id: "tryharder-10b",
        name: "Tryharder 10B",
        tier: Tier::Tryharder,
        tokens: 10_000_000_000,
        amount_vnd: 950_000,
    },
];

/// A catalogue package by id, with its shipped amount (names and grants never change).
pub fn catalogue_package(id: &str) -> Option<&'static Package> {
    CATALOGUE.iter().find(|p| p.id == id)
}

/// Custom orders below this many VND are refused unless the config says otherwise.
pub const DEFAULT_MIN_ORDER_VND: u64 = 10_000;

/// One billion đồng: far above any real top-up, far below amounts whose token counts or sums
/// come near the integer limits.
pub const DEFAULT_MAX_WEBHOOK_AMOUNT_VND: i64 = 1_000_000_000;

#[derive(Debug, Clone)]
pub struct PaymentConfig {
    pub webhook_provider: String,
    pub code_prefix: String,
    pub max_pending_orders: u32,
    pub order_ttl: Duration,
    pub lot_days: u64,
    pub token_price_vnd_per_million: Option<u64>,
    pub request_price_vnd_per_thousand: Option<u64>,
    /// The largest amount one webhook item may carry; larger (and non-positive) amounts are
    /// refused (`amount_mismatch`, nothing stored). At most `i64::MAX`, so it compares with any stored amount.
    pub max_webhook_amount_vnd: i64,
    pub bank_bin: String,
    pub account_number: String,
    pub account_name: String,
    pub orders_per_hour: u32,
    /// Custom orders priced below this are refused (0: no minimum).
    pub min_order_vnd: u64,
    /// The catalogue in its order, at the operator's amounts.
    pub packages: [Package; 3],
}

impl PaymentConfig {
    /// A package of the catalogue at the configured amount.
    pub fn package(&self, id: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.id == id)
    }
}

pub(super) fn validate(c: &Checker, f: PaymentFile) -> Result<PaymentConfig, ConfigError> {
    let code_prefix = f.code_prefix.unwrap_or_else(|| "GW".into());
    if code_prefix.is_empty()
        || code_prefix.len() > 8
        || !code_prefix
            .chars()
            .all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit())
    {
        return Err(c.err(
            "payment.code_prefix",
            "must be 1 to 8 uppercase letters or digits",
        ));
    }
    let webhook_provider = f.webhook_provider.unwrap_or_else(|| "sepay".into());
    if webhook_provider.is_empty()
        || !webhook_provider
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
    {
        return Err(c.err(
            "payment.webhook_provider",
            "must be letters, digits, - or _",
        ));
    }
    let mut packages = CATALOGUE;
    for (id, over) in &f.packages {
        let key = format!("payment.packages.{id}");
        let Some(p) = packages.iter_mut().find(|p| p.id == id) else {
            let ids: Vec<&str> = CATALOGUE.iter().map(|p| p.id).collect();
            return Err(c.err(
                &key,
                format!("unknown package (the catalogue has {})", ids.join(", ")),
            ));
        };
        if let Some(amount) = over.amount_vnd {
            if amount == 0 || amount > i64::MAX as u64 {
                return Err(c.err(
                    format!("{key}.amount_vnd"),
                    "must be a positive whole number of VND",
                ));
            }
            p.amount_vnd = amount;
        }
    }
    let min_order_vnd = f.min_order_vnd.unwrap_or(DEFAULT_MIN_ORDER_VND);
    if min_order_vnd > i64::MAX as u64 {
        return Err(c.err("payment.min_order_vnd", "is too large"));
    }
    let max_webhook_amount_vnd = match f.max_webhook_amount_vnd {
        None => DEFAULT_MAX_WEBHOOK_AMOUNT_VND,
        Some(n) => i64::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
            c.err(
                "payment.max_webhook_amount_vnd",
                format!("must be between 1 and {}", i64::MAX),
            )
        })?,
    };
    Ok(PaymentConfig {
        webhook_provider,
        max_webhook_amount_vnd,
        code_prefix,
        max_pending_orders: f.max_pending_orders.unwrap_or(3).max(1),
        order_ttl: match f.order_ttl_seconds {
            Some(secs) => Duration::from_secs(secs.max(1)),
            None => Duration::from_secs(60 * f.order_ttl_minutes.unwrap_or(60).max(1)),
        },
        lot_days: f.lot_days.unwrap_or(30).max(1),
        token_price_vnd_per_million: f.token_price_vnd_per_million,
        request_price_vnd_per_thousand: f.request_price_vnd_per_thousand,
        bank_bin: f.bank_bin.unwrap_or_default(),
        account_number: f.account_number.unwrap_or_default(),
        account_name: f.account_name.unwrap_or_default(),
        orders_per_hour: f.orders_per_hour.unwrap_or(20).max(1),
        min_order_vnd,
        packages,
    })
}
