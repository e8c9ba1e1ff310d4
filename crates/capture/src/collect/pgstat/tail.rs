//! Following the server log file: new complete lines since the last read.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::log::{parse_log_line, LogLine};

/// At most this much new log is read per interval.
const LOG_READ_MAX: usize = 4 << 20;

/// New complete lines appended to a file since the last read.
pub(super) struct LogTail {
    pub(super) path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl LogTail {
    /// Start at the end of `path`; also return the complete lines of its
    /// last `backlog` bytes (to find a checkpoint already under way).
    pub(super) fn open(path: &Path, backlog: u64) -> std::io::Result<(LogTail, Vec<String>)> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let from = len.saturating_sub(backlog);
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::new();
        f.take(len - from).read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        let mut lines: Vec<String> = text.lines().map(String::from).collect();
        if from > 0 && !lines.is_empty() {
            lines.remove(0); // cut in the middle
        }
        if !buf.ends_with(b"\n") {
            lines.pop();
        }
        let consumed = buf.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1) as u64;
        Ok((
            LogTail {
                path: path.to_path_buf(),
                offset: from + consumed,
                partial: Vec::new(),
            },
            lines,
        ))
    }

    pub(super) fn read_new(&mut self) -> std::io::Result<Vec<String>> {
        let mut f = File::open(&self.path)?;
        let len = f.metadata()?.len();
        if len < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.take(LOG_READ_MAX as u64).read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        let mut data = std::mem::take(&mut self.partial);
        data.extend_from_slice(&buf);
        let cut = data.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        self.partial = data.split_off(cut);
        Ok(String::from_utf8_lossy(&data)
            .lines()
            .map(String::from)
            .collect())
    }
}

/// The last checkpoint/restartpoint start among `lines` with no completion after it.
pub fn unfinished_start(lines: &[String]) -> Option<LogLine> {
    let mut open = None;
    for l in lines {
        if let Some(p) = parse_log_line(l) {
            match p.event.phase.as_str() {
                "start" => open = Some(p),
                "complete" => open = None,
                _ => {}
            }
        }
    }
    open
}
