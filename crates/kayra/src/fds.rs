//! The descriptor limit of `kayra serve`: every watch stream holds a
//! connection, and `server.max_streams` (10,000 by default) of them must
//! fit with room left for `/healthz`, ordinary requests and the store
//! (§17). A soft limit below that (1,024 is common) is raised to the hard
//! limit at startup, as Go's runtime does for every program.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept free beside the streams: connections of ordinary
/// requests, the store's, files.
const HEADROOM: u64 = 1024;

/// Raises the soft descriptor limit to the hard one, and warns when even
/// that leaves less than `streams` plus headroom.
pub fn raise_for(streams: usize) {
    let wanted = streams as u64 + HEADROOM;
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the descriptor limit");
            return;
        }
    };
    let mut now = soft;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => now = hard,
            Err(e) => tracing::warn!(error = %e, soft, hard, "cannot raise the descriptor limit"),
        }
    }
    if now < wanted {
        tracing::warn!(
            limit = now,
            wanted,
            max_streams = streams,
            "the descriptor limit leaves too little room for server.max_streams; raise it (LimitNOFILE) or lower server.max_streams"
        );
    }
}
