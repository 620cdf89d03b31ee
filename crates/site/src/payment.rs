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
//! Decisions the spec leaves open (README "Payments"):
//! - Paying at least the order's amount matches (the surplus stays on record); less is
//!   `amount_mismatch` and the order stays pending.
//! - A pending order can be cancelled by its owner (`POST /orders/{id}/cancel`). A transfer for
//!   an order that is already paid, cancelled or expired is `unmatched` (with the order named)
//!   and waits for an operator to refund it or `gateway payment credit` it.
//! - A notification with `status: false` is answered item by item as `ignored` and stores
//!   nothing, so a later `status: true` delivery of the same transfers still counts.
//! - With no webhook secret configured every notification is refused with 503, so the sender
//!   keeps retrying until an operator sets one.

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::map_response;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{json, Map, Value};
use subtle::ConstantTimeEq;

use super::auth::json_response;
use super::csrf::require_mutation;
use super::error::SiteError;
use super::session::{current_session, SessionInfo};
use crate::views::lot_json;
use gateway_core::config::{Config, PaymentConfig};
use gateway_core::domain::LotKind;
use gateway_core::domain::Tier;
use gateway_core::state::{AppState, SharedState};
use gateway_core::storage::payments::{
    find_codes, CancelError, IncomingItem, ItemStatus, MatchRules, NewOrder, OrderError,
    OrderRecord, OrderRules, OrderStatus, TransactionRecord,
};
use gateway_core::storage::StoreError;
use gateway_core::util::{iso, iso_opt, now_ms};

/// Spec §8: the webhook body limit. Larger bodies are refused while reading.
pub const WEBHOOK_BODY_LIMIT: usize = 64 * 1024;
/// Order requests are a couple of short fields.
const ORDER_BODY_LIMIT: usize = 16 * 1024;
/// `GET /orders` shows at most this many orders.
const ORDER_HISTORY_LIMIT: i64 = 100;
/// Custom orders buy at most this many tokens or requests at once.
pub const MAX_CUSTOM_QUANTITY: u64 = 1_000_000_000_000;
/// Longest accepted `transactionID`.
const MAX_TRANSACTION_ID: usize = 256;
/// The background sweep that expires overdue orders runs this often (reads expire lazily too).
const EXPIRE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// One package of the fixed catalogue (spec §2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Package {
    pub id: &'static str,
    pub name: &'static str,
    pub tier: Tier,
    pub tokens: u64,
    pub amount_vnd: u64,
}

/// Spec §2.5, exactly.
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

pub fn package(id: &str) -> Option<&'static Package> {
    CATALOGUE.iter().find(|p| p.id == id)
}

/// The `/api/payment` routes; `site::router` nests them.
pub fn router() -> Router<SharedState> {
    Router::new()
        .route(
            "/orders",
            get(list_orders)
                .post(create_order)
                .layer(DefaultBodyLimit::max(ORDER_BODY_LIMIT)),
        )
        .route(
            "/orders/{id}/cancel",
            post(cancel_order).layer(DefaultBodyLimit::max(ORDER_BODY_LIMIT)),
        )
        .route("/{provider}/callback", post(webhook))
        .layer(map_response(private_headers))
}

/// Every payment answer is personal or a webhook receipt: never cached.
async fn private_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Origin, Cookie"));
    resp
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

fn failed(code: &'static str) -> impl Fn(StoreError) -> SiteError {
    move |e| {
        log::error!("payment storage failed ({code}): {e}");
        SiteError::Code(code)
    }
}

/// `private_beta_only` while the beta is closed and the signed-in address (or its `@domain`)
/// is no longer on the allowlist: asked on every request, like the sign-in gate, so removal
/// takes effect without waiting for the session to end.
fn beta_gate(cfg: &Config, session: &SessionInfo) -> Result<(), SiteError> {
    let auth = &cfg.auth;
    let email = session.email.as_str();
    let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or("");
    let allowed = !auth.private_beta
        || auth
            .beta_allowlist
            .iter()
            .any(|a| a == email || a.strip_prefix('@') == Some(domain));
    if allowed {
        Ok(())
    } else {
        Err(SiteError::Code("private_beta_only"))
    }
}

// ---------------------------------------------------------------------------------------------
// Renderings

