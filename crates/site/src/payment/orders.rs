//! `/orders`: the account's orders: list (with the catalogue and settings), create, cancel.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use super::catalogue::{order_request, PackageView, Pricing};
use super::views::{OrderView, PaymentSettings};
use crate::access::check_beta;
use crate::error::{Failing, SiteError};
use crate::extract::{MaybeSession, Member, Mutation};
use crate::reply::Reply;
use crate::views::{self, LotView};
use gateway_core::state::SharedState;
use gateway_core::storage::payments::{CancelError, OrderError, OrderRules};
use gateway_core::util::{is_valid_id, now_ms};

/// `GET /orders` shows at most this many orders.
const ORDER_HISTORY_LIMIT: i64 = 100;

/// An empty JSON object.
#[derive(Serialize)]
struct Empty {}

/// The spec's exact answer to a signed-out `GET /orders`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SignedOutOrders {
    ok: bool,
    authenticated: bool,
    packages: [Value; 0],
    orders: [Value; 0],
    quota_lots: [Value; 0],
    pricing: Empty,
    config: Empty,
    csrf_token: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Orders<'a> {
    ok: bool,
    authenticated: bool,
    packages: Vec<PackageView>,
    orders: Vec<OrderView<'a>>,
    quota_lots: Vec<LotView<'a>>,
    pricing: Pricing,
    config: PaymentSettings<'a>,
    csrf_token: &'a str,
    payment_code: String,
}

/// `GET /orders`. Signed out: the spec's exact empty shape. Signed in: catalogue, history,
/// lots, pricing, payment settings, the CSRF token and the personal payment code (drawn on
/// first need).
pub(super) async fn list_orders(
    State(state): State<SharedState>,
    MaybeSession(session): MaybeSession,
) -> Result<Response, SiteError> {
    let Some(session) = session else {
        return Ok(Reply(SignedOutOrders {
            ok: true,
            authenticated: false,
            packages: [],
            orders: [],
            quota_lots: [],
            pricing: Empty {},
            config: Empty {},
            csrf_token: None,
        })
        .into_response());
    };
    let cfg = state.config();
    check_beta(&cfg.auth, &session.email)?;
    let pay = &cfg.payment;
    let store = state.db.payments();
    let failure = SiteError::PaymentQueryFailed;
    let personal = store
        .personal_code(&session.user_id, &pay.code_prefix)
        .await
        .or_fail(failure)?;
    let now = now_ms();
    let orders = store
        .orders_for_user(&session.user_id, now, ORDER_HISTORY_LIMIT)
        .await
        .or_fail(failure)?;
    let lots = state
        .db
        .quota()
        .lots(&session.user_id, now)
        .await
        .or_fail(failure)?;
    Ok(Reply(Orders {
        ok: true,
        authenticated: true,
        packages: pay
            .packages
            .iter()
            .map(|p| PackageView::new(p, pay))
            .collect(),
        orders: orders.iter().map(|o| OrderView::new(o, pay, now)).collect(),
        quota_lots: views::all(&lots),
        pricing: Pricing::new(&cfg),
        config: PaymentSettings::from(pay),
        csrf_token: &session.csrf_token,
        payment_code: personal,
    })
    .into_response())
}

#[derive(Serialize)]
struct OrderAnswer<'a> {
    ok: bool,
    order: OrderView<'a>,
}

/// `POST /orders {packageId} | {quotaType, quantity}`: a new pending order with its transfer
/// instructions.
pub(super) async fn create_order(
    State(state): State<SharedState>,
    Member(Mutation { session, body }): Member<Mutation>,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    let pay = &cfg.payment;
    let new = order_request(&cfg, &session.user_id, &body)?;
    let rules = OrderRules {
        code_prefix: pay.code_prefix.clone(),
        ttl_ms: i64::try_from(pay.order_ttl.as_millis()).unwrap_or(i64::MAX),
        max_pending: pay.max_pending_orders,
        per_hour: pay.orders_per_hour,
    };
    let order = state
        .db
        .payments()
        .create_order(&new, &rules)
        .await
        .map_err(|e| match e {
            OrderError::TooManyPending => SiteError::TooManyPendingPaymentOrders,
            OrderError::RateLimited => SiteError::RateLimited,
            OrderError::Store(e) => SiteError::PaymentOrderFailed.logged(e),
        })?;
    log::info!(
        "payment order created: {} user={} amount={} VND",
        order.id,
        order.user_id,
        order.amount_vnd
    );
    Ok(Reply(OrderAnswer {
        ok: true,
        order: OrderView::new(&order, pay, now_ms()),
    })
    .into_response())
}

/// `POST /orders/{id}/cancel`: withdraws one of the account's pending orders: `{ok, order}`
/// with `paymentStatus: "cancelled"`. An order of another account is `not_found`, like one that
/// does not exist; an order that is no longer pending is 409 `order_not_pending`, so a double
/// click or a payment that landed first is told apart from a success.
pub(super) async fn cancel_order(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Member(Mutation { session, .. }): Member<Mutation>,
) -> Result<Response, SiteError> {
    let cfg = state.config();
    if !is_valid_id("ord", &id) {
        return Err(SiteError::NotFound);
    }
    let now = now_ms();
    let order = state
        .db
        .payments()
        .cancel_order(&session.user_id, &id, now)
        .await
        .map_err(|e| match e {
            CancelError::NotFound => SiteError::NotFound,
            CancelError::NotPending(_) => SiteError::OrderNotPending,
            CancelError::Store(e) => SiteError::PaymentOrderFailed.logged(e),
        })?;
    log::info!(
        "payment order cancelled: {} user={}",
        order.id,
        order.user_id
    );
    Ok(Reply(OrderAnswer {
        ok: true,
        order: OrderView::new(&order, &cfg.payment, now),
    })
    .into_response())
}
