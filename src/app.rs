//! The thin layer on top: record (lab or attach), then evidence → analyse →
//! report, and write the report next to its recording. `lab` and `attach`
//! only record; `report` never sees how a recording was made.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::attach::RecordOptions;
use crate::evidence::Evidence;
use crate::lab::LabOptions;
use crate::recording::Recorded;
use crate::report::{self, Report};

/// A recording with its evidence and report.
pub struct Analysed {
    pub dir: PathBuf,
    pub evidence: Evidence,
    pub report: Report,
}

/// Evidence → findings → report for the recording in `dir`, written into it
/// (`report.json`, `report.txt`).
pub fn analyse(dir: &Path) -> Result<Analysed> {
    let evidence = Evidence::load(dir)?;
    let report = report::build(&evidence);
    report::write_files(dir, &report)?;
    Ok(Analysed {
        dir: dir.to_path_buf(),
        evidence,
        report,
    })
}

/// Report a recording, then fail with what went wrong after it was made
/// (the run itself or its sweep): a failure must not cost the recorded
/// part its report.
fn finish(rec: Recorded) -> Result<Analysed> {
    let a = analyse(&rec.dir)?;
    rec.follow_up
        .with_context(|| format!("the recording's report is in {}", rec.dir.display()))?;
    Ok(a)
}

/// `pgbelow lab run`.
pub fn lab(opts: &LabOptions) -> Result<Analysed> {
    finish(crate::lab::run(opts)?)
}

/// `pgbelow record`.
pub fn record(opts: &RecordOptions) -> Result<Analysed> {
    finish(crate::attach::run(opts)?)
}
