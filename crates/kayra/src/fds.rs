//! The descriptor limit of `kayra serve`: every watch stream holds a
//! connection, and `server.max_streams` (10,000 by default) of them must
//! fit with room left for `/healthz`, ordinary requests and the store
//! (§17). A soft limit below that (1,024 is common) is raised to the hard
//! limit at startup, as Go's runtime does for every program; when even the
//! hard limit leaves too little room, the stream cap is lowered to what it
//! allows, so streams at their cap can never take the descriptors the rest
//! needs.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept free beside the streams: connections of ordinary
/// requests, the store's, files.
const HEADROOM: u64 = 1024;

/// Raises the soft descriptor limit to the hard one and answers the stream
/// cap the limit allows: `streams` when it fits with [`HEADROOM`] beside
/// it, else the lower [`stream_cap`], with one warning naming both.
pub fn raise_for(streams: usize) -> usize {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, max_streams = streams, "cannot read the descriptor limit; keeping server.max_streams");
            return streams;
        }
    };
    let mut now = soft;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => now = hard,
            Err(e) => tracing::warn!(error = %e, soft, hard, "cannot raise the descriptor limit"),
        }
    }
    let cap = stream_cap(streams, now);
    if cap < streams {
        tracing::warn!(
            limit = now,
            max_streams = streams,
            effective_max_streams = cap,
            "the descriptor limit leaves too little room for server.max_streams; serving at most \
             effective_max_streams watch streams (raise the limit, LimitNOFILE, or lower server.max_streams)"
        );
    }
    cap
}

/// How many of `streams` fit under a descriptor `limit` with room beside
/// them for everything else: [`HEADROOM`] descriptors, or half the limit
/// when the limit is below twice that (a 1,024 limit allows 512 streams).
/// At least one, as the hub's caps are.
fn stream_cap(streams: usize, limit: u64) -> usize {
    let headroom = HEADROOM.min(limit / 2);
    let room = usize::try_from(limit - headroom).unwrap_or(usize::MAX);
    streams.min(room).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_the_headroom_free_or_half_of_a_small_limit() {
        // Room enough: the configured cap stands.
        assert_eq!(stream_cap(10_000, 1_048_576), 10_000);
        assert_eq!(stream_cap(10_000, 11_024), 10_000);
        assert_eq!(stream_cap(100, 4096), 100);
        // Too little: the limit less the headroom.
        assert_eq!(stream_cap(10_000, 11_023), 9_999);
        assert_eq!(stream_cap(10_000, 4096), 3072);
        assert_eq!(stream_cap(10_000, 2048), 1024);
        // Below twice the headroom: half of it.
        assert_eq!(stream_cap(10_000, 2047), 1024);
        assert_eq!(stream_cap(10_000, 1024), 512);
        assert_eq!(stream_cap(10_000, 256), 128);
        // Never zero, never past an unlimited limit.
        assert_eq!(stream_cap(10_000, 1), 1);
        assert_eq!(stream_cap(10_000, 0), 1);
        assert_eq!(stream_cap(10_000, u64::MAX), 10_000);
        assert_eq!(stream_cap(usize::MAX, u64::MAX), usize::try_from(u64::MAX - HEADROOM).unwrap_or(usize::MAX));
        // Whatever is asked, the streams and the headroom fit.
        for limit in [0, 1, 2, 3, 100, 1023, 1024, 1025, 2047, 2048, 2049, 65_536] {
            for streams in [1, 2, 512, 1000, 10_000] {
                let cap = stream_cap(streams, limit) as u64;
                assert!(cap <= streams as u64, "{streams} at {limit}: {cap}");
                assert!(cap == 1 || cap + HEADROOM.min(limit / 2) <= limit, "{streams} at {limit}: {cap}");
            }
        }
    }

    #[test]
    fn the_process_limit_caps_what_is_asked() {
        // This process's real limit: a single stream always fits, and no
        // limit holds usize::MAX streams beside the headroom.
        assert_eq!(raise_for(1), 1);
        assert!(raise_for(usize::MAX) < usize::MAX);
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert!(soft == hard || setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_err(), "{soft} {hard}");
    }
}
