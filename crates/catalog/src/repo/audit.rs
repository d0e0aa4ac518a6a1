//! Audit records (platform §13): one for every successful catalog change,
//! written as a [`Rider`] of the change, in its own store transaction.
//!
//! The API builds an [`AuditContext`] per request (who, what, why, from
//! where) and hands the Repository a handle carrying it
//! ([`Repository::audited`]). Every audited write then goes through
//! [`Repository::auditing`] with the object as a GET shows it before and
//! after, which turns the context into an [`AuditRecord`] riding on that
//! write; a handle without a context writes none. A change whose compare
//! fails writes neither the change nor its record.
//!
//! Keys order newest first: a record's key ends in its UUIDv7 id
//! subtracted from the largest UUID ([`order_key`]), so a list from the
//! start of the prefix is a list from now backwards, `since` ends a scan,
//! and retention deletes from the far end ([`Repository::prune_audit`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kayra_core::AuditRecord;
use kayra_store::{Compare, Op, Revision, Txn};
use serde_json::Value;

use super::{Collection, RecordRef, Repository, Result, Rider, decode, encode};

/// Who changed what, why and from where: everything of an audit record
/// but its id, time and before/after. Built once per request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditContext {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// The status the route answers on success.
    pub code: u16,
    pub reason: String,
    pub request_id: String,
    pub source: String,
}

impl AuditContext {
    /// The record of a change from `before` to `after`, made now.
    pub fn record(&self, before: Value, after: Value) -> AuditRecord {
        let id = uuid::Uuid::now_v7();
        AuditRecord {
            id: id.to_string(),
            time: id_time(&id).map(format_time).unwrap_or_default(),
            user: self.user.clone(),
            verb: self.verb.clone(),
            resource: self.resource.clone(),
            namespace: self.namespace.clone(),
            // A create's path names no object: the created one's name
            // (a subscription's `api`) is the record's.
            name: match self.name.as_str() {
                "" => ["name", "api"]
                    .iter()
                    .find_map(|field| after.get(field).and_then(Value::as_str))
                    .unwrap_or_default()
                    .to_string(),
                name => name.to_string(),
            },
            code: self.code,
            reason: self.reason.clone(),
            request_id: self.request_id.clone(),
            source: self.source.clone(),
            before,
            after,
        }
    }
}

/// Which records a listing returns (each filter empty: any).
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub user: String,
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// Only records made at or after this time.
    pub since: Option<SystemTime>,
}

impl AuditFilter {
    /// Whether `record` passes the equality filters (`since` is a
    /// listing's bound, not checked here).
    pub fn matches(&self, record: &AuditRecord) -> bool {
        let field = |want: &str, have: &str| want.is_empty() || want == have;
        field(&self.user, &record.user)
            && field(&self.resource, &record.resource)
            && field(&self.namespace, &record.namespace)
            && field(&self.name, &record.name)
    }
}

/// One page of audit records, newest first.
#[derive(Debug, Clone, Default)]
pub struct AuditPage {
    pub items: Vec<AuditRecord>,
    /// The key to continue after, when more may remain.
    pub next: Option<String>,
}

/// How many records one listing reads at most, matching or not: a filter
/// that matches little answers a short (even empty) page with a `continue`
/// rather than scanning the whole trail in one request.
pub const MAX_SCANNED: usize = 5000;

/// The key segment that orders record `id` newest first: `u128::MAX - id`
/// in 32 hex digits. `None` when `id` is not a UUID.
pub fn order_key(id: &str) -> Option<String> {
    let id = uuid::Uuid::parse_str(id).ok()?;
    Some(format!("{:032x}", u128::MAX - id.as_u128()))
}

/// An id made at `time` (UUIDv7), for tests that backdate a record.
#[doc(hidden)]
pub fn id_at(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, since.as_secs(), since.subsec_nanos());
    uuid::Uuid::new_v7(ts).to_string()
}

