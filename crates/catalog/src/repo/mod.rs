//! `Repository`: typed reads and compare-and-swap writes over the store.
//!
//! Records are JSON values under a fixed key layout (see [`keys`]). Every
//! read returns the record with its revision ([`Versioned`]); every
//! read-modify-write goes through [`Repository::modify`], a CAS loop that
//! re-reads and re-applies on conflict, so concurrent writers never lose an
//! update. Writes that would not change anything are skipped, which is what
//! makes the reconciler's writes idempotent (it never loops on its own
//! writes).
//!
//! # Layout
//! - this file: `Repository`, `Versioned`, `Error`, the generic typed ops.
//! - [`keys`]: the key layout, one function per resource.
//! - [`tenancy`]: namespaces, API registrations, subscriptions.
//! - [`auth`]: users, tokens, roles, bindings.

pub mod auth;
pub mod keys;
pub mod tenancy;

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use kayra_store::{Revision, Store};

use crate::cache::AuthCache;

/// Why a repository operation failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The record does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The record exists already, or changed under a conditional write.
    #[error("{0}")]
    Conflict(String),
    /// A stored value does not decode: the store holds something kayra did not write.
    #[error("stored record {key:?} is unreadable: {message}")]
    Corrupt { key: String, message: String },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] kayra_store::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A record and the revision of its last write (its CAS token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub revision: Revision,
}

/// One page of a typed listing.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<Versioned<T>>,
    /// The key to continue after, when more remain.
    pub next: Option<String>,
}

/// What [`Repository::modify`]'s closure decided.
pub enum Change<E> {
    /// Write the modified value.
    Write,
    /// Leave the record as it is (nothing to change).
    Keep,
    /// Abort with this error.
    Abort(E),
}

/// The typed repository of one deployment (platform + region).
#[derive(Debug, Clone)]
pub struct Repository {
    store: Store,
    /// Shared, not owned: the repository is cloned into every request's
    /// handler state, and a clone must not allocate.
    platform: std::sync::Arc<str>,
    region: std::sync::Arc<str>,
    /// `kayra serve`'s auth caches: authentication and RBAC read them, and
    /// every write here is reported to them (read-your-writes).
    cache: Option<AuthCache>,
}

impl Repository {
    pub fn new(store: Store, platform: impl Into<String>, region: impl Into<String>) -> Self {
        let (platform, region): (String, String) = (platform.into(), region.into());
        Self { store, platform: platform.into(), region: region.into(), cache: None }
    }

    /// This repository, deciding authentication and RBAC from `cache`.
    pub fn with_cache(mut self, cache: AuthCache) -> Self {
        self.cache = Some(cache);
        self
    }

    pub fn cache(&self) -> Option<&AuthCache> {
        self.cache.as_ref()
    }

    /// Reports an acknowledged update or delete to the caches, so this
    /// process's next decision waits until they have seen it. Every update
    /// and delete path calls it. Creates need not: a create can only grant,
    /// and what the caches do not know yet is confirmed against the store.
    pub(crate) fn wrote(&self, key: &str, revision: Revision) -> Revision {
        if let Some(cache) = &self.cache {
            cache.note_write(key, revision);
        }
        revision
    }

    /// Runs `txn`, sharing a round trip with others on their way to the
    /// store ([`Store::txn_grouped`]: each answers as if alone, and many
    /// tenants' writes at once share commits), and reports what it wrote
    /// to the caches, like [`Repository::wrote`]: every put (but a create,
    /// a put guarded by `Absent` on its key), delete and deleted prefix of
    /// the branch that ran.
    pub(crate) async fn txn(&self, txn: kayra_store::Txn) -> Result<kayra_store::TxnResponse> {
        let response = self.store.txn_grouped(txn.clone()).await?;
        if self.cache.is_some() {
            let ops = if response.succeeded { &txn.success } else { &txn.failure };
            let created =
                |key: &str| txn.compares.iter().any(|c| matches!(c, kayra_store::Compare::Absent(k) if k == key));
            for op in ops {
                match op {
                    kayra_store::Op::Put { key, .. } if !created(key) => self.wrote(key, response.revision),
                    kayra_store::Op::Delete { key } => self.wrote(key, response.revision),
                    kayra_store::Op::DeletePrefix { prefix } => self.wrote(prefix, response.revision),
                    _ => response.revision,
                };
            }
        }
        Ok(response)
    }

