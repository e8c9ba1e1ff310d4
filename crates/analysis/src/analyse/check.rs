//! Every rule's status in every report: `raised` (its finding), `clear`
//! (its key figure and the bound it stayed on the right side of),
//! `not_applicable` (nothing to check on this server: no quota, no standby,
//! a version without the mechanism — good news, with why) or
//! `not_measurable` (it applies, but the recording could not measure it:
//! what was missing and how to get it). A DBA learns to trust the warnings
//! from the checks that say what was looked at and found healthy.
use serde::{Deserialize, Serialize};

use super::{Finding, Severity};

/// The key figure a rule decides on, against its bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// What was measured, e.g. "WAL flush p99 (kernel)".
    pub name: String,
    pub value: f64,
    pub unit: String,
    /// The bound past which the rule raises (with its other conditions).
    pub limit: f64,
    /// Whether a value above the limit is the bad side (else below is).
    pub worse_above: bool,
}

impl Figure {
    pub fn above(name: impl Into<String>, value: f64, unit: &str, limit: f64) -> Figure {
        Figure {
            name: name.into(),
            value,
            unit: unit.into(),
            limit,
            worse_above: true,
        }
    }
    pub fn below(name: impl Into<String>, value: f64, unit: &str, limit: f64) -> Figure {
        Figure {
            worse_above: false,
            ..Figure::above(name, value, unit, limit)
        }
    }
    /// Is the figure on the bad side of its bound?
    pub fn past(&self) -> bool {
        if self.worse_above {
            self.value >= self.limit
        } else {
            self.value <= self.limit
        }
    }
    /// How far past (>1) or short of (<1) the bound the figure is, as a
    /// factor: value/limit when above is worse, limit/value otherwise.
    pub fn margin(&self) -> f64 {
        let (a, b) = if self.worse_above {
            (self.value, self.limit)
        } else {
            (self.limit, self.value)
        };
        if b <= 0.0 {
            if a > 0.0 {
                f64::INFINITY
            } else {
                1.0
            }
        } else {
            a / b
        }
    }
    fn number(v: f64, unit: &str) -> String {
        let n = if v == 0.0 || v.abs() >= 100.0 {
            format!("{v:.0}")
        } else if v.abs() >= 10.0 {
            format!("{v:.1}")
        } else if v.abs() >= 0.01 {
            format!("{v:.2}")
        } else {
            format!("{v:.2e}")
        };
        match unit {
            "" => n,
            "%" => format!("{n} %"),
            u => format!("{n} {u}"),
        }
    }
    /// "WAL flush p99 (kernel) 0.40 ms"
    pub fn text(&self) -> String {
        format!("{} {}", self.name, Figure::number(self.value, &self.unit))
    }
    /// "≥ 30 ms" (the side that raises).
    pub fn bound_text(&self) -> String {
        format!(
            "{} {}",
            if self.worse_above { "≥" } else { "≤" },
            Figure::number(self.limit, &self.unit)
        )
    }
}

/// What a rule measured: its key figure, or why it could not.
#[derive(Clone, Debug, PartialEq)]
pub enum Measure {
    Figure(Figure),
    /// What was missing, and how to get it.
    Missing(String),
    /// Why there is nothing to check on this server.
    NotApplicable(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Raised,
    Clear,
    /// Added after the first three: a reader that knows only those should
    /// take any other status as "neither raised nor clear" (docs/contract.md).
    NotApplicable,
    NotMeasurable,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Raised => "raised",
            Status::Clear => "clear",
            Status::NotApplicable => "not applicable",
            Status::NotMeasurable => "not measurable",
        }
    }
}

/// One rule's verdict on a recording (report JSON `checks`, additive).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub id: String,
    pub status: Status,
    /// The finding's severity when raised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
    /// The key figure in words ("WAL flush p99 (kernel) 0.40 ms"), null when not measured.
    pub figure: Option<String>,
    /// The bound that raises ("≥ 30 ms"), null when not measured.
    pub bound: Option<String>,
    /// The key figure as a number, its bound and which side is bad.
    pub measured: Option<Figure>,
    /// Why it could not be measured and what to enable.
    pub missing: Option<String>,
    /// Why it does not apply to this server (status `not_applicable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not_applicable: Option<String>,
    /// Why a figure past its bound raised nothing: the rule's other
    /// condition that was not met (absent when the rule does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_back: Option<String>,
}

impl Check {
    pub fn new(id: &str, finding: Option<&Finding>, m: Measure) -> Check {
        let (measured, missing, inapplicable) = match m {
            Measure::Figure(f) => (Some(f), None, None),
            Measure::Missing(why) => (None, Some(why), None),
            Measure::NotApplicable(why) => (None, None, Some(why)),
        };
        let status = match (finding, &measured, &inapplicable) {
            (Some(_), _, _) => Status::Raised,
            (None, Some(_), _) => Status::Clear,
            (None, None, Some(_)) => Status::NotApplicable,
            (None, None, None) => Status::NotMeasurable,
        };
        Check {
            id: id.to_string(),
            status,
            severity: finding.map(|f| f.severity),
            figure: measured.as_ref().map(Figure::text),
            bound: measured.as_ref().map(Figure::bound_text),
            measured,
            // A raised finding measured its cost in its own terms.
            missing: if finding.is_some() { None } else { missing },
            why_not_applicable: if finding.is_some() {
                None
            } else {
                inapplicable
            },
            held_back: None,
        }
    }

