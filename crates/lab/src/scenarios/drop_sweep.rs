//! `drop-many --sweep`: after the recorded run, the drops again over several
//! table counts N and several standby shared_buffers, without collectors.
//! Each shared_buffers value gets a fresh primary + standby (same settings as
//! the recorded run, the standby's shared_buffers replaced); on it the N
//! values run in turn. Per point: client ms per DROP, its primary-only
//! baseline, and the standby's startup-process CPU per drop, read from
//! /proc/PID/schedstat (ns) of the startup process before and after.
//!
//! Then the growth is fitted (least squares on log-log): total replay CPU vs
//! N at each shared_buffers (≈ 1: a fixed cost per drop; ≈ 2: each drop
//! costs more the more there are), and replay CPU per drop vs shared_buffers
//! at each N (≈ 1 on ≤ 13: a full buffer-pool scan per drop; ≈ 0 when the
//! lookup fast path of 14+ applies). Written to [`SWEEP`].
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::drop_run::{self, Params};
use super::LabOptions;
use super::Params as Given;
use crate::collect::procfs::aggregate::Counters;
use crate::collect::procfs::clock_ticks_per_s;
use crate::interrupt;
use crate::procinfo::{self, Role};
use crate::provision::{ClusterOptions, PgInstall, Topology, TopologyOptions};
pub use crate::recording::summaries::{DropSweep, Fit, LinearFit, Point};
use crate::recording::writer::write_json_atomic;
use crate::round3;

/// `--tables N --empty-tables --one-transaction
/// --sweep-tables LIST --sweep-standby-shared-buffers LIST`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub tables: Option<u32>,
    pub empty: bool,
    pub one_transaction: bool,
    /// `--sweep`: table counts (default [`DEFAULT_TABLES`]).
    pub sweep_tables: Option<Vec<u32>>,
    /// `--sweep`: standby shared_buffers values (default
    /// [`DEFAULT_SHARED_BUFFERS`]).
    pub sweep_shared_buffers: Option<Vec<String>>,
}

impl Options {
    /// From the `lab run` flags given.
    pub fn from_params(p: &Given) -> Options {
        let text = |f: &str| p.get::<String>(f);
        Options {
            tables: p.get("tables"),
            empty: p.on("empty-tables"),
            one_transaction: p.on("one-transaction"),
            sweep_tables: text("sweep-tables").and_then(|s| parse_tables(&s).ok()),
            sweep_shared_buffers: text("sweep-standby-shared-buffers")
                .and_then(|s| parse_sizes(&s).ok()),
        }
    }
}

/// Per-point results and fits of `--sweep`.
pub const SWEEP: &str = crate::recording::files::DROP_SWEEP;
/// `--sweep-tables` when not given.
pub const DEFAULT_TABLES: &[u32] = &[50, 100, 200];
/// `--sweep-standby-shared-buffers` when not given.
pub const DEFAULT_SHARED_BUFFERS: &[&str] = &["128MB", "1GB", "4GB"];

/// Ordinary least squares: (slope, intercept, r²), unrounded; `None` with
/// fewer than two distinct x.
fn ols(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx < 1e-12 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let slope = sxy / sxx;
    let r2 = if syy > 0.0 {
        sxy * sxy / (sxx * syy)
    } else {
        1.0
    };
    Some((slope, my - slope * mx, r2))
}

/// [`ols`] rounded for the report.
pub fn linear_fit(points: &[(f64, f64)]) -> Option<LinearFit> {
    let (slope, intercept, r2) = ols(points)?;
    Some(LinearFit {
        slope: round3(slope) + 0.0,
        intercept: round3(intercept) + 0.0,
        r2: round3(r2),
    })
}

/// Median of the fits' exponents.
fn median_exponent(fits: &[Fit]) -> Option<f64> {
    let med = crate::stats::median(fits.iter().map(|f| f.exponent).collect())?;
    Some(round3(med) + 0.0)
}

