//! Writes a recording as the run goes: JSON lines appended and flushed each
//! interval, the manifest replaced atomically, so a run killed halfway still
//! leaves a readable recording.
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use super::files;
use super::manifest::Manifest;
use crate::error::fixable;

pub struct Writer {
    dir: PathBuf,
    streams: BTreeMap<&'static str, BufWriter<File>>,
    pub manifest: Manifest,
}

impl Writer {
    /// Create `dir` (it must not hold a recording already) and write the
    /// manifest with status "recording".
    pub fn create(dir: &Path, manifest: Manifest) -> Result<Writer> {
        if dir.join(files::MANIFEST).exists() {
            return Err(fixable(
                format!("{} already holds a recording", dir.display()),
                "pass another --out DIR, or remove that one",
            ));
        }
        fs::create_dir_all(dir).map_err(|e| {
            fixable(
                format!("cannot create output directory {}: {e}", dir.display()),
                "pass --out with a writable directory",
            )
        })?;
        let probe = dir.join(".pgbelow-write-test");
        File::create(&probe).map_err(|e| {
            fixable(
                format!("output directory {} is not writable: {e}", dir.display()),
                "pass --out with a writable directory",
            )
        })?;
        let _ = fs::remove_file(&probe);
        let mut w = Writer {
            dir: dir.to_path_buf(),
            streams: BTreeMap::new(),
            manifest,
        };
        w.write_manifest()?;
        Ok(w)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Replace manifest.json atomically (write a temp file, then rename).
    pub fn write_manifest(&mut self) -> Result<()> {
        write_json_atomic(&self.dir.join(files::MANIFEST), &self.manifest)
    }

    /// Append one JSON line to `<stream>`; flushed by [`Writer::flush`].
    pub fn append(&mut self, stream: &'static str, value: &impl Serialize) -> Result<()> {
        if !self.streams.contains_key(stream) {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join(stream))
                .with_context(|| format!("opening {}", self.dir.join(stream).display()))?;
            self.streams.insert(stream, BufWriter::new(f));
        }
        let w = self.streams.get_mut(stream).expect("inserted above");
        serde_json::to_writer(&mut *w, value)?;
        w.write_all(b"\n")?;
        Ok(())
    }

    /// Flush every stream; called once per sampling interval.
    pub fn flush(&mut self) -> Result<()> {
        for w in self.streams.values_mut() {
            w.flush()?;
        }
        Ok(())
    }

    /// Write a whole JSON file inside the recording, atomically.
    pub fn put(&self, name: &str, value: &impl Serialize) -> Result<()> {
        write_json_atomic(&self.dir.join(name), value)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

/// Fail early, before anything is started, if `dir` cannot be created and
/// written; leaves no directory behind either way.
pub fn probe_writable(dir: &Path) -> Result<()> {
    let mut existing = dir;
    let mut created = Vec::new();
    while !existing.exists() {
        created.push(existing.to_path_buf());
        match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => existing = p,
            _ => break,
        }
    }
    let bad = |e: std::io::Error| {
        fixable(
            format!("output directory {} is not writable: {e}", dir.display()),
            "pass --out with a writable directory",
        )
    };
    let result = fs::create_dir_all(dir)
        .and_then(|_| File::create(dir.join(".pgbelow-write-test")).map(drop))
        .and_then(|_| fs::remove_file(dir.join(".pgbelow-write-test")));
    for d in &created {
        let _ = fs::remove_dir(d);
    }
    result.map_err(bad)
}

pub fn write_json_atomic(path: &Path, value: &impl Serialize) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut body = serde_json::to_vec_pretty(value)?;
    body.push(b'\n');
    fs::write(&tmp, body).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// Write a text file atomically (reports).
pub fn write_text_atomic(path: &Path, text: &str) -> Result<()> {
    write_bytes_atomic(path, text.as_bytes())
}

/// Write a file atomically: a temporary beside it, renamed over it.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}
