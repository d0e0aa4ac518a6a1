//! The stored form of a run record (platform §4.4, §16): a compact binary
//! encoding instead of the API's JSON.
//!
//! A run record is the most numerous record kayra keeps (up to
//! `run_history` of them a subscription), so its bytes decide how many
//! subscriptions fit in etcd's quota. The stored form leaves out what the
//! record's key already says (its namespace and API), spells no field
//! names, and keeps a UUID id, RFC 3339 millisecond times and the enums
//! as the bytes they are: a placeholder run takes about a third of its
//! JSON (`docs/decisions.md`, "Compact run records").
//!
//! - **Tagged.** The first byte is the format ([`COMPACT_V1`]); anything
//!   else is read as the JSON records of earlier builds, which stay
//!   readable for as long as they are kept.
//! - **Exact.** Every field round-trips exactly, whatever it holds: an id
//!   that is no canonical UUID, or a time that is no canonical RFC 3339
//!   millisecond UTC time, is kept as its text.
//! - **Stable.** The field order and the enums' variant order are the
//!   format: [`tests::the_format_is_pinned`] holds a record's bytes, so a
//!   change to either fails a test rather than old records.
//! - [`id`] reads a record's id alone, without decoding the rest (a page
//!   of runs is found from the ids, §17).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{Run, RunResult, RunStep, RunTrigger};

/// The first byte of a run record in the compact format, version 1. JSON
/// starts with `{` or white space, never with it.
pub const COMPACT_V1: u8 = 1;

/// Why a stored run record does not decode.
#[derive(Debug, thiserror::Error)]
#[error("run record does not decode: {0}")]
pub struct DecodeError(pub(crate) String);

/// `run` in its stored form. Its namespace and API are its key's.
pub fn encode(run: &Run) -> Vec<u8> {
    let stored = Stored {
        id: Id::of(&run.id),
        sync_id: &run.sync_id,
        mode: &run.mode,
        trigger: run.trigger,
        result: run.result,
        error: &run.error,
        started_at: Time::of(&run.started_at),
        finished_at: Time::after(&run.finished_at, &run.started_at),
        lock_id: run.lock_id as u64,
        reconciler: &run.reconciler,
        steps: run.steps.iter().map(Step::of).collect(),
    };
    let mut bytes = vec![COMPACT_V1];
    // Serializing plain data into a Vec cannot fail.
    bytes.extend(postcard::to_allocvec(&stored).unwrap_or_default());
    bytes
}

/// The run stored as `bytes` under the key of `namespace`'s subscription
/// to `api`: the compact form, or the JSON of earlier builds.
pub fn decode(bytes: &[u8], namespace: &str, api: &str) -> Result<Run, DecodeError> {
    let Some(compact) = bytes.strip_prefix(&[COMPACT_V1]) else {
        return serde_json::from_slice(bytes).map_err(|e| DecodeError(e.to_string()));
    };
    let stored: Stored<'_> = postcard::from_bytes(compact).map_err(|e| DecodeError(e.to_string()))?;
    let started_at = stored.started_at.text();
    Ok(Run {
        id: stored.id.text(),
        namespace: namespace.to_string(),
        api: api.to_string(),
        sync_id: stored.sync_id.to_string(),
        mode: stored.mode.to_string(),
        trigger: stored.trigger,
        result: stored.result,
        error: stored.error.to_string(),
        finished_at: stored.finished_at.text_after(&stored.started_at),
        started_at,
        lock_id: usize::try_from(stored.lock_id).map_err(|e| DecodeError(e.to_string()))?,
        reconciler: stored.reconciler.to_string(),
        steps: stored.steps.into_iter().map(Step::into_step).collect::<Result<_, _>>()?,
    })
}

/// The id of the run stored as `bytes`, read without the rest of it.
pub fn id(bytes: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: String,
    }
    match bytes.strip_prefix(&[COMPACT_V1]) {
        Some(compact) => postcard::take_from_bytes::<Id<'_>>(compact).ok().map(|(id, _)| id.text()),
        None => serde_json::from_slice::<IdOnly>(bytes).ok().map(|only| only.id),
    }
}

/// The stored fields, in format order (never reorder them).
#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    #[serde(borrow)]
    id: Id<'a>,
    sync_id: &'a str,
    mode: &'a str,
    trigger: RunTrigger,
    result: RunResult,
    error: &'a str,
    #[serde(borrow)]
    started_at: Time<'a>,
    #[serde(borrow)]
    finished_at: Time<'a>,
    lock_id: u64,
    reconciler: &'a str,
    #[serde(borrow)]
    steps: Vec<Step<'a>>,
}