/// Refit `s` from its points: the fits, their medians and the summary.
pub fn conclude(s: &mut DropSweep) {
    let (a, b) = fits(&s.points);
    s.exponent_tables = median_exponent(&a);
    s.exponent_shared_buffers = median_exponent(&b);
    let range = |f: &[Fit]| {
        let lo = f.iter().map(|f| f.exponent).fold(f64::INFINITY, f64::min);
        let hi = f
            .iter()
            .map(|f| f.exponent)
            .fold(f64::NEG_INFINITY, f64::max);
        if f.len() == 1 {
            format!("exponent {lo:.2}")
        } else {
            format!("exponents {lo:.2} to {hi:.2}")
        }
    };
    let mut parts = Vec::new();
    if let Some(e) = s.exponent_shared_buffers {
        parts.push(format!(
            "replay cost per drop is {} in the standby's shared_buffers (median exponent {e:.2}; {})",
            growth(e),
            range(&b)
        ));
    }
    let (_, per) = per_drop(&s.points);
    let gb: Vec<(f64, f64)> = s
        .points
        .iter()
        .map(|p| {
            (
                p.standby_shared_buffers_bytes as f64 / (1u64 << 30) as f64,
                per(p),
            )
        })
        .collect();
    s.per_drop_vs_gb = linear_fit(&gb);
    if let Some(l) = &s.per_drop_vs_gb {
        parts.push(format!(
            "per drop ≈ {:.2} ms {} {:.2} ms per GB of standby shared_buffers (r² {:.2})",
            l.intercept,
            if l.slope < 0.0 { "−" } else { "+" },
            l.slope.abs(),
            l.r2
        ));
    }
    if let Some(e) = s.exponent_tables {
        parts.push(format!(
            "total replay cost is {} in the number of dropped tables (median exponent {e:.2}; {})",
            growth(e),
            range(&a)
        ));
    }
    s.summary = if parts.is_empty() {
        "too few points to fit a growth".into()
    } else {
        parts.join("; ")
    };
    s.vs_tables = a;
    s.vs_shared_buffers = b;
}

/// Least-squares slope of ln y on ln x: the exponent k of y ∝ x^k. `None`
/// with fewer than two distinct x, or any x or y not > 0.
pub fn loglog_slope(points: &[(f64, f64)]) -> Option<f64> {
    if points
        .iter()
        .any(|&(x, y)| !(x > 0.0 && y > 0.0 && x.is_finite() && y.is_finite()))
    {
        return None;
    }
    let logs: Vec<(f64, f64)> = points.iter().map(|p| (p.0.ln(), p.1.ln())).collect();
    ols(&logs).map(|(slope, _, _)| slope)
}

/// An exponent in words: ≈ 0 constant, ≈ 1 linear, ≈ 2 quadratic (±0.25),
/// and what lies between.
pub fn growth(exponent: f64) -> &'static str {
    match exponent {
        e if e < -0.25 => "decreasing",
        e if e < 0.25 => "constant",
        e if e < 0.75 => "sub-linear",
        e if e < 1.25 => "linear",
        e if e < 1.75 => "between linear and quadratic",
        e if e < 2.25 => "quadratic",
        _ => "worse than quadratic",
    }
}

/// A PostgreSQL memory size (`128MB`, `1GB`, `512kB`, `16384` = 8 kB pages)
/// in bytes; units are powers of 1024 as in postgresql.conf.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" => 8192,
        "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// `--sweep-tables 50,100,200`: sorted, deduplicated, each ≥ 1.
pub fn parse_tables(s: &str) -> Result<Vec<u32>, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(n) if (1..=100_000).contains(&n) => v.push(n),
            _ => return Err(format!("'{part}' is not a table count (1–100000)")),
        }
    }
    if v.is_empty() {
        return Err("expected a comma-separated list of table counts, e.g. 50,100,200".into());
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// `--sweep-standby-shared-buffers 128MB,1GB`: sorted by size, deduplicated
/// (of two spellings of one size, the first given).
pub fn parse_sizes(s: &str) -> Result<Vec<String>, String> {
    let mut v: Vec<(u64, String)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match parse_size(part) {
            Some(b) if b >= 128 << 10 => v.push((b, part.to_string())),
            _ => {
                return Err(format!(
                    "'{part}' is not a shared_buffers size of at least 128kB (e.g. 128MB, 1GB)"
                ))
            }
        }
    }
    if v.is_empty() {
        return Err("expected a comma-separated list of sizes, e.g. 128MB,1GB,4GB".into());
    }
    // Stable: of equal sizes, the first given stays.
    v.sort_by_key(|(b, _)| *b);
    v.dedup_by_key(|(b, _)| *b);
    Ok(v.into_iter().map(|(_, s)| s).collect())
}

