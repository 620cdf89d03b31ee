//! Talking to providers: address resolution, pooled HTTP/1.1 (TLS with SNI for https),
//! timeouts, and the one retry a stale pooled connection deserves.
//!
//! Why not Pingora's stock proxy path: the gateway must read the whole request body before it
//! can route (the model is in the body), and Pingora 0.9 can only re-send an already-read body
//! through its 64 KiB retry buffer. So the exchange is done here with pingora-core's public
//! `Connector`, and the caller streams the response back chunk by chunk.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::http::v1::client::{http_req_header_to_wire, HttpSession};
use pingora_core::protocols::Stream;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_http::{RequestHeader, ResponseHeader};
use tokio::io::AsyncWriteExt;

use crate::config::Provider;
use crate::proxy::pool::IdlePool;

const DNS_TTL: Duration = Duration::from_secs(60);
/// How long an idle pooled upstream connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Why an exchange failed. Everything here happens before a response byte reached the client,
/// so the caller may fail over to another deployment.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("resolve {0}: {1}")]
    Resolve(String, String),
    #[error("connect: {0}")]
    Connect(String),
    #[error("timeout waiting for the provider")]
    Timeout,
    #[error("i/o: {0}")]
    Io(String),
}

/// Shared upstream connection machinery for all providers.
pub struct UpstreamPool {
    /// Dials new connections (TCP, TLS with SNI); idle ones are kept in `idle`.
    connector: TransportConnector,
    idle: IdlePool,
    dns: DashMap<(String, u16), (Vec<SocketAddr>, Instant)>,
}

impl Default for UpstreamPool {
    fn default() -> Self {
        Self::new()
    }
}

/// A request to one provider: method, full path, headers already filtered, body.
pub struct ProviderRequest<'a> {
    pub provider: &'a Provider,
    pub method: &'a str,
    pub path: &'a str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
}

/// An exchange whose response header has arrived; the body is read with `next_chunk`.
pub struct Exchange {
    session: HttpSession,
    peer: HttpPeer,
    idle_timeout: Duration,
}

impl UpstreamPool {
    pub fn new() -> Self {
        UpstreamPool {
            connector: TransportConnector::new(None),
            idle: IdlePool::new(POOL_IDLE),
            dns: DashMap::new(),
        }
    }

    /// Resolves without blocking: IP literals directly, names through tokio with a short cache.
    async fn resolve(&self, host: &str, port: u16) -> Result<SocketAddr, UpstreamError> {
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        let key = (host.to_string(), port);
        if let Some(entry) = self.dns.get(&key) {
            if entry.1.elapsed() < DNS_TTL {
                if let Some(a) = entry.0.first() {
                    return Ok(*a);
                }
            }
        }
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| UpstreamError::Resolve(host.to_string(), e.to_string()))?
            .collect();
        let first = *addrs
            .first()
            .ok_or_else(|| UpstreamError::Resolve(host.to_string(), "no address".into()))?;
        self.dns.insert(key, (addrs, Instant::now()));
        Ok(first)
    }

    async fn peer(&self, p: &Provider) -> Result<HttpPeer, UpstreamError> {
        let addr = self.resolve(&p.host, p.port).await?;
        let sni = if p.tls { p.host.clone() } else { String::new() };
        let mut peer = HttpPeer::new(addr, p.tls, sni);
        peer.options.connection_timeout = Some(p.connect_timeout);
        peer.options.total_connection_timeout = Some(p.connect_timeout + Duration::from_secs(5));
        peer.options.idle_timeout = Some(POOL_IDLE);
        Ok(peer)
    }

    /// Sends the request and waits for the response header (first-byte timeout). A pooled
    /// connection that turns out to be dead before any response byte is retried on a fresh one.
    pub async fn start(&self, req: &ProviderRequest<'_>) -> Result<Exchange, UpstreamError> {
        let peer = self.peer(req.provider).await?;
        let wire = request_bytes(req)?;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (mut stream, reused) = match self.idle.take(peer.reuse_hash()) {
                Some(s) => (s, true),
                None => (
                    self.connector
                        .new_stream(&peer)
                        .await
                        .map_err(|e| UpstreamError::Connect(e.to_string()))?,
                    false,
                ),
            };
            // The request goes out in one write (header and body together): one packet and one
            // wake-up of the provider instead of two. Pingora's session API flushes the header
            // on its own, so the bytes are written to the stream and the session is built
            // around it to read the answer.
            let write_timeout = req.provider.connect_timeout.max(Duration::from_secs(30));
            let sent = match tokio::time::timeout(write_timeout, write_request(&mut stream, &wire))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(UpstreamError::Timeout),
            };
            let mut session = HttpSession::new_with_options(stream, &peer);
            session.read_timeout = Some(req.provider.first_byte_timeout);
            let answered = match sent {
                Ok(()) => read_header(&mut session).await,
                Err(e) => Err(e),
            };
            match answered {
                Ok(()) => {
                    session.read_timeout = Some(req.provider.idle_timeout);
                    return Ok(Exchange {
                        session,
                        peer,
                        idle_timeout: req.provider.idle_timeout,
                    });
                }
                Err(e) => {
                    session.shutdown().await;
                    let retryable = reused && attempts < 3 && !matches!(e, UpstreamError::Timeout);
                    if !retryable {
                        return Err(e);
                    }
                    log::debug!(
                        "stale pooled connection to {}: {e}; retrying",
                        req.provider.name
                    );
                }
            }
        }
    }

    /// Returns a fully read connection to the pool; anything half-read is closed instead.
    pub async fn finish(&self, mut ex: Exchange) {
        if ex.session.is_body_done() {
            ex.session.respect_keepalive();
            if let Some(stream) = ex.session.reuse().await {
                self.idle.put(ex.peer.reuse_hash(), stream);
            }
        } else {
            ex.session.shutdown().await;
        }
    }

    /// Closes idle connections past the idle timeout; run periodically.
    pub fn sweep_idle(&self) {
        self.idle.sweep();
    }

    /// Closes the connection without returning it (aborted stream, client gone).
    pub async fn abort(&self, mut ex: Exchange) {
        ex.session.shutdown().await;
    }
}

