//! HTTP-level tests of the catalog API and the server around it: a real
//! server on 127.0.0.1:0, driven with reqwest, every case run against both
//! store backends (local SQLite and a private etcd) as `<case>::local` and
//! `<case>::etcd`. One test binary, so the server is linked once.

#[path = "common/mod.rs"]
mod common;

mod api {
    mod atomicity;
    mod audit;
    mod auth;
    mod cancel;
    mod concurrency;
    mod deployments;
    mod fuzz;
    mod hardening;
    mod hostile;
    mod labels;
    mod namespaces;
    mod notifications;
    mod operations;
    mod progress;
    mod rbac;
    mod registrations;
    mod replicas;
    mod rollouts;
    mod round_trips;
    mod runs;
    mod slow_clients;
    mod status;
    mod store_outage;
    mod subscriptions;
    pub mod watch;
}
