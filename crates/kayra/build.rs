// Records the commit the binary is built from, for `--version`
// (`kayra 0.1.0 (commit abc1234)`), as the compile-time variable
// `KAYRA_COMMIT`.
//
// The commit is `KAYRA_COMMIT` from the environment when set (a build from
// a source tarball, which has no `.git`), else `git rev-parse --short HEAD`,
// else `unknown`. The script reruns only when the checked-out commit can
// have moved: `.git/HEAD`, the branch ref it points to and `packed-refs`
// (paths asked from git, so a worktree works too). `kayra-cli`'s build
// script is this file.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    // A change to this file rebuilds and so reruns the script anyway
    // (also when `kayra-cli`'s build script includes it).
    println!("cargo:rerun-if-env-changed=KAYRA_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    let commit = match std::env::var("KAYRA_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_owned(),
        _ => {
            watch_git(&dir);
            git(&dir, &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=KAYRA_COMMIT={commit}");
}

/// `git ARGS` in `dir`: its trimmed output, or `None` without git, outside
/// a repository, or on any failure.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).current_dir(dir).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// Reruns this script when HEAD moves: HEAD itself (a checkout), the ref
/// it points to (a commit) and `packed-refs` (a `git gc`). Only existing
/// files are named: cargo reruns every build for a missing one.
fn watch_git(dir: &Path) {
    let Some(head) = git(dir, &["rev-parse", "--git-path", "HEAD"]) else { return };
    let head = dir.join(head);
    let mut watched = vec![head.clone()];
    let reference =
        std::fs::read_to_string(&head).ok().and_then(|h| h.strip_prefix("ref:").map(|r| r.trim().to_owned()));
    if let Some(path) = reference.and_then(|r| git(dir, &["rev-parse", "--git-path", &r])) {
        watched.push(dir.join(path));
    }
    if let Some(path) = git(dir, &["rev-parse", "--git-path", "packed-refs"]) {
        watched.push(dir.join(path));
    }
    for path in watched.into_iter().filter(|p| p.is_file()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
