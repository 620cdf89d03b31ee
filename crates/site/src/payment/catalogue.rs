//! What can be bought: the fixed package catalogue at the configured amounts and custom
//! orders priced by `[payment]`.

use serde::Serialize;
use serde_json::Value;

use crate::error::SiteError;
use gateway_core::config::{catalogue_package, Config, Package, PaymentConfig};
use gateway_core::domain::LotKind;
use gateway_core::storage::payments::NewOrder;

/// Custom orders buy at most this many tokens or requests at once.
pub const MAX_CUSTOM_QUANTITY: u64 = 1_000_000_000_000;

/// A catalogue package by id (its name and grant; the amount charged is the configured one,
/// [`PaymentConfig::package`]).
pub fn package(id: &str) -> Option<&'static Package> {
    catalogue_package(id)
}

/// A package as the panel lists it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageView {
    id: &'static str,
    name: &'static str,
    tier: &'static str,
    tokens: u64,
    amount: u64,
    currency: &'static str,
    lot_days: u64,
}

impl PackageView {
    pub fn new(p: &Package, cfg: &PaymentConfig) -> PackageView {
        PackageView {
            id: p.id,
            name: p.name,
            tier: p.tier.as_str(),
            tokens: p.tokens,
            amount: p.amount_vnd,
            currency: "VND",
            lot_days: cfg.lot_days,
        }
    }
}

/// The prices of custom orders; a price that is absent or 0 is `null` (not sold). Requests
/// are sold only while some tier caps them: otherwise the request meter is never drawn and a
/// request lot would buy nothing. `minOrderAmount`: the smallest custom order in VND (0: none).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pricing {
    currency: &'static str,
    token_price_per_million: Option<u64>,
    request_price_per_thousand: Option<u64>,
    min_order_amount: u64,
    lot_days: u64,
}

impl Pricing {
    pub fn new(cfg: &Config) -> Pricing {
        let pay = &cfg.payment;
        Pricing {
            currency: "VND",
            token_price_per_million: pay.token_price_vnd_per_million.filter(|p| *p > 0),
            request_price_per_thousand: request_price(cfg),
            min_order_amount: pay.min_order_vnd,
            lot_days: pay.lot_days,
        }
    }
}

/// The price of a thousand requests, when requests are sold: priced, and metered by some tier.
fn request_price(cfg: &Config) -> Option<u64> {
    cfg.payment
        .request_price_vnd_per_thousand
        .filter(|p| *p > 0 && cfg.quota.meters_requests())
}

