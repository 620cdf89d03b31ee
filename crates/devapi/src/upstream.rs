//! Talking to providers: address resolution, pooled HTTP/1.1 (TLS with SNI for https),
//! timeouts, and the one retry a stale pooled connection deserves.
//!
//! Why not Pingora's stock proxy path: the gateway must read the whole request body before it
//! can route (the model is in the body), and Pingora 0.9 can only re-send an already-read body
//! through its 64 KiB retry buffer. So connections are dialed with pingora-core's public
//! `Connector`, the request is written in one piece, the answer read by [`crate::http1`], and
//! the caller streams it back chunk by chunk.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use pingora_core::connectors::TransportConnector;
use pingora_core::protocols::Stream;
use pingora_core::upstreams::peer::HttpPeer;
use tokio::io::AsyncWriteExt;

use crate::http1::{ReadError, Response};

use crate::pool::IdlePool;
use gateway_core::config::Provider;
use gateway_core::util::FastHash;

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
    /// The TLS handshake failed: most often a certificate that does not chain to a trusted
    /// authority or does not name the host.
    #[error(
        "TLS handshake with {0} failed: the provider's certificate is not trusted or not valid \
         for its name (a private CA is trusted through the provider's ca_file or SSL_CERT_FILE): {1}"
    )]
    Tls(String, String),
    #[error("timeout waiting for {0}")]
    Timeout(Wait),
    #[error("i/o: {0}")]
    Io(String),
    /// The request cannot be put on the wire (a value HTTP does not allow): no provider is at
    /// fault, and none would take it.
    #[error("request: {0}")]
    Request(String),
}

/// What a timed-out exchange was waiting for; each has its provider setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `connect_timeout_ms`.
    Connect,
    /// `first_byte_timeout_ms`: the answer's header.
    FirstByte,
    /// `idle_timeout_ms`: the next chunk of the body.
    Idle,
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Wait::Connect => "the connection",
            Wait::FirstByte => "the first byte",
            Wait::Idle => "the next chunk",
        })
    }
}

/// Shared upstream connection machinery for all providers.
pub struct UpstreamPool {
    /// Dials new connections (TCP, TLS with SNI); idle ones are kept in `idle`.
    connector: TransportConnector,
    idle: IdlePool,
    /// The addresses of the host names providers are named by, and when they were looked up:
    /// keyed by the name alone (the port is set when dialling), so a lookup borrows the
    /// provider's `host` and allocates nothing, and `http://` and `https://` of one name share
    /// an entry.
    dns: DashMap<String, (Vec<SocketAddr>, Instant), FastHash>,
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
    pub path: std::borrow::Cow<'a, str>,
    pub headers: Vec<(&'static str, std::borrow::Cow<'a, str>)>,
    pub body: Bytes,
}

/// An exchange whose response header has arrived; the body is read with `next_chunk`.
///
/// The answer is boxed: an exchange is moved out of `start` and through the caller's futures,
/// and its read buffer and header map inline would be copied with every move.
pub struct Exchange {
    answer: Box<Response<Stream>>,
    pool_key: u64,
}

impl UpstreamPool {
    pub fn new() -> Self {
        UpstreamPool {
            connector: TransportConnector::new(None),
            idle: IdlePool::new(POOL_IDLE),
            dns: DashMap::default(),
        }
    }

