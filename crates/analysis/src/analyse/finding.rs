use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub fn parse(s: &str) -> Option<Severity> {
        match s {
            "info" => Some(Severity::Info),
            "warning" => Some(Severity::Warning),
            "critical" => Some(Severity::Critical),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// A diagnosis with the measurements that support it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub id: String,
    pub severity: Severity,
    pub title: String,
    pub summary: String,
    /// Numbers and the time window; keys sorted (serde_json's map is a BTreeMap).
    pub evidence: serde_json::Value,
    /// The cost it explains; None when no cost could be measured (then the
    /// finding is at most info). Additive in the JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<Impact>,
    pub remedy: String,
}

/// What a finding costs, as measured: the share of something a DBA pays
/// for (backend time, CPU, throughput, latency, memory) that the cause
/// explains, and the measurement behind it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Impact {
    /// 0–1 of `of`.
    pub share: f64,
    /// What the share is of, e.g. "the backends' busy time".
    pub of: String,
    /// The measurement, e.g. "pg_stat_activity at 10 Hz: 412 of 1650 busy
    /// backend samples in Lock:extend".
    pub basis: String,
}

impl Impact {
    /// None when the share is not a number (nothing measured to divide).
    pub fn new(share: f64, of: impl Into<String>, basis: impl Into<String>) -> Option<Impact> {
        share.is_finite().then(|| Impact {
            share: (share.clamp(0.0, 1.0) * 1000.0).round() / 1000.0,
            of: of.into(),
            basis: basis.into(),
        })
    }
}
