//! Time series every recording can have: the server's own throughput from
//! its counters (lab and attach alike) — commits and rollbacks, in total and
//! per database, and with pg_stat_statements the statements and their mean
//! execution time — and pgbench's progress as one more source when the lab
//! ran it. pgbelow's own read-only transactions and statements are
//! subtracted from every server series.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Evidence;
use crate::recording::reader::PgstatSample;

/// Fewer server samples than this make no series (one rate needs two).
const MIN_SERVER_POINTS: usize = 3;

/// A per-second series: `value` over the interval `(t - dt, t]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub t: f64,
    pub dt: f64,
    pub value: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Where the numbers come from, for the evidence.
    pub source: String,
    pub unit: String,
    pub points: Vec<Point>,
}

impl Series {
    pub fn values(&self) -> Vec<f64> {
        self.points.iter().map(|p| p.value).collect()
    }
}

/// Transactions per second, from the best source the recording has.
pub type Throughput = Series;

/// Every per-second series of a recording; a series the recording cannot
/// give is absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// What throughput rules judge: [`Evidence::throughput`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Series>,
    /// Commits per second, all databases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commits: Option<Series>,
    /// Rollbacks per second, all databases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollbacks: Option<Series>,
    /// Commits per second of each database.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_database: BTreeMap<String, Series>,
    /// Statements per second (pg_stat_statements calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statements: Option<Series>,
    /// Mean execution time of the interval's statements, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_exec_ms: Option<Series>,
    /// pgbench's own per-second tps (lab).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgbench_tps: Option<Series>,
}

impl Timeline {
    pub fn is_empty(&self) -> bool {
        *self == Timeline::default()
    }
}

/// Consecutive server samples with a positive interval: the pairs rates are
/// taken over.
/// Intervals shorter than this are merged into the next one (or dropped at
/// the end): a rate over a 0.44 s or 0.001 s remainder is a spike, not a
/// second of the workload (a "max 1175 tps" from a 0.44 s last interval).
const MIN_INTERVAL_S: f64 = 0.5;

fn intervals(samples: &[PgstatSample]) -> impl Iterator<Item = (&PgstatSample, &PgstatSample)> {
    let mut out = Vec::new();
    let mut from: Option<&PgstatSample> = None;
    for s in samples {
        match from {
            None => from = Some(s),
            Some(a) if s.t - a.t >= MIN_INTERVAL_S => {
                out.push((a, s));
                from = Some(s);
            }
            Some(_) => {}
        }
    }
    out.into_iter()
}

fn point(b: &PgstatSample, dt: f64, value: f64) -> Point {
    Point {
        t: b.t,
        dt: crate::round3(dt),
        value: crate::round3(value),
    }
}

/// `per_interval` over each pair of samples, a point where it gives a value
/// (`None` where the samples lack the counters); no series with fewer than
/// [`MIN_SERVER_POINTS`] samples or without a single point.
fn server_series(
    samples: &[PgstatSample],
    source: &str,
    unit: &str,
    per_interval: impl Fn(&PgstatSample, &PgstatSample, f64) -> Option<f64>,
) -> Option<Series> {
    if samples.len() < MIN_SERVER_POINTS {
        return None;
    }
    let points: Vec<Point> = intervals(samples)
        .filter_map(|(a, b)| {
            let dt = b.t - a.t;
            per_interval(a, b, dt).map(|v| point(b, dt, v))
        })
        .collect();
    (!points.is_empty()).then(|| Series {
        source: source.into(),
        unit: unit.into(),
        points,
    })
}

