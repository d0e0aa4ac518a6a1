//! A throwaway certificate authority for TLS tests, made with the
//! `openssl` command line tool (installed like etcd when missing).
//!
//! It issues one server certificate for `127.0.0.1` / `localhost` and one
//! client certificate, with P-256 keys (fast to make) valid for a day:
//! the shape of a production etcd with `--client-cert-auth`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// PEM files in one directory.
#[derive(Debug, Clone)]
pub struct Certificates {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certificates {
    /// Makes a CA and certificates signed by it under `dir`.
    pub fn generate(dir: &Path) -> Certificates {
        let openssl = crate::apt::ensure("openssl", &["openssl"]);
        std::fs::create_dir_all(dir).expect("certificate dir");
        let path = |name: &str| dir.join(name);
        let run = |args: &[&str]| {
            let output = Command::new(&openssl).args(args).current_dir(dir).output().expect("run openssl");
            assert!(output.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        };
        const KEY: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        let ca =
            ["req", "-x509", "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "1", "-subj", "/CN=kayra-test-ca"];
        run(&[&ca[..], &KEY].concat());
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let ext = format!(
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage={usage}\n\
                 subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            );
            std::fs::write(path(&format!("{name}.ext")), ext).expect("write extensions");
            let (csr, key_file, cert) = (format!("{name}.csr"), format!("{name}-key.pem"), format!("{name}.pem"));
            let subject = format!("/CN={name}");
            run(&[&["req", "-keyout", &key_file, "-out", &csr, "-subj", &subject][..], &KEY].concat());
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "1",
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
        Certificates {
            ca: path("ca.pem"),
            server_cert: path("server.pem"),
            server_key: path("server-key.pem"),
            client_cert: path("client.pem"),
            client_key: path("client-key.pem"),
        }
    }

    /// The store's view: trust the CA, present the client certificate.
    pub fn client_config(&self) -> kayra_config::EtcdTls {
        kayra_config::EtcdTls {
            ca_file: self.ca.clone(),
            cert_file: Some(self.client_cert.clone()),
            key_file: Some(self.client_key.clone()),
        }
    }
}