pub fn package_json(p: &Package, cfg: &PaymentConfig) -> Value {
    json!({
        "id": p.id,
        "name": p.name,
        "tier": p.tier.as_str(),
        "tokens": p.tokens,
        "amount": p.amount_vnd,
        "currency": "VND",
        "lotDays": cfg.lot_days,
    })
}

fn pricing_json(cfg: &PaymentConfig) -> Value {
    json!({
        "currency": "VND",
        "tokenPricePerMillion": cfg.token_price_vnd_per_million.filter(|p| *p > 0),
        "requestPricePerThousand": cfg.request_price_vnd_per_thousand.filter(|p| *p > 0),
        "lotDays": cfg.lot_days,
    })
}

/// Public payment settings for the panel: where to transfer, how codes look. No secrets.
fn config_json(cfg: &PaymentConfig) -> Value {
    json!({
        "provider": cfg.webhook_provider,
        "bank": cfg.bank_bin,
        "bankBin": cfg.bank_bin,
        "accountNumber": cfg.account_number,
        "accountName": cfg.account_name,
        "codePrefix": cfg.code_prefix,
        "orderTtlSeconds": cfg.order_ttl.as_secs(),
        "maxPendingOrders": cfg.max_pending_orders,
        "lotDays": cfg.lot_days,
    })
}

/// An order as its owner and operators see it. Pending orders carry their transfer
/// instructions, so the panel can show them again.
pub fn order_json(o: &OrderRecord, cfg: &PaymentConfig, now: i64) -> Value {
    let status = o.status_at(now);
    let pkg = o.package_id.as_deref().and_then(package);
    let kind = if o.package_id.is_some() {
        "package"
    } else if o.personal_code.is_some() {
        "topup"
    } else {
        "custom"
    };
    let code = o.payment_code.as_ref().or(o.personal_code.as_ref());
    let mut v = json!({
        "id": o.id,
        "paymentStatus": status.as_str(),
        "paymentCode": code,
        "amount": o.amount_vnd,
        "currency": "VND",
        "orderType": kind,
        "packageId": o.package_id,
        "packageName": pkg.map(|p| p.name),
        "quotaType": o.kind.as_str(),
        "quantity": o.quantity,
        "tier": o.tier.map(|t| t.as_str()),
        "createdAt": iso(o.created_at),
        "expiresAt": if kind == "topup" { Value::Null } else { Value::String(iso(o.expires_at)) },
        "paidAt": iso_opt(o.paid_at),
        "transactionId": o.transaction_id,
        "lotId": o.lot_id,
    });
    if let (OrderStatus::Pending, Some(code), Some(obj)) = (status, code, v.as_object_mut()) {
        obj.insert("transfer".into(), transfer_json(cfg, code, o.amount_vnd));
    }
    v
}

/// Bank-transfer instructions: the account, the exact amount, the description to type (the
/// payment code), a VietQR image URL and the EMVCo payload it encodes.
pub fn transfer_json(cfg: &PaymentConfig, code: &str, amount: u64) -> Value {
    let have_bank = !cfg.bank_bin.is_empty() && !cfg.account_number.is_empty();
    json!({
        "bank": cfg.bank_bin,
        "bankBin": cfg.bank_bin,
        "accountNumber": cfg.account_number,
        "accountName": cfg.account_name,
        "amount": amount,
        "currency": "VND",
        "description": code,
        "vietqr": have_bank.then(|| vietqr_image_url(cfg, code, amount)),
        "qrPayload": if have_bank { vietqr_payload(&cfg.bank_bin, &cfg.account_number, amount, code) } else { None },
    })
}

