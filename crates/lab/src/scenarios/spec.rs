//! What a scenario declares about itself: its name, description and
//! defaults, the pgbench plan, and the `lab run` flags it owns
//! ([`Flag`], whose values reach it as [`Params`]).
use std::collections::BTreeMap;
use std::str::FromStr;

use crate::provision::SyncMode;
use crate::workload::Plan;

/// A scenario's facts, read by the CLI (`lab list`, defaults, flags), the
/// lab runner and the matrix.
#[derive(Debug)]
pub struct Spec {
    pub name: &'static str,
    /// `lab list`'s text.
    pub description: &'static str,
    /// The timed pgbench run; `None`: the scenario drives its own workload.
    pub pgbench: Option<Plan>,
    /// Whether the lab runs `pgbench -i` first (else the scenario makes its tables).
    pub init: bool,
    /// Statements the server executes per pgbench transaction, so rules can
    /// compute per-statement ratios (each one arms statement_timeout).
    pub statements_per_transaction: u64,
    /// Defaults when the CLI does not say.
    pub clients: u32,
    pub duration_s: u32,
    pub standbys: u32,
    pub sync: SyncMode,
    /// The flags only this scenario (or a few) reads.
    pub flags: &'static [&'static Flag],
    /// Whether `--checkpoint-at` applies (a pgbench workload that can take one).
    pub checkpoint_at: bool,
    /// The workload and the server's view are on the first standby.
    pub on_standby: bool,
    /// The finding the scenario reproduces: `lab matrix` tabulates its
    /// rule's headline figure and the commits that changed it.
    pub finding: Option<&'static str>,
    /// Settings `lab matrix` adds (unless given) so that the finding is
    /// possible at all.
    pub matrix_set: &'static [(&'static str, &'static str)],
    /// pgbench connects over TCP to 127.0.0.1 (else the unix socket).
    pub tcp: bool,
    /// The syscall counting budget (percent of one CPU) when the user gives
    /// none; None: the collector's default.
    pub syscalls_budget_pct: Option<f64>,
}

impl Spec {
    /// The defaults every field but name and description takes: a pgbench
    /// built-in workload (select-only's plan must be given), one client,
    /// 20 s, no standby.
    pub const BASE: Spec = Spec {
        name: "",
        description: "",
        pgbench: None,
        init: false,
        statements_per_transaction: 1,
        clients: 1,
        duration_s: 20,
        standbys: 0,
        sync: SyncMode::First,
        flags: &[],
        checkpoint_at: false,
        on_standby: false,
        finding: None,
        matrix_set: &[],
        tcp: false,
        syscalls_budget_pct: None,
    };

    pub fn owns(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f.long == flag)
    }
}

/// A `lab run` flag a scenario owns. Its value is checked and normalised
/// by `parse` when the command line is read, and stored as text.
#[derive(Debug)]
pub struct Flag {
    /// The long name without dashes.
    pub long: &'static str,
    /// The value's name in help; `None`: a switch.
    pub value_name: Option<&'static str>,
    pub help: &'static str,
    pub parse: fn(&str) -> Result<String, String>,
    /// Another flag this one needs.
    pub requires: Option<&'static str>,
}

impl Flag {
    /// A switch (`--sweep`).
    pub const fn switch(long: &'static str, help: &'static str) -> Flag {
        Flag {
            long,
            value_name: None,
            help,
            parse: text,
            requires: None,
        }
    }

    pub const fn value(
        long: &'static str,
        value_name: &'static str,
        help: &'static str,
        parse: fn(&str) -> Result<String, String>,
    ) -> Flag {
        Flag {
            long,
            value_name: Some(value_name),
            help,
            parse,
            requires: None,
        }
    }

    pub const fn requiring(mut self, other: &'static str) -> Flag {
        self.requires = Some(other);
        self
    }
}

/// `--sweep`, which syncrep-commit and drop-many read.
pub static SWEEP: Flag = Flag::switch(
    "sweep",
    "After the recorded run, the scenario's sweep: syncrep-commit runs the \
     workload at each synchronous_commit level and reports tps per level; \
     drop-many drops N tables for each N and standby shared_buffers of \
     --sweep-tables × --sweep-standby-shared-buffers (a fresh primary and \
     standby per shared_buffers) and fits the growth on log-log",
);

/// A value taken as given.
pub fn text(s: &str) -> Result<String, String> {
    Ok(s.to_string())
}

/// A whole number in `lo..=hi`.
pub fn count_in(s: &str, lo: u64, hi: u64) -> Result<String, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n.to_string()),
        _ => Err(format!("'{s}' is not a whole number from {lo} to {hi}")),
    }
}

/// `on` or `off`.
pub fn on_off(s: &str) -> Result<String, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        v @ ("on" | "off") => Ok(v.to_string()),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

/// The scenario flags given on the command line (long name → normalised
/// value; a switch given is `true`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params(BTreeMap<String, String>);

impl Params {
    pub fn set(&mut self, flag: &str, value: impl ToString) {
        self.0.insert(flag.to_string(), value.to_string());
    }

    /// The flag's value, if given (values were checked when parsed).
    pub fn get<T: FromStr>(&self, flag: &str) -> Option<T> {
        self.0.get(flag).and_then(|v| v.parse().ok())
    }

    /// Whether a switch was given.
    pub fn on(&self, flag: &str) -> bool {
        self.0.get(flag).is_some_and(|v| v == "true")
    }

    /// The flags given, by name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_read_back_typed() {
        let mut p = Params::default();
        p.set("tables", 5);
        p.set("sweep", true);
        assert_eq!(p.get::<u32>("tables"), Some(5));
        assert_eq!(p.get::<u32>("hogs"), None);
        assert!(p.on("sweep"));
        assert!(!p.on("tables"));
        assert_eq!(p.names().collect::<Vec<_>>(), ["sweep", "tables"]);
        assert_eq!(count_in("7", 1, 10), Ok("7".into()));
        assert!(count_in("70", 1, 10).is_err());
        assert_eq!(on_off("ON"), Ok("on".into()));
    }
}
