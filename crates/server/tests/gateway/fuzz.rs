//! A seeded property test of the gateway's path and method handling (§6):
//! thousands of generated requests mixing dot segments, backslashes,
//! percent-encoded and double-encoded separators, `;` parameters, NUL,
//! control and non-ASCII bytes, sent raw with a token allowed only to
//! `widgets` in namespace `a`. Whatever the path, nothing outside
//! `/namespaces/a/widgets` may reach the backend, and no answer is a 5xx
//! other than 502/503/504.
//!
//! Run alone: `cargo test -p kayra-server --test gateway -- fuzz`. The seed
//! is fixed, so a failure reproduces; proptest prints the shrunk input.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::common::{Backend, Server};
use crate::gateway::hostile::{raw, two_tenants};

/// Requests per run: a few seconds on a loaded machine.
const CASES: u32 = 2000;

/// Pieces hostile paths are made of.
const PIECES: &[&str] = &[
    "..",
    ".",
    "\\",
    "/",
    "%2e",
    "%2E",
    "%2e%2e",
    ".%2e",
    "%2f",
    "%2F",
    "%5c",
    "%5C",
    "%252e",
    "%252f",
    "%255c",
    "%25",
    ";",
    ";x=1",
    "..;",
    "%00",
    "%0a",
    "%0d",
    "%09",
    "%7f",
    "%c2%85",
    "é",
    "%c3%a9",
    "\u{ff0e}",
    "a",
    "b",
    "w1",
    "widgets",
    "namespaces",
    "compute.example.com",
    "v1",
    "apis",
    "%",
    "%zz",
    "?",
    "?x=..%2f",
    "&",
    "=",
    "~",
    "+",
    "|",
];

/// Where a generated tail is attached.
const PREFIXES: &[&str] = &[
    "/apis/compute.example.com/v1/namespaces/a/widgets/",
    "/apis/compute.example.com/v1/namespaces/a/widgets",
    "/apis/compute.example.com/v1/namespaces/a/",
    "/apis/compute.example.com/v1/namespaces/",
    "/apis/compute.example.com/v1/",
    "/apis/compute.example.com/",
    "/apis/",
];

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
const NOT_METHODS: &[&str] = &["get", "Post", "delete", "FOO", "PROPFIND", "OPTIONS", "TRACE", "CONNECT", "MOVE"];

fn request() -> impl Strategy<Value = (String, Vec<u8>)> {
    let method = prop_oneof![
        4 => proptest::sample::select(METHODS).prop_map(str::to_string),
        1 => proptest::sample::select(NOT_METHODS).prop_map(str::to_string),
    ];
    let prefix = proptest::sample::select(PREFIXES);
    let tail = proptest::collection::vec(proptest::sample::select(PIECES), 0..10);
    let raw_byte = proptest::option::weighted(0.1, prop_oneof![Just(0u8), Just(b'\t'), Just(0x80u8), Just(0xffu8)]);
    (method, prefix, tail, raw_byte).prop_map(|(method, prefix, tail, raw_byte)| {
        let mut target = format!("{prefix}{}", tail.concat()).into_bytes();
        if let Some(byte) = raw_byte {
            let at = target.len() / 2;
            target.insert(at, byte);
        }
        (method, target)
    })
}

/// Whether a path the backend received is inside what alice may use.
fn inside(uri: &str) -> bool {
    let path = uri.split('?').next().unwrap_or_default();
    let Some(rest) = path.strip_prefix("/apis/compute.example.com/v1/namespaces/a/widgets") else {
        return false;
    };
    (rest.is_empty() || rest.starts_with('/'))
        && rest.split('/').all(|segment| kayra_core::validation::path_segment(segment).is_ok())
}

#[test]
fn generated_paths_never_escape_namespace_and_resource() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (world, token) = runtime.block_on(async { two_tenants(Server::start(Backend::Local).await, &["*"]).await });
    let auth = format!("Authorization: Bearer {token}\r\n");

    let config = Config { cases: CASES, failure_persistence: None, max_shrink_iters: 200, ..Config::default() };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[0x6b; 32]);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, usize>::new());
    let checked = std::cell::Cell::new(0);
    let result = runner.run(&request(), |(method, target)| {
        let reply = runtime.block_on(raw(&world.server.base, method.as_bytes(), &target, &auth));
        *statuses.borrow_mut().entry(reply.status).or_default() += 1;
        // No status at all would be a dropped connection: a panic, or worse.
        prop_assert!(
            (100..500).contains(&reply.status) || matches!(reply.status, 502..=504),
            "{method} {:?} answered {}: {}",
            String::from_utf8_lossy(&target),
            reply.status,
            reply.body
        );
        let new = world.backend.seen_since(checked.get());
        checked.set(checked.get() + new.len());
        for seen in new {
            prop_assert!(
                inside(&seen.uri),
                "{method} {:?} reached the backend as {:?}",
                String::from_utf8_lossy(&target),
                seen.uri
            );
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let statuses = statuses.into_inner();
    eprintln!("answers by status: {statuses:?}");
    // The generator must actually get requests through, or it proves nothing.
    assert!(statuses.get(&200).copied().unwrap_or_default() > 20, "too few forwarded requests: {statuses:?}");
    assert!(statuses.get(&400).copied().unwrap_or_default() > 100, "too few refused paths: {statuses:?}");
    drop(world);
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
}
