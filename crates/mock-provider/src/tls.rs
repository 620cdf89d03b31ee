//! The mock's optional TLS listener (`--tls-cert`, `--tls-key`): the same answers as over plain
//! HTTP, so a test can show that a provider reached over HTTPS behaves exactly like one reached
//! over HTTP. HTTP/1.1 only, as the gateway speaks to providers.
//!
//! The certificate is offered only to clients that name a server (SNI), and every name asked
//! for is kept and shown in `/__mock/stats` as `tls_server_names`: a test proves the gateway
//! sends the provider's host name by reading it there.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use pingora_rustls::sign::CertifiedKey;
use pingora_rustls::{ClientHello, CryptoProvider, ResolvesServerCert, ServerConfig, TlsAcceptor};

/// Server names the TLS clients asked for, in handshake order.
static SERVER_NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The server names seen so far.
pub fn server_names() -> Vec<String> {
    SERVER_NAMES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Answers only handshakes that name a server, and notes the name.
#[derive(Debug)]
struct SniOnly(Arc<CertifiedKey>);

impl ResolvesServerCert for SniOnly {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?.to_string();
        SERVER_NAMES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name);
        Some(Arc::clone(&self.0))
    }
}

/// An acceptor for the PEM certificate chain and key at these paths.
pub fn acceptor(cert: &str, key: &str) -> io::Result<TlsAcceptor> {
    pingora_rustls::install_default_crypto_provider();
    let (certs, key) = pingora_rustls::load_certs_and_key_files(cert, key)
        .map_err(|e| io::Error::other(format!("TLS files: {e}")))?
        .ok_or_else(|| io::Error::other("TLS files hold no certificate or no key"))?;
    let provider =
        CryptoProvider::get_default().ok_or_else(|| io::Error::other("no TLS crypto provider"))?;
    let certified = CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| io::Error::other(format!("TLS certificate: {e}")))?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniOnly(Arc::new(certified))));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