#[derive(Serialize, Deserialize)]
struct Step<'a> {
    index: u64,
    method: &'a str,
    endpoint: &'a str,
    is_async: bool,
    attempts: u32,
    status: u16,
    error: &'a str,
    duration_ms: u64,
    #[serde(borrow)]
    outputs: Vec<(&'a str, &'a str)>,
}

impl<'a> Step<'a> {
    fn of(step: &'a RunStep) -> Self {
        Step {
            index: step.index as u64,
            method: &step.method,
            endpoint: &step.endpoint,
            is_async: step.is_async,
            attempts: step.attempts,
            status: step.status,
            error: &step.error,
            duration_ms: step.duration_ms,
            outputs: step.outputs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        }
    }

    fn into_step(self) -> Result<RunStep, DecodeError> {
        Ok(RunStep {
            index: usize::try_from(self.index).map_err(|e| DecodeError(e.to_string()))?,
            method: self.method.to_string(),
            endpoint: self.endpoint.to_string(),
            is_async: self.is_async,
            attempts: self.attempts,
            status: self.status,
            error: self.error.to_string(),
            duration_ms: self.duration_ms,
            outputs: self.outputs.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }
}

/// A run id: the 16 bytes of a canonical (lower-case, hyphenated) UUID,
/// as the reconciler makes them, or any other text as it is.
#[derive(Serialize, Deserialize)]
enum Id<'a> {
    Uuid([u8; 16]),
    Text(&'a str),
}

impl<'a> Id<'a> {
    fn of(id: &'a str) -> Self {
        match uuid::Uuid::try_parse(id) {
            Ok(uuid) if uuid.hyphenated().to_string() == id => Id::Uuid(*uuid.as_bytes()),
            _ => Id::Text(id),
        }
    }

    fn text(&self) -> String {
        match self {
            Id::Uuid(bytes) => uuid::Uuid::from_bytes(*bytes).hyphenated().to_string(),
            Id::Text(text) => text.to_string(),
        }
    }
}

/// A run's time: milliseconds since the epoch when the text is exactly
/// what [`humantime::format_rfc3339_millis`] writes for them, milliseconds
/// after the run's start (its end), or any other text as it is.
#[derive(Serialize, Deserialize)]
enum Time<'a> {
    Millis(u64),
    After(u64),
    Text(&'a str),
}

impl<'a> Time<'a> {
    fn of(text: &'a str) -> Self {
        match millis(text) {
            Some(ms) => Time::Millis(ms),
            None => Time::Text(text),
        }
    }

    /// `text`, an end, as milliseconds after `start` when both are times.
    fn after(text: &'a str, start: &str) -> Self {
        match (millis(text), millis(start)) {
            (Some(end), Some(start)) if end >= start => Time::After(end - start),
            _ => Time::of(text),
        }
    }

    fn text(&self) -> String {
        match self {
            Time::Millis(ms) | Time::After(ms) => format_millis(*ms),
            Time::Text(text) => text.to_string(),
        }
    }

    fn text_after(&self, start: &Time<'_>) -> String {
        match (self, start) {
            (Time::After(delta), Time::Millis(start)) => format_millis(start.saturating_add(*delta)),
            _ => self.text(),
        }
    }
}

/// `text`'s milliseconds since the epoch, when formatting them gives `text` back.
fn millis(text: &str) -> Option<u64> {
    let time = humantime::parse_rfc3339(text).ok()?;
    let ms = u64::try_from(time.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    (format_millis(ms) == text).then_some(ms)
}

fn format_millis(ms: u64) -> String {
    let time: SystemTime = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn sample() -> Run {
        Run {
            id: "0193a6c1-2f3e-7a4b-8c5d-6e7f8091a2b3".into(),
            namespace: "core".into(),
            api: "compute.example.com".into(),
            sync_id: "2026-02-01T00Z".into(),
            mode: "api".into(),
            trigger: RunTrigger::Initial,
            result: RunResult::Success,
            error: String::new(),
            started_at: "2026-02-01T00:00:03.200Z".into(),
            finished_at: "2026-02-01T00:00:04.900Z".into(),
            lock_id: 3,
            reconciler: "host-a:4711".into(),
            steps: vec![RunStep {
                index: 0,
                method: "POST".into(),
                endpoint: "https://compute.local.services/api/v1/namespaces/core/sync".into(),
                is_async: true,
                attempts: 1,
                status: 202,
                error: String::new(),
                duration_ms: 41,
                outputs: BTreeMap::from([("JobID".to_string(), "77".to_string())]),
            }],
        }
    }

    #[test]
    fn a_run_round_trips_in_a_third_of_its_json() {
        let run = sample();
        let bytes = encode(&run);
        assert_eq!(decode(&bytes, "core", "compute.example.com").unwrap(), run);
        assert_eq!(id(&bytes).as_deref(), Some(run.id.as_str()));
        let json = serde_json::to_vec(&run).unwrap();
        assert!(bytes.len() * 3 <= json.len(), "{} bytes against {} of JSON", bytes.len(), json.len());
    }

    #[test]
    fn records_of_earlier_builds_still_read() {
        let run = sample();
        let json = serde_json::to_vec(&run).unwrap();
        assert_eq!(decode(&json, "ignored", "ignored").unwrap(), run, "JSON carries its own namespace and API");
        assert_eq!(id(&json).as_deref(), Some(run.id.as_str()));
        let spaced = format!("  \n{}", String::from_utf8(json).unwrap());
        assert_eq!(decode(spaced.as_bytes(), "", "").unwrap(), run);
    }

    #[test]
    fn broken_records_are_errors_not_panics() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len], "core", "compute.example.com").is_err(), "cut at {len}");
        }
        assert!(decode(b"", "", "").is_err());
        assert!(decode(&[COMPACT_V1, 0xff, 0xff, 0xff], "", "").is_err());
        assert!(id(&[COMPACT_V1]).is_none());
    }

    /// The bytes of [`sample`]: the format itself. A change to the field
    /// order or to an enum's variant order fails here, not on records
    /// already stored.
    #[test]
    fn the_format_is_pinned() {
        let hex: String = encode(&sample()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            concat!(
                "01000193a6c12f3e7a4b8c5d6e7f8091a2b30e323032362d30322d30315430305a03617069000000",
                "0080b1ffb3c13301a40d030b686f73742d613a34373131010004504f53543a68747470733a2f2f63",
                "6f6d707574652e6c6f63616c2e73657276696365732f6170692f76312f6e616d657370616365732f",
                "636f72652f73796e630101ca01002901054a6f624944023737",
            )
        );
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "\\PC{0,40}",
            any::<String>(),
            Just("0193a6c1-2f3e-7a4b-8c5d-6e7f8091a2b3".to_string()),
            Just("0193A6C1-2F3E-7A4B-8C5D-6E7F8091A2B3".to_string()),
            Just("0193a6c12f3e7a4b8c5d6e7f8091a2b3".to_string()),
        ]
    }

    fn time() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..4_102_444_800_000).prop_map(format_millis),
            Just("2026-02-01T00:00:03Z".to_string()),
            Just("2026-02-01T00:00:03.2Z".to_string()),
            Just("2026-02-01T00:00:03.200+00:00".to_string()),
            text(),
        ]
    }

    fn step() -> impl Strategy<Value = RunStep> {
        (
            (any::<usize>(), text(), text(), any::<bool>()),
            (any::<u32>(), any::<u16>(), text(), any::<u64>()),
            proptest::collection::btree_map(text(), text(), 0..4),
        )
            .prop_map(
                |((index, method, endpoint, is_async), (attempts, status, error, duration_ms), outputs)| RunStep {
                    index,
                    method,
                    endpoint,
                    is_async,
                    attempts,
                    status,
                    error,
                    duration_ms,
                    outputs,
                },
            )
    }

    fn run() -> impl Strategy<Value = Run> {
        let trigger = prop_oneof![
            Just(RunTrigger::Initial),
            Just(RunTrigger::Ongoing),
            Just(RunTrigger::Resync),
            Just(RunTrigger::Startup),
            Just(RunTrigger::Retry),
        ];
        let result = prop_oneof![
            Just(RunResult::Success),
            Just(RunResult::Error),
            Just(RunResult::Cancelled),
            Just(RunResult::Superseded),
        ];
        (
            (text(), text(), text(), text(), text()),
            (trigger, result, text(), time(), time()),
            (any::<usize>(), text(), proptest::collection::vec(step(), 0..4)),
        )
            .prop_map(
                |(
                    (id, namespace, api, sync_id, mode),
                    (trigger, result, error, started_at, finished_at),
                    (lock_id, reconciler, steps),
                )| Run {
                    id,
                    namespace,
                    api,
                    sync_id,
                    mode,
                    trigger,
                    result,
                    error,
                    started_at,
                    finished_at,
                    lock_id,
                    reconciler,
                    steps,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, rng_seed: proptest::test_runner::RngSeed::Fixed(34), ..ProptestConfig::default() })]

        /// Every field of §4.4 comes back exactly, whatever it holds.
        #[test]
        fn every_field_round_trips_exactly(run in run()) {
            let bytes = encode(&run);
            prop_assert_eq!(bytes[0], COMPACT_V1);
            prop_assert_eq!(id(&bytes), Some(run.id.clone()));
            prop_assert_eq!(decode(&bytes, &run.namespace, &run.api).unwrap(), run);
        }

        /// Any bytes decode to a run or an error, never a panic.
        #[test]
        fn any_bytes_decode_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, "core", "compute.example.com");
            let _ = id(&bytes);
        }
    }
}
