//! A subscription's run history as one stored record (platform §4.4, §16).
//!
//! A subscription keeps its newest `reconciler.run_history` runs. Stored
//! as a record each, they cost etcd about 103 B of key and bookkeeping a
//! run before a byte of the run itself (`docs/decisions.md`, "Run records
//! at a million subscriptions"), which alone is past what a million
//! subscriptions may take of etcd's 2 GiB. So the runs of one subscription
//! are one record, its **ring**: the runs newest first, each in the
//! compact form of [`run_codec`], the whole deflated. The runs of one
//! subscription repeat their SyncID, mode, reconciler, endpoints and most
//! of their times, which the compression takes back: twenty placeholder
//! runs take about 600 B.
//!
//! - **Tagged.** The first byte is the format ([`RING_V1`]), apart from a
//!   single run record's ([`run_codec::COMPACT_V1`]) and JSON's.
//! - **Bounded.** A ring holds at most [`MAX_RING_BYTES`] of runs (their
//!   compact form, before compression): past that its oldest runs go,
//!   whatever `run_history` allows, so a ring always fits one store write
//!   (etcd takes at most 1.5 MiB a request). The newest run always stays
//!   (a run is at most [`crate::runs::MAX_RUN_RECORD_BYTES`]). Decoding
//!   stops at [`MAX_DECODED_BYTES`], so no stored value can make a reader
//!   inflate more than that.
//! - **Read in part.** [`RunRing::ids`] reads every run's id without
//!   decoding the rest, and [`RunRing::run`] decodes one run: a page of
//!   runs decodes only its own (§17).

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::Run;
use crate::run_codec::{self, DecodeError};

/// The first byte of a ring in format version 1.
pub const RING_V1: u8 = 2;

/// The most a ring holds of runs, in their compact form before
/// compression: sixteen of the largest runs a record may hold.
pub const MAX_RING_BYTES: usize = 16 * crate::runs::MAX_RUN_RECORD_BYTES;

/// The most a stored ring may inflate to before it is refused as broken.
pub const MAX_DECODED_BYTES: usize = 4 * MAX_RING_BYTES;

/// A subscription's runs, newest first, each in the compact form of
/// [`run_codec`] (without its namespace and API: the key says them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunRing {
    records: Vec<Vec<u8>>,
}

impl RunRing {
    /// A ring of `runs`, given newest first, as [`RunRing::push`] keeps
    /// them with `keep` (the generator's and tests' way to plant runs).
    pub fn of(runs: &[Run], keep: usize) -> Self {
        let mut ring = RunRing::default();
        for run in runs.iter().rev() {
            ring.push(run, keep);
        }
        ring
    }

    /// The ring stored as `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let Some(deflated) = bytes.strip_prefix(&[RING_V1]) else {
            return Err(DecodeError("not a run history record".into()));
        };
        let inflated = inflate(deflated)?;
        let records: Vec<&[u8]> = postcard::from_bytes(&inflated).map_err(|e| DecodeError(e.to_string()))?;
        Ok(RunRing { records: records.into_iter().map(<[u8]>::to_vec).collect() })
    }

    /// The ring's stored form.
    pub fn encode(&self) -> Vec<u8> {
        let records: Vec<&[u8]> = self.records.iter().map(Vec::as_slice).collect();
        // Serializing plain data into a Vec cannot fail, nor can
        // compressing into one.
        let plain = postcard::to_allocvec(&records).unwrap_or_default();
        deflate(&plain)
    }

    /// Adds `run` as the newest and keeps at most `keep` runs, the newest,
    /// and at most [`MAX_RING_BYTES`] of them (the newest always).
    pub fn push(&mut self, run: &Run, keep: usize) {
        self.push_stored(run_codec::encode(run), keep);
    }

    /// [`RunRing::push`] of a run already in its compact form (`record`
    /// is not checked: for tests that plant one that does not decode).
    #[doc(hidden)]
    pub fn push_stored(&mut self, record: Vec<u8>, keep: usize) {
        self.records.insert(0, record);
        self.records.truncate(keep.max(1));
        let mut total = 0;
        let kept = self.records.iter().take_while(|record| {
            total += record.len();
            total <= MAX_RING_BYTES
        });
        let kept = kept.count().max(1);
        self.records.truncate(kept);
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Every run's id, newest first, read without the rest of the run
    /// (`None` for a record whose id does not read).
    pub fn ids(&self) -> Vec<Option<String>> {
        self.records.iter().map(|record| run_codec::id(record)).collect()
    }

    /// Run `index` (0: the newest) of `namespace`'s subscription to `api`.
    pub fn run(&self, index: usize, namespace: &str, api: &str) -> Option<Result<Run, DecodeError>> {
        self.records.get(index).map(|record| run_codec::decode(record, namespace, api))
    }

    /// Every run, newest first.
    pub fn runs(&self, namespace: &str, api: &str) -> Result<Vec<Run>, DecodeError> {
        self.records.iter().map(|record| run_codec::decode(record, namespace, api)).collect()
    }
}