/// The per-drop cost the fits use: startup CPU when every point has some,
/// else the client-side replay ms. True when it is startup CPU.
fn per_drop(points: &[Point]) -> (bool, fn(&Point) -> f64) {
    if points.iter().all(|p| p.startup_cpu_ms_per_drop > 0.0) {
        (true, |p| p.startup_cpu_ms_per_drop)
    } else {
        (false, |p| p.replay_ms_per_drop)
    }
}

/// Fit both growths over `points` (see [`per_drop`]).
pub fn fits(points: &[Point]) -> (Vec<Fit>, Vec<Fit>) {
    let (by_cpu, per) = per_drop(points);
    let (y_total, y_per) = if by_cpu {
        ("startup CPU ms (total)", "startup CPU ms per drop")
    } else {
        ("client replay ms (total)", "client replay ms per drop")
    };
    let fit = |fixed: String, x: &str, y: &str, xy: Vec<(f64, f64)>| {
        loglog_slope(&xy).map(|e| Fit {
            fixed,
            x: x.into(),
            y: y.into(),
            points: xy.len(),
            // + 0.0: no "-0.00" for a flat fit.
            exponent: round3(e) + 0.0,
            growth: growth(e).into(),
        })
    };
    let mut sbs: Vec<(u64, &str)> = points
        .iter()
        .map(|p| {
            (
                p.standby_shared_buffers_bytes,
                p.standby_shared_buffers.as_str(),
            )
        })
        .collect();
    sbs.sort();
    sbs.dedup();
    let vs_tables = sbs
        .iter()
        .filter_map(|&(b, name)| {
            let xy = points
                .iter()
                .filter(|p| p.standby_shared_buffers_bytes == b)
                .map(|p| (f64::from(p.tables), per(p) * f64::from(p.tables)))
                .collect();
            fit(
                format!("standby_shared_buffers={name}"),
                "tables",
                y_total,
                xy,
            )
        })
        .collect();
    let mut ns: Vec<u32> = points.iter().map(|p| p.tables).collect();
    ns.sort_unstable();
    ns.dedup();
    let vs_sb = ns
        .iter()
        .filter_map(|&n| {
            let xy = points
                .iter()
                .filter(|p| p.tables == n)
                .map(|p| (p.standby_shared_buffers_bytes as f64, per(p)))
                .collect();
            fit(
                format!("tables={n}"),
                "standby shared_buffers (bytes)",
                y_per,
                xy,
            )
        })
        .collect();
    (vs_tables, vs_sb)
}

/// CPU time of a process so far, ms (the procfs collector's counters:
/// schedstat's ns, else stat's ticks).
fn cpu_ms(pid: u32) -> Option<f64> {
    Counters::read(pid, clock_ticks_per_s()).map(|c| c.cpu_ns as f64 / 1e6)
}

/// The startup process among a standby postmaster's children.
fn startup_pid(postmaster: u32) -> Option<u32> {
    procinfo::descendants(postmaster).into_iter().find(|&pid| {
        procinfo::read_title(pid).is_some_and(|t| procinfo::classify_title(&t) == Role::Startup)
    })
}

/// The sweep's table counts and sizes: the options', else the defaults.
pub fn lists(opts: &LabOptions) -> (Vec<u32>, Vec<String>) {
    let o = &Options::from_params(&opts.params);
    (
        o.sweep_tables
            .clone()
            .unwrap_or_else(|| DEFAULT_TABLES.to_vec()),
        o.sweep_shared_buffers.clone().unwrap_or_else(|| {
            DEFAULT_SHARED_BUFFERS
                .iter()
                .map(|s| s.to_string())
                .collect()
        }),
    )
}

