//! `catalog`: the typed repository over the store, the catalog API routes
//! and the HTTP step pipeline (seed: `internal/catalog`).
//!
//! # Layout
//! - [`repo`]: `Repository`, typed reads and compare-and-swap writes of every
//!   resource over [`kayra_store::Store`]; the key layout, private to it.
//! - [`api`] (feature `api`, on by default): the `/apis/catalog.example.com/v1`
//!   routes. The reconciler builds this crate without it, so it links no
//!   HTTP server (axum) nor OpenAPI (utoipa).
//!
//! The HTTP step pipeline lives in `kayra_pipeline`; the Repository's key
//! layout places its limit records (`kayra_pipeline::LimitKeys`).
//!
//! The reconciler itself (`Reconciler.Run`, `ensureReconciled`) is the
//! `kayra-reconciler` crate (`crates/reconciler`).

#[cfg(feature = "api")]
pub mod api;
pub mod cache;
pub mod repo;

pub use kayra_config::{ASYNC_STEP_ACK_TIMEOUT, DEFAULT_MAX_CONCURRENT_RECONCILES, WAIT_POLL_INTERVAL};
