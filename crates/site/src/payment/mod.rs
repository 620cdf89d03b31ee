//! `/api/payment`: token packages, payment orders by bank transfer, and the bank's payment
//! webhook (spec §2.5-§2.7, §4.4; CONTRACT §2 `[payment]`, §3).
//!
//! The flow: the panel lists the catalogue and the account's orders (`GET /orders`), creates an
//! order (`POST /orders`) and shows its transfer instructions; the customer transfers the
//! amount with the order's payment code in the description; the bank's notifier posts the
//! transfer to `/<webhook_provider>/callback`, which finds the code, marks the order `paid` and
//! grants its quota lot, exactly once (`storage::payments`). A transfer that carries the
//! account's personal code instead tops up tokens at the configured price.
//!
//! Decisions the spec leaves open (docs/payments.md):
//! - Paying at least the order's amount matches (the surplus stays on record); less is
//!   `amount_mismatch` and the order stays pending.
//! - A pending order can be cancelled by its owner (`POST /orders/{id}/cancel`). A transfer for
//!   an order that is already paid, cancelled or expired is `unmatched` (with the order named)
//!   and waits for an operator to refund it or `gateway payment credit` it.
//! - A notification with `status: false` is answered item by item as `ignored` and stores
//!   nothing, so a later `status: true` delivery of the same transfers still counts.
//! - With no webhook secret configured every notification is refused with 503, so the sender
//!   keeps retrying until an operator sets one.

mod catalogue;
mod orders;
mod vietqr;
mod views;
mod webhook;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use gateway_core::state::SharedState;
use gateway_core::util::now_ms;

pub use catalogue::{package, MAX_CUSTOM_QUANTITY};
pub use vietqr::{vietqr_image_url, vietqr_payload};
pub use views::{order_json, transaction_json, OrderView, TransactionView};
pub use webhook::WEBHOOK_BODY_LIMIT;

/// Order requests are a couple of short fields.
const ORDER_BODY_LIMIT: usize = 16 * 1024;
/// The background sweep that expires overdue orders runs this often (reads expire lazily too).
const EXPIRE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The `/api/payment` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route(
            "/orders",
            get(orders::list_orders)
                .post(orders::create_order)
                .layer(DefaultBodyLimit::max(ORDER_BODY_LIMIT)),
        )
        .route(
            "/orders/{id}/cancel",
            post(orders::cancel_order).layer(DefaultBodyLimit::max(ORDER_BODY_LIMIT)),
        )
        .route("/{provider}/callback", post(webhook::webhook))
}

/// Expires overdue pending orders every minute, so an order nobody looks at still leaves
/// `pending` on time (reads and webhook matches also expire lazily).
pub async fn expire_loop(state: SharedState) {
    let mut tick = tokio::time::interval(EXPIRE_EVERY);
    loop {
        tick.tick().await;
        match state.db.payments().expire_due(now_ms()).await {
            Ok(0) => {}
            Ok(n) => log::info!("payment orders expired: {n}"),
            Err(e) => log::warn!("payment order sweep failed: {e}"),
        }
    }
}
