//! One span per site request when telemetry is on: the matched route, the status and the
//! outcome, as a child of the caller's `traceparent` when it sent one. Added to the router only
//! when telemetry is on ([`crate::router`]); nothing of a request (cookies, bodies, query
//! values) is recorded.

use std::borrow::Cow;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use gateway_telemetry::{SpanKind, SpanRecord};

/// Wraps one routed request in a server span.
pub async fn span(req: Request, next: Next) -> Response {
    let Some(t) = gateway_telemetry::get() else {
        return next.run(req).await;
    };
    let parent = t.parent_from(req.headers());
    let context = t.server_context(parent.as_ref());
    if !context.is_sampled() {
        return next.run(req).await;
    }
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| req.uri().path().to_owned(), |m| m.as_str().to_owned());
    let mut span = SpanRecord::start(
        context,
        parent.as_ref().map(|p| (p, true)),
        format!("{method} {route}"),
        SpanKind::Server,
        gateway_telemetry::Timestamp::now(),
    );
    span.set("http.request.method", method.as_str());
    span.set("http.route", route.as_str());
    span.set("url.scheme", "http");
    let resp = next.run(req).await;
    let status = resp.status();
    span.set("http.response.status_code", i64::from(status.as_u16()));
    span.set("gateway.outcome", crate::outcome(status));
    if status.is_server_error() {
        span.set("error.type", status.as_u16().to_string().as_str());
        span.error = Some(Cow::Owned(status.as_u16().to_string()));
    }
    span.end = gateway_telemetry::Timestamp::now();
    t.submit(&span);
    resp
}
