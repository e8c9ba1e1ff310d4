//! Reports of a recording: a JSON document (the contract in DESIGN.md) and
//! a text rendering of the same document.

pub mod html;
pub mod json;
pub mod pprof;
pub mod sections;
pub mod text;

pub use json::{build, Report};

use std::path::Path;

use anyhow::Result;

use crate::recording::writer::{write_json_atomic, write_text_atomic};

/// Files a report is saved as inside its recording.
pub const JSON_FILE: &str = "report.json";
pub const TEXT_FILE: &str = "report.txt";

/// Save the report next to the data it came from.
pub fn write_files(dir: &Path, rep: &Report) -> Result<()> {
    write_json_atomic(&dir.join(JSON_FILE), rep)?;
    write_text_atomic(&dir.join(TEXT_FILE), &text::render(rep))
}