/// The request on the wire: header and body in one buffer.
fn request_bytes(req: &ProviderRequest<'_>) -> Result<BytesMut, UpstreamError> {
    let mut header =
        RequestHeader::build_no_case(req.method, req.path.as_bytes(), Some(req.headers.len() + 2))
            .map_err(|e| UpstreamError::Io(e.to_string()))?;
    header
        .insert_header("host", &req.provider.host_header)
        .map_err(|e| UpstreamError::Io(e.to_string()))?;
    for (name, value) in &req.headers {
        header
            .insert_header(*name, value.as_str())
            .map_err(|e| UpstreamError::Io(e.to_string()))?;
    }
    if req.method != "GET" {
        header
            .insert_header("content-length", req.body.len().to_string())
            .map_err(|e| UpstreamError::Io(e.to_string()))?;
    }
    let mut wire = http_req_header_to_wire(&header)
        .ok_or_else(|| UpstreamError::Io("request header cannot be written".into()))?;
    wire.extend_from_slice(&req.body);
    Ok(wire)
}

async fn write_request(stream: &mut Stream, wire: &[u8]) -> Result<(), UpstreamError> {
    stream
        .write_all(wire)
        .await
        .map_err(|e| UpstreamError::Io(e.to_string()))?;
    stream
        .flush()
        .await
        .map_err(|e| UpstreamError::Io(e.to_string()))
}

/// Waits for the response header, skipping informational (1xx) answers; bounded so a hostile
/// peer cannot loop us.
async fn read_header(session: &mut HttpSession) -> Result<(), UpstreamError> {
    for _ in 0..5 {
        session.read_response().await.map_err(|e| {
            if e.etype() == &pingora_error::ErrorType::ReadTimedout {
                UpstreamError::Timeout
            } else {
                UpstreamError::Io(e.to_string())
            }
        })?;
        match session.get_status() {
            Some(s) if s.is_informational() => continue,
            Some(_) => return Ok(()),
            None => return Err(UpstreamError::Io("no status".into())),
        }
    }
    Err(UpstreamError::Io("too many informational responses".into()))
}

impl Exchange {
    pub fn status(&self) -> u16 {
        self.session.get_status().map(|s| s.as_u16()).unwrap_or(502)
    }

    pub fn header(&self) -> Option<&ResponseHeader> {
        self.session.resp_header()
    }

    /// The next body chunk; `Ok(None)` at the end. The idle timeout applies between chunks.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        self.session.read_body_bytes().await.map_err(|e| {
            if e.etype() == &pingora_error::ErrorType::ReadTimedout {
                UpstreamError::Timeout
            } else {
                UpstreamError::Io(e.to_string())
            }
        })
    }

    /// Reads the whole body, bounded by `limit` bytes (provider error bodies, small JSON).
    pub async fn read_all(&mut self, limit: usize) -> Result<Bytes, UpstreamError> {
        let mut buf = bytes::BytesMut::new();
        while let Some(chunk) = self.next_chunk().await? {
            if buf.len() + chunk.len() > limit {
                return Err(UpstreamError::Io("response body too large".into()));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf.freeze())
    }

    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }
}

/// Shared handle type used by the proxy service.
pub type SharedUpstreams = Arc<UpstreamPool>;
