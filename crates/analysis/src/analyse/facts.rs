//! What a rule states once about its case: the headline figure `lab matrix`
//! tabulates (with the gauge `watch` exports, where it does) and the
//! PostgreSQL commits that changed the case. The rule's texts, the matrix,
//! `watch` and the tests read them from the rule, never from a copy.
use crate::evidence::Evidence;

/// A PostgreSQL commit that changed the case, from `major` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// The first major with the change.
    pub major: u32,
    /// Its commit, abbreviated to 10 hex digits.
    pub commit: &'static str,
    /// What it did.
    pub what: &'static str,
}

impl Change {
    /// The latest of `changes` a server of `major` has.
    pub fn latest(changes: &'static [Change], major: u32) -> Option<&'static Change> {
        changes
            .iter()
            .filter(|c| c.major <= major)
            .max_by_key(|c| c.major)
    }
}

/// The rule's key figure as `lab matrix` records it for each run.
#[derive(Clone, Copy)]
pub struct Headline {
    /// Its name in the matrix's table (and JSON).
    pub figure: &'static str,
    /// The figure, as the matrix records it (None: the recording cannot
    /// give it).
    pub value: fn(&Evidence) -> Option<f64>,
    /// The gauge `watch` exports for the rule each window, if any.
    pub metric: Option<Gauge>,
}

/// A Prometheus gauge `watch` sets from each window's recording.
#[derive(Clone, Copy)]
pub struct Gauge {
    /// The metric's name (`pgbelow_…`).
    pub name: &'static str,
    pub help: &'static str,
    /// In the gauge's unit, unrounded (`watch` keeps six decimals); None
    /// leaves the gauge out of the window's exposition.
    pub value: fn(&Evidence) -> Option<f64>,
}
