//! The admin listener: metrics and liveness for the operator.

use async_trait::async_trait;

/// The admin listener: Prometheus text at `/metrics`, liveness at `/health`.
pub(super) struct AdminApp;

#[async_trait]
impl pingora_core::apps::http_app::ServeHttp for AdminApp {
    async fn response(
        &self,
        session: &mut pingora_core::protocols::http::ServerSession,
    ) -> http::Response<Vec<u8>> {
        let (status, ctype, body) = match session.req_header().uri.path() {
            "/metrics" => (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                gateway_core::metrics::render().into_bytes(),
            ),
            "/health" => (
                200,
                "application/json; charset=utf-8",
                b"{\"ok\":true}".to_vec(),
            ),
            _ => (404, "text/plain; charset=utf-8", b"not found".to_vec()),
        };
        http::Response::builder()
            .status(status)
            .header("content-type", ctype)
            .header("content-length", body.len())
            .body(body)
            .unwrap_or_default()
    }
}