    /// Resolves without blocking: IP literals directly (parsed at config load), names through
    /// tokio with a short cache.
    async fn resolve(&self, p: &Provider) -> Result<SocketAddr, UpstreamError> {
        let (host, port) = (p.host.as_str(), p.port);
        if let Some(ip) = p.ip {
            return Ok(SocketAddr::new(ip, port));
        }
        // Whole socket addresses are kept, the port set per use: a link-local IPv6 address
        // (an mDNS name's) needs its scope id.
        let with_port = |mut a: SocketAddr| {
            a.set_port(port);
            a
        };
        if let Some(entry) = self.dns.get(host) {
            if entry.1.elapsed() < DNS_TTL {
                if let Some(a) = entry.0.first() {
                    return Ok(with_port(*a));
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
        self.dns.insert(host.to_string(), (addrs, Instant::now()));
        Ok(with_port(first))
    }

    /// The peer to open a new connection to (only needed when none is idle).
    fn peer(p: &Provider, addr: SocketAddr) -> HttpPeer {
        let sni = if p.tls { p.host.clone() } else { String::new() };
        let mut peer = HttpPeer::new(addr, p.tls, sni);
        peer.options.connection_timeout = Some(p.connect_timeout);
        peer.options.total_connection_timeout = Some(p.connect_timeout + Duration::from_secs(5));
        peer.options.idle_timeout = Some(POOL_IDLE);
        peer.options.ca = p.ca.as_ref().map(|ca| Arc::clone(&ca.certs));
        peer
    }

    /// Sends the request and waits for the response header (first-byte timeout). A pooled
    /// connection that turns out to be dead before any response byte is retried on a fresh one.
    pub async fn start(&self, req: &ProviderRequest<'_>) -> Result<Exchange, UpstreamError> {
        let p = req.provider;
        let addr = self.resolve(p).await?;
        let pool_key = pool_key(p, addr);
        let wire = request_bytes(req)?;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (mut stream, reused) = match self.idle.take(pool_key) {
                Some(s) => (s, true),
                // Boxed: dialing (TCP, TLS) is a ~8 KiB future, and inline it would make this
                // whole future that large, copied on every request that reuses a connection.
                None => (
                    Box::pin(self.connector.new_stream(&Self::peer(p, addr)))
                        .await
                        .map_err(|e| connect_error(p, &e))?,
                    false,
                ),
            };
            // The request goes out in one write (header and body together): one packet and one
            // wake-up of the provider instead of two.
            let write_timeout = req.provider.connect_timeout.max(Duration::from_secs(30));
            let sent = match tokio::time::timeout(write_timeout, write_request(&mut stream, &wire))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(UpstreamError::Timeout(Wait::FirstByte)),
            };
            // A pooled connection the provider had closed fails the write, or ends before any
            // byte of an answer: only then is the request sent again on a fresh one. An answer
            // that broke off part-way may mean the provider did the work: never resent.
            let (answered, stale) = match sent {
                Ok(()) => {
                    match Response::read_head(stream, Some(req.provider.first_byte_timeout)).await {
                        Ok(answer) => (Ok(answer), false),
                        Err(e) => {
                            let stale = matches!(e, ReadError::NothingArrived(_));
                            (Err(read_error(e, Wait::FirstByte)), stale)
                        }
                    }
                }
                Err(e) => {
                    let stale = !matches!(e, UpstreamError::Timeout(_));
                    (Err(e), stale)
                }
            };
            match answered {
                Ok(mut answer) => {
                    answer.read_timeout = Some(req.provider.idle_timeout);
                    return Ok(Exchange {
                        answer: Box::new(answer),
                        pool_key,
                    });
                }
                Err(e) => {
                    if !(reused && stale && attempts < 3) {
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
    pub async fn finish(&self, ex: Exchange) {
        if let Some(stream) = ex.answer.reusable() {
            self.idle.put(ex.pool_key, stream);
        }
    }

    /// Closes idle connections past the idle timeout; run periodically.
    pub fn sweep_idle(&self) {
        self.idle.sweep();
    }

    /// Closes the connection without returning it (aborted stream, client gone).
    pub async fn abort(&self, ex: Exchange) {
        drop(ex);
    }
}

/// Which idle connections can serve a provider: same address, same TLS and server name. (Pingora's
/// `HttpPeer::reuse_hash` says the same, but needs a peer built for every request.)
fn pool_key(p: &Provider, addr: SocketAddr) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    addr.hash(&mut h);
    p.tls.hash(&mut h);
    if p.tls {
        p.host.hash(&mut h);
        p.ca.as_ref().map(|ca| ca.file.as_str()).hash(&mut h);
    }
    h.finish()
}

/// A dialing failure, with TLS handshake failures told apart: their log line has to say that
/// trust is the likely problem, not the network.
fn connect_error(p: &Provider, e: &pingora_error::Error) -> UpstreamError {
    use pingora_error::ErrorType;
    match e.etype() {
        ErrorType::ConnectTimedout => UpstreamError::Timeout(Wait::Connect),
        ErrorType::TLSHandshakeFailure
        | ErrorType::TLSHandshakeTimedout
        | ErrorType::HandshakeError
        | ErrorType::InvalidCert
        | ErrorType::TLSWantX509Lookup => UpstreamError::Tls(p.host.clone(), e.to_string()),
        _ => UpstreamError::Connect(e.to_string()),
    }
}

/// The request on the wire: header and body in one buffer, written directly (no header map:
/// the names are the gateway's own, the values already parsed header values or configuration).
/// A value that would break the framing (control characters) refuses the request.
fn request_bytes(req: &ProviderRequest<'_>) -> Result<BytesMut, UpstreamError> {
    fn field(wire: &mut BytesMut, name: &str, value: &str) -> Result<(), UpstreamError> {
        // Every byte looked at, no early exit: the compiler checks 16 or 32 at once.
        let allowed = value.bytes().fold(true, |ok, b| {
            ok & ((b == b'\t') | ((b >= 0x20) & (b != 0x7f)))
        });
        if !allowed {
            return Err(UpstreamError::Request(format!(
                "header {name} has a character HTTP does not allow"
            )));
        }
        wire.extend_from_slice(name.as_bytes());
        wire.extend_from_slice(b": ");
        wire.extend_from_slice(value.as_bytes());
        wire.extend_from_slice(b"\r\n");
        Ok(())
    }
    if !req.path.starts_with('/') || !req.path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(UpstreamError::Request(format!(
            "invalid request path {:?}",
            req.path
        )));
    }
    let mut wire = BytesMut::with_capacity(256 + req.path.len() + req.body.len());
    wire.extend_from_slice(req.method.as_bytes());
    wire.extend_from_slice(b" ");
    wire.extend_from_slice(req.path.as_bytes());
    wire.extend_from_slice(b" HTTP/1.1\r\n");
    field(&mut wire, "host", &req.provider.host_header)?;
    for (name, value) in &req.headers {
        field(&mut wire, name, value)?;
    }
    if req.method != "GET" {
        field(
            &mut wire,
            "content-length",
            itoa::Buffer::new().format(req.body.len()),
        )?;
    }
    wire.extend_from_slice(b"\r\n");
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

/// An answer that could not be read, as the exchange's error: a timeout names what it waited
/// for.
fn read_error(e: ReadError, waiting: Wait) -> UpstreamError {
    match e {
        ReadError::Timeout => UpstreamError::Timeout(waiting),
        other => UpstreamError::Io(other.to_string()),
    }
}

impl Exchange {
    pub fn status(&self) -> u16 {
        self.answer.status
    }

    pub fn header(&self) -> &crate::http1::Fields {
        &self.answer.headers
    }

    /// The next body chunk; `Ok(None)` at the end. The idle timeout applies between chunks.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, UpstreamError> {
        self.answer
            .next_chunk()
            .await
            .map_err(|e| read_error(e, Wait::Idle))
    }

    /// The next body chunk if it has already arrived; `None` when a read would wait. A stream's
    /// events arrive as one chunk each, and the relay reads what is already buffered
    /// (`forward::coalesce`) before the waiting read (`next_chunk`, with the idle timeout).
    pub fn ready_chunk(&mut self) -> Option<Result<Option<Bytes>, UpstreamError>> {
        self.answer
            .ready_chunk()
            .map(|r| r.map_err(|e| read_error(e, Wait::Idle)))
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
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use super::*;
    use gateway_core::domain::ProviderStyle;

    fn provider() -> Provider {
        Provider {
            name: "p".into(),
            style: ProviderStyle::OpenAi,
            tls: false,
            host: "127.0.0.1".into(),
            ip: "127.0.0.1".parse().ok(),
            port: 9000,
            base_path: String::new(),
            host_header: "127.0.0.1:9000".into(),
            api_key: None,
            api_key_env: None,
            api_key_mask: Default::default(),
            connect_timeout: Duration::from_secs(1),
            first_byte_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            eject_after_failures: 3,
            cooldown: Duration::from_secs(1),
            ca: None,
            serves_responses: true,
            access: Default::default(),
            max_cooldown: Duration::from_secs(1),
        }
    }

    /// An IP literal is dialled as parsed at load; a host name is looked up once and then
    /// found in the cache by its name, with each provider's own port (`http://` and
    /// `https://` of one name share the entry).
    #[tokio::test]
    async fn addresses_come_from_the_literal_or_the_cache() {
        let pool = UpstreamPool::new();
        let literal = provider();
        assert_eq!(
            pool.resolve(&literal).await.unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert!(pool.dns.is_empty());
        let named = Provider {
            host: "localhost".into(),
            ip: None,
            host_header: "localhost".into(),
            port: 80,
            ..provider()
        };
        let first = pool.resolve(&named).await.unwrap();
        assert_eq!((first.ip().is_loopback(), first.port()), (true, 80));
        assert_eq!(pool.dns.len(), 1);
        assert_eq!(pool.resolve(&named).await.unwrap(), first);
        let other_port = Provider {
            port: 443,
            tls: true,
            ..named
        };
        let second = pool.resolve(&other_port).await.unwrap();
        assert_eq!((second.ip(), second.port()), (first.ip(), 443));
        assert_eq!(pool.dns.len(), 1);
        // A link-local address (an mDNS name's) keeps its scope id from the cache.
        let scoped: SocketAddr = "[fe80::1%2]:1".parse().unwrap();
        pool.dns
            .insert("box.local".into(), (vec![scoped], Instant::now()));
        let local = Provider {
            host: "box.local".into(),
            host_header: "box.local:11434".into(),
            port: 11434,
            ..other_port
        };
        match pool.resolve(&local).await.unwrap() {
            SocketAddr::V6(a) => assert_eq!((a.scope_id(), a.port()), (2, 11434)),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn request_is_written_with_its_length_and_body() {
        let p = provider();
        let req = ProviderRequest {
            provider: &p,
            method: "POST",
            path: "/v1/chat/completions".into(),
            headers: vec![
                ("content-type", Cow::Borrowed("application/json")),
                ("authorization", Cow::Owned("Bearer k".into())),
            ],
            body: Bytes::from_static(b"{\"a\":1}"),
        };
        let wire = request_bytes(&req).unwrap();
        assert_eq!(
            &wire[..],
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:9000\r\n\
              content-type: application/json\r\nauthorization: Bearer k\r\n\
              content-length: 7\r\n\r\n{\"a\":1}"
        );
    }

    #[test]
    fn values_that_would_break_the_framing_are_refused() {
        let p = provider();
        for bad in ["a\r\nx-injected: 1", "a\nb", "a\0b"] {
            let req = ProviderRequest {
                provider: &p,
                method: "GET",
                path: "/v1/models".into(),
                headers: vec![("user-agent", Cow::Borrowed(bad))],
                body: Bytes::new(),
            };
            assert!(request_bytes(&req).is_err(), "{bad:?}");
        }
        let req = ProviderRequest {
            provider: &p,
            method: "GET",
            path: "/v1/models x".into(),
            headers: vec![],
            body: Bytes::new(),
        };
        assert!(request_bytes(&req).is_err());
    }
}