    pub fn store(&self) -> &Store {
        &self.store
    }
    pub fn platform(&self) -> &str {
        &self.platform
    }
    pub fn region(&self) -> &str {
        &self.region
    }

    /// Reads one record.
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<Versioned<T>>> {
        let (kv, _) = self.store.get(key).await?;
        kv.map(|kv| decode(&kv)).transpose()
    }

    /// Reads one page of records under `prefix`, after the key `after`.
    pub async fn list<T: DeserializeOwned>(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Page<T>> {
        let page = self.store.list(prefix, after, limit).await?;
        let next = if page.more { page.items.last().map(|kv| kv.key.clone()) } else { None };
        let items = page.items.iter().map(decode).collect::<Result<Vec<_>>>()?;
        Ok(Page { items, next })
    }

    /// Reads every record under `prefix`.
    pub async fn list_all<T: DeserializeOwned>(&self, prefix: &str) -> Result<(Vec<Versioned<T>>, Revision)> {
        let (kvs, revision) = self.store.list_all(prefix).await?;
        Ok((kvs.iter().map(decode).collect::<Result<Vec<_>>>()?, revision))
    }

    /// Creates a record; `Conflict(what)` when it exists.
    pub async fn create<T: Serialize>(&self, key: &str, value: &T, what: &str) -> Result<Revision> {
        match self.store.create(key, encode(value)).await {
            Err(kayra_store::Error::Conflict(_)) => Err(Error::Conflict(format!("{what} already exists"))),
            other => Ok(other?),
        }
    }

    /// Replaces a record iff it is still at `revision`.
    pub async fn update<T: Serialize>(&self, key: &str, value: &T, revision: Revision, what: &str) -> Result<Revision> {
        match self.store.update(key, encode(value), revision).await {
            Err(kayra_store::Error::Conflict(_)) => Err(Error::Conflict(format!("{what} was changed concurrently"))),
            Err(kayra_store::Error::NotFound(_)) => Err(Error::NotFound(what.to_string())),
            other => Ok(self.wrote(key, other?)),
        }
    }

    /// Deletes a record (iff at `revision`, when given).
    pub async fn delete(&self, key: &str, revision: Option<Revision>, what: &str) -> Result<Revision> {
        match self.store.delete(key, revision).await {
            Err(kayra_store::Error::Conflict(_)) => Err(Error::Conflict(format!("{what} was changed concurrently"))),
            Err(kayra_store::Error::NotFound(_)) => Err(Error::NotFound(what.to_string())),
            other => Ok(self.wrote(key, other?)),
        }
    }

    /// Read-modify-write with compare-and-swap, retried on conflict.
    ///
    /// `f` sees the current value and decides; `Change::Keep` writes nothing
    /// (and returns the record as read). Returns `NotFound(what)` when the
    /// record does not exist.
    pub async fn modify<T, F>(&self, key: &str, what: &str, mut f: F) -> Result<Versioned<T>>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&mut T) -> Change<Error>,
    {
        loop {
            let Some(mut current) = self.get::<T>(key).await? else {
                return Err(Error::NotFound(what.to_string()));
            };
            match f(&mut current.value) {
                Change::Keep => return Ok(current),
                Change::Abort(e) => return Err(e),
                Change::Write => {}
            }
            match self.store.update(key, encode(&current.value), current.revision).await {
                Ok(revision) => return Ok(Versioned { value: current.value, revision: self.wrote(key, revision) }),
                Err(kayra_store::Error::Conflict(_)) => continue,
                Err(kayra_store::Error::NotFound(_)) => return Err(Error::NotFound(what.to_string())),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing our own plain structs into JSON cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

pub(crate) fn decode<T: DeserializeOwned>(kv: &kayra_store::KeyValue) -> Result<Versioned<T>> {
    serde_json::from_slice(&kv.value)
        .map(|value| Versioned { value, revision: kv.mod_revision })
        .map_err(|e| Error::Corrupt { key: kv.key.clone(), message: e.to_string() })
}
