//! `POST /<webhook_provider>/callback`: the bank's payment notifications (spec §4.4).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::{Map, Value};
use subtle::ConstantTimeEq;

use crate::error::SiteError;
use crate::reply;
use gateway_core::state::SharedState;
use gateway_core::storage::payments::{find_codes, IncomingItem, ItemStatus, MatchRules};

/// Spec §8: the webhook body limit. Larger bodies are refused while reading.
pub const WEBHOOK_BODY_LIMIT: usize = 64 * 1024;
/// Longest accepted `transactionID`.
const MAX_TRANSACTION_ID: usize = 256;

/// `{status:false}` with an optional message: what the sender sees when it should fix
/// something (or retry, for a 5xx).
#[derive(Serialize)]
struct Refusal<'a> {
    status: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    msg: Option<&'a str>,
}

fn refused(status: StatusCode, msg: &str) -> Response {
    reply::json(
        status,
        &Refusal {
            status: false,
            msg: Some(msg),
        },
    )
}

/// One item's outcome in the receipt.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Processed {
    #[serde(rename = "transactionID")]
    transaction_id: String,
    payment_code: Option<String>,
    order_id: Option<String>,
    status: &'static str,
}

#[derive(Serialize)]
struct Receipt {
    status: bool,
    msg: String,
    processed: Vec<Processed>,
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
pub(super) async fn webhook(
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
        return reply::json(
            StatusCode::UNAUTHORIZED,
            &Refusal {
                status: false,
                msg: None,
            },
        );
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
        max_amount_vnd: cfg.payment.max_webhook_amount_vnd,
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
        if !gateway_core::storage::payments::amount_in_range(item, &rules) {
            log::warn!(
                "payment webhook item {} refused: amount {} VND is outside 1..={} \
                 ([payment] max_webhook_amount_vnd); nothing stored",
                item.transaction_id,
                item.amount_vnd,
                cfg.payment.max_webhook_amount_vnd
            );
        }
        log::info!(
            "payment webhook item {}: {} amount={} order={}",
            item.transaction_id,
            status.as_str(),
            item.amount_vnd,
            order.as_deref().unwrap_or("-")
        );
        processed.push(Processed {
            transaction_id: item.transaction_id.clone(),
            payment_code: code,
            order_id: order,
            status: status.as_str(),
        });
    }
    let msg = if note.status {
        format!("processed {} item(s)", processed.len())
    } else {
        "notification status is false; items ignored".to_string()
    };
    reply::json(
        StatusCode::OK,
        &Receipt {
            status: true,
            msg,
            processed,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
}
