//! Reading a subscription's runs (platform §4.4) a page at a time.
//!
//! A subscription's runs are one record, its run history
//! ([`kayra_core::run_ring`]): newest first, each run in its compact form.
//! A page is found from the runs' ids alone (read without the rest of
//! each run), and only the runs of the page asked for are decoded (§17:
//! `?limit=1` reads one record and decodes one run). What is read at all
//! is bounded by the history's own bound (`run_ring::MAX_RING_BYTES`).
//!
//! A subscription whose runs an earlier build recorded (one record a run,
//! in ring slots) has no history record until its next run: until then
//! those records are read instead. That run's job reads them too
//! ([`Repository::earlier_runs`]) and its result's write replaces them
//! with a history holding them and the new run, so an upgrade loses no
//! run.

use kayra_core::run_ring::RunRing;
use kayra_core::{Run, run_codec};
use kayra_store::{KeyValue, Op, Revision, Txn};

use super::{Collection, Error, RecordRef, Repository, Result};

/// One page of runs, newest first.
#[derive(Debug)]
pub struct RunPage {
    pub items: Vec<Run>,
    /// The id of the page's last run when older ones follow.
    pub next: Option<String>,
}

/// A subscription's runs as stored: its history, or an earlier build's
/// records (newest first, with their ids).
enum Stored {
    History { key: String, ring: RunRing },
    Slots(Vec<(String, KeyValue)>),
}

impl Stored {
    /// The stored runs' ids, newest first (a run whose id does not read is left out).
    fn ids(&self) -> Vec<(usize, String)> {
        match self {
            Stored::History { ring, .. } => {
                ring.ids().into_iter().enumerate().filter_map(|(i, id)| Some((i, id?))).collect()
            }
            Stored::Slots(records) => records.iter().enumerate().map(|(i, (id, _))| (i, id.clone())).collect(),
        }
    }

    /// Run `index` of [`Stored::ids`]'s numbering.
    fn decode(&self, index: usize, namespace: &str, api: &str) -> Result<Run> {
        let (key, decoded) = match self {
            Stored::History { key, ring } => (key, ring.run(index, namespace, api)),
            Stored::Slots(records) => {
                let (_, kv) = &records[index];
                (&kv.key, Some(run_codec::decode(&kv.value, namespace, api)))
            }
        };
        match decoded {
            Some(Ok(run)) => Ok(run),
            Some(Err(e)) => Err(Error::Corrupt { key: key.clone(), message: e.to_string() }),
            None => Err(Error::Corrupt { key: key.clone(), message: format!("no run {index}") }),
        }
    }
}

impl Repository {
    /// The runs of `namespace`'s subscription to `api` older than the run
    /// `after` (an id; `None`: from the newest), at most `limit` (0: all).
    pub async fn runs_page(&self, namespace: &str, api: &str, after: Option<&str>, limit: usize) -> Result<RunPage> {
        let stored = self.stored_runs(namespace, api).await?;
        let mut ids = stored.ids();
        if let Some(after) = after {
            // After the run the last page ended with; if it has gone from
            // the history since, after every run older than it.
            match ids.iter().position(|(_, id)| id == after) {
                Some(at) => drop(ids.drain(..=at)),
                None => ids.retain(|(_, id)| id.as_str() < after),
            }
        }
        let more = limit > 0 && ids.len() > limit;
        if limit > 0 {
            ids.truncate(limit);
        }
        let items = ids.iter().map(|(i, _)| stored.decode(*i, namespace, api)).collect::<Result<Vec<_>>>()?;
        let next = more.then(|| items.last().map(|run| run.id.clone())).flatten();
        Ok(RunPage { items, next })
    }

    /// The run `id` of `namespace`'s subscription to `api`.
    pub async fn run(&self, namespace: &str, api: &str, id: &str) -> Result<Option<Run>> {
        let stored = self.stored_runs(namespace, api).await?;
        let Some((index, _)) = stored.ids().into_iter().find(|(_, found)| found == id) else {
            return Ok(None);
        };
        Ok(Some(stored.decode(index, namespace, api)?))
    }

    /// Adds `run` to its subscription's history as the newest, keeping
    /// `keep` runs, as a reconciler's result writes it (without a result):
    /// for tests that plant runs. Not guarded against a reconciler's own
    /// write: only for a subscription none is running.
    #[doc(hidden)]
    pub async fn add_run(&self, run: &Run, keep: usize) -> Result<Revision> {
        self.add_stored_run(&run.namespace, &run.api, run_codec::encode(run), keep).await
    }

    /// [`Repository::add_run`] of a run as stored (its compact form), so
    /// tests can plant one that does not decode.
    #[doc(hidden)]
    pub async fn add_stored_run(&self, namespace: &str, api: &str, record: Vec<u8>, keep: usize) -> Result<Revision> {
        let key = self.base.layout.key(RecordRef::Runs { namespace, api });
        let mut ring = match self.base.store.get(&key).await? {
            (Some(kv), _) => {
                RunRing::decode(&kv.value).map_err(|e| Error::Corrupt { key: key.clone(), message: e.to_string() })?
            }
            (None, _) => RunRing::default(),
        };
        ring.push_stored(record, keep);
        let txn = Txn::new().then(Op::Put { key, value: ring.encode() });
        Ok(self.base.store.txn(txn).await?.revision)
    }

    /// The runs an earlier build recorded for `namespace`'s subscription to
    /// `api`, one record a run, as a history (empty when there are none):
    /// what a job reads when the subscription has no history record yet,
    /// so that its result's history keeps them. A record that does not
    /// decode is left out (runs are history, not state).
    pub async fn earlier_runs(&self, namespace: &str, api: &str) -> Result<RunRing> {
        let runs: Vec<Run> = self
            .slot_records(namespace, api)
            .await?
            .iter()
            .filter_map(|(_, kv)| match run_codec::decode(&kv.value, namespace, api) {
                Ok(run) => Some(run),
                Err(e) => {
                    tracing::warn!(key = %kv.key, error = %e, "an earlier build's run record does not read; left out");
                    None
                }
            })
            .collect();
        Ok(RunRing::of(&runs, runs.len()))
    }

    /// The subscription's run history, one record; without one, the run
    /// records an earlier build kept for it.
    async fn stored_runs(&self, namespace: &str, api: &str) -> Result<Stored> {
        let key = self.base.layout.key(RecordRef::Runs { namespace, api });
        if let (Some(kv), _) = self.base.store.get(&key).await? {
            let ring = RunRing::decode(&kv.value).map_err(|e| Error::Corrupt { key, message: e.to_string() })?;
            return Ok(Stored::History { key: kv.key, ring });
        }
        Ok(Stored::Slots(self.slot_records(namespace, api).await?))
    }

    /// The run records an earlier build kept for the subscription, one a
    /// run in its ring slots, with their ids, newest first (a record whose
    /// id does not read is left out).
    async fn slot_records(&self, namespace: &str, api: &str) -> Result<Vec<(String, KeyValue)>> {
        let prefix = self.base.layout.prefix(Collection::RunSlots { namespace, api });
        let (records, _) = self.base.store.list_all(&prefix).await?;
        let mut records: Vec<(String, KeyValue)> =
            records.into_iter().filter_map(|kv| Some((run_codec::id(&kv.value)?, kv))).collect();
        records.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(records)
    }
}
