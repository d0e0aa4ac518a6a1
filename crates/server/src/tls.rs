//! HTTPS for `kayra serve` when `server.tls` is set: rustls (ring) with a
//! PEM certificate chain and key.
//!
//! axum serves any [`axum::serve::Listener`]; ours hands out connections
//! whose TLS handshake has already completed. Handshakes run in their own
//! tasks with a timeout (`server.request_header_timeout`: the handshake
//! comes before the head), so a slow or silent client never holds up the
//! accept loop for everyone else.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kayra_config::ServerTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Handshaken connections waiting for axum to take them.
const BACKLOG: usize = 128;

/// The acceptor for `tls`'s certificate chain and key.
pub fn acceptor(tls: &ServerTls) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(&tls.cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("read certificates from {}", tls.cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .with_context(|| format!("read private key from {}", tls.key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("certificate and key do not form a valid pair")?;
    // The server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A TCP listener that yields TLS streams.
pub struct Listener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    accept_loop: JoinHandle<()>,
}

impl Listener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor, handshake_timeout: Duration) -> io::Result<Self> {
        let local_addr = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(BACKLOG);
        let accept_loop = tokio::spawn(accept_loop(tcp, acceptor, tx, handshake_timeout));
        Ok(Self { ready, local_addr, accept_loop })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Dropped when axum stops serving: stop accepting new connections.
        self.accept_loop.abort();
    }
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop only ends when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    handshake_timeout: Duration,
) {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(connection) => connection,
            Err(e) => {
                // Out of file descriptors and the like: back off, as axum does.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}
