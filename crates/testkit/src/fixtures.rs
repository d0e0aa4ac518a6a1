//! Sample records for tests that need one shaped like the real thing.

use kayra_core::{Run, RunResult, RunStep, RunTrigger};

/// A UUIDv7-shaped id whose time part is `n`: ids sort by `n`.
pub fn run_id(n: u64) -> String {
    format!("{:08x}-{:04x}-7000-8000-{:012x}", n >> 16, n & 0xffff, n)
}

/// Run `n` of (`namespace`, `api`), shaped like platform §4.4's example:
/// one async POST step; an `Error` run failed on a 500.
pub fn run(namespace: &str, api: &str, n: u64, result: RunResult) -> Run {
    let failed = result == RunResult::Error;
    Run {
        id: run_id(n),
        namespace: namespace.into(),
        api: api.into(),
        sync_id: format!("s{n}"),
        mode: "api".into(),
        trigger: if n == 0 { RunTrigger::Initial } else { RunTrigger::Ongoing },
        result,
        error: if failed { "step 0: POST answered 500".into() } else { String::new() },
        started_at: "2026-02-01T00:00:03.200Z".into(),
        finished_at: "2026-02-01T00:00:04.900Z".into(),
        lock_id: 3,
        reconciler: "host-a:4711".into(),
        steps: vec![RunStep {
            index: 0,
            method: "POST".into(),
            endpoint: format!("https://compute.local/api/v1/namespaces/{namespace}/sync"),
            is_async: true,
            attempts: 1,
            status: if failed { 500 } else { 202 },
            error: String::new(),
            duration_ms: 41,
            outputs: [("JobID".to_string(), "77".to_string())].into(),
        }],
    }
}
