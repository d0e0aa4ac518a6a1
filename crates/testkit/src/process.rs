//! Freezing and thawing a process (SIGSTOP / SIGCONT), for outage tests.
//!
//! `kill -STOP` returns once the signal is queued, not once the process
//! has stopped: the kernel wakes one thread, and that thread stops the
//! others when it runs. On a loaded machine the rest of a multi-threaded
//! server (etcd) can go on answering requests for milliseconds after
//! `kill` returned. [`freeze`] waits until every thread is seen stopped,
//! so a request sent after it is certain to meet a frozen server.

use std::process::{Command, Stdio};
use std::time::Instant;

use crate::WAIT;

/// Stops process `pid` (SIGSTOP) and waits until all its threads are
/// stopped; panics after [`WAIT`].
pub fn freeze(pid: u32) {
    send(pid, "STOP");
    let deadline = Instant::now() + WAIT;
    while !stopped(pid) {
        assert!(Instant::now() < deadline, "process {pid} did not stop within {WAIT:?} of SIGSTOP");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Lets process `pid` run again (SIGCONT).
pub fn thaw(pid: u32) {
    send(pid, "CONT");
}

fn send(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// Whether every thread of `pid` is in state `T` (stopped) or `t`
/// (traced). A thread that exits meanwhile is no obstacle.
fn stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return true;
        };
        // `pid (comm) state …`: comm may hold spaces and parentheses.
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|s| s == "T" || s == "t")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frozen_child_is_seen_stopped_and_runs_again_after_thawing() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        assert!(!stopped(child.id()));
        freeze(child.id());
        assert!(stopped(child.id()));
        thaw(child.id());
        let deadline = Instant::now() + WAIT;
        while stopped(child.id()) {
            assert!(Instant::now() < deadline, "the child did not run again");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
