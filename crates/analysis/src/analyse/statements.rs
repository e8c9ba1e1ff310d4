//! How many statements the server ran in a window: pgbench's count in the
//! lab, the server's own counters when attached.
use crate::evidence::Evidence;

#[derive(Clone, Debug, PartialEq)]
pub struct Statements {
    pub count: u64,
    /// Where the number came from, for the evidence.
    pub source: String,
    /// Recording time window (s) the count covers.
    pub window: (f64, f64),
}

impl Statements {
    /// What was counted: statements, or transactions where the server's
    /// statements were not (no pg_stat_statements), so every ratio names
    /// its true denominator.
    pub fn unit(&self) -> &'static str {
        if self.source.starts_with("pg_stat_database") {
            "transaction"
        } else {
            "statement"
        }
    }
}

pub fn statements(rec: &Evidence) -> Option<Statements> {
    if let Some(w) = &rec.workload {
        if w.statements > 0 {
            return Some(Statements {
                count: w.statements,
                source: w.statements_source.clone(),
                window: (w.t_start, w.t_end),
            });
        }
    }
    let first = rec.pgstat.first()?;
    let last = rec.pgstat.last()?;
    let own = last.own_statements.saturating_sub(first.own_statements);
    let (count, source) = match (first.statements, last.statements) {
        (Some(a), Some(b)) => (
            b.saturating_sub(a).saturating_sub(own),
            "pg_stat_statements.calls",
        ),
        _ => (
            last.transactions
                .saturating_sub(first.transactions)
                .saturating_sub(own),
            "pg_stat_database xact_commit+xact_rollback (transactions: pg_stat_statements is not installed, so statements were not counted)",
        ),
    };
    (last.t > first.t).then(|| Statements {
        count,
        source: source.to_string(),
        window: (first.t, last.t),
    })
}
