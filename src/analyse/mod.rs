//! Rules: each reads a loaded recording and raises a [`Finding`] only from
//! what the recording measured. Versions and settings go into the text.

pub mod checkpoint_stall;
pub mod clock_reads;
pub mod finding;
pub mod replay_drop;
pub mod statements;
pub mod syncrep_wait;
pub mod timer_syscalls;

pub use finding::{Finding, Severity};

use crate::recording::Loaded;

pub trait Rule {
    /// The finding id it raises (stable; part of the contract).
    fn id(&self) -> &'static str;
    fn evaluate(&self, rec: &Loaded) -> Option<Finding>;
}

pub fn rules() -> Vec<Box<dyn Rule>> {
    vec![
        Box::new(timer_syscalls::TimerSyscalls),
        Box::new(checkpoint_stall::CheckpointStall),
        Box::new(clock_reads::ClockReads),
        Box::new(replay_drop::ReplayDropCost),
        Box::new(syncrep_wait::SyncrepWait),
    ]
}

/// Every rule's findings, most severe first, then by id.
pub fn analyse(rec: &Loaded) -> Vec<Finding> {
    let mut out: Vec<Finding> = rules().iter().filter_map(|r| r.evaluate(rec)).collect();
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then_with(|| a.id.cmp(&b.id)));
    out
}

/// A recording from tests/fixtures/recordings, for the rules' tests.
#[cfg(test)]
pub(crate) fn fixture(name: &str) -> Loaded {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name);
    Loaded::open(&dir).expect("fixture recording")
}
