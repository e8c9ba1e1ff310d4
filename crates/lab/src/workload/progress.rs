//! Parsers for pgbench's output: the `-P` progress lines on stderr and the
//! summary on stdout.
use std::io::BufRead;

pub use crate::recording::summaries::Progress;
use serde::{Deserialize, Serialize};

/// Parse one progress line; `None` for anything else.
pub fn parse_progress_line(line: &str) -> Option<Progress> {
    let rest = line.trim().strip_prefix("progress: ")?;
    let mut parts = rest.split(", ");
    let t = parts.next()?.strip_suffix(" s")?.parse().ok()?;
    let tps = parts.next()?.strip_suffix(" tps")?.parse().ok()?;
    let mut lat_ms = f64::NAN;
    let mut lat_stddev_ms = None;
    let mut failed = None;
    for part in parts {
        if let Some(l) = part.strip_prefix("lat ") {
            let mut words = l.split_whitespace();
            lat_ms = words.next()?.parse().ok()?;
            if words.next() == Some("ms") && words.next() == Some("stddev") {
                lat_stddev_ms = words.next().and_then(|s| s.parse().ok());
            }
        } else if let Some(f) = part.strip_suffix(" failed") {
            failed = f.trim().parse().ok();
        }
    }
    if lat_ms.is_nan() {
        return None;
    }
    Some(Progress {
        t,
        tps,
        lat_ms,
        lat_stddev_ms,
        failed,
    })
}

/// All progress lines of a stream, skipping everything else.
pub fn parse_progress(input: impl BufRead) -> Vec<Progress> {
    input
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| parse_progress_line(&l))
        .collect()
}

/// The end-of-run summary pgbench prints on stdout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub transaction_type: Option<String>,
    pub clients: Option<u32>,
    pub transactions: Option<u64>,
    pub failed: Option<u64>,
    pub latency_avg_ms: Option<f64>,
    pub latency_stddev_ms: Option<f64>,
    pub tps: Option<f64>,
    /// `-C`'s mean time to connect (pgbench 14+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_avg_ms: Option<f64>,
}

fn first_num<T: std::str::FromStr>(v: &str) -> Option<T> {
    v.split_whitespace().next().and_then(|w| w.parse().ok())
}

pub fn parse_summary(input: impl BufRead) -> Summary {
    let mut s = Summary::default();
    for line in input.lines().map_while(Result::ok) {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("transaction type: ") {
            s.transaction_type = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("number of clients: ") {
            s.clients = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("number of transactions actually processed: ") {
            // "148250" or "148250/150000" with -t
            s.transactions = v.split('/').next().and_then(|n| n.trim().parse().ok());
        } else if let Some(v) = line.strip_prefix("number of failed transactions: ") {
            s.failed = first_num(v);
        } else if let Some(v) = line.strip_prefix("latency average = ") {
            s.latency_avg_ms = first_num(v);
        } else if let Some(v) = line.strip_prefix("latency stddev = ") {
            s.latency_stddev_ms = first_num(v);
        } else if let Some(v) = line.strip_prefix("average connection time = ") {
            s.connection_avg_ms = first_num(v);
        } else if let Some(v) = line.strip_prefix("tps = ") {
            s.tps = first_num(v);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::io::BufReader<std::fs::File> {
        let p = format!(
            "{}/tests/fixtures/pgbench/{name}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../..")
        );
        std::io::BufReader::new(std::fs::File::open(p).expect("fixture"))
    }

    #[test]
    fn progress_of_a_real_select_only_run() {
        let p = parse_progress(fixture("select-only-pg15.stderr"));
        assert_eq!(p.len(), 4);
        assert_eq!(
            p[2],
            Progress {
                t: 3.0,
                tps: 37467.4,
                lat_ms: 0.027,
                lat_stddev_ms: Some(0.154),
                failed: Some(0)
            }
        );
    }

    #[test]
    fn progress_line_of_an_older_pgbench_without_failed() {
        // pgbench 13's form.
        let p =
            parse_progress_line("progress: 5.0 s, 1200.5 tps, lat 0.832 ms stddev 0.101").unwrap();
        assert_eq!(p.failed, None);
        assert_eq!(p.lat_stddev_ms, Some(0.101));
        assert!(parse_progress_line("starting vacuum...end.").is_none());
        assert!(parse_progress_line("progress: x s, 1 tps").is_none());
    }

    #[test]
    fn summary_of_real_runs() {
        let s = parse_summary(fixture("select-only-pg15.stdout"));
        assert_eq!(s.transactions, Some(148250));
        assert_eq!(s.clients, Some(1));
        assert_eq!(s.failed, Some(0));
        assert_eq!(s.tps, Some(37118.883584));
        assert_eq!(
            s.transaction_type.as_deref(),
            Some("<builtin: select only>")
        );
        let t = parse_summary(fixture("tpcb-pg15.stdout"));
        assert_eq!(t.transactions, Some(1180));
        assert_eq!(t.clients, Some(2));
        assert_eq!(t.latency_avg_ms, Some(5.072));
        assert_eq!(t.connection_avg_ms, None);
        // pgbench -C -S (a new connection per transaction, TCP).
        let c = parse_summary(fixture("select-only-connect-pg15.stdout"));
        assert_eq!(c.connection_avg_ms, Some(12.362));
        assert_eq!(c.latency_avg_ms, Some(50.2));
        assert_eq!(c.tps, Some(79.681078));
    }

    #[test]
    fn summary_of_a_failed_connection_is_empty() {
        let s = parse_summary(fixture("baddb.stdout"));
        assert_eq!(s.transactions, None);
    }
}