/// A per-second series of counts less what is not the clients' (`net`
/// gives each interval's raw count and what to take out of it). What is
/// taken out does not reach the counters in the same second as what it
/// takes out of: pgbelow's own statements are counted as they run and
/// their commits reported up to a second later, a parallel worker's
/// commits at its exit and the leader's count of workers when it reports.
/// Clipping each second at 0 would keep the early excess and drop the
/// late correction (a run of 40 parallel counts summed to 174 over 52
/// client transactions), so each second's count is the running total's
/// lowest value from then on, less the one before: the series sums to the
/// window's count and no second holds commits a later one takes back.
fn server_net_series(
    samples: &[PgstatSample],
    source: &str,
    unit: &str,
    net: impl Fn(&PgstatSample, &PgstatSample) -> Option<(u64, u64)>,
) -> Option<Series> {
    if samples.len() < MIN_SERVER_POINTS {
        return None;
    }
    let mut running = 0i64;
    let mut at: Vec<(&PgstatSample, f64, i64)> = Vec::new();
    for (a, b) in intervals(samples) {
        if let Some((raw, less)) = net(a, b) {
            running += raw as i64 - less as i64;
            at.push((b, b.t - a.t, running));
        }
    }
    // The lowest running total from each interval on.
    let mut settled = vec![0i64; at.len()];
    let mut low = i64::MAX;
    for (i, &(_, _, c)) in at.iter().enumerate().rev() {
        low = low.min(c);
        settled[i] = low;
    }
    let mut before = settled.first().map_or(0, |&f| f.min(0));
    let points: Vec<Point> = at
        .iter()
        .zip(&settled)
        .map(|(&(b, dt, _), &now)| {
            let n = now - before;
            before = now;
            point(b, dt, n as f64 / dt)
        })
        .collect();
    (!points.is_empty()).then(|| Series {
        source: source.into(),
        unit: unit.into(),
        points,
    })
}

/// pgbelow's own statements (each its own read-only transaction) in the interval.
fn own(a: &PgstatSample, b: &PgstatSample) -> u64 {
    b.own_statements.saturating_sub(a.own_statements)
}

fn delta(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(b?.saturating_sub(a?))
}

/// What the series' sources add when the server's counters took
/// [`PgstatSample::startup_commits_since`] out.
fn not_clients_source(samples: &[PgstatSample]) -> &'static str {
    match samples.last() {
        Some(s) if s.parallel_workers.is_some() => {
            ", less connections' start-up and parallel workers' transactions"
        }
        Some(s) if s.sessions.is_some() => ", less connections' start-up transactions",
        _ => "",
    }
}

impl Evidence {
    /// Commits + rollbacks per second from `pg_stat_database` (all
    /// databases, pgbelow's own read-only transactions subtracted): what
    /// any server yields, with or without pgbench.
    pub fn server_throughput(&self) -> Option<Series> {
        // Every interval gives a point here: an empty series stays a series
        // (and `throughput` then falls back to pgbench).
        if self.pgstat.len() < MIN_SERVER_POINTS {
            return None;
        }
        let source = format!(
            "pg_stat_database xact_commit + xact_rollback, all databases{}, 1 Hz",
            not_clients_source(&self.pgstat)
        );
        let series = server_net_series(&self.pgstat, &source, "tps", |a, b| {
            Some((
                b.transactions.saturating_sub(a.transactions),
                own(a, b) + b.startup_commits_since(a),
            ))
        });
        Some(series.unwrap_or(Series {
            source,
            unit: "tps".into(),
            points: Vec::new(),
        }))
    }

    /// Commits per second, all databases, pgbelow's own subtracted.
    pub fn server_commits(&self) -> Option<Series> {
        server_net_series(
            &self.pgstat,
            &format!(
                "pg_stat_database xact_commit, all databases{}, 1 Hz",
                not_clients_source(&self.pgstat)
            ),
            "commits/s",
            |a, b| {
                Some((
                    delta(a.commits, b.commits)?,
                    own(a, b) + b.startup_commits_since(a),
                ))
            },
        )
    }

    /// Rollbacks per second, all databases (pgbelow's own never roll back).
    pub fn server_rollbacks(&self) -> Option<Series> {
        server_series(
            &self.pgstat,
            "pg_stat_database xact_rollback, all databases, 1 Hz",
            "rollbacks/s",
            |a, b, dt| Some(delta(a.rollbacks, b.rollbacks)? as f64 / dt),
        )
    }

    /// The database pgbelow's own transactions count in, when recorded.
    fn observer_database(&self) -> Option<&str> {
        self.manifest
            .facts
            .get(crate::recording::schema::pgstat::FACT)?
            .get("database")?
            .as_str()
    }

