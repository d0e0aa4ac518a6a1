//! Readiness for systemd's `Type=notify` units (`deploy/systemd/`).
//!
//! When systemd starts a process with `$NOTIFY_SOCKET` set, the process
//! tells it "started" with a `READY=1` datagram on that socket (the
//! sd_notify protocol: one datagram of `KEY=VALUE` lines to a Unix socket,
//! `@` meaning the abstract namespace). A few lines of std do that; no
//! crate is needed.
//!
//! `kayra serve` and `kayra reconciler` say `READY=1` when their own
//! `/readyz` first answers 200: [`when_ready`] asks it over loopback, so
//! "started" for systemd means exactly what it means to a load balancer or
//! a probe (store reachable, auth caches current, the reconciler's startup
//! list dispatched), and there is one definition of ready, not two. Without
//! `$NOTIFY_SOCKET` nothing is probed or sent.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The variable systemd sets for a `Type=notify` service.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// Pause between two `/readyz` probes while not ready.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// One probe's deadline: `/readyz` itself waits up to 2 s for the store.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether systemd waits for a notification from this process.
pub fn expected() -> bool {
    std::env::var_os(NOTIFY_SOCKET).is_some_and(|s| !s.is_empty())
}

/// Sends `state` (e.g. `READY=1`) to `$NOTIFY_SOCKET`; nothing without it.
pub fn send(state: &str) -> io::Result<()> {
    let Some(path) = std::env::var_os(NOTIFY_SOCKET).filter(|s| !s.is_empty()) else {
        return Ok(());
    };
    let socket = UnixDatagram::unbound()?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    if let Some(name) = bytes.strip_prefix(b"@") {
        abstract_send(&socket, name, state.as_bytes())
    } else {
        socket.send_to(state.as_bytes(), &path).map(drop)
    }
}

#[cfg(target_os = "linux")]
fn abstract_send(socket: &UnixDatagram, name: &[u8], message: &[u8]) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    socket.send_to_addr(message, &address).map(drop)
}

#[cfg(not(target_os = "linux"))]
fn abstract_send(_: &UnixDatagram, _: &[u8], _: &[u8]) -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "abstract NOTIFY_SOCKET addresses exist on Linux only"))
}

/// When systemd expects a notification: probes `GET /readyz` on `listen`
/// (the process's own listener; over TLS with `tls`) until it answers
/// 200, then sends `READY=1`. Runs until then; the caller spawns it.
pub async fn when_ready(listen: SocketAddr, tls: bool) {
    if !expected() {
        return;
    }
    let target = loopback(listen);
    let connector = match tls.then(insecure_connector).transpose() {
        Ok(connector) => connector,
        Err(e) => {
            tracing::warn!(error = %e, "cannot probe /readyz over TLS; systemd is not told when this process is ready");
            return;
        }
    };
    loop {
        let probe = probe(target, connector.as_ref());
        if let Ok(Ok(true)) = tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            break;
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    match send("READY=1") {
        Ok(()) => tracing::info!("ready: told systemd"),
        Err(e) => tracing::warn!(error = %e, "ready, but telling systemd failed"),
    }
}

/// The address to reach a listener bound to `listen` from this host.
fn loopback(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// One `GET /readyz`: whether it answered 200.
async fn probe(target: SocketAddr, tls: Option<&TlsConnector>) -> io::Result<bool> {
    let tcp = TcpStream::connect(target).await?;
    match tls {
        None => readyz(tcp).await,
        Some(connector) => {
            let name = ServerName::IpAddress(target.ip().into());
            readyz(connector.connect(name, tcp).await?).await
        }
    }
}

async fn readyz(mut stream: impl AsyncRead + AsyncWrite + Unpin) -> io::Result<bool> {
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await?;
    // "HTTP/1.1 200"
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await?;
    Ok(head.starts_with(b"HTTP/1.") && &head[9..12] == b"200")
}

/// A TLS client for the probe of the process's own listener over loopback.
/// It does not check the certificate: the server's name in it is not
/// "localhost", the probe sends nothing secret and reads one status line,
/// and the peer is this very process.
fn insecure_connector() -> Result<TlsConnector, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Accepts any certificate, but still checks the handshake's signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
