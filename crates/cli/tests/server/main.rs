//! The built `kayra-cli` against a real `kayra serve` on the local store:
//! the seed's examples as written, every verb, output formats parsed
//! back, `-d` from files and stdin, error statuses, `--until-synced` with a
//! reconciler, and the gateway.
//!
//! One test binary (modules below) so the server is linked once.

#[path = "../common/mod.rs"]
mod common;

mod apply;
mod errors;
mod escape;
mod fanout;
mod gateway;
mod rollout;
mod seed;
mod verbs;
mod watch;
