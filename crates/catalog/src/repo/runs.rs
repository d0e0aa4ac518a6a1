//! Reading a subscription's run records (platform §4.4) a page at a time.
//!
//! A subscription's runs sit in ring slots (`seq % run_history`), so their
//! keys do not sort by time; their ids (UUIDv7) do. A page is found from
//! the ids alone: each record is read for its `id` only, without decoding
//! the rest, and only the records of the page asked for are decoded
//! (§17: `?limit=1` decodes one). What is read at all is bounded by the
//! ring (`reconciler.run_history`) and the record's cap (16 KiB).

use kayra_core::{Run, run_codec};
use kayra_store::KeyValue;

use super::{Collection, Error, Repository, Result};

/// One page of runs, newest first.
#[derive(Debug)]
pub struct RunPage {
    pub items: Vec<Run>,
    /// The id of the page's last run when older ones follow.
    pub next: Option<String>,
}

impl Repository {
    /// The runs of `namespace`'s subscription to `api` older than the run
    /// `after` (an id; `None`: from the newest), at most `limit` (0: all).
    pub async fn runs_page(&self, namespace: &str, api: &str, after: Option<&str>, limit: usize) -> Result<RunPage> {
        let mut records = self.run_records(namespace, api).await?;
        records.retain(|(id, _)| after.is_none_or(|after| id.as_str() < after));
        let more = limit > 0 && records.len() > limit;
        if limit > 0 {
            records.truncate(limit);
        }
        let items = records.iter().map(|(_, kv)| decode_run(kv, namespace, api)).collect::<Result<Vec<_>>>()?;
        let next = more.then(|| items.last().map(|run| run.id.clone())).flatten();
        Ok(RunPage { items, next })
    }

    /// The run `id` of `namespace`'s subscription to `api`.
    pub async fn run(&self, namespace: &str, api: &str, id: &str) -> Result<Option<Run>> {
        let records = self.run_records(namespace, api).await?;
        let Some((_, kv)) = records.iter().find(|(found, _)| found == id) else {
            return Ok(None);
        };
        Ok(Some(decode_run(kv, namespace, api)?))
    }

    /// The subscription's run records with their ids, newest first; a
    /// record without a readable id is no run and is left out.
    async fn run_records(&self, namespace: &str, api: &str) -> Result<Vec<(String, KeyValue)>> {
        let prefix = self.layout.prefix(Collection::SubscriptionRuns { namespace, api });
        let (records, _) = self.store.list_all(&prefix).await?;
        let mut records: Vec<(String, KeyValue)> =
            records.into_iter().filter_map(|kv| Some((run_codec::id(&kv.value)?, kv))).collect();
        records.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(records)
    }
}

/// The run stored in `kv`, a record of `namespace`'s subscription to `api`
/// ([`run_codec`]: the compact form, or the JSON of earlier builds).
fn decode_run(kv: &KeyValue, namespace: &str, api: &str) -> Result<Run> {
    run_codec::decode(&kv.value, namespace, api)
        .map_err(|e| Error::Corrupt { key: kv.key.clone(), message: e.to_string() })
}
