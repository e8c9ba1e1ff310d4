//! Reports of a recording: a JSON document (the contract in docs/contract.md) and
//! a text rendering of the same document.

pub mod html;
pub mod json;
pub mod otlp;
pub mod pprof;
pub mod sections;
pub mod text;
pub mod view;

pub use crate::evidence::{Series, Timeline};
pub use json::{build, Report};

use std::path::Path;

use anyhow::Result;

use crate::recording::writer::{write_json_atomic, write_text_atomic};

/// Files a report is saved as inside its recording.
pub const JSON_FILE: &str = "report.json";
pub const TEXT_FILE: &str = "report.txt";

/// The report saved inside a recording, against the one just built from it.
#[derive(Debug, PartialEq)]
pub enum Saved {
    /// The same report.
    Current,
    /// None saved (an interrupted recording, or removed).
    Absent,
    /// Unreadable or not a report: why.
    Damaged(String),
    /// A report, but not what this analysis says (an older pgbelow).
    Stale,
}

/// Compares `dir`'s saved report.json with `rep`.
pub fn saved(dir: &Path, rep: &Report) -> Saved {
    let bytes = match std::fs::read(dir.join(JSON_FILE)) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Saved::Absent,
        Err(e) => return Saved::Damaged(e.to_string()),
    };
    let stored: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return Saved::Damaged(format!("not JSON: {e}")),
    };
    if let Err(e) = serde_json::from_value::<Report>(stored.clone()) {
        return Saved::Damaged(format!("not a pgbelow report: {e}"));
    }
    match serde_json::to_value(rep) {
        Ok(fresh) if fresh == stored => Saved::Current,
        _ => Saved::Stale,
    }
}

/// Save the report next to the data it came from.
pub fn write_files(dir: &Path, rep: &Report) -> Result<()> {
    write_json_atomic(&dir.join(JSON_FILE), rep)?;
    write_text_atomic(&dir.join(TEXT_FILE), &text::render(rep))
}
