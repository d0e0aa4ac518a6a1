//! One transaction shape for both backends: compares on keys, then the
//! operations of the branch the compares chose (an etcd Txn; one SQLite
//! transaction locally).
//!
//! Callers use it for "check these keys, then write those" in one round
//! trip: create-with-existence-checks, the reconciler's fenced result write,
//! guard and index keys.

use crate::{KeyValue, Revision};

/// A condition on one key, evaluated at the transaction's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key exists.
    Exists(String),
    /// The key's mod_revision is exactly this (it exists).
    ModRevision(String, Revision),
    /// No key starts with this prefix (a guard or index range is empty).
    /// On etcd: `create_revision < 1` over the prefix's range, which holds
    /// exactly when no key in the range exists.
    PrefixEmpty(String),
    /// No key under the prefix was created or modified after this revision
    /// (an index read at that revision gained no entry since; deletes are
    /// not seen). On etcd: `mod_revision < revision + 1` over the range.
    PrefixUnchangedSince(String, Revision),
}

/// An operation of a branch, applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Creates or replaces the key.
    Put { key: String, value: Vec<u8> },
    /// Deletes the key if present.
    Delete { key: String },
    /// Deletes every key under the prefix.
    DeletePrefix { prefix: String },
    /// Reads the key as the branch's earlier operations left it.
    Get { key: String },
}

/// Compares, then `success` when all hold, else `failure`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compare: Compare) -> Self {
        self.compares.push(compare);
        self
    }
    pub fn then(mut self, op: Op) -> Self {
        self.success.push(op);
        self
    }
    pub fn otherwise(mut self, op: Op) -> Self {
        self.failure.push(op);
        self
    }
    /// Whether it only reads, whichever branch runs.
    pub fn reads_only(&self) -> bool {
        self.success.iter().chain(&self.failure).all(|op| matches!(op, Op::Get { .. }))
    }
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    /// Every compare held and `success` ran.
    pub succeeded: bool,
    /// The store revision after the transaction.
    pub revision: Revision,
    /// One entry per `Get` of the branch that ran, in order.
    pub gets: Vec<Option<KeyValue>>,
}