/// The img.vietqr.io quick-link image for a transfer.
pub fn vietqr_image_url(cfg: &PaymentConfig, code: &str, amount: u64) -> String {
    let path = |s: &str| -> String {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("amount", &amount.to_string())
        .append_pair("addInfo", code)
        .append_pair("accountName", &cfg.account_name)
        .finish();
    format!(
        "https://img.vietqr.io/image/{}-{}-compact2.png?{query}",
        path(&cfg.bank_bin),
        path(&cfg.account_number)
    )
}

fn tlv(id: &str, value: &str) -> Option<String> {
    (value.len() <= 99).then(|| format!("{id}{:02}{value}", value.len()))
}

/// The VietQR (NAPAS EMVCo) payload of a dynamic transfer to an account: any Vietnamese banking
/// app scanning it fills in bank, account, amount and description. `None` when a field is too
/// long for the format.
pub fn vietqr_payload(bin: &str, account: &str, amount: u64, description: &str) -> Option<String> {
    let beneficiary = format!("{}{}", tlv("00", bin)?, tlv("01", account)?);
    let merchant = format!(
        "{}{}{}",
        tlv("00", "A000000727")?,
        tlv("01", &beneficiary)?,
        tlv("02", "QRIBFTTA")?
    );
    let mut s = String::new();
    s.push_str(&tlv("00", "01")?);
    s.push_str(&tlv("01", "12")?);
    s.push_str(&tlv("38", &merchant)?);
    s.push_str(&tlv("53", "704")?);
    s.push_str(&tlv("54", &amount.to_string())?);
    s.push_str(&tlv("58", "VN")?);
    s.push_str(&tlv("62", &tlv("08", description)?)?);
    s.push_str("6304");
    let crc = crc16_ccitt(s.as_bytes());
    s.push_str(&format!("{crc:04X}"));
    Some(s)
}

/// CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF), the EMVCo QR checksum.
fn crc16_ccitt(data: &[u8]) -> u16 {
    let mut crc: u16 = 0xFFFF;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A stored webhook transaction for operators (`gateway payment list`).
pub fn transaction_json(t: &TransactionRecord) -> Value {
    json!({
        "transactionID": t.transaction_id,
        "status": t.status,
        "type": t.kind,
        "amount": t.amount_vnd,
        "description": t.description,
        "bank": t.bank,
        "date": t.transferred_at,
        "paymentCode": t.payment_code,
        "orderId": t.order_id,
        "userId": t.user_id,
        "lotId": t.lot_id,
        "receivedAt": iso(t.received_at),
        "resolvedAt": iso_opt(t.resolved_at),
        "raw": serde_json::from_str::<Value>(&t.raw).unwrap_or(Value::String(t.raw.clone())),
    })
}

// ---------------------------------------------------------------------------------------------
// GET /orders

/// Signed out: the spec's exact empty shape. Signed in: catalogue, history, lots, pricing,
/// payment settings, the CSRF token and the personal payment code (drawn on first need).
async fn list_orders(State(state): State<SharedState>, headers: HeaderMap) -> Response {
    match orders_answer(&state, &headers).await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

async fn orders_answer(state: &AppState, headers: &HeaderMap) -> Result<Value, SiteError> {
    let Some(session) = current_session(state, headers).await? else {
        return Ok(json!({
            "ok": true,
            "authenticated": false,
            "packages": [],
            "orders": [],
            "quotaLots": [],
            "pricing": {},
            "config": {},
            "csrfToken": null,
        }));
    };
    let cfg = state.config();
    beta_gate(&cfg, &session)?;
    let pay = &cfg.payment;
    let store = state.db.payments();
    let query_failed = failed("payment_query_failed");
    let personal = store
        .personal_code(&session.user_id, &pay.code_prefix)
        .await
        .map_err(&query_failed)?;
    let now = now_ms();
    let orders = store
        .orders_for_user(&session.user_id, now, ORDER_HISTORY_LIMIT)
        .await
        .map_err(&query_failed)?;
    let lots = state
        .db
        .quota()
        .lots(&session.user_id, now)
        .await
        .map_err(&query_failed)?;
    Ok(json!({
        "ok": true,
        "authenticated": true,
        "packages": CATALOGUE.iter().map(|p| package_json(p, pay)).collect::<Vec<_>>(),
        "orders": orders.iter().map(|o| order_json(o, pay, now)).collect::<Vec<_>>(),
        "quotaLots": lots.iter().map(lot_json).collect::<Vec<_>>(),
        "pricing": pricing_json(pay),
        "config": config_json(pay),
        "csrfToken": session.csrf_token,
        "paymentCode": personal,
    }))
}

// ---------------------------------------------------------------------------------------------
// POST /orders

/// Reads `{packageId}` or `{quotaType, quantity}` and prices it. Custom quantities are counted
/// in tokens or requests (what the lot will hold) and cost `ceil(quantity × price / unit)` VND,
/// the unit being a million tokens or a thousand requests.
fn order_request(cfg: &PaymentConfig, user_id: &str, body: &Value) -> Result<NewOrder, SiteError> {
    if let Some(id) = body.get("packageId") {
        let p = id
            .as_str()
            .and_then(package)
            .ok_or(SiteError::Code("invalid_package"))?;
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
        return Err(SiteError::Code("invalid_package"));
    };
    let kind = kind
        .as_str()
        .and_then(LotKind::parse)
        .ok_or(SiteError::Code("invalid_quota_type"))?;
    let quantity = body
        .get("quantity")
        .and_then(Value::as_u64)
        .filter(|q| (1..=MAX_CUSTOM_QUANTITY).contains(q))
        .ok_or(SiteError::Code("invalid_quantity"))?;
    let (price, unit) = match kind {
        LotKind::Token => (cfg.token_price_vnd_per_million, 1_000_000u128),
        LotKind::Request => (cfg.request_price_vnd_per_thousand, 1_000u128),
    };
    let price = price
        .filter(|p| *p > 0)
        .ok_or(SiteError::Code("price_not_configured"))?;
    let amount = (u128::from(quantity) * u128::from(price)).div_ceil(unit);
    let amount_vnd = u64::try_from(amount)
        .ok()
        .filter(|a| *a <= i64::MAX as u64)
        .ok_or(SiteError::Code("invalid_quantity"))?;
    Ok(NewOrder {
        user_id: user_id.to_string(),
        package_id: None,
        kind,
        quantity,
        tier: None,
        amount_vnd,
    })
}

/// Needs the site's origin, a session and its CSRF token, in that order; then the body.
async fn create_order(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let session = require_mutation(&state, &headers, Some(&body)).await?;
    let cfg = state.config();
    beta_gate(&cfg, &session)?;
    let pay = &cfg.payment;
    let new = order_request(pay, &session.user_id, &body)?;
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
            OrderError::TooManyPending => SiteError::Code("too_many_pending_payment_orders"),
            OrderError::RateLimited => SiteError::Code("rate_limited"),
            OrderError::Store(e) => failed("payment_order_failed")(e),
        })?;
    log::info!(
        "payment order created: {} user={} amount={} VND",
        order.id,
        order.user_id,
        order.amount_vnd
    );
    Ok(json_response(
        StatusCode::OK,
        &json!({ "ok": true, "order": order_json(&order, pay, now_ms()) }),
    ))
}

// ---------------------------------------------------------------------------------------------
// POST /orders/{id}/cancel

/// Withdraws one of the account's pending orders: `{ok, order}` with `paymentStatus:
/// "cancelled"`. Needs the site's origin, a session and its CSRF token like any mutation. An
/// order of another account is `not_found`, like one that does not exist; an order that is no
/// longer pending is 409 `order_not_pending`, so a double click or a payment that landed first
/// is told apart from a success.
async fn cancel_order(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, SiteError> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let session = require_mutation(&state, &headers, Some(&body)).await?;
    let cfg = state.config();
    beta_gate(&cfg, &session)?;
    if !gateway_core::util::is_valid_id("ord", &id) {
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
            CancelError::NotPending(_) => SiteError::Code("order_not_pending"),
            CancelError::Store(e) => failed("payment_order_failed")(e),
        })?;
    log::info!(
        "payment order cancelled: {} user={}",
        order.id,
        order.user_id
    );
    Ok(json_response(
        StatusCode::OK,
        &json!({ "ok": true, "order": order_json(&order, &cfg.payment, now) }),
    ))
}

