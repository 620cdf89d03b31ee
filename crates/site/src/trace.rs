//! One span per site request when telemetry is on: the matched route, the status and the
//! outcome, as a child of the caller's `traceparent` when it sent one. Added to the router only
//! when telemetry is on ([`crate::router`]); nothing of a request (cookies, bodies, query
//! values) is recorded.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use gateway_telemetry::{KeyValue, Span, SpanKind, Status, Tracer};

/// Wraps one routed request in a server span.
pub async fn span(req: Request, next: Next) -> Response {
    let Some(t) = gateway_telemetry::get() else {
        return next.run(req).await;
    };
    let method = req.method().as_str().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| req.uri().path().to_owned(), |m| m.as_str().to_owned());
    let parent = t.parent_from(req.headers());
    let builder = t
        .tracer()
        .span_builder(format!("{method} {route}"))
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("http.request.method", method),
            KeyValue::new("http.route", route),
            KeyValue::new("url.scheme", "http"),
        ]);
    let mut span = t.tracer().build_with_context(builder, &parent);
    let resp = next.run(req).await;
    let status = resp.status();
    let outcome = crate::outcome(status);
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status.as_u16()),
    ));
    span.set_attribute(KeyValue::new("gateway.outcome", outcome));
    if status.is_server_error() {
        span.set_attribute(KeyValue::new("error.type", status.as_u16().to_string()));
        span.set_status(Status::error(status.as_u16().to_string()));
    }
    span.end();
    resp
}
