//! Slow and silent connections (§2 `server.request_header_timeout`,
//! `server.idle_timeout`): a connection whose request head is not complete
//! in time is closed — silent or trickling one header line at a time — and
//! so is an idle keep-alive connection, on plain and TLS listeners, while
//! `/healthz` keeps answering. Short configured timeouts keep it quick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Backend, Server};

const HEAD_TIMEOUT: Duration = Duration::from_secs(1);
const IDLE_TIMEOUT: Duration = Duration::from_secs(4);
/// Generous upper bound for a close to be noticed on a loaded machine.
const NOTICE: Duration = Duration::from_secs(20);

async fn server(change: impl FnOnce(&mut kayra_config::Config)) -> Server {
    let plain = Server::start(Backend::Local).await;
    plain
        .restart_with(|c| {
            c.server.request_header_timeout = kayra_config::Duration(HEAD_TIMEOUT);
            c.server.idle_timeout = kayra_config::Duration(IDLE_TIMEOUT);
            change(c);
        })
        .await
}

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").trim_start_matches("https://").to_string()
}

/// Waits until the peer closes `stream` (EOF or reset), reading and
/// discarding whatever comes; how long that took.
async fn closed<S: AsyncRead + Unpin>(stream: &mut S) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let wait = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(NOTICE, wait).await.expect("the server closed the connection in time");
    started.elapsed()
}

async fn healthz_answers(server: &Server) {
    let reply = server.call(reqwest::Method::GET, "/healthz", None, None).await;
    assert_eq!(reply.status, 200, "{}", reply.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_trickling_and_idle_connections_are_closed() {
    let server = server(|_| {}).await;
    let addr = addr(&server);

    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    let trickling: Vec<_> = (0..5)
        .map(|i| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(&addr).await.expect("connect");
                stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.expect("first line");
                let started = Instant::now();
                // One header line every 200ms, never the blank line that ends the head.
                let mut lines = 0u32;
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if stream.write_all(format!("X-Slow-{i}-{lines}: 1\r\n").as_bytes()).await.is_err() {
                        break;
                    }
                    lines += 1;
                    let mut probe = [0u8; 1];
                    if let Ok(Ok(0) | Err(_)) =
                        tokio::time::timeout(Duration::from_millis(1), stream.read(&mut probe)).await
                    {
                        break;
                    }
                    assert!(started.elapsed() < NOTICE, "a trickling connection was never closed");
                }
                assert!(lines >= 2, "the connection was closed before it trickled");
                started.elapsed()
            })
        })
        .collect();

    // Everyone else is still served while they hang around.
    healthz_answers(&server).await;

    for stream in &mut silent {
        closed(stream).await;
    }
    for trickle in trickling {
        trickle.await.expect("trickling connection");
    }
    healthz_answers(&server).await;

    // A keep-alive connection survives the head timeout between requests,
    // and is closed once idle for the idle timeout.
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    stream.write_all(request).await.expect("first request");
    read_response(&mut stream).await;
    tokio::time::sleep(HEAD_TIMEOUT * 2).await;
    stream.write_all(request).await.expect("second request on the same connection");
    read_response(&mut stream).await;
    let idle = closed(&mut stream).await;
    assert!(idle >= IDLE_TIMEOUT - Duration::from_millis(500), "closed after {idle:?}, before the idle timeout");
    healthz_answers(&server).await;
}

/// Reads one `/healthz` response (it has a Content-Length) off `stream`.
async fn read_response(stream: &mut TcpStream) {
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "the connection closed before the response");
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_string))
                    .and_then(|l| l.trim().parse().ok())
                    .expect("content-length");
                if body.len() >= length {
                    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                    return;
                }
            }
        }
    };
    tokio::time::timeout(NOTICE, read).await.expect("a response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_connections_that_never_finish_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let certs = kayra_testkit::Certificates::generate(dir.path());
    let tls = kayra_config::ServerTls { cert_file: certs.server_cert.clone(), key_file: certs.server_key.clone() };
    let mut server = server(|c| c.server.tls = Some(tls)).await;
    let ca = std::fs::read(&certs.ca).unwrap();
    server.client =
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()]).build().unwrap();
    server.wait_ready().await;
    let addr = addr(&server);

    // No handshake at all.
    let mut silent = TcpStream::connect(&addr).await.expect("connect");
    // A handshake, then nothing; and a handshake, then a trickle.
    let connector = connector(&certs.ca);
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tcp = TcpStream::connect(&addr).await.expect("connect");
    let mut quiet = connector.connect(name.clone(), tcp).await.expect("handshake");
    let tcp = TcpStream::connect(&addr).await.expect("connect");
    let mut trickle = connector.connect(name, tcp).await.expect("handshake");
    trickle.write_all(b"GET /healthz HTTP/1.1\r\n").await.expect("first line");
    trickle.flush().await.unwrap();

    healthz_answers(&server).await;
    closed(&mut silent).await;
    closed(&mut quiet).await;
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if trickle.write_all(format!("X-Slow-{i}: 1\r\n").as_bytes()).await.is_err() {
            break;
        }
        let _ = trickle.flush().await;
    }
    closed(&mut trickle).await;
    healthz_answers(&server).await;
}

fn connector(ca: &std::path::Path) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_catalog_body_is_refused() {
    let server = server(|_| {}).await;
    let addr = addr(&server);
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /apis/catalog.example.com/v1/namespaces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{{\"name\":",
        server.admin
    );
    stream.write_all(head.as_bytes()).await.expect("head and part of the body");
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(NOTICE, async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&answer).contains("\r\n\r\n") {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(read.is_ok(), "no answer to a stalled body");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(started.elapsed() >= HEAD_TIMEOUT - Duration::from_millis(200), "{:?}", started.elapsed());
    healthz_answers(&server).await;
    assert_eq!(server.get("/namespaces").await.expect(200)["items"], serde_json::json!([]));
}