/// Reads `{packageId}` or `{quotaType, quantity}` and prices it. Custom quantities are counted
/// in tokens or requests (what the lot will hold) and cost `ceil(quantity × price / unit)` VND,
/// the unit being a million tokens or a thousand requests, at least `min_order_vnd`
/// (`order_below_minimum` below it) and at most `max_webhook_amount_vnd` (`invalid_quantity`
/// beyond). `quotaType: "request"` is `invalid_quota_type` while no tier caps requests (see
/// [`Pricing`]).
pub fn order_request(cfg: &Config, user_id: &str, body: &Value) -> Result<NewOrder, SiteError> {
    let pay = &cfg.payment;
    if let Some(id) = body.get("packageId") {
        let p = id
            .as_str()
            .and_then(|id| pay.package(id))
            .ok_or(SiteError::InvalidPackage)?;
        return Ok(NewOrder {
            user_id: user_id.to_string(),
            package_id: Some(p.id.to_string()),
            kind: LotKind::Token,
            quantity: p.tokens,
            tier: Some(p.tier),
            amount_vnd: p.amount_vnd,
        });
    }
    let Some(kind) = body.get("quotaType") else {
        // Neither form: there is nothing to buy.
        return Err(SiteError::InvalidPackage);
    };
    let kind = kind
        .as_str()
        .and_then(LotKind::parse)
        .filter(|k| *k == LotKind::Token || cfg.quota.meters_requests())
        .ok_or(SiteError::InvalidQuotaType)?;
    let quantity = body
        .get("quantity")
        .and_then(Value::as_u64)
        .filter(|q| (1..=MAX_CUSTOM_QUANTITY).contains(q))
        .ok_or(SiteError::InvalidQuantity)?;
    let (price, unit) = match kind {
        LotKind::Token => (pay.token_price_vnd_per_million, 1_000_000u128),
        LotKind::Request => (pay.request_price_vnd_per_thousand, 1_000u128),
    };
    let price = price
        .filter(|p| *p > 0)
        .ok_or(SiteError::PriceNotConfigured)?;
    let amount = (u128::from(quantity) * u128::from(price)).div_ceil(unit);
    // No more than one webhook item may carry: an order above it could never be paid.
    let amount_vnd = i64::try_from(amount)
        .ok()
        .filter(|a| *a <= pay.max_webhook_amount_vnd)
        .and_then(|a| u64::try_from(a).ok())
        .ok_or(SiteError::InvalidQuantity)?;
    if amount_vnd < pay.min_order_vnd {
        return Err(SiteError::OrderBelowMinimum);
    }
    Ok(NewOrder {
        user_id: user_id.to_string(),
        package_id: None,
        kind,
        quantity,
        tier: None,
        amount_vnd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::config::CATALOGUE;
    use serde_json::json;

    fn config(text: &str) -> Config {
        Config::from_str(std::path::Path::new("t.toml"), text).expect("config")
    }

    #[test]
    fn catalogue_is_the_spec() {
        let ids: Vec<_> = CATALOGUE.iter().map(|p| p.id).collect();
        assert_eq!(ids, ["steady-100m", "persistent-1b", "tryharder-10b"]);
        assert_eq!(
            package("persistent-1b").map(|p| p.amount_vnd),
            Some(240_000)
        );
        assert_eq!(
            package("tryharder-10b").map(|p| p.tokens),
            Some(10_000_000_000)
        );
        assert!(package("gold").is_none());
    }

    #[test]
    fn operators_price_packages() {
        let cfg = config("[payment.packages.steady-100m]\namount_vnd = 99000\n");
        let o = order_request(&cfg, "u", &json!({"packageId": "steady-100m"})).expect("order");
        assert_eq!((o.amount_vnd, o.quantity), (99_000, 100_000_000));
        let o = order_request(&cfg, "u", &json!({"packageId": "persistent-1b"})).expect("order");
        assert_eq!(o.amount_vnd, 240_000);
        for (text, key) in [
            (
                "[payment.packages.gold]\namount_vnd = 5\n",
                "payment.packages.gold",
            ),
            (
                "[payment.packages.steady-100m]\namount_vnd = 0\n",
                "payment.packages.steady-100m.amount_vnd",
            ),
            ("[payment.packages.steady-100m]\nprice = 5\n", "price"),
        ] {
            let err = Config::from_str(std::path::Path::new("t.toml"), text)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(key), "{text}: {err}");
        }
    }

    #[test]
    fn custom_orders_are_priced_up() {
        let cfg = config("[payment]\ntoken_price_vnd_per_million = 1000\nmin_order_vnd = 1000\n");
        let p = &cfg;
        let o = order_request(p, "u", &json!({"quotaType":"token","quantity":1_500_001}))
            .expect("order");
        assert_eq!(o.amount_vnd, 1501);
        let err = |b: Value| order_request(p, "u", &b).err().map(|e| e.code());
        let code = |c: &str| Some(c.to_string());
        // Below the minimum (1,500 tokens cost 2 VND).
        assert_eq!(
            err(json!({"quotaType":"token","quantity":1_500})),
            code("order_below_minimum")
        );
        // The default minimum is 10,000 VND.
        let default_min = config("[payment]\ntoken_price_vnd_per_million = 1000\n");
        let at = |q: u64| {
            order_request(
                &default_min,
                "u",
                &json!({"quotaType":"token","quantity":q}),
            )
            .map(|o| o.amount_vnd)
            .map_err(|e| e.code())
        };
        assert_eq!(at(9_999_000), Err("order_below_minimum".to_string()));
        assert_eq!(at(10_000_000), Ok(10_000));
        // No tier caps requests: a request lot would never be drawn, so none is sold.
        assert_eq!(
            err(json!({"quotaType":"request","quantity":5})),
            code("invalid_quota_type")
        );
        let capped = config("[quota.tiers.beginner]\nweekly_requests = 100\n");
        assert_eq!(
            order_request(&capped, "u", &json!({"quotaType":"request","quantity":5}))
                .err()
                .map(|e| e.code()),
            code("price_not_configured")
        );
        assert_eq!(
            err(json!({"quotaType":"token","quantity":0})),
            code("invalid_quantity")
        );
        assert_eq!(
            err(json!({"quotaType":"token","quantity":"5"})),
            code("invalid_quantity")
        );
        assert_eq!(
            err(json!({"quotaType":"token","quantity":2.5})),
            code("invalid_quantity")
        );
        assert_eq!(
            err(json!({"quotaType":"gold","quantity":5})),
            code("invalid_quota_type")
        );
        assert_eq!(err(json!({"packageId":"gold"})), code("invalid_package"));
        assert_eq!(err(json!({"packageId":7})), code("invalid_package"));
        assert_eq!(err(json!({})), code("invalid_package"));
    }

    #[test]
    fn custom_orders_cost_no_more_than_one_transfer_may_carry() {
        let cfg = gateway_core::config::Config::from_str(
            std::path::Path::new("t.toml"),
            "[payment]\ntoken_price_vnd_per_million = 1000\nmax_webhook_amount_vnd = 2000\n\
             min_order_vnd = 0\n",
        )
        .expect("config");
        let order = |q: u64| order_request(&cfg, "u", &json!({"quotaType":"token","quantity":q}));
        assert_eq!(order(2_000_000).expect("order").amount_vnd, 2000);
        assert_eq!(
            order(2_000_001).err().map(|e| e.code()),
            Some("invalid_quantity".to_string())
        );
    }
}
