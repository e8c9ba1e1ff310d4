//! How many statements the server ran in a window: pgbench's count in the
//! lab, the server's own counters when attached.
use crate::evidence::Evidence;
use crate::recording::reader::PgstatSample;

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
            "pg_stat_statements.calls".to_string(),
        ),
        _ => {
            let (n, source) = client_transactions(first, last);
            (
                n,
                format!("{source} (transactions: pg_stat_statements is not installed, so statements were not counted)"),
            )
        }
    };
    (last.t > first.t).then_some(Statements {
        count,
        source,
        window: (first.t, last.t),
    })
}

/// The clients' transactions between two samples of pg_stat_database, and
/// what the count is: less pgbelow's own and the start-up transactions of
/// connections and parallel workers
/// ([`PgstatSample::startup_commits_since`]), which would make a
/// per-transaction figure of a connection-per-transaction or parallel
/// workload a half or a third of the truth; where the server did not count
/// them apart the text says the count includes them.
pub fn client_transactions(a: &PgstatSample, b: &PgstatSample) -> (u64, String) {
    let delta = |x: Option<u64>, y: Option<u64>| Some(y?.saturating_sub(x?));
    let n = b
        .transactions
        .saturating_sub(a.transactions)
        .saturating_sub(b.own_statements.saturating_sub(a.own_statements))
        .saturating_sub(b.startup_commits_since(a));
    let mut less = vec!["pgbelow's own".to_string()];
    let mut with = Vec::new();
    match delta(a.sessions, b.sessions) {
        Some(s) => less.push(format!("{s} connections' start-up transactions")),
        None => with.push("each new connection's start-up commit (counted apart from 14)"),
    }
    match delta(a.parallel_workers, b.parallel_workers) {
        Some(w) => less.push(format!("{w} parallel workers' two each")),
        None => with.push("two commits per parallel worker (counted apart from 18)"),
    }
    let mut source = format!(
        "pg_stat_database xact_commit+xact_rollback less {}",
        less.join(", ")
    );
    if !with.is_empty() {
        source.push_str(&format!("; includes {}", with.join(" and ")));
    }
    (n, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(
        transactions: u64,
        own: u64,
        sessions: Option<u64>,
        workers: Option<u64>,
    ) -> PgstatSample {
        PgstatSample {
            transactions,
            own_statements: own,
            sessions,
            parallel_workers: workers,
            ..Default::default()
        }
    }

    // The counts of a real run on 18: `pgbench -C -S -t 100` beside 100
    // counts with two parallel workers each (xact_commit +715, sessions
    // +101 with psql's, parallel_workers_launched +200), pgbelow's 10 own.
    #[test]
    fn connections_and_parallel_workers_start_ups_are_no_clients_transactions() {
        let a = sample(1_000, 4, Some(7), Some(0));
        let b = sample(1_715, 14, Some(108), Some(200));
        let (n, source) = client_transactions(&a, &b);
        assert_eq!(n, 715 - 10 - 101 - 400, "{source}");
        assert!(source.contains("101 connections'"), "{source}");
        assert!(source.contains("200 parallel workers'"), "{source}");
        assert!(!source.contains("includes"), "{source}");
    }

    #[test]
    fn a_server_that_does_not_count_them_apart_is_said_to_include_them() {
        // 13: neither counter; 15: sessions only.
        let (n, source) =
            client_transactions(&sample(10, 0, None, None), &sample(30, 2, None, None));
        assert_eq!(n, 18);
        assert!(
            source.contains("includes each new connection's start-up commit"),
            "{source}"
        );
        assert!(
            source.contains("and two commits per parallel worker"),
            "{source}"
        );
        let (n, source) =
            client_transactions(&sample(10, 0, Some(1), None), &sample(30, 2, Some(5), None));
        assert_eq!(n, 14);
        assert!(source.contains("4 connections'"), "{source}");
        assert!(
            source.ends_with("includes two commits per parallel worker (counted apart from 18)"),
            "{source}"
        );
    }
}