thread_local! {
    /// One compressor and one decompressor a thread, reset for each ring:
    /// building a compressor allocates and zeroes some 300 KiB of tables,
    /// which took most of a ring's encoding time (and a decompressor some
    /// 40 KiB), once for every run a reconciler records.
    /// Level 1: on zlib-rs it compresses a ring as small as level 6 does
    /// (runs repeat whole fields, which its fastest matching finds) in a
    /// quarter of the time (`docs/decisions.md`, "Run records at a million
    /// subscriptions").
    static DEFLATE: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
    static INFLATE: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// `plain` as a ring's stored form: [`RING_V1`], then raw deflate.
fn deflate(plain: &[u8]) -> Vec<u8> {
    DEFLATE.with_borrow_mut(|deflate| {
        deflate.reset();
        let mut out = Vec::with_capacity(plain.len() / 2 + 64);
        out.push(RING_V1);
        loop {
            let consumed = deflate.total_in() as usize;
            match deflate.compress_vec(&plain[consumed..], &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => return out,
                // The output is full: more room, and on.
                Ok(_) => out.reserve(out.capacity()),
                // Compressing into memory cannot fail.
                Err(_) => return vec![RING_V1],
            }
        }
    })
}

/// `deflated` inflated, refused past [`MAX_DECODED_BYTES`] (never
/// inflating more than one byte past it) or when the stream ends early.
fn inflate(deflated: &[u8]) -> Result<Vec<u8>, DecodeError> {
    INFLATE.with_borrow_mut(|inflate| {
        inflate.reset(false);
        let mut out = Vec::with_capacity((deflated.len() * 4).clamp(64, MAX_DECODED_BYTES + 1));
        loop {
            let (consumed, produced) = (inflate.total_in(), inflate.total_out());
            let status = inflate
                .decompress_vec(&deflated[consumed as usize..], &mut out, FlushDecompress::None)
                .map_err(|e| DecodeError(e.to_string()))?;
            if out.len() > MAX_DECODED_BYTES {
                return Err(DecodeError(format!("run history record inflates past {MAX_DECODED_BYTES} bytes")));
            }
            if status == Status::StreamEnd {
                return Ok(out);
            }
            if out.len() == out.capacity() {
                out.reserve_exact(out.capacity().min(MAX_DECODED_BYTES + 1 - out.len()));
            } else if (inflate.total_in(), inflate.total_out()) == (consumed, produced) {
                // Room left and nothing more comes of the input: it stops short.
                return Err(DecodeError("run history record ends inside its compressed stream".into()));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;
    use crate::{RunResult, RunStep, RunTrigger};

    fn run(n: u64, steps: usize) -> Run {
        let started = 1_780_000_000_000 + n * 60_000;
        let time = |ms: u64| {
            humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
        };
        Run {
            id: uuid::Uuid::now_v7().to_string(),
            namespace: "tenant-0042".into(),
            api: "compute.example.com".into(),
            sync_id: "2026-02-01T00Z".into(),
            mode: "api".into(),
            trigger: RunTrigger::Ongoing,
            result: RunResult::Success,
            error: String::new(),
            started_at: time(started),
            finished_at: time(started + 40 + n % 7),
            lock_id: (n % 30) as usize,
            reconciler: "reconciler-7f9c:48211".into(),
            steps: (0..steps)
                .map(|index| RunStep {
                    index,
                    method: "POST".into(),
                    endpoint: "https://compute.local.services/api/v1/namespaces/tenant-0042/sync".into(),
                    is_async: true,
                    attempts: 1,
                    status: 202,
                    error: String::new(),
                    duration_ms: 20 + n % 13,
                    outputs: [("JobID".to_string(), format!("{}", 7000 + n))].into(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_ring_keeps_the_newest_runs_newest_first() {
        let runs: Vec<Run> = (0..25).map(|n| run(n, 0)).collect();
        let mut ring = RunRing::default();
        for run in &runs {
            ring.push(run, 20);
        }
        let decoded = RunRing::decode(&ring.encode()).unwrap();
        assert_eq!(decoded, ring);
        let newest_first: Vec<Run> = runs.iter().rev().take(20).cloned().collect();
        assert_eq!(decoded.runs("tenant-0042", "compute.example.com").unwrap(), newest_first);
        let ids: Vec<Option<String>> = newest_first.iter().map(|r| Some(r.id.clone())).collect();
        assert_eq!(decoded.ids(), ids);
        assert_eq!(decoded.run(3, "tenant-0042", "compute.example.com").unwrap().unwrap(), newest_first[3]);
        assert!(decoded.run(20, "", "").is_none());
        assert_eq!(RunRing::of(&newest_first, 20), ring, "planted newest first, as pushed");
        ring.push(&run(99, 0), 3);
        assert_eq!(ring.len(), 3, "a smaller history drops the oldest at the next run");
    }

    /// The reason for the ring: twenty runs in a fraction of twenty records
    /// (each of which etcd charges about 103 B before its value).
    #[test]
    fn twenty_runs_compress_to_a_few_hundred_bytes() {
        for (steps, most) in [(0, 700), (2, 1400)] {
            let runs: Vec<Run> = (0..20).map(|n| run(n, steps)).collect();
            let ring = RunRing::of(&runs, 20).encode();
            let separate: usize = runs.iter().map(|r| run_codec::encode(r).len()).sum();
            assert!(ring.len() <= most, "{steps} steps: {} bytes (separately {separate})", ring.len());
        }
    }

    #[test]
    fn a_ring_is_bounded_in_bytes_keeping_the_newest_run() {
        let mut big = run(0, 0);
        big.error = "x".repeat(run_codec::encode(&run(0, 0)).len().max(MAX_RING_BYTES / 3));
        let mut ring = RunRing::default();
        for n in 0..5 {
            ring.push(&Run { id: format!("run-{n}"), ..big.clone() }, 1000);
        }
        assert_eq!(ring.len(), 2, "three of these are past the bound");
        assert_eq!(ring.ids()[0].as_deref(), Some("run-4"));
        let mut huge = big.clone();
        huge.error = "y".repeat(MAX_RING_BYTES * 2);
        ring.push(&huge, 1000);
        assert_eq!(ring.len(), 1, "the newest run stays whatever it weighs");
        assert_eq!(RunRing::decode(&ring.encode()).unwrap(), ring);
    }

    /// The stream format is plain raw deflate whatever wrote it: a ring
    /// deflated by a stream encoder (as earlier builds wrote them) reads,
    /// and what the reused compressor writes reads with a fresh decoder.
    #[test]
    fn rings_read_across_encoders() {
        use std::io::Read;
        for steps in [0, 2] {
            let ring = RunRing::of(&(0..20).map(|n| run(n, steps)).collect::<Vec<_>>(), 20);
            let records: Vec<&[u8]> = ring.records.iter().map(Vec::as_slice).collect();
            let plain = postcard::to_allocvec(&records).unwrap();
            let mut earlier = flate2::write::DeflateEncoder::new(vec![RING_V1], flate2::Compression::default());
            earlier.write_all(&plain).unwrap();
            assert_eq!(RunRing::decode(&earlier.finish().unwrap()).unwrap(), ring);
            let mut inflated = Vec::new();
            flate2::read::DeflateDecoder::new(&ring.encode()[1..]).read_to_end(&mut inflated).unwrap();
            assert_eq!(inflated, plain);
            // Twice in a row on one thread: the reused state starts afresh.
            assert_eq!(ring.encode(), ring.encode());
        }
    }

    /// A history as the builds before `zlib-rs` wrote it (`miniz_oxide`,
    /// level 6), pinned: four runs of one step, ids fixed. It still reads,
    /// run for run, whatever deflate implementation this build has.
    #[test]
    fn a_history_deflated_by_earlier_builds_reads() {
        const EARLIER: &str = "02bdce3d6a024118c6f179dd4d9b2a2657c807ebbc334a4cec026992268158a59b0c13b2b0ce0e3b13c14e\
            3c8088606121889ec24e5b4f6121780d5d6cb6d86df729ffc5c3cf5f0210186d168418d227e75d72e48f01f200591bf1db13268453ee\
            8fc683431d6e49355132d6328c5412347f9f65abf1c41903e27f7e7cb55ffe9c33b645a98c3be6dfa95a144b11d5ac4abaa154969ece\
            6897512d3aca1a9116a7b4d02e406c706a7b5a026c815cc1c57bfcf3f6ea371131070905c8dd7e9222efa00c6435836439c84a0172bd\
            9aa6c8fb4a19c8eb0c92e720bd02e47c384b910f5e19c89b0cb27e04";
        let bytes: Vec<u8> =
            (0..EARLIER.len()).step_by(2).map(|i| u8::from_str_radix(&EARLIER[i..i + 2], 16).unwrap()).collect();
        let runs: Vec<Run> =
            (0..4).map(|n| Run { id: format!("0190c1a2-0000-7000-8000-{n:012}"), ..run(n, 1) }).collect();
        let expected = RunRing::of(&runs, 20);
        let read = RunRing::decode(&bytes).unwrap();
        assert_eq!(read, expected);
        assert_eq!(read.runs("tenant-0042", "compute.example.com").unwrap(), runs);
    }

    #[test]
    fn what_is_no_ring_is_an_error_not_a_panic() {
        let bytes = RunRing::of(&[run(1, 1), run(2, 0)], 20).encode();
        for len in 0..bytes.len() {
            assert!(RunRing::decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        assert!(RunRing::decode(&run_codec::encode(&run(1, 0))).is_err(), "a single run record");
        assert!(RunRing::decode(b"{}").is_err());
        // A value that inflates without bound is refused at the bound.
        let mut bomb = flate2::write::DeflateEncoder::new(vec![RING_V1], flate2::Compression::best());
        bomb.write_all(&vec![0u8; MAX_DECODED_BYTES + 10]).unwrap();
        let bomb = bomb.finish().unwrap();
        assert!(bomb.len() < 10_000);
        assert!(RunRing::decode(&bomb).unwrap_err().to_string().contains("inflates past"));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, rng_seed: proptest::test_runner::RngSeed::Fixed(34), ..ProptestConfig::default() })]

        /// Any bytes after the tag decode to a ring or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut tagged = vec![RING_V1];
            tagged.extend(&bytes);
            if let Ok(ring) = RunRing::decode(&tagged) {
                let _ = ring.runs("core", "x.io");
            }
            let _ = RunRing::decode(&bytes);
        }
    }
}
