//! The timeline's panels, part of the view model: per-second series from
//! the evidence, each panel on one x axis (recording seconds) with its series aligned on it, as the
//! page's script hands them to uPlot. A panel whose data were not recorded
//! is absent; the page says "not recorded" for it.
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::evidence::{Evidence, Series};
use crate::report::Report;
use crate::role::Role;
use crate::round3;

/// Every panel the page can draw, in page order: (data-chart name, title).
pub const PANELS: &[(&str, &str)] = &[
    ("throughput", "Throughput"),
    ("latency", "Latency"),
    ("states", "Process states (seconds per second)"),
    ("waits", "Wait events by type (sessions waiting)"),
    ("writeback", "Dirty and Writeback (machine-wide)"),
    (
        "pressure",
        "Pressure stall, machine-wide (% of each second)",
    ),
    ("checkpoints", "Checkpoint phases"),
    ("syscalls", "Syscalls per second"),
    ("replay-lag", "Replay lag"),
];

/// Series a panel shows at most (the largest by total).
const MAX_SERIES: usize = 10;

/// One named series before alignment: (t, value) points.
#[derive(Clone, Debug)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn as steps (phases) rather than lines.
    pub step: bool,
    pub dash: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Panel {
    pub name: &'static str,
    pub title: &'static str,
    pub unit: String,
    /// Where the numbers come from.
    pub source: String,
    pub labels: Vec<String>,
    pub step: Vec<bool>,
    /// Drawn dashed (recording B of a comparison).
    pub dash: Vec<bool>,
    /// The shared x values (recording seconds), ascending.
    pub x: Vec<f64>,
    /// One column per label, `None` where that series has no point at x.
    pub ys: Vec<Vec<Option<f64>>>,
}

/// Align lines on the union of their times.
pub fn panel(name: &'static str, unit: &str, source: &str, lines: Vec<Line>) -> Option<Panel> {
    let lines: Vec<Line> = lines.into_iter().filter(|l| !l.points.is_empty()).collect();
    if lines.is_empty() {
        return None;
    }
    let title = PANELS.iter().find(|p| p.0 == name).map_or(name, |p| p.1);
    // Milliseconds are the recordings' resolution: the key of a time.
    let key = |t: f64| (t * 1000.0).round() as i64;
    let xs: BTreeSet<i64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| key(p.0)))
        .collect();
    let index: BTreeMap<i64, usize> = xs.iter().enumerate().map(|(i, k)| (*k, i)).collect();
    let ys = lines
        .iter()
        .map(|l| {
            let mut col = vec![None; xs.len()];
            for (t, v) in &l.points {
                col[index[&key(*t)]] = Some(round3(*v));
            }
            col
        })
        .collect();
    Some(Panel {
        name,
        title,
        unit: unit.into(),
        source: source.into(),
        labels: lines.iter().map(|l| l.label.clone()).collect(),
        step: lines.iter().map(|l| l.step).collect(),
        dash: lines.iter().map(|l| l.dash).collect(),
        x: xs.iter().map(|k| *k as f64 / 1000.0).collect(),
        ys,
    })
}

impl Line {
    /// A solid line (not steps, not dashed).
    fn plain(label: impl Into<String>, points: Vec<(f64, f64)>) -> Line {
        Line {
            label: label.into(),
            points,
            step: false,
            dash: false,
        }
    }
}

fn line(label: impl Into<String>, s: &Series) -> Line {
    Line::plain(label, s.points.iter().map(|p| (p.t, p.value)).collect())
}

/// Plain lines from labelled points.
fn plain_lines(acc: BTreeMap<String, Vec<(f64, f64)>>) -> Vec<Line> {
    acc.into_iter()
        .map(|(label, points)| Line::plain(label, points))
        .collect()
}

/// Keep the `MAX_SERIES` largest lines by sum, largest first.
fn largest(mut lines: Vec<Line>) -> Vec<Line> {
    let sum = |l: &Line| l.points.iter().map(|p| p.1).sum::<f64>();
    lines.retain(|l| sum(l) > 0.0);
    lines.sort_by(|a, b| sum(b).total_cmp(&sum(a)).then(a.label.cmp(&b.label)));
    lines.truncate(MAX_SERIES);
    lines
}