/// When the UUIDv7 `id` was made (millisecond precision).
fn id_time(id: &uuid::Uuid) -> Option<SystemTime> {
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// The largest object a record shows whole, in bytes of JSON: a record
/// holds two, and must stay under the store's request limit (etcd's
/// 1.5 MiB) whatever `server.max_body_bytes` lets an object grow to.
pub const MAX_SHOWN_BYTES: usize = 256 * 1024;

/// `value` as a record's `before`/`after` (our own plain structs always
/// serialize). Past [`MAX_SHOWN_BYTES`] only its size is shown:
/// `{"omitted_bytes": N}`.
pub fn shown<T: serde::Serialize>(value: &T) -> Value {
    let json = serde_json::to_vec(value).unwrap_or_default();
    if json.len() > MAX_SHOWN_BYTES {
        return serde_json::json!({ "omitted_bytes": json.len() });
    }
    serde_json::from_slice(&json).unwrap_or(Value::Null)
}

fn format_time(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// The order key of the oldest id made at `time`: every record made
/// before `time` sorts after it.
fn time_boundary(time: SystemTime) -> String {
    let millis = time.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    let smallest = (millis & ((1 << 48) - 1)) << 80;
    format!("{:032x}", u128::MAX - smallest)
}

impl Repository {
    /// This repository, writing an audit record from `context` with every
    /// change made through [`Repository::auditing`].
    pub fn audited(&self, context: AuditContext) -> Self {
        let mut handle = self.clone();
        handle.audit = Some(std::sync::Arc::new(context));
        handle
    }

    /// The request's audit context, when this handle carries one.
    pub fn audit_context(&self) -> Option<&AuditContext> {
        self.audit.as_deref()
    }

    /// A handle whose writes also write the audit record of the change
    /// from `before` to `after` (each the object as a GET shows it, `null`
    /// where there is none). Without an audit context, this handle itself.
    /// One record per change: call it for the write that commits the
    /// change, afresh on every retry of a compare-and-swap loop.
    pub fn auditing(&self, before: Value, after: Value) -> Self {
        let Some(context) = &self.audit else {
            return self.clone();
        };
        let record = context.record(before, after);
        let mut handle = self.clone();
        let ops: Vec<Op> = self.riders.iter().cloned().chain(self.rider_ops(&Rider::Audit(&record))).collect();
        handle.riders = ops.into();
        handle
    }

    /// The store ops of one audit record.
    pub(super) fn audit_ops(&self, record: &AuditRecord) -> Vec<Op> {
        match order_key(&record.id) {
            Some(order) => vec![Op::Put { key: self.base.layout.key(RecordRef::Audit(&order)), value: encode(record) }],
            None => Vec::new(),
        }
    }

    /// The record of a request that answered 2xx without changing its
    /// object (a PUT that changes nothing, a subscription's confirmation):
    /// written alone, only while `record` is still at `revision`. `false`
    /// when it moved meanwhile (re-read and decide again). Without an
    /// audit context, nothing is written.
    pub async fn audit_unchanged(&self, record: RecordRef<'_>, revision: Revision, view: Value) -> Result<bool> {
        if self.audit.is_none() {
            return Ok(true);
        }
        let key = self.base.layout.key(record);
        let handle = self.auditing(view.clone(), view);
        let txn = Txn::new().when(Compare::ModRevision(key, revision));
        Ok(handle.txn(txn).await?.succeeded)
    }

    /// One audit record, by id.
    pub async fn get_audit(&self, id: &str) -> Result<Option<AuditRecord>> {
        let Some(order) = order_key(id) else {
            return Ok(None);
        };
        Ok(self.get::<AuditRecord>(RecordRef::Audit(&order)).await?.map(|v| v.value))
    }

    /// Up to `limit` records (0: up to [`MAX_SCANNED`]) matching `filter`,
    /// newest first, after the key `after` (a page's `next`). Reads at most
    /// [`MAX_SCANNED`] records; `since` ends the scan at the first older one.
    pub async fn list_audit(&self, filter: &AuditFilter, after: Option<&str>, limit: usize) -> Result<AuditPage> {
        let prefix = self.base.layout.prefix(Collection::Audit);
        let want = if limit == 0 { MAX_SCANNED } else { limit.min(MAX_SCANNED) };
        let boundary = filter.since.map(|since| format!("{prefix}{}", time_boundary(since)));
        let mut page = AuditPage::default();
        let mut cursor = after.map(str::to_string);
        let mut scanned = 0;
        while scanned < MAX_SCANNED {
            let batch = (want - page.items.len()).clamp(16, 500).min(MAX_SCANNED - scanned);
            let read = self.base.store.list(&prefix, cursor.as_deref(), batch).await?;
            for kv in &read.items {
                scanned += 1;
                if boundary.as_deref().is_some_and(|b| kv.key.as_str() > b) {
                    return Ok(page);
                }
                cursor = Some(kv.key.clone());
                let record = decode::<AuditRecord>(kv)?.value;
                if filter.matches(&record) {
                    page.items.push(record);
                    if page.items.len() == want {
                        let more = read.more || kv.key != read.items.last().map(|l| l.key.clone()).unwrap_or_default();
                        page.next = if more { cursor } else { None };
                        return Ok(page);
                    }
                }
            }
            if !read.more {
                return Ok(page);
            }
        }
        page.next = cursor;
        Ok(page)
    }

    /// Deletes audit records made before `cutoff`, at most `batch` per
    /// transaction, until none remain; the number deleted. Safe to run
    /// from several processes at once (a delete of a gone key is a no-op).
    pub async fn prune_audit(&self, cutoff: SystemTime, batch: usize) -> Result<usize> {
        let prefix = self.base.layout.prefix(Collection::Audit);
        let boundary = format!("{prefix}{}", time_boundary(cutoff));
        let mut deleted = 0;
        loop {
            let read = self.base.store.list(&prefix, Some(&boundary), batch.max(1)).await?;
            if read.items.is_empty() {
                return Ok(deleted);
            }
            let txn = read.items.iter().fold(Txn::new(), |txn, kv| txn.then(Op::Delete { key: kv.key.clone() }));
            self.base.store.txn(txn).await?;
            deleted += read.items.len();
            if !read.more {
                return Ok(deleted);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kayra_core::Namespace;

    use super::*;
    use crate::repo::tests::local_repo;

    async fn reasons(repo: &Repository) -> Vec<String> {
        let page = repo.list_audit(&AuditFilter::default(), None, 0).await.unwrap();
        page.items.into_iter().map(|r| r.reason).collect()
    }

    #[tokio::test]
    async fn a_record_commits_with_its_change_and_only_with_it() {
        let (_dir, repo) = local_repo().await;
        let context = |reason: &str| AuditContext { user: "alice".into(), reason: reason.into(), ..Default::default() };
        let ns = Namespace { name: "core".into(), ..Namespace::default() };
        let audited = repo.audited(context("create"));
        audited.auditing(Value::Null, shown(&ns)).create(RecordRef::Namespace("core"), &ns, "ns").await.unwrap();
        let revision = repo.get::<Namespace>(RecordRef::Namespace("core")).await.unwrap().unwrap().revision;
        assert_eq!(reasons(&repo).await, ["create"]);

        // A change whose compare fails leaves no record.
        let audited = repo.audited(context("stale"));
        let changed = Namespace { description: "d".into(), ..ns.clone() };
        let e = audited
            .auditing(shown(&ns), shown(&changed))
            .update(RecordRef::Namespace("core"), &changed, revision + 99, "ns")
            .await;
        assert!(matches!(e, Err(crate::repo::Error::Conflict(_))), "{e:?}");
        assert!(!audited.audit_unchanged(RecordRef::Namespace("core"), revision + 99, shown(&ns)).await.unwrap());
        let e = audited.auditing(Value::Null, shown(&ns)).create(RecordRef::Namespace("core"), &ns, "ns").await;
        assert!(matches!(e, Err(crate::repo::Error::Conflict(_))), "{e:?}");
        assert_eq!(reasons(&repo).await, ["create"]);

        // A handle without a context records nothing; one with a context
        // records only what goes through `auditing`.
        repo.auditing(shown(&ns), shown(&changed))
            .update(RecordRef::Namespace("core"), &changed, revision, "ns")
            .await
            .unwrap();
        assert_eq!(reasons(&repo).await, ["create"]);
        let audited = repo.audited(context("delete"));
        audited.delete_namespace("core").await.unwrap();
        let page = repo.list_audit(&AuditFilter::default(), None, 0).await.unwrap();
        assert_eq!(page.items.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>(), ["delete", "create"]);
        assert_eq!((page.items[0].before["description"].as_str(), &page.items[0].after), (Some("d"), &Value::Null));
        assert_eq!(page.items[0].user, "alice");
    }

    #[tokio::test]
    async fn pruning_removes_only_older_records_in_batches() {
        let (_dir, repo) = local_repo().await;
        let now = SystemTime::now();
        for age in [10u64, 7200, 7300, 7400, 7500, 7600] {
            let mut record = AuditContext::default().record(Value::Null, Value::Null);
            record.id = id_at(now - Duration::from_secs(age));
            record.reason = age.to_string();
            let key = repo.layout().key(RecordRef::Audit(&order_key(&record.id).unwrap()));
            repo.store().create(&key, encode(&record)).await.unwrap();
        }
        let deleted = repo.prune_audit(now - Duration::from_secs(3600), 2).await.unwrap();
        assert_eq!((deleted, reasons(&repo).await), (5, vec!["10".to_string()]));
        assert_eq!(repo.prune_audit(now - Duration::from_secs(3600), 2).await.unwrap(), 0);
    }

    #[test]
    fn order_keys_sort_newest_first_and_bound_by_time() {
        let old = id_at(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        let new = id_at(UNIX_EPOCH + Duration::from_secs(1_700_000_001));
        let (old_key, new_key) = (order_key(&old).unwrap(), order_key(&new).unwrap());
        assert!(new_key < old_key, "newer sorts first");
        let boundary = time_boundary(UNIX_EPOCH + Duration::from_millis(1_700_000_000_500));
        assert!(new_key < boundary && old_key > boundary, "older than the boundary sorts after it");
        assert_eq!(order_key("not-a-uuid"), None);
        let record = AuditContext::default().record(Value::Null, Value::Null);
        assert!(record.time.ends_with('Z') && record.time.contains('.'), "{}", record.time);
    }
}
