//! `catalog`: the typed repository over the store, the catalog API routes,
//! the reconciler and its HTTP step pipeline (seed: `internal/catalog`).
//!
//! # Layout
//! - [`repo`]: `Repository`, typed reads and compare-and-swap writes of every
//!   resource over [`kayra_store::Store`]; the key layout.
//! - [`api`]: the `/apis/catalog.example.com/v1` routes.
//! - [`reconciler`]: `Reconciler::run`, the controller of `kayra reconciler`.
//!
//! The HTTP step pipeline lives in `kayra_pipeline`, re-exported here as
//! [`pipeline`].

pub mod api;
pub mod cache;
pub mod reconciler;
pub mod repo;

pub use kayra_pipeline as pipeline;

pub use kayra_config::{ASYNC_STEP_ACK_TIMEOUT, DEFAULT_MAX_CONCURRENT_RECONCILES, WAIT_POLL_INTERVAL};
