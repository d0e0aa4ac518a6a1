//! `kayra dev`: `kayra serve` and `kayra reconciler` as two child processes
//! on the local store, for a laptop.
//!
//! The admin token is generated on first run and kept in
//! `.kayra/admin-token` (mode 0600); it is handed to `serve` as
//! `KAYRA_BOOTSTRAP_TOKEN` so the admin user exists (platform contract
//! §5.4). Ctrl-C (or SIGTERM) is forwarded to both children as SIGTERM; a
//! child that exits on its own stops the other.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::RngCore;
use tokio::process::{Child, Command};

use crate::Common;

const TOKEN_FILE: &str = ".kayra/admin-token";

pub async fn run(common: Common) -> anyhow::Result<()> {
    let config = common.load()?;
    let Some(local) = &config.database.local else {
        bail!("kayra dev runs on the local store: set database.local (or no database key at all)");
    };
    let token = admin_token(Path::new(TOKEN_FILE))?;
    let listen = common.listen.clone().unwrap_or_else(|| config.server.listen.clone());
    let exe = std::env::current_exe().context("find the kayra executable")?;

    let mut args: Vec<String> = Vec::new();
    if let Some(path) = &common.config {
        args.extend(["--config".into(), path.display().to_string()]);
    }
    if let Some(format) = &common.log_format {
        args.extend(["--log-format".into(), format.clone()]);
    }
    let spawn = |sub: &str, extra: &[&str]| -> anyhow::Result<Child> {
        Command::new(&exe)
            .arg(sub)
            .args(&args)
            .args(extra)
            .env("KAYRA_BOOTSTRAP_TOKEN", &token)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start kayra {sub}"))
    };
    let mut serve = spawn("serve", &["--listen", &listen])?;
    let mut reconciler = spawn("reconciler", &[])?;

    let url = format!("http://{}", listen.replace("0.0.0.0", "127.0.0.1"));
    println!("kayra dev: API server  {url}");
    println!("kayra dev: store       {}", local.path.display());
    println!("kayra dev: admin token {token}   (kept in {TOKEN_FILE})");
    println!(
        "kayra dev: try         KAYRA_SERVER={url} KAYRA_TOKEN=$(cat {TOKEN_FILE}) kayra-cli get catalog namespaces"
    );
    println!("kayra dev: Ctrl-C stops both processes");

    let cancel = crate::signal::shutdown_token();
    let first = tokio::select! {
        _ = cancel.cancelled() => None,
        status = serve.wait() => Some(("serve", status)),
        status = reconciler.wait() => Some(("reconciler", status)),
    };
    if let Some((name, status)) = &first {
        eprintln!("kayra dev: {name} exited ({status:?}); stopping the other");
    }
    for child in [&mut serve, &mut reconciler] {
        if let Some(pid) = child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
    let (a, b) = (serve.wait().await, reconciler.wait().await);
    match first {
        None if a.as_ref().is_ok_and(|s| s.success()) && b.as_ref().is_ok_and(|s| s.success()) => Ok(()),
        None => bail!("a child did not exit cleanly: serve {a:?}, reconciler {b:?}"),
        Some((name, _)) => bail!("kayra {name} exited unexpectedly"),
    }
}

/// Reads the admin token, generating it (0600) on first run only: a file
/// that exists but cannot be read (or is empty) is an error, never a
/// reason to mint a new token silently (platform §5.4: minting one would
/// revoke the token the operator has).
fn admin_token(path: &Path) -> anyhow::Result<String> {
    let refuse = |why: String| {
        anyhow::anyhow!(
            "{} {why}; fix it, or delete it to have a new bootstrap token minted (the previous one is then revoked)",
            path.display()
        )
    };
    match std::fs::read_to_string(path) {
        Ok(token) if !token.trim().is_empty() => return Ok(token.trim().to_string()),
        Ok(_) => return Err(refuse("is empty".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(refuse(format!("cannot be read: {e}"))),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("write {}", path.display()))?;
    file.write_all(token.as_bytes())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(token)
}

#[cfg(test)]
mod admin_token_tests {
    use super::admin_token;

    #[test]
    fn minted_once_then_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".kayra/admin-token");
        let token = admin_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(admin_token(&path).unwrap(), token);
    }

    #[test]
    fn an_unreadable_or_empty_file_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let unreadable = dir.path().join("binary");
        std::fs::write(&unreadable, [0xff, 0xfe, 0x00]).unwrap();
        let err = admin_token(&unreadable).unwrap_err().to_string();
        assert!(err.contains("cannot be read") && err.contains("delete it"), "{err}");
        assert_eq!(std::fs::read(&unreadable).unwrap(), [0xff, 0xfe, 0x00], "left as it was");

        let a_dir = dir.path().join("dir");
        std::fs::create_dir(&a_dir).unwrap();
        assert!(admin_token(&a_dir).unwrap_err().to_string().contains("cannot be read"));

        let empty = dir.path().join("empty");
        std::fs::write(&empty, "  \n").unwrap();
        assert!(admin_token(&empty).unwrap_err().to_string().contains("is empty"));
    }
}
