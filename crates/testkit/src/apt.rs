//! Installing a missing tool with apt-get, once per machine.
//!
//! Tests never skip for want of a tool: they install it (Debian's package)
//! and fail loudly when that fails. Parallel test processes queue on one
//! file lock, and whoever comes second finds the tool already installed.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where concurrent test processes serialise their installs.
const INSTALL_LOCK: &str = "/tmp/kayra-etcd-install.lock";

/// The path of `binary`, installing `packages` first when it is not on `PATH`.
pub(crate) fn ensure(binary: &str, packages: &[&str]) -> PathBuf {
    if let Some(path) = find_on_path(binary) {
        return path;
    }
    install(binary, packages);
    find_on_path(binary).unwrap_or_else(|| panic!("{binary} is still not on PATH after installing {packages:?}"))
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file())
}

fn install(binary: &str, packages: &[&str]) {
    // `$0` is the binary, the other arguments the packages.
    const SCRIPT: &str = r#"
        command -v "$0" >/dev/null 2>&1 && exit 0
        if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo -n"; fi
        $sudo apt-get update &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
    "#;
    eprintln!("kayra-testkit: {binary} is not on PATH; installing {packages:?} with apt-get");
    let output = Command::new("flock")
        .args([INSTALL_LOCK, "sh", "-c", SCRIPT, binary])
        .args(packages)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `flock {INSTALL_LOCK} sh -c ...` to install {packages:?}: {e}"));
    assert!(
        output.status.success(),
        "installing {packages:?} failed ({}); install them by hand.\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}
