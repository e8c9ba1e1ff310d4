//! Which cgroup version a directory belongs to: a word of both the cgroup
//! stream and its memory part (its own file, so neither imports the other).
use serde::{Deserialize, Serialize};

/// Which cgroup version a directory belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}
