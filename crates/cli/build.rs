//! The commit for `--version`: the same script as the `kayra` binary's.
include!("../kayra/build.rs");
