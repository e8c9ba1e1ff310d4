//! pgbelow's analysis: a recording in, findings and reports out.
//!
//! `recording → evidence → analyse → report` (and `compare`, two reports
//! side by side). Nothing here starts a process, opens a connection or loads
//! a BPF program: it builds and tests without clang, libbpf or PostgreSQL,
//! and the crate graph keeps capture out of it.

pub use pgbelow_recording as recording;
pub use pgbelow_recording::{error, role, round3, stats};

pub mod analyse;
pub mod compare;
pub mod evidence;
pub mod report;