    /// Commits per second of each database seen in two consecutive samples
    /// (pgbelow's own subtracted from the database it is connected to).
    pub fn database_commits(&self) -> BTreeMap<String, Series> {
        let mut names: Vec<&String> = self
            .pgstat
            .iter()
            .flat_map(|s| s.by_database.keys())
            .collect();
        names.sort();
        names.dedup();
        let observer = self.observer_database();
        names
            .into_iter()
            .filter_map(|db| {
                let mine = observer == Some(db.as_str());
                let s = server_net_series(
                    &self.pgstat,
                    &format!(
                        "pg_stat_database xact_commit of {db}{}{}, 1 Hz",
                        not_clients_source(&self.pgstat),
                        if mine {
                            ", pgbelow's own subtracted"
                        } else {
                            ""
                        }
                    ),
                    "commits/s",
                    |a, b| {
                        let (x, y) = (a.by_database.get(db)?, b.by_database.get(db)?);
                        let own = if mine { own(a, b) } else { 0 };
                        Some((
                            y.commits.saturating_sub(x.commits),
                            own + y.startup_commits_since(x),
                        ))
                    },
                )?;
                Some((db.clone(), s))
            })
            .collect()
    }

    /// Statements per second from pg_stat_statements' calls, pgbelow's own
    /// subtracted (as the per-statement rules count them).
    pub fn server_statements(&self) -> Option<Series> {
        server_series(
            &self.pgstat,
            "pg_stat_statements calls, 1 Hz",
            "statements/s",
            |a, b, dt| {
                let n = delta(a.statements, b.statements)?.saturating_sub(own(a, b));
                Some(n as f64 / dt)
            },
        )
    }

    /// Mean execution time (ms) of the statements that finished in each
    /// interval: Δ total_exec_time / Δ calls of pg_stat_statements. pgbelow's
    /// own statements are left out when the recording identified them
    /// (`own_calls`, `own_exec_time_ms`); in older recordings they are in
    /// both sums. No point for an interval without statements.
    pub fn server_mean_exec_ms(&self) -> Option<Series> {
        let exact = self.pgstat.iter().all(|s| s.own_calls.is_some());
        server_series(
            &self.pgstat,
            if exact {
                "pg_stat_statements Δ total_exec_time / Δ calls, pgbelow's own statements left out, 1 Hz"
            } else {
                "pg_stat_statements Δ total_exec_time / Δ calls, pgbelow's own statements included, 1 Hz"
            },
            "ms",
            |a, b, _| {
                let mut calls = delta(a.statements, b.statements)?;
                let mut ms = b.exec_time_ms? - a.exec_time_ms?;
                if let (Some(c0), Some(c1), Some(m0), Some(m1)) = (
                    a.own_calls,
                    b.own_calls,
                    a.own_exec_time_ms,
                    b.own_exec_time_ms,
                ) {
                    calls = calls.saturating_sub(c1.saturating_sub(c0));
                    ms -= m1 - m0;
                }
                (calls > 0).then(|| ms.max(0.0) / calls as f64)
            },
        )
    }

    /// pgbench's `-P 1` progress (lab runs only).
    pub fn pgbench_throughput(&self) -> Option<Series> {
        (!self.progress.is_empty()).then(|| Series {
            source: "pgbench progress (-P 1)".into(),
            unit: "tps".into(),
            points: self
                .progress
                .iter()
                .map(|p| Point {
                    t: p.t,
                    dt: 1.0,
                    value: p.tps,
                })
                .collect(),
        })
    }

    /// The throughput rules judge: the server's own series, which every
    /// recording with a connection has; pgbench's progress when there is
    /// no server series (a recording without the pgstat collector).
    pub fn throughput(&self) -> Option<Throughput> {
        self.server_throughput()
            .filter(|s| !s.points.is_empty())
            .or_else(|| self.pgbench_throughput())
    }