/// Run every point and write [`SWEEP`] into `dir` (after each point, so an
/// interrupted sweep keeps what it measured).
pub fn sweep(
    opts: &LabOptions,
    install: &PgInstall,
    dir: &Path,
    status: &dyn Fn(&str),
) -> Result<DropSweep> {
    let (tables, sizes) = lists(opts);
    let o = &Options::from_params(&opts.params);
    let mut out = DropSweep {
        empty: o.empty,
        one_transaction: o.one_transaction,
        tables: tables.clone(),
        standby_shared_buffers: sizes.clone(),
        ..Default::default()
    };
    let rep = &opts.replication;
    for sb in &sizes {
        if interrupt::requested() {
            break;
        }
        let bytes = parse_size(sb).with_context(|| format!("standby shared_buffers {sb}"))?;
        let mut standby_settings: Vec<(String, String)> = rep
            .standby_set
            .iter()
            .filter(|(k, _)| k != "shared_buffers")
            .cloned()
            .collect();
        standby_settings.push(("shared_buffers".into(), sb.clone()));
        status(&format!(
            "sweep: standby shared_buffers={sb}: starting a primary and {} standby(s)",
            rep.standbys
        ));
        let mut topo = Topology::start(
            install,
            &TopologyOptions {
                primary: ClusterOptions {
                    settings: opts.set.clone(),
                    log_checkpoints: false,
                },
                standbys: rep.standbys.max(1),
                sync: rep.sync,
                standby_settings,
                primary_template: None,
            },
            status,
        )?;
        let res = sweep_on(&topo, &tables, sb, bytes, o, &mut out, dir, status);
        let stopped = topo.stop();
        res?;
        stopped.context("stopping the sweep's cluster(s)")?;
    }
    Ok(out)
}

