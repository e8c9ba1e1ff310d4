//! What the collectors' streams and files hold: their names and row types,
//! owned by the recording so that collect writes them and evidence, the
//! rules and the reports read them without depending on the collectors.
//! Format: docs/recording.md and docs/collectors/.

pub mod cgroup;
pub mod cgroup_version;
pub mod clock;
pub mod fsync;
pub mod memcg;
pub mod offcpu;
pub mod pgstat;
pub mod procfs;
pub mod profile;
pub mod queries;
pub mod system;