fn throughput(r: &Report) -> Option<Panel> {
    let tl = r.timeline.as_ref()?;
    let mut lines = Vec::new();
    let mut sources = Vec::new();
    if let Some(s) = &tl.throughput {
        if s.source.starts_with("pg_stat_database") {
            lines.push(line("transactions/s (server)", s));
            sources.push(s.source.clone());
        }
    }
    if let Some(s) = &tl.commits {
        lines.push(line("commits/s", s));
    }
    // Per database only when there is more than one to tell apart.
    if tl.by_database.len() > 1 {
        for (db, s) in &tl.by_database {
            lines.push(line(format!("commits/s in {db}"), s));
        }
    }
    if let Some(s) = &tl.pgbench_tps {
        lines.push(line("pgbench tps", s));
        sources.push(s.source.clone());
    }
    panel("throughput", "per second", &sources.join("; "), lines)
}

fn latency(r: &Report, ev: &Evidence) -> Option<Panel> {
    let mut lines = Vec::new();
    let mut sources = Vec::new();
    if let Some(s) = r.timeline.as_ref().and_then(|t| t.mean_exec_ms.as_ref()) {
        lines.push(line("mean statement execution (pg_stat_statements)", s));
        sources.push(s.source.clone());
    }
    if !ev.progress.is_empty() {
        lines.push(Line::plain(
            "pgbench latency",
            ev.progress.iter().map(|p| (p.t, p.lat_ms)).collect(),
        ));
        sources.push("pgbench progress (-P 1)".into());
    }
    panel("latency", "ms", &sources.join("; "), lines)
}

/// Seconds per second in each state, per role (procfs sampling).
fn states(ev: &Evidence) -> Option<Panel> {
    let mut acc: BTreeMap<(Role, String), Vec<(f64, f64)>> = BTreeMap::new();
    for s in &ev.procfs {
        let mut per: BTreeMap<(Role, String), f64> = BTreeMap::new();
        for row in &s.rows {
            if matches!(row.state.as_str(), "R" | "S" | "D") && row.role != Role::Observer {
                *per.entry((row.role, row.state.clone())).or_default() += row.s;
            }
        }
        for (k, v) in per {
            acc.entry(k).or_default().push((s.t, v / s.dt.max(1e-9)));
        }
    }
    let lines = acc
        .into_iter()
        .map(|((role, state), points)| Line::plain(format!("{role} {state}"), points))
        .collect();
    let hz = ev.procfs.first().map_or(0.0, |s| s.hz);
    panel(
        "states",
        "s/s",
        &format!("/proc/PID/stat sampled at {hz} Hz, per role and state"),
        largest(lines),
    )
}

/// Sessions in each wait event type, averaged over the interval's ticks.
fn waits(ev: &Evidence) -> Option<Panel> {
    let mut acc: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let types: BTreeSet<String> = ev
        .waits
        .iter()
        .flat_map(|s| &s.rows)
        .filter(|r| r.role != Role::Observer)
        .filter_map(|r| r.wait_event_type.clone())
        .collect();
    for s in &ev.waits {
        let ticks = s.ticks.max(1) as f64;
        for ty in &types {
            let n: u64 = s
                .rows
                .iter()
                .filter(|r| r.role != Role::Observer && r.wait_event_type.as_ref() == Some(ty))
                .map(|r| r.samples)
                .sum();
            acc.entry(ty.clone())
                .or_default()
                .push((s.t, n as f64 / ticks));
        }
    }
    let lines = plain_lines(acc);
    panel(
        "waits",
        "sessions",
        "pg_stat_activity wait_event_type, sampled; pgbelow's own session left out",
        largest(lines),
    )
}

fn writeback(ev: &Evidence) -> Option<Panel> {
    let mb = |kb: u64| kb as f64 / 1024.0;
    let pts = |f: &dyn Fn(&crate::recording::schema::system::SystemSample) -> Option<f64>| {
        ev.system
            .iter()
            .filter_map(|s| Some((s.t, f(s)?)))
            .collect::<Vec<_>>()
    };
    let lines = vec![
        Line::plain("Dirty MB", pts(&|s| Some(mb(s.dirty_kb)))),
        Line::plain("Writeback MB", pts(&|s| Some(mb(s.writeback_kb)))),
        Line::plain(
            "dirty background threshold MB",
            pts(&|s| s.dirty_background_threshold_kb.map(mb)),
        ),
    ];
    panel("writeback", "MB", "/proc/meminfo, /proc/vmstat", lines)
}

