//! Writing gateway-made responses (errors, local JSON) to the client.

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use crate::error::ApiError;
use gateway_core::quota::RateView;

pub const JSON: &str = "application/json; charset=utf-8";

/// The request-id header name, built at compile time (a `&str` name is parsed on every use).
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Anthropic's name for the request id: its SDKs read it into `_request_id`. Style-B answers
/// carry it beside `x-request-id`, with the same value.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

/// The headers of the gateway's own answers beyond [`header`]'s: the rate-limit windows and,
/// for style B, `request-id` and Anthropic's rate-limit headers.
pub fn gateway_headers(
    rate: &RateView,
    style_b: bool,
    request_id: &str,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut h = crate::rate_headers::list(rate);
    if style_b {
        add_style_b(&mut h, rate, request_id);
    }
    h
}

/// What a style-B answer carries beyond a style-A one: `request-id` and Anthropic's
/// rate-limit headers.
pub fn add_style_b(
    h: &mut impl Extend<(HeaderName, HeaderValue)>,
    rate: &RateView,
    request_id: &str,
) {
    if let Ok(id) = HeaderValue::from_str(request_id) {
        h.extend([(REQUEST_ID, id)]);
    }
    h.extend(crate::rate_headers::anthropic(
        rate,
        time::OffsetDateTime::now_utc().unix_timestamp(),
    ));
}

/// `content-length: n` without a `String` in between.
pub fn content_length(n: usize) -> HeaderValue {
    HeaderValue::from(n as u64)
}

/// Builds a response header with the gateway's standard headers.
pub fn header(status: u16, content_type: &str, request_id: &str) -> Option<ResponseHeader> {
    let mut h = ResponseHeader::build_no_case(status, Some(4)).ok()?;
    h.insert_header(http::header::CONTENT_TYPE, content_type)
        .ok()?;
    h.insert_header(X_REQUEST_ID, request_id).ok()?;
    h.insert_header(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    )
    .ok()?;
    Some(h)
}

/// Writes a complete JSON response. Failures mean the client is gone; nothing else to do.
pub async fn json(
    session: &mut Session,
    status: u16,
    body: Bytes,
    request_id: &str,
    extra: &[(HeaderName, HeaderValue)],
) {
    let Some(mut h) = header(status, JSON, request_id) else {
        return;
    };
    for (k, v) in extra {
        let _ = h.insert_header(k.clone(), v.clone());
    }
    let _ = h.insert_header(http::header::CONTENT_LENGTH, content_length(body.len()));
    if session
        .write_response_header(Box::new(h), false)
        .await
        .is_ok()
    {
        let _ = session.write_response_body(Some(body), true).await;
    }
}

/// Writes an API error in the style of the route (A or B).
pub async fn error(
    session: &mut Session,
    err: &ApiError,
    style_b: bool,
    request_id: &str,
    rate: &RateView,
) {
    let mut extra = gateway_headers(rate, style_b, request_id);
    if let ApiError::RateLimited {
        retry_after_secs, ..
    } = err
    {
        extra.push((
            http::header::RETRY_AFTER,
            HeaderValue::from(*retry_after_secs),
        ));
    }
    if matches!(err, ApiError::ServerBusy | ApiError::QuotaUnavailable) {
        extra.push((http::header::RETRY_AFTER, HeaderValue::from_static("1")));
    }
    json(session, err.status(), err.body(style_b), request_id, &extra).await;
}