// ---------------------------------------------------------------------------------------------
// POST /<provider>/callback

fn webhook_reply(status: StatusCode, body: Value) -> Response {
    json_response(status, &body)
}

fn refused(status: StatusCode, msg: &str) -> Response {
    webhook_reply(status, json!({ "status": false, "msg": msg }))
}

/// True when the request carries `Authorization: Apikey <secret>` (scheme case-insensitive).
/// The secret is compared in constant time.
fn authorized(secret: &[u8], headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, sent)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("apikey") && bool::from(sent.trim().as_bytes().ct_eq(secret))
}

/// Reads at most `WEBHOOK_BODY_LIMIT` bytes: a declared or actual larger body is refused as
/// soon as it is seen, never buffered whole.
async fn read_limited(headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let too_large = || refused(StatusCode::PAYLOAD_TOO_LARGE, "request body exceeds 64 KiB");
    if declared.is_some_and(|n| n > WEBHOOK_BODY_LIMIT as u64) {
        return Err(too_large());
    }
    match Limited::new(body, WEBHOOK_BODY_LIMIT).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => {
            log::warn!("payment webhook body unreadable: {e}");
            Err(refused(StatusCode::BAD_REQUEST, "unreadable request body"))
        }
    }
}

/// A notification that passed the schema check.
struct Notification {
    status: bool,
    items: Vec<IncomingItem>,
}

