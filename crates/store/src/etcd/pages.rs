//! How a snapshot of a key range is read from etcd a page at a time.
//!
//! etcd 3.4 answers a range by first collecting the revision of **every**
//! key in the requested `[from, end)` (its in-memory index), and only
//! then reading the first `limit` of them: a limited range costs it as
//! much as the whole rest of the range (its `count`; etcd-io/etcd#11057).
//! A list of `n` keys in pages of `p`, each page asking for the rest of
//! the range, costs `n² / 2p` index steps: a million subscriptions in
//! pages of 7,000 keys, some 70 million.
//!
//! So each request asks for a **bounded sub-range**: its end is where the
//! page before it says about a page's worth of keys ends, by
//! interpolating between that page's first and last keys (keys taken as
//! big-endian numbers from a few bytes before the byte they part at). A
//! sub-range that holds more keys than a page is read on in pages as
//! before; one that holds fewer is done and the next starts at its end,
//! twice as long as it when it held too few keys to say (none or one). Every request then costs etcd about a page's keys, whatever
//! the range's size, and the sub-ranges still cover `[start, end)`
//! exactly, in order, at the snapshot's one revision.

use crate::Revision;

/// What a snapshot's page aims to weigh (keys and values).
pub(super) const PAGE_BYTES: usize = 2 << 20;
/// A snapshot's first page, and its fewest keys a page.
pub(super) const PAGE_MIN: usize = 1_000;
/// A snapshot's most keys a page.
pub(super) const PAGE_MAX: usize = 50_000;

/// Where a snapshot read page by page stands: the next request's first
/// key, the snapshot's revision once the first page fixed it, the next
/// page's size and the sub-range it asks for.
pub(super) struct PageCursor {
    pub from: Vec<u8>,
    pub at: Option<Revision>,
    pub limit: usize,
    /// The sub-range being read: its end, and how it was found (to try a
    /// longer one after an empty answer). `None`: to the snapshot's end.
    pub span: Option<Span>,
}

/// A sub-range's end as the interpolation found it: the keys' shared
/// `base`, then the end's 16 bytes as a number, and the step that led
/// there from the page before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Span {
    base: Vec<u8>,
    end: u128,
    step: u128,
}

impl Span {
    /// The key this span ends at.
    pub fn end_key(&self) -> Vec<u8> {
        let mut key = self.base.clone();
        key.extend_from_slice(&self.end.to_be_bytes());
        key
    }

    /// The span after this one, twice as long.
    fn doubled(&self) -> Option<Span> {
        let step = self.step.checked_mul(2)?;
        Some(Span { base: self.base.clone(), end: self.end.checked_add(step)?, step })
    }
}

impl PageCursor {
    pub fn new(from: Vec<u8>, at: Option<Revision>) -> Self {
        Self { from, at, limit: PAGE_MIN, span: None }
    }

    /// The end of the next request: the current sub-range's, capped at
    /// the snapshot's `end` (`[0]`: the end of the key space).
    pub fn request_end(&self, end: &[u8]) -> Vec<u8> {
        match &self.span {
            Some(span) => {
                let key = span.end_key();
                if is_key_space_end(end) || key.as_slice() < end { key } else { end.to_vec() }
            }
            None => end.to_vec(),
        }
    }

    /// Moves past an answer to the request `[self.from, request_end)`:
    /// `keys` its keys (in order), `more` whether the sub-range holds
    /// more. Returns whether the snapshot has more to read.
    pub fn advance(&mut self, keys: &[&[u8]], bytes: usize, more: bool, request_end: Vec<u8>, end: &[u8]) -> bool {
        self.limit = next_page(self.limit, keys.len(), bytes);
        if more && let Some(last) = keys.last() {
            // The sub-range holds more: read on from after its last key,
            // towards an end found from this page.
            self.from = successor(last);
            self.span = self.span_after(keys, last);
        } else if request_end == end {
            // The snapshot's last sub-range is done.
            return false;
        } else {
            // This sub-range is done: the next starts at its end, as far as
            // its keys say a page goes, or twice as far as this one when it
            // held too few keys to say.
            self.span = match keys.len() {
                0 | 1 => self.span.as_ref().and_then(Span::doubled),
                _ => self.span_after(keys, &request_end),
            };
            self.from = request_end;
        }
        self.span = self.span.take().filter(|span| span.end_key() > self.from);
        true
    }

    /// The sub-range from `origin` that should hold about the next page's
    /// keys after a page of `keys`: its keys' density from its first and
    /// last (as numbers from a little before the byte they part at).
    fn span_after(&self, keys: &[&[u8]], origin: &[u8]) -> Option<Span> {
        let (first, last) = (keys.first()?, keys.last()?);
        let parted = shared(first, last);
        // The numbers' 16 bytes start up to 8 bytes before the keys part,
        // so that a step can carry into them, and within what `origin`
        // shares with the keys.
        let base_len = parted.saturating_sub(8).min(shared(origin, last));
        let gap = number(last, base_len).checked_sub(number(first, base_len)).filter(|gap| *gap > 0)?;
        // `keys.len() - 1` gaps between keys cover `gap`; the next page
        // takes `limit` of them.
        let step = (gap / (keys.len() as u128 - 1)).checked_mul(self.limit as u128)?.max(1);
        let end = number(origin, base_len).checked_add(step)?;
        Some(Span { base: origin[..base_len].to_vec(), end, step })
    }
}

