//! pgbelow: finds why PostgreSQL is slow when the cause lies below the database.
//!
//! Pipeline: `provision → workload → collect → analyse → report`, with a
//! recording (a directory) between capture and interpretation.

pub(crate) mod account;
pub mod analyse;
pub mod app;
pub mod attach;
pub mod collect;
pub mod compare;
pub mod connect;
pub mod doctor;
pub mod error;
pub mod evidence;
pub mod interrupt;
pub mod lab;
pub mod ledger;
pub mod matrix;
pub mod pidns;
pub mod privilege;
pub mod procinfo;
pub mod provision;
pub mod recording;
pub mod report;
pub mod scenarios;
pub mod stats;
pub mod watch;
pub mod workload;

/// Round to three decimals (milliseconds of seconds, ratios) so reports and
/// recordings print stable numbers.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