    /// Every series of the recording.
    pub fn timeline(&self) -> Timeline {
        Timeline {
            throughput: self.throughput(),
            commits: self.server_commits(),
            rollbacks: self.server_rollbacks(),
            by_database: self.database_commits(),
            statements: self.server_statements(),
            mean_exec_ms: self.server_mean_exec_ms(),
            pgbench_tps: self.pgbench_throughput(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::evidence::fixture;

    fn total(s: &super::Series) -> f64 {
        s.points.iter().map(|p| p.value * p.dt).sum()
    }

    #[test]
    fn a_short_last_interval_is_no_spike() {
        // The real recording with a 0.44 s remainder appended (its last
        // sample's counters, 500 commits later): a rate over it would be a
        // spike; it is dropped, and every interval lasts ≥ 0.5 s.
        let mut rec = fixture("pg15-attach-counters-checkpoint");
        let mut last = rec.pgstat.last().unwrap().clone();
        last.t += 0.44;
        last.transactions += 500;
        rec.pgstat.push(last);
        let thr = rec.timeline().throughput.unwrap();
        assert!(thr.points.iter().all(|p| p.dt >= 0.5), "{:?}", thr.points);
        let max = thr.points.iter().map(|p| p.value).fold(0.0, f64::max);
        assert!(
            max < 1136.0,
            "a spike of {max} tps from 500 commits in 0.44 s"
        );
    }

    /// A real attach recording of PostgreSQL 15 with pg_stat_statements
    /// under pgbench's tpcb-like load (see evidence::checkpoints' tests).
    #[test]
    fn server_series_of_a_real_recording() {
        let rec = fixture("pg15-attach-counters-checkpoint");
        let tl = rec.timeline();
        let thr = tl.throughput.as_ref().unwrap();
        assert!(thr.source.starts_with("pg_stat_database"), "{thr:?}");
        assert_eq!(Some(thr), rec.server_throughput().as_ref());
        let commits = tl.commits.as_ref().unwrap();
        let rollbacks = tl.rollbacks.as_ref().unwrap();
        assert_eq!(total(rollbacks), 0.0);
        // commits + rollbacks are the transactions, interval by interval.
        for ((t, c), r) in thr
            .points
            .iter()
            .zip(&commits.points)
            .zip(&rollbacks.points)
        {
            assert_eq!(t.t, c.t);
            assert!(
                (t.value - c.value - r.value).abs() < 0.01,
                "{t:?} {c:?} {r:?}"
            );
        }
        // One database besides the templates: its commits are all of them.
        assert_eq!(tl.by_database.keys().collect::<Vec<_>>(), ["postgres"]);
        let db = &tl.by_database["postgres"];
        assert!(db.source.contains("pgbelow's own subtracted"), "{db:?}");
        assert!(
            (total(db) - total(commits)).abs() < 0.05,
            "{} vs {}",
            total(db),
            total(commits)
        );
        // pgbench's tpcb-like transaction is 7 statements (BEGIN, 3
        // UPDATEs, SELECT, INSERT, END): pg_stat_statements' calls and
        // pg_stat_database's commits agree on it.
        let stmts = tl.statements.as_ref().unwrap();
        let ratio = total(stmts) / total(commits);
        assert!(
            (ratio - 7.0).abs() < 0.05,
            "{} statements for {} commits: {ratio} a transaction",
            total(stmts),
            total(commits)
        );
        let mean = tl.mean_exec_ms.as_ref().unwrap();
        assert_eq!(mean.unit, "ms");
        assert!(mean.source.contains("own statements left out"), "{mean:?}");
        // Only intervals with statements, each a plausible mean.
        assert!(mean.points.len() >= 8, "{mean:?}");
        assert!(
            mean.points.iter().all(|p| p.value > 0.0 && p.value < 50.0),
            "{mean:?}"
        );
        assert!(tl.pgbench_tps.is_none());
        // After pgbench ended only pgbelow ran: nothing left once its own
        // are subtracted.
        let tail: Vec<f64> = commits
            .points
            .iter()
            .filter(|p| p.t > 10.0)
            .map(|p| p.value)
            .collect();
        assert!(tail.iter().all(|v| *v <= 1.0), "{tail:?}");
    }

    /// Recordings from before the new fields: the series they can give.
    #[test]
    fn older_recordings() {
        let tl = fixture("pg13-select-only-timeout-all").timeline();
        assert!(tl
            .throughput
            .unwrap()
            .source
            .starts_with("pg_stat_database"));
        assert!(tl.pgbench_tps.is_some());
        assert!(tl.commits.is_none() && tl.rollbacks.is_none() && tl.by_database.is_empty());
        assert!(tl.statements.is_none() && tl.mean_exec_ms.is_none());
        // No pgstat collector: pgbench's progress is the throughput.
        let tl = fixture("pg15-checkpoint-stall").timeline();
        assert_eq!(tl.throughput, tl.pgbench_tps);
        assert!(tl.throughput.is_some());
        assert!(fixture("pg13-drop-many-1row-1g").timeline().is_empty());
    }
}
