//! pgbelow's capture: the collectors that count in the kernel (BPF, perf
//! events) and read /proc and PostgreSQL's statistics views into a
//! recording, the connections they make, and the host state pgbelow must
//! undo (the cleanup ledger, signals).
//!
//! Writes recordings; never reads them back to judge (the analysis crate
//! is not among its dependencies).

pub use pgbelow_recording as recording;
pub use pgbelow_recording::{error, round3, stats};

pub mod account;
pub mod collect;
pub mod connect;
pub mod interrupt;
pub mod ledger;
pub mod pidns;
pub mod privilege;
pub mod procinfo;
