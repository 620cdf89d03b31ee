//! Quota lots: granting them through the admin CLI and reading what is left of them in the
//! database.

use std::time::Duration;

use gateway_core::domain::Lot;
use serde_json::Value;

use super::Gateway;

/// How long a granted lot takes to reach the quota engines (the lot feed polls every 250 ms).
pub const LOT_FEED: Duration = Duration::from_millis(600);

/// Grants `email` a lot of `amount` of `kind` (`token` or `request`) with `gateway lot grant`
/// and its `extra` arguments (`--days`, `--tier`); returns the command's JSON.
pub fn grant_lot(gw: &Gateway, email: &str, kind: &str, amount: u64, extra: &[&str]) -> Value {
    let amount = amount.to_string();
    let mut args = vec![
        "lot", "grant", "--email", email, "--type", kind, "--amount", &amount,
    ];
    args.extend_from_slice(extra);
    gw.admin_json(&args)
}

/// Grants `email` a token lot of `amount` with `gateway lot grant`; returns the command's JSON.
pub fn grant_tokens(gw: &Gateway, email: &str, amount: u64) -> Value {
    grant_lot(gw, email, "token", amount, &[])
}

/// [`grant_tokens`], then waits until the quota engines have seen the lot.
pub async fn grant_tokens_and_wait(gw: &Gateway, email: &str, amount: u64) -> Value {
    let granted = grant_tokens(gw, email, amount);
    tokio::time::sleep(LOT_FEED).await;
    granted
}

/// The id of the lot in a `lot grant` answer.
pub fn lot_id(granted: &Value) -> String {
    granted["id"]
        .as_str()
        .or(granted["lot"]["id"].as_str())
        .unwrap_or_else(|| panic!("lot id in {granted}"))
        .to_string()
}

/// User `user_id`'s lots as the database holds them (those not expired).
pub async fn lots(gw: &Gateway, user_id: &str) -> Vec<Lot> {
    gw.db()
        .await
        .quota()
        .lots(user_id, gateway_core::util::now_ms())
        .await
        .expect("lots")
}

/// [`lots`] of the account with `email`.
pub async fn lots_of(gw: &Gateway, email: &str) -> Vec<Lot> {
    lots(gw, &gw.user_id(email).await).await
}

/// The tokens left in all of user `user_id`'s lots, as the database holds them.
pub async fn lots_remaining(gw: &Gateway, user_id: &str) -> u64 {
    lots(gw, user_id).await.iter().map(|l| l.remaining).sum()
}

/// [`lots_remaining`] of the account with `email`.
pub async fn lots_remaining_of(gw: &Gateway, email: &str) -> u64 {
    lots_of(gw, email).await.iter().map(|l| l.remaining).sum()
}