    /// `why` a figure past its bound raised nothing, kept only when that
    /// is the case.
    pub fn held_back(mut self, why: Option<String>) -> Check {
        let past = self.measured.as_ref().is_some_and(Figure::past);
        if self.status == Status::Clear && past {
            self.held_back = why;
        }
        self
    }

    /// A figure past its bound that could not decide for want of `why`:
    /// not measurable (the figure kept), never clear.
    pub fn undecided(mut self, why: String) -> Check {
        let past = self.measured.as_ref().is_some_and(Figure::past);
        if self.status == Status::Clear && past {
            self.status = Status::NotMeasurable;
            self.missing = Some(why);
        }
        self
    }

    /// One line for the text report.
    pub fn line(&self) -> String {
        let what = match (&self.figure, &self.bound, &self.missing) {
            (Some(f), Some(b), _) if self.status == Status::Raised => {
                format!("{f} (raises at {b})")
            }
            (Some(f), Some(b), Some(why)) if self.status == Status::NotMeasurable => {
                format!("{f} (bound {b}; cannot decide: {why})")
            }
            (Some(f), Some(b), _) => {
                let past = self.measured.as_ref().is_some_and(Figure::past);
                if let (true, Some(why)) = (past, &self.held_back) {
                    format!("{f} (bound {b}; not raised: {why})")
                } else if past {
                    format!("{f} (bound {b}; its other conditions not met)")
                } else {
                    format!("{f}, bound {b}")
                }
            }
            (_, _, Some(m)) => m.clone(),
            _ => self.why_not_applicable.clone().unwrap_or_default(),
        };
        let status = match self.severity {
            Some(s) => s.as_str(),
            None => self.status.as_str(),
        };
        format!("{status:<14} {:<34} {what}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_the_finding_then_the_figure() {
        let f = Figure::above("WAL flush p99", 0.4, "ms", 30.0);
        assert!(!f.past());
        assert!((f.margin() - 0.4 / 30.0).abs() < 1e-9);
        let c = Check::new("x", None, Measure::Figure(f.clone()));
        assert_eq!(c.status, Status::Clear);
        assert_eq!(c.figure.as_deref(), Some("WAL flush p99 0.40 ms"));
        assert_eq!(c.bound.as_deref(), Some("≥ 30.0 ms"));
        let c = Check::new("x", None, Measure::Missing("no fsync collector".into()));
        assert_eq!(c.status, Status::NotMeasurable);
        assert!(c.line().contains("no fsync collector"), "{}", c.line());
        let below = Figure::below("tps ratio", 0.2, "", 0.5);
        assert!(below.past());
        assert!((below.margin() - 2.5).abs() < 1e-9);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["status"], "not_measurable");
        assert!(json["figure"].is_null());
        assert!(json.get("held_back").is_none(), "{json}");
        assert!(json.get("why_not_applicable").is_none(), "{json}");
        let c = Check::new("x", None, Measure::NotApplicable("no standby".into()));
        assert_eq!(c.status, Status::NotApplicable);
        assert!(c.missing.is_none());
        assert!(c.line().starts_with("not applicable"), "{}", c.line());
        assert!(c.line().contains("no standby"), "{}", c.line());
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["status"], "not_applicable");
        assert_eq!(json["why_not_applicable"], "no standby");
    }

    #[test]
    fn a_figure_past_its_bound_says_what_held_it_back() {
        let past = Figure::above("run-queue s per CPU s", 0.65, "", 0.5);
        let why = "the cluster's own processes filled the CPUs".to_string();
        let c = Check::new("x", None, Measure::Figure(past)).held_back(Some(why.clone()));
        assert!(
            c.line().ends_with(
                "(bound ≥ 0.50; not raised: the cluster's own processes filled the CPUs)"
            ),
            "{}",
            c.line()
        );
        assert_eq!(serde_json::to_value(&c).unwrap()["held_back"], why);
        // Unsaid, the line still says the bound alone did not decide.
        let c = Check::new("x", None, Measure::Figure(Figure::above("f", 2.0, "", 1.0)));
        assert!(
            c.line().contains("its other conditions not met"),
            "{}",
            c.line()
        );
        // Past its bound but undecided: not measurable, the figure kept.
        let c = Check::new("x", None, Measure::Figure(Figure::above("f", 2.0, "", 1.0)))
            .undecided("who used the CPUs was not recorded".into());
        assert_eq!(c.status, Status::NotMeasurable);
        assert!(
            c.line()
                .contains("f 2.00 (bound ≥ 1.00; cannot decide: who used"),
            "{}",
            c.line()
        );
        let short = Check::new("x", None, Measure::Figure(Figure::above("f", 0.5, "", 1.0)))
            .undecided("no".into());
        assert_eq!(short.status, Status::Clear);
        // Short of its bound, a reason is not kept.
        let short = Figure::above("f", 0.1, "", 1.0);
        let c = Check::new("x", None, Measure::Figure(short)).held_back(Some("no".into()));
        assert!(c.held_back.is_none());
    }
}
