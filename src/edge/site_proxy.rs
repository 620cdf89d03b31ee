//! The site listener: a reverse proxy in front of the account service's private socket.

use std::path::PathBuf;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_proxy::{ProxyHttp, Session};

use gateway_devapi::conn_limits::Phase;

/// The site listener: forwards everything to the account service's private socket, telling it
/// the real client address (any client-sent forwarding header is replaced, never trusted).
pub(super) struct SiteEdge {
    pub(super) socket: PathBuf,
}

#[async_trait]
impl ProxyHttp for SiteEdge {
    type CTX = ();

    fn new_ctx(&self) {}

    /// The head is in: the connection's limits move on to the body, or straight to serving.
    async fn request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_error::Result<bool> {
        let phase = if session.is_body_empty() {
            Phase::Serving
        } else {
            Phase::Body
        };
        if let Some(stream) = session.as_downstream().stream() {
            gateway_devapi::affinity::set_phase(stream, phase);
        }
        Ok(false)
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        _body: &mut Option<Bytes>,
        end_of_stream: bool,
        _ctx: &mut (),
    ) -> pingora_error::Result<()> {
        if end_of_stream {
            if let Some(stream) = session.as_downstream().stream() {
                gateway_devapi::affinity::set_phase(stream, Phase::Serving);
            }
        }
        Ok(())
    }

    async fn logging(
        &self,
        session: &mut Session,
        _e: Option<&pingora_error::Error>,
        _ctx: &mut (),
    ) {
        gateway_devapi::affinity::request_done(session);
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora_error::Result<Box<HttpPeer>> {
        let path = self.socket.display().to_string();
        Ok(Box::new(HttpPeer::new_uds(&path, false, String::new())?))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut pingora_http::RequestHeader,
        _ctx: &mut (),
    ) -> pingora_error::Result<()> {
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        upstream_request.insert_header("x-gateway-client-ip", client)?;
        upstream_request.remove_header("x-forwarded-for");
        if !session.is_body_empty() {
            // A request with a body gets a connection of its own. The account service may
            // answer before it has read the body (a refusal decided from the head); its HTTP
            // server then closes the connection after the answer, possibly after it went back
            // to the pool, and the next request on it failed (a 502 on a sign-in step). The
            // socket is local: a fresh connection per mutation costs little.
            upstream_request.insert_header(http::header::CONNECTION, "close")?;
        }
        Ok(())
    }

    /// A pooled connection to the account service may have been closed by it while idle.
    /// Writing the next request then fails; the service cannot have received that request
    /// whole, so it is retried on a fresh connection whatever its method (Pingora's default
    /// retries only idempotent methods, which answered a POST with 502).
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<pingora_error::Error>,
        _ctx: &mut (),
        client_reused: bool,
    ) -> Box<pingora_error::Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let unsent = e.etype() == &pingora_error::ErrorType::WriteError;
        if client_reused && unsent && !session.as_ref().retry_buffer_truncated() {
            e.set_retry(true);
        } else if !session.req_header().method.is_idempotent()
            || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        e
    }
}
