//! pgbelow: finds why PostgreSQL is slow when the cause lies below the database.
//!
//! Pipeline: `provision → workload → collect → analyse → report`, with a
//! recording (a directory) between capture and interpretation.

pub mod analyse;
pub mod attach;
pub mod collect;
pub mod compare;
pub mod doctor;
pub mod error;
pub mod interrupt;
pub mod lab;
pub mod procinfo;
pub mod provision;
pub mod recording;
pub mod report;
pub mod scenarios;
pub mod workload;