/// The machine's PSI: the share of each second in which some (or every
/// non-idle) task waited for a CPU, memory or I/O.
fn pressure(ev: &Evidence) -> Option<Panel> {
    use crate::recording::schema::cgroup::Pressure;
    let pts = |f: fn(&Pressure) -> Option<f64>| {
        ev.system
            .iter()
            .filter(|s| s.dt > 0.0)
            .filter_map(|s| Some((s.t, 100.0 * f(s.pressure.as_ref()?)? / s.dt)))
            .collect::<Vec<_>>()
    };
    let lines = vec![
        Line::plain("CPU some %", pts(|p| p.cpu_some_s)),
        Line::plain("memory some %", pts(|p| p.memory_some_s)),
        Line::plain("memory full %", pts(|p| p.memory_full_s)),
        Line::plain("I/O some %", pts(|p| p.io_some_s)),
        Line::plain("I/O full %", pts(|p| p.io_full_s)),
    ];
    panel("pressure", "%", "/proc/pressure (PSI)", lines)
}

/// A checkpoint's time window, where known: (start, end).
pub fn checkpoint_windows(ev: &Evidence, end: f64) -> Vec<Window> {
    ev.checkpoints
        .iter()
        .filter_map(|c| {
            let start = c.start_t?;
            Some(Window {
                start: round3(start.max(0.0)),
                end: round3(c.end_t.unwrap_or(end)),
                open: c.end_t.is_none(),
                label: format!(
                    "{}{} ({})",
                    c.kind,
                    c.flags
                        .as_deref()
                        .map(|f| format!(" {f}"))
                        .unwrap_or_default(),
                    c.source
                ),
            })
        })
        .collect()
}

#[derive(Clone, Debug, Serialize)]
pub struct Window {
    pub start: f64,
    pub end: f64,
    pub label: String,
    /// Still running when the recording ended: `end` is the recording's.
    #[serde(skip)]
    pub open: bool,
}

/// 1 while a checkpoint is in its write (or unknown) phase, 2 in sync.
fn checkpoints(ev: &Evidence, end: f64) -> Option<Panel> {
    let recorded = ev.recorded("pgstat") || !ev.log_events.is_empty();
    if !recorded {
        return None;
    }
    let mut pts = vec![(0.0, 0.0)];
    for c in &ev.checkpoints {
        let Some(start) = c.start_t else { continue };
        let stop = c.end_t.unwrap_or(end);
        pts.push((start.max(0.0), 1.0));
        if let Some(sync) = c.sync_start_t {
            pts.push((sync.max(0.0), 2.0));
        }
        pts.push((stop, 0.0));
    }
    pts.push((end, 0.0));
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts.dedup_by(|b, a| (a.0 * 1000.0).round() == (b.0 * 1000.0).round());
    let source = if ev.checkpoints.iter().any(|c| c.source == "counters") {
        "server log lines, else the checkpointer's counters (1 Hz)"
    } else {
        "server log (log_checkpoints); 1 = write phase, 2 = sync phase"
    };
    panel(
        "checkpoints",
        "phase",
        source,
        vec![Line {
            label: "checkpoint (1 write, 2 sync)".into(),
            points: pts,
            step: true,
            dash: false,
        }],
    )
}

