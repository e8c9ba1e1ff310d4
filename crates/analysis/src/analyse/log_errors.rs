//! What the error checks (disk-io-errors, filesystem-full, fd-exhaustion,
//! shm-too-small) share: the server log's error events of one kind within
//! the recording or before it, where their files live, and the seconds
//! their rates are per.
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::LogEvent;

/// The server log's events of `kind` within the recording (a line may be
/// read up to a second after its end).
pub fn in_recording<'a>(ev: &'a Evidence, kind: &str) -> Vec<&'a LogEvent> {
    let end = ev.manifest.duration_s.unwrap_or(f64::INFINITY);
    ev.log_events
        .iter()
        .filter(|e| e.kind == kind && e.t >= 0.0 && e.t <= end + 1.0)
        .collect()
}

/// The server log's events of `kind` before the recording (`--since`).
pub fn before_recording<'a>(ev: &'a Evidence, kind: &str) -> Vec<&'a LogEvent> {
    ev.log_history
        .iter()
        .filter(|e| e.kind == kind && e.t < 0.0)
        .collect()
}

/// Whether an error stopped the server rather than one statement.
pub fn server_level(e: &LogEvent) -> bool {
    matches!(e.phase.as_str(), "PANIC" | "FATAL")
}

/// The recording's seconds, never 0 (a rate's denominator).
pub fn secs(ev: &Evidence) -> f64 {
    ev.manifest.duration_s.unwrap_or(0.0).max(1e-9)
}

/// Where the file of an error lives, in the words of the report.
pub fn place(file: &str) -> String {
    if file.starts_with("pg_wal/") || file.starts_with("pg_xlog/") {
        "pg_wal".into()
    } else if let Some(rest) = file.strip_prefix("pg_tblspc/") {
        format!("tablespace {}", rest.split('/').next().unwrap_or("?"))
    } else if file.contains("pgsql_tmp") {
        "temporary files".into()
    } else {
        "data".into()
    }
}

/// The places of the files the errors name, sorted, each once.
pub fn places_of(errors: &[&LogEvent]) -> Vec<String> {
    let mut places: Vec<String> = errors
        .iter()
        .filter_map(|e| e.file.as_deref())
        .map(place)
        .collect();
    places.sort();
    places.dedup();
    places
}

/// The first five files the errors name, sorted, each once.
pub fn files_of<'a>(errors: &[&'a LogEvent]) -> Vec<&'a str> {
    let mut files: Vec<&str> = errors.iter().filter_map(|e| e.file.as_deref()).collect();
    files.sort_unstable();
    files.dedup();
    files.truncate(5);
    files
}

/// The distinct whole seconds of the recording in which an error was logged.
pub fn seconds_with(errors: &[&LogEvent]) -> usize {
    let mut seconds: Vec<i64> = errors.iter().map(|e| e.t.floor() as i64).collect();
    seconds.sort_unstable();
    seconds.dedup();
    seconds.len()
}

/// A check's failures within the recording, counted once: statements
/// (`failed`) apart from the errors that stopped the server (`server`).
pub struct Failures<'a> {
    pub errors: Vec<&'a LogEvent>,
    pub server: usize,
    pub failed: usize,
    /// Failed statements per second.
    pub rate: f64,
    pub places: Vec<String>,
    pub files: Vec<&'a str>,
}

impl<'a> Failures<'a> {
    pub fn of(ev: &'a Evidence, kind: &str) -> Failures<'a> {
        let errors = in_recording(ev, kind);
        let server = errors.iter().filter(|e| server_level(e)).count();
        let failed = errors.len() - server;
        Failures {
            server,
            failed,
            rate: crate::round3(failed as f64 / secs(ev)),
            places: places_of(&errors),
            files: files_of(&errors),
            errors,
        }
    }

    /// The evidence they give every check alike.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "failed_statements": self.failed,
            "failed_per_s": self.rate,
            "server_failures": self.server,
            "first_t": self.errors.first().map(|e| e.t),
            "where": self.places,
            "files": self.files,
        })
    }
}

/// `more`'s keys added to the object `v`.
pub fn extend(v: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(o), serde_json::Value::Object(m)) = (v.as_object_mut(), more) {
        o.extend(m);
    }
}
