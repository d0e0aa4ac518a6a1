//! Several independent transactions as one etcd Txn ([`crate::Backend::txn_group`]).
//!
//! The batch's compares are all of theirs, its success branch all their
//! success operations in order. When every compare holds, the one Txn did
//! exactly what the transactions would have done one after another —
//! provided none writes a key another one reads or writes (a compare
//! evaluated before, not after, another's write would then see the wrong
//! state; and etcd refuses a Txn that writes one key twice). So a batch is cut into
//! chunks of pairwise-disjoint transactions within etcd's request limits,
//! and a chunk whose combined compares fail is sent again one transaction
//! at a time, each then answering with its own branch.

use etcd_client::{Compare, Txn, TxnOp, TxnOpResponse};

use super::{Attempted, Keyspace, MAX_TXN_OPS, revision_of};
use crate::{Error, Op, Result, TxnResponse};

/// Well under etcd's default `--max-request-bytes` (1.5 MiB).
const MAX_CHUNK_BYTES: usize = 512 * 1024;

/// A half-open key range `[start, end)`; a single key is `[k, k\0)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Range {
    start: Vec<u8>,
    end: Vec<u8>,
}

impl Range {
    fn key(keys: &Keyspace, key: &str) -> Self {
        let start = keys.full(key).into_bytes();
        let mut end = start.clone();
        end.push(0);
        Self { start, end }
    }

    fn prefix(keys: &Keyspace, prefix: &str) -> Self {
        let (start, end) = keys.range(prefix);
        Self { start, end }
    }

    fn overlaps(&self, other: &Self) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The key ranges `txn` reads (compares, gets) and writes, in either branch.
fn touched(keys: &Keyspace, txn: &crate::Txn) -> (Vec<Range>, Vec<Range>) {
    use crate::Compare as C;
    let mut reads: Vec<Range> = txn
        .compares
        .iter()
        .map(|c| match c {
            C::Absent(k) | C::Exists(k) | C::ModRevision(k, _) => Range::key(keys, k),
            C::PrefixEmpty(p) | C::PrefixUnchangedSince(p, _) => Range::prefix(keys, p),
        })
        .collect();
    let mut writes = Vec::new();
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            Op::Get { key } => reads.push(Range::key(keys, key)),
            Op::Put { key, .. } | Op::Delete { key } => writes.push(Range::key(keys, key)),
            Op::DeletePrefix { prefix } => writes.push(Range::prefix(keys, prefix)),
        }
    }
    (reads, writes)
}

/// A transaction converted, with what it weighs against etcd's limits.
struct Part {
    compares: Vec<Compare>,
    success: Vec<TxnOp>,
    reads: Vec<Range>,
    writes: Vec<Range>,
    bytes: usize,
}

impl Part {
    /// Whether the two may share a Txn: neither writes what the other
    /// reads or writes (reading one key together is fine).
    fn independent(&self, other: &Self) -> bool {
        let clear = |writes: &[Range], of: &Self| {
            writes.iter().all(|w| of.reads.iter().chain(&of.writes).all(|r| !w.overlaps(r)))
        };
        clear(&self.writes, other) && clear(&other.writes, self)
    }
}

/// Cuts `txns` (indexes into them) into chunks that may share one Txn.
fn chunks(keys: &Keyspace, txns: &[crate::Txn]) -> (Vec<Part>, Vec<Vec<usize>>) {
    let parts: Vec<Part> = txns
        .iter()
        .map(|txn| {
            let (reads, writes) = touched(keys, txn);
            Part {
                compares: txn.compares.iter().flat_map(|c| keys.compare(c)).collect(),
                success: txn.success.iter().map(|op| keys.op(op)).collect(),
                reads,
                writes,
                bytes: txn
                    .success
                    .iter()
                    .map(|op| match op {
                        Op::Put { key, value } => key.len() + value.len(),
                        Op::Delete { key } | Op::Get { key } => key.len(),
                        Op::DeletePrefix { prefix } => prefix.len(),
                    })
                    .sum(),
            }
        })
        .collect();
    let mut chunks: Vec<Vec<usize>> = Vec::new();
    'next: for (i, part) in parts.iter().enumerate() {
        for chunk in &mut chunks {
            let (compares, ops, bytes) = chunk.iter().fold((0, 0, 0), |(c, o, b), j| {
                (c + parts[*j].compares.len(), o + parts[*j].success.len(), b + parts[*j].bytes)
            });
            let fits = compares + part.compares.len() <= MAX_TXN_OPS
                && ops + part.success.len() <= MAX_TXN_OPS
                && bytes + part.bytes <= MAX_CHUNK_BYTES;
            let disjoint = || chunk.iter().all(|j| parts[*j].independent(part));
            if fits && disjoint() {
                chunk.push(i);
                continue 'next;
            }
        }
        chunks.push(vec![i]);
    }
    (parts, chunks)
}

/// Runs `txns` in as few etcd Txns as their keys and etcd's limits allow.
pub(super) async fn run<F, Fut>(keys: &Keyspace, txns: Vec<crate::Txn>, alone: F) -> Vec<Result<TxnResponse>>
where
    F: Fn(crate::Txn) -> Fut,
    Fut: std::future::Future<Output = Result<TxnResponse>>,
{
    let (mut parts, chunks) = chunks(keys, &txns);
    let mut answers: Vec<Option<Result<TxnResponse>>> = (0..txns.len()).map(|_| None).collect();
    for chunk in chunks {
        if let [only] = chunk[..] {
            answers[only] = Some(alone(txns[only].clone()).await);
            continue;
        }
        let counts: Vec<usize> = chunk.iter().map(|i| parts[*i].success.len()).collect();
        let mut compares = Vec::new();
        let mut success = Vec::new();
        for i in &chunk {
            compares.append(&mut parts[*i].compares);
            success.append(&mut parts[*i].success);
        }
        match keys.txn(Txn::new().when(compares).and_then(success)).await {
            Ok(Attempted { value: resp, .. }) if resp.succeeded() => {
                let revision = revision_of(resp.header());
                let mut responses = resp.op_responses().into_iter();
                for (i, count) in chunk.iter().zip(counts) {
                    let gets = responses
                        .by_ref()
                        .take(count)
                        .filter_map(|op| match op {
                            TxnOpResponse::Get(get) => Some(get.kvs().first().and_then(|kv| keys.record(kv))),
                            _ => None,
                        })
                        .collect();
                    answers[*i] =
                        Some(revision.clone().map(|revision| TxnResponse { succeeded: true, revision, gets }));
                }
            }
            // The compares failed; after an unknown first outcome perhaps
            // because that attempt applied everything: no check can tell.
            Ok(Attempted { ambiguous: true, .. }) => {
                let unknown = Error::Unavailable(
                    "etcd transaction: outcome unknown (a member failed while it ran; the retry found the compares \
                     false)"
                        .into(),
                );
                for i in &chunk {
                    answers[*i] = Some(Err(unknown.clone()));
                }
            }
            // Some compare failed, or etcd refused the whole (too large,
            // say) for what one of them carries: each alone, with its own
            // branch or its own refusal.
            Ok(_) | Err(Error::Refused(_)) => {
                let each = futures::future::join_all(chunk.iter().map(|i| alone(txns[*i].clone()))).await;
                for (i, answer) in chunk.iter().zip(each) {
                    answers[*i] = Some(answer);
                }
            }
            Err(e) => {
                for i in &chunk {
                    answers[*i] = Some(Err(e.clone()));
                }
            }
        }
    }
    answers.into_iter().map(|a| a.unwrap_or_else(|| Err(Error::Unavailable("transaction not sent".into())))).collect()
}