// The sweep's state, passed through.
#[allow(clippy::too_many_arguments)]
fn sweep_on(
    topo: &Topology,
    tables: &[u32],
    sb: &str,
    bytes: u64,
    o: &Options,
    out: &mut DropSweep,
    dir: &Path,
    status: &dyn Fn(&str),
) -> Result<()> {
    let dsn = topo.primary().conninfo("postgres");
    let standby = &topo.standbys()[0].cluster;
    // The same startup process replays every N of this topology.
    let Some(pid) = startup_pid(standby.postmaster_pid()) else {
        bail!("no startup process under the standby's postmaster");
    };
    for &n in tables {
        if interrupt::requested() {
            break;
        }
        let p = Params::new(n, o.empty, o.one_transaction);
        drop_run::prepare(&dsn, &p, &|_| {})?;
        topo.wait_caught_up()?;
        status(&format!("sweep: {n} tables, standby shared_buffers={sb}"));
        let cpu0 = cpu_ms(pid);
        let ran = drop_run::run_blocking(&dsn, &p)?;
        let cpu1 = cpu_ms(pid);
        let s = drop_run::summarise(&p, &ran.level, &ran.runs, 0.0, ran.elapsed_s);
        let all = (s.drops + s.baseline_drops).max(1) as f64;
        let cpu_per = match (cpu0, cpu1) {
            (Some(a), Some(b)) => (b - a).max(0.0) / all,
            _ => 0.0,
        };
        out.synchronous_commit = ran.level.clone();
        out.points.push(Point {
            tables: n,
            standby_shared_buffers: sb.to_string(),
            standby_shared_buffers_bytes: bytes,
            drops: s.drops,
            baseline_drops: s.baseline_drops,
            ms_per_drop: s.ms_per_drop,
            ms_per_drop_median: s.ms_per_drop_median,
            baseline_ms_per_drop: s.baseline_ms_per_drop,
            replay_ms_per_drop: round3(s.replay_ms_per_drop()),
            startup_cpu_ms_per_drop: round3(cpu_per),
            startup_cpu_ms_total: round3(cpu_per * f64::from(n)),
            replay_lag: drop_run::summarise_lag(&ran.lag),
        });
        conclude(out);
        write_json_atomic(&dir.join(SWEEP), out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_fit_finds_slope_and_fixed_cost() {
        let l = linear_fit(&[(0.125, 0.5), (1.0, 1.6), (4.0, 5.5)]).unwrap();
        assert!((l.slope - 1.29).abs() < 0.02, "{l:?}");
        assert!((l.intercept - 0.33).abs() < 0.05, "{l:?}");
        assert!(l.r2 > 0.99, "{l:?}");
        let flat = linear_fit(&[(0.125, 0.3), (1.0, 0.3), (4.0, 0.3)]).unwrap();
        assert_eq!((flat.slope, flat.intercept), (0.0, 0.3));
        assert_eq!(linear_fit(&[(1.0, 2.0), (1.0, 3.0)]), None);
        assert_eq!(linear_fit(&[(1.0, 2.0)]), None);
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn slopes_of_power_laws() {
        let pts = |k: f64| -> Vec<(f64, f64)> {
            [10.0, 20.0, 40.0, 80.0]
                .iter()
                .map(|&x: &f64| (x, 3.0 * x.powf(k)))
                .collect()
        };
        assert!(close(loglog_slope(&pts(0.0)).unwrap(), 0.0));
        assert!(close(loglog_slope(&pts(1.0)).unwrap(), 1.0));
        assert!(close(loglog_slope(&pts(2.0)).unwrap(), 2.0));
        // Two points: the exact slope.
        let e = loglog_slope(&[(128.0, 0.5), (1024.0, 4.0)]).unwrap();
        assert!(close(e, 1.0), "{e}");
        // Noisy linear data: least squares, not the end points.
        let e = loglog_slope(&[(1.0, 1.0), (2.0, 2.4), (4.0, 3.6), (8.0, 8.0)]).unwrap();
        assert!((0.9..1.1).contains(&e), "{e}");
        assert!(!close(e, 1.0));
    }

    #[test]
    fn no_slope_without_spread_or_with_non_positive_values() {
        assert_eq!(loglog_slope(&[]), None);
        assert_eq!(loglog_slope(&[(1.0, 2.0)]), None);
        assert_eq!(loglog_slope(&[(5.0, 1.0), (5.0, 2.0)]), None);
        assert_eq!(loglog_slope(&[(1.0, 0.0), (2.0, 2.0)]), None);
        assert_eq!(loglog_slope(&[(-1.0, 1.0), (2.0, 2.0)]), None);
    }

    #[test]
    fn growth_in_words() {
        assert_eq!(growth(0.05), "constant");
        assert_eq!(growth(-0.1), "constant");
        assert_eq!(growth(-0.6), "decreasing");
        assert_eq!(growth(0.5), "sub-linear");
        assert_eq!(growth(0.93), "linear");
        assert_eq!(growth(1.5), "between linear and quadratic");
        assert_eq!(growth(2.1), "quadratic");
        assert_eq!(growth(3.0), "worse than quadratic");
    }

    #[test]
    fn sizes_and_lists() {
        assert_eq!(parse_size("128MB"), Some(128 << 20));
        assert_eq!(parse_size("4GB"), Some(4 << 30));
        assert_eq!(parse_size("512kB"), Some(512 << 10));
        assert_eq!(parse_size("16384"), Some(16384 * 8192));
        assert_eq!(parse_size("1 GB"), Some(1 << 30));
        assert_eq!(parse_size("1gb"), None);
        assert_eq!(parse_size("GB"), None);
        assert_eq!(parse_tables("200,50, 100,50"), Ok(vec![50, 100, 200]));
        assert!(parse_tables("10,x").is_err());
        assert!(parse_tables("0").is_err());
        assert!(parse_tables("").is_err());
        assert_eq!(
            parse_sizes("4GB,128MB,1GB,1024MB"),
            Ok(vec!["128MB".to_string(), "1GB".into(), "4GB".into()])
        );
        assert!(parse_sizes("1XB").is_err());
        assert!(parse_sizes("64kB").is_err());
    }

    fn point(tables: u32, sb: &str, cpu_per: f64) -> Point {
        Point {
            tables,
            standby_shared_buffers: sb.into(),
            standby_shared_buffers_bytes: parse_size(sb).unwrap(),
            drops: u64::from(tables),
            baseline_drops: 5,
            ms_per_drop: cpu_per + 0.3,
            ms_per_drop_median: cpu_per + 0.3,
            baseline_ms_per_drop: 0.3,
            replay_ms_per_drop: cpu_per,
            startup_cpu_ms_per_drop: cpu_per,
            startup_cpu_ms_total: cpu_per * f64::from(tables),
            replay_lag: None,
        }
    }

    /// A ≤ 13 standby: per-drop cost ∝ shared_buffers, independent of N.
    fn scan_sweep() -> DropSweep {
        let mut points = Vec::new();
        for n in [20, 60] {
            for (sb, ms) in [("128MB", 0.5), ("2GB", 8.0)] {
                points.push(point(n, sb, ms));
            }
        }
        let mut s = DropSweep {
            empty: false,
            one_transaction: false,
            synchronous_commit: "remote_apply".into(),
            tables: vec![20, 60],
            standby_shared_buffers: vec!["128MB".into(), "2GB".into()],
            points,
            ..Default::default()
        };
        conclude(&mut s);
        s
    }

    #[test]
    fn fits_per_fixed_parameter() {
        let s = scan_sweep();
        assert_eq!(s.vs_tables.len(), 2);
        for f in &s.vs_tables {
            assert_eq!((f.exponent, f.growth.as_str()), (1.0, "linear"), "{f:?}");
        }
        assert_eq!(s.vs_tables[0].fixed, "standby_shared_buffers=128MB");
        assert_eq!(
            (s.exponent_tables, s.exponent_shared_buffers),
            (Some(1.0), Some(1.0))
        );
        assert_eq!(
            s.summary,
            "replay cost per drop is linear in the standby's shared_buffers (median exponent 1.00; \
             exponents 1.00 to 1.00); per drop ≈ 0.00 ms + 4.00 ms per GB of standby shared_buffers \
             (r² 1.00); total replay cost is linear in the number of dropped tables \
             (median exponent 1.00; exponents 1.00 to 1.00)"
        );
        let l = s.per_drop_vs_gb.as_ref().unwrap();
        assert_eq!((l.slope, l.intercept, l.r2), (4.0, 0.0, 1.0));
        assert_eq!(s.vs_shared_buffers.len(), 2);
        for f in &s.vs_shared_buffers {
            assert_eq!((f.exponent, f.growth.as_str()), (1.0, "linear"), "{f:?}");
            assert_eq!(f.y, "startup CPU ms per drop");
        }
        // Without startup CPU the client-side replay ms are fitted.
        let mut pts = s.points.clone();
        pts[0].startup_cpu_ms_per_drop = 0.0;
        let (_, b) = fits(&pts);
        assert_eq!(b[0].y, "client replay ms per drop");
        // One shared_buffers value: no fit against it.
        let (a, b) = fits(&[point(20, "1GB", 1.0), point(60, "1GB", 1.0)]);
        assert_eq!((a.len(), b.len()), (1, 0));
    }

    #[test]
    fn medians_and_a_constant_cost() {
        let f = |e: f64| Fit {
            fixed: String::new(),
            x: String::new(),
            y: String::new(),
            points: 2,
            exponent: e,
            growth: growth(e).into(),
        };
        assert_eq!(median_exponent(&[]), None);
        assert_eq!(median_exponent(&[f(0.9), f(0.1), f(0.5)]), Some(0.5));
        assert_eq!(median_exponent(&[f(0.9), f(0.1)]), Some(0.5));
        let flat = median_exponent(&[f(-0.0001)]).unwrap();
        assert!(flat == 0.0 && flat.is_sign_positive(), "{flat}");
        // 14+ with one-row tables: the same cost at every shared_buffers.
        let mut s = DropSweep {
            points: vec![
                point(50, "128MB", 0.3),
                point(50, "4GB", 0.3),
                point(200, "128MB", 0.3),
                point(200, "4GB", 0.3),
            ],
            ..Default::default()
        };
        conclude(&mut s);
        assert_eq!(s.exponent_shared_buffers, Some(0.0));
        assert!(
            s.summary.starts_with("replay cost per drop is constant"),
            "{}",
            s.summary
        );
        let mut empty = DropSweep::default();
        conclude(&mut empty);
        assert_eq!(empty.summary, "too few points to fit a growth");
    }

    #[test]
    fn renders_the_table_and_the_fits() {
        let mut o = String::new();
        crate::report::sections::lab::render_drop_sweep(&scan_sweep(), &mut o);
        assert!(
            o.contains("one-row tables, one DROP per transaction"),
            "{o}"
        );
        assert!(
            o.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["60", "2GB", "8.300", "0.300", "8.000", "8.000", "480.0", "-"]),
            "{o}"
        );
        assert!(
            o.contains(
                "startup CPU ms per drop vs standby shared_buffers (bytes) at tables=20: exponent 1.00 (linear, 2 points)"
            ),
            "{o}"
        );
        // Deterministic: the same sweep renders the same text.
        let mut again = String::new();
        crate::report::sections::lab::render_drop_sweep(&scan_sweep(), &mut again);
        assert_eq!(o, again);
    }
}