/// Spec §4.4 schema: `status` boolean, `data` array of items with `transactionID` string,
/// `type` string, `amount` integer, `description` string, `date` `YYYY-MM-DD HH:MM:SS` and
/// `bank` string. Extra fields are kept (in `raw`) and otherwise ignored. The message names the
/// first problem.
fn parse_notification(body: &[u8]) -> Result<Notification, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|_| "body is not valid JSON".to_string())?;
    let obj = v.as_object().ok_or("body must be a JSON object")?;
    let status = obj
        .get("status")
        .and_then(Value::as_bool)
        .ok_or("status must be a boolean")?;
    let data = obj
        .get("data")
        .and_then(Value::as_array)
        .ok_or("data must be an array")?;
    let items = data
        .iter()
        .enumerate()
        .map(|(n, item)| parse_item(item).map_err(|m| format!("data[{n}]: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Notification { status, items })
}

fn parse_item(item: &Value) -> Result<IncomingItem, String> {
    let obj: &Map<String, Value> = item.as_object().ok_or("item must be an object")?;
    let string = |name: &str| -> Result<String, String> {
        obj.get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("{name} must be a string"))
    };
    let transaction_id = string("transactionID")?;
    if transaction_id.trim().is_empty() || transaction_id.len() > MAX_TRANSACTION_ID {
        return Err(format!(
            "transactionID must be 1 to {MAX_TRANSACTION_ID} characters"
        ));
    }
    let amount = obj
        .get("amount")
        .and_then(Value::as_i64)
        .ok_or("amount must be an integer")?;
    let date = string("date")?;
    if !is_bank_date(&date) {
        return Err("date must be YYYY-MM-DD HH:MM:SS".into());
    }
    Ok(IncomingItem {
        transaction_id,
        kind: string("type")?,
        amount_vnd: amount,
        description: string("description")?,
        bank: string("bank")?,
        date,
        raw: item.to_string(),
    })
}

/// `YYYY-MM-DD HH:MM:SS`, a real calendar date and time.
fn is_bank_date(s: &str) -> bool {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    s.len() == 19 && time::PrimitiveDateTime::parse(s, format).is_ok()
}

/// The bank's notifier. Order of checks: the provider in the path (404), the shared secret
/// (401 `{status:false}`), the body size (413, while reading), the schema (400). Then each item
/// in its own transaction; a storage failure answers 500 so the sender retries, and the retry
/// finds the items already stored as `duplicate`.
async fn webhook(
    State(state): State<SharedState>,
    Path(provider): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let cfg = state.config();
    if provider != cfg.payment.webhook_provider {
        return SiteError::NotFound.into_response();
    }
    let Some(secret) = state.secrets.webhook_secret.as_ref() else {
        log::error!("payment webhook refused: GATEWAY_WEBHOOK_SECRET is not set");
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook secret not configured",
        );
    };
    if !authorized(secret.expose(), &headers) {
        log::warn!("payment webhook refused: bad or missing Authorization");
        return webhook_reply(StatusCode::UNAUTHORIZED, json!({ "status": false }));
    }
    let body = match read_limited(&headers, body).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let note = match parse_notification(&body) {
        Ok(n) => n,
        Err(msg) => return refused(StatusCode::BAD_REQUEST, &msg),
    };

    let rules = MatchRules {
        lot_days: cfg.payment.lot_days,
        token_price_vnd_per_million: cfg.payment.token_price_vnd_per_million,
    };
    let store = state.db.payments();
    let mut processed = Vec::with_capacity(note.items.len());
    for item in &note.items {
        let (status, code, order) = if !note.status {
            (ItemStatus::Ignored, None, None)
        } else {
            let candidates = find_codes(&item.description, &cfg.payment.code_prefix);
            match store.process_item(item, &candidates, &rules).await {
                Ok(out) => (out.status, out.payment_code, out.order_id),
                Err(e) => {
                    log::error!(
                        "payment webhook storage failed at transaction {}: {e}",
                        item.transaction_id
                    );
                    return refused(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "storage failure; retry the notification",
                    );
                }
            }
        };
        gateway_core::metrics::webhook_item(status.as_str());
        log::info!(
            "payment webhook item {}: {} amount={} order={}",
            item.transaction_id,
            status.as_str(),
            item.amount_vnd,
            order.as_deref().unwrap_or("-")
        );
        processed.push(json!({
            "transactionID": item.transaction_id,
            "paymentCode": code,
            "orderId": order,
            "status": status.as_str(),
        }));
    }
    let msg = if note.status {
        format!("processed {} item(s)", processed.len())
    } else {
        "notification status is false; items ignored".to_string()
    };
    webhook_reply(
        StatusCode::OK,
        json!({ "status": true, "msg": msg, "processed": processed }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn crc_matches_the_reference_vector() {
        assert_eq!(crc16_ccitt(b"123456789"), 0x29B1);
    }

    #[test]
    fn vietqr_payload_shape() {
        let p = vietqr_payload("970415", "0000000000", 85000, "GWABCDEFGH").expect("payload");
        assert!(p.starts_with("000201010212"), "{p}");
        assert!(p.contains("0010A000000727"), "{p}");
        assert!(p.contains("5303704540585000"), "{p}");
        assert!(p.contains("62140810GWABCDEFGH"), "{p}");
        let (body, crc) = p.split_at(p.len() - 4);
        assert_eq!(format!("{:04X}", crc16_ccitt(body.as_bytes())), crc);
    }

    #[test]
    fn schema_is_checked() {
        let ok = br#"{"status":true,"data":[{"transactionID":"T1","type":"IN","amount":1000,
            "description":"x","date":"2026-11-22 10:00:00","bank":"VCB","extra":1}]}"#;
        let n = parse_notification(ok).expect("valid");
        assert_eq!(n.items.len(), 1);
        assert!(n.items[0].raw.contains("\"extra\":1"));
        for bad in [
            &br#"{"status":"yes","data":[]}"#[..],
            br#"{"status":true}"#,
            br#"{"status":true,"data":[{"transactionID":"T","type":"IN","amount":1.5,"description":"","date":"2026-11-22 10:00:00","bank":""}]}"#,
            br#"{"status":true,"data":[{"transactionID":"T","type":"IN","amount":1,"description":"","date":"2026-11-22","bank":""}]}"#,
            br#"{"status":true,"data":[{"transactionID":"T","type":"IN","amount":1,"description":"","date":"2026-13-22 10:00:00","bank":""}]}"#,
            br#"{"status":true,"data":[{"transactionID":"","type":"IN","amount":1,"description":"","date":"2026-11-22 10:00:00","bank":""}]}"#,
            br#"[1]"#,
            b"not json",
        ] {
            assert!(parse_notification(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn secret_is_checked() {
        let mut h = HeaderMap::new();
        assert!(!authorized(b"s3cret", &h));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Apikey s3cret"),
        );
        assert!(authorized(b"s3cret", &h));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("apikey s3cret"),
        );
        assert!(authorized(b"s3cret", &h));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer s3cret"),
        );
        assert!(!authorized(b"s3cret", &h));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Apikey s3cre"),
        );
        assert!(!authorized(b"s3cret", &h));
    }

    #[test]
    fn custom_orders_are_priced_up() {
        let cfg = gateway_core::config::Config::from_str(
            std::path::Path::new("t.toml"),
            "[payment]\ntoken_price_vnd_per_million = 1000\n",
        )
        .expect("config");
        let p = &cfg.payment;
        let o = order_request(p, "u", &json!({"quotaType":"token","quantity":1_500_001}))
            .expect("order");
        assert_eq!(o.amount_vnd, 1501);
        let err = |b: Value| order_request(p, "u", &b).err().map(|e| e.code());
        assert_eq!(
            err(json!({"quotaType":"request","quantity":5})),
            Some("price_not_configured")
        );
        assert_eq!(
            err(json!({"quotaType":"token","quantity":0})),
            Some("invalid_quantity")
        );
        assert_eq!(
            err(json!({"quotaType":"token","quantity":"5"})),
            Some("invalid_quantity")
        );
        assert_eq!(
            err(json!({"quotaType":"token","quantity":2.5})),
            Some("invalid_quantity")
        );
        assert_eq!(
            err(json!({"quotaType":"gold","quantity":5})),
            Some("invalid_quota_type")
        );
        assert_eq!(err(json!({"packageId":"gold"})), Some("invalid_package"));
        assert_eq!(err(json!({"packageId":7})), Some("invalid_package"));
        assert_eq!(err(json!({})), Some("invalid_package"));
    }
}