/// Syscall names the findings cite (as keys or values of their evidence).
fn cited(r: &Report) -> BTreeSet<String> {
    fn walk(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    walk(v, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            serde_json::Value::String(s) => {
                out.insert(s.clone());
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for f in &r.findings {
        walk(&f.evidence, &mut out);
    }
    out
}

/// Per role all calls per second, and the calls the findings cite (or the
/// watched ones) per role.
fn syscalls(r: &Report, ev: &Evidence) -> Option<Panel> {
    let cited = cited(r);
    let named = |n: &str| cited.contains(n) || crate::report::json::WATCHED.contains(&n);
    let mut acc: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    // An interval nothing was counted in is left out (a gap), never drawn as 0.
    for s in ev.syscalls.iter().filter(|s| s.counted()) {
        let dt = s.dt.max(1e-9);
        let mut per: BTreeMap<String, u64> = BTreeMap::new();
        for (pid, calls) in &s.counts {
            let role = ev.role_of(*pid);
            if role == Role::Observer {
                continue;
            }
            *per.entry(format!("{role} all")).or_default() += calls.values().sum::<u64>();
            for (name, n) in calls {
                if named(name) {
                    *per.entry(format!("{role} {name}")).or_default() += n;
                }
            }
        }
        for (k, n) in per {
            acc.entry(k).or_default().push((s.t, n as f64 / dt));
        }
    }
    let lines = plain_lines(acc);
    panel(
        "syscalls",
        "calls/s",
        "syscall counts per process, per role (all, and the calls findings cite)",
        largest(lines),
    )
}

fn replay_lag(ev: &Evidence) -> Option<Panel> {
    let mut acc: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for s in &ev.server {
        if let (true, Some(age)) = (s.in_recovery, s.replay_age_s) {
            acc.entry("standby: time since last replayed transaction".into())
                .or_default()
                .push((s.t, age));
        }
        for r in &s.replication {
            if let Some(l) = r.replay_lag_s {
                acc.entry(format!("replay_lag of {}", r.application_name))
                    .or_default()
                    .push((s.t, l));
            }
        }
    }
    let lines = plain_lines(acc);
    panel(
        "replay-lag",
        "s",
        "pg_stat_replication replay_lag; standbys' pg_last_xact_replay_timestamp()",
        lines,
    )
}

/// The recording's last second with data.
pub fn end_of(r: &Report, ev: &Evidence) -> f64 {
    let mut end = r.recording.duration_s.unwrap_or(0.0);
    for t in ev
        .procfs
        .iter()
        .map(|s| s.t)
        .chain(ev.system.iter().map(|s| s.t))
        .chain(ev.syscalls.iter().map(|s| s.t))
        .chain(ev.progress.iter().map(|s| s.t))
        .chain(ev.pgstat.iter().map(|s| s.t))
    {
        end = end.max(t);
    }
    round3(end)
}

/// Every panel the recording has data for, in page order; `end` is [`end_of`].
pub fn build(r: &Report, ev: &Evidence, end: f64) -> Vec<Panel> {
    [
        throughput(r),
        latency(r, ev),
        states(ev),
        waits(ev),
        writeback(ev),
        pressure(ev),
        checkpoints(ev, end),
        syscalls(r, ev),
        replay_lag(ev),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A finding's time window from its evidence: `window_s`, else its
/// checkpoint's start and end (`end` when it was still running).
pub fn finding_window(f: &crate::analyse::Finding, end: f64) -> Option<[f64; 2]> {
    let e = &f.evidence;
    if let Some(w) = e.get("window_s").and_then(|w| w.as_array()) {
        if let (Some(a), Some(b)) = (w.first()?.as_f64(), w.get(1)?.as_f64()) {
            return Some([a, b]);
        }
    }
    let c = e.get("checkpoint")?;
    let start = c.get("start_t")?.as_f64()?;
    Some([
        start,
        c.get("end_t").and_then(|v| v.as_f64()).unwrap_or(end),
    ])
}

/// The panel's series back as lines, labels prefixed.
fn lines_of(p: &Panel, prefix: &str, dash: bool) -> Vec<Line> {
    p.labels
        .iter()
        .zip(&p.ys)
        .zip(&p.step)
        .map(|((label, col), step)| Line {
            label: format!("{prefix}{label}"),
            points: p
                .x
                .iter()
                .zip(col)
                .filter_map(|(x, y)| Some((*x, (*y)?)))
                .collect(),
            step: *step,
            dash,
        })
        .collect()
}

/// A's and B's panel of one name on one axis (both start at 0 s), B
/// dashed; the side that did not record it said so in the source.
pub fn overlay(name: &'static str, a: Option<&Panel>, b: Option<&Panel>) -> Option<Panel> {
    let src = |p: Option<&Panel>| p.map_or("not recorded".to_string(), |p| p.source.clone());
    let unit = a.or(b)?.unit.clone();
    let mut lines = Vec::new();
    if let Some(p) = a {
        lines.extend(lines_of(p, "A: ", false));
    }
    if let Some(p) = b {
        lines.extend(lines_of(p, "B: ", true));
    }
    let source = if a.map(|p| &p.source) == b.map(|p| &p.source) {
        src(a)
    } else {
        format!("A: {}; B: {}", src(a), src(b))
    };
    panel(name, &unit, &source, lines)
}
