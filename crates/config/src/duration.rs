//! Durations written as strings (`500ms`, `5s`, `3600s`, `1h`).

use serde::{Deserialize, Deserializer};

/// A `std::time::Duration` that deserializes from a humantime string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    pub const fn from_millis(ms: u64) -> Self {
        Self(std::time::Duration::from_millis(ms))
    }
    pub const fn from_secs(s: u64) -> Self {
        Self(std::time::Duration::from_secs(s))
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(s.trim()).map(Duration).map_err(|e| {
            serde::de::Error::custom(format!("invalid duration {s:?} ({e}); write e.g. \"500ms\", \"5s\", \"1h\""))
        })
    }
}