/// How many leading bytes `a` and `b` share.
fn shared(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// `key`'s 16 bytes from `at` as a big-endian number (zeros past its end).
fn number(key: &[u8], at: usize) -> u128 {
    let mut bytes = [0u8; 16];
    let tail = key.get(at..).unwrap_or_default();
    let n = tail.len().min(16);
    bytes[..n].copy_from_slice(&tail[..n]);
    u128::from_be_bytes(bytes)
}

/// The next page's size after one of `keys` keys weighing `bytes`, sized
/// to weigh about [`PAGE_BYTES`].
pub(super) fn next_page(limit: usize, keys: usize, bytes: usize) -> usize {
    if keys == 0 {
        return limit;
    }
    let per_key = bytes.div_ceil(keys).max(1);
    (PAGE_BYTES / per_key).clamp(PAGE_MIN, PAGE_MAX)
}

/// Whether `end` is etcd's "to the end of the key space".
fn is_key_space_end(end: &[u8]) -> bool {
    end == [0]
}

/// The smallest key strictly after `key`.
pub(super) fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A snapshot of `keys` (sorted, unique) in `[start, end)` read as
    /// etcd 3.4 answers: each request's cost is every key in its range.
    /// Returns the keys read, in order, and the keys etcd visited.
    fn read(keys: &[Vec<u8>], start: &[u8], end: &[u8], bytes_a_key: usize) -> (Vec<Vec<u8>>, usize) {
        let in_range =
            |key: &Vec<u8>, from: &[u8], to: &[u8]| key.as_slice() >= from && (to == [0] || key.as_slice() < to);
        let (mut read, mut visited) = (Vec::new(), 0);
        let mut cursor = PageCursor::new(start.to_vec(), None);
        for _ in 0..1_000_000 {
            let request_end = cursor.request_end(end);
            assert!(request_end.as_slice() > cursor.from.as_slice() || request_end == [0], "an empty request");
            let range: Vec<&Vec<u8>> = keys.iter().filter(|key| in_range(key, &cursor.from, &request_end)).collect();
            visited += range.len();
            let page: Vec<&[u8]> = range.iter().take(cursor.limit).map(|key| key.as_slice()).collect();
            read.extend(page.iter().map(|key| key.to_vec()));
            if !cursor.advance(&page, page.len() * bytes_a_key, range.len() > page.len(), request_end, end) {
                return (read, visited);
            }
        }
        panic!("the snapshot never ended");
    }

    fn prefixed(prefix: &str, names: impl Iterator<Item = String>) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> = names.map(|name| format!("{prefix}{name}").into_bytes()).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    #[test]
    fn snapshot_pages_grow_to_their_weight_within_bounds() {
        assert_eq!(next_page(1_000, 1_000, 300_000), PAGE_BYTES / 300, "small records: larger pages");
        assert_eq!(next_page(1_000, 1_000, 1_000 * 16_384), PAGE_MIN, "large records: never below the least");
        assert_eq!(next_page(1_000, 1_000, 1_000), PAGE_MAX, "tiny records: never above the most");
        assert_eq!(next_page(7_000, 0, 0), 7_000, "an empty page says nothing");
    }

    /// The shapes of kayra's collections at scale: every key read once, in
    /// order, and etcd's work a small multiple of the keys (asking for the
    /// rest of the range each page, it was `n² / 2p`).
    #[test]
    fn large_lists_cost_etcd_about_their_keys() {
        let prefix = "/kayra/subscriptions/p/r/";
        let shapes = [
            (
                "namespaces × APIs",
                prefixed(
                    prefix,
                    (0..2_000).flat_map(|n| (0..50).map(move |a| format!("t{n:05}/api{a:03}.example.com"))),
                ),
            ),
            (
                "long shared names",
                prefixed(prefix, (0..100_000).map(|n| format!("organization-production-{n:08}/compute.example.com"))),
            ),
            (
                "two clusters far apart",
                prefixed(
                    prefix,
                    (0..50_000).map(|n| format!("a{n:06}")).chain((0..50_000).map(|n| format!("z{n:06}"))),
                ),
            ),
            (
                "random",
                prefixed(prefix, (0..100_000u64).map(|n| format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)))),
            ),
        ];
        for (shape, keys) in shapes {
            let (start, end) = (prefix.as_bytes(), b"/kayra/subscriptions/p/r0".as_slice());
            let (read, visited) = read(&keys, start, end, 300);
            assert_eq!(read, keys, "{shape}: every key once, in order");
            assert!(visited <= 4 * keys.len(), "{shape}: etcd visited {visited} keys for {}", keys.len());
        }
    }

    #[test]
    fn small_empty_and_key_space_wide_ranges_read_whole() {
        let keys = prefixed("/a/", (0..5).map(|n| n.to_string()));
        assert_eq!(read(&keys, b"/a/", b"/a0", 10).0, keys);
        assert_eq!(read(&keys, b"/b/", b"/b0", 10).0, Vec::<Vec<u8>>::new());
        let keys = prefixed("", (0..20_000).map(|n| format!("{n:05}")).chain(["\u{7f}\u{7f}".to_string()]));
        assert_eq!(read(&keys, b"\0", &[0], 30).0, keys, "to the end of the key space");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, rng_seed: proptest::test_runner::RngSeed::Fixed(34), ..ProptestConfig::default() })]

        /// Any keys, of any bytes, in any distribution: read whole, once each, in order.
        #[test]
        fn any_keys_read_whole_in_order(
            mut keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 0..4_000),
            bytes_a_key in 1usize..5_000,
        ) {
            let prefix = b"/p/".to_vec();
            let mut keys: Vec<Vec<u8>> = keys.drain(..).map(|key| [prefix.clone(), key].concat()).collect();
            keys.sort();
            keys.dedup();
            prop_assert_eq!(read(&keys, &prefix, b"/p0", bytes_a_key).0, keys);
        }
    }
}
