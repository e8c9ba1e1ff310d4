//! The view model: what the page and the profile exports draw beyond the
//! [`Report`] — the timeline's aligned per-second series, checkpoint
//! windows, why a panel is absent, the sessions table, folded stacks, the
//! on-CPU profile as samples — built once from the evidence. The views
//! (`html`, `pprof`, `otlp`, compare's page) read only the report and this;
//! none reaches into the evidence or the collectors (tests/cli/layers.rs).
pub mod profile;
pub mod series;

use std::collections::BTreeMap;

use crate::evidence::Evidence;
use crate::report::sections::profile::FoldedStack;
use crate::report::Report;
use crate::role::Role;

pub use series::{finding_window, overlay, Panel, Window, PANELS};

/// One recording as its views draw it.
#[derive(Clone, Debug)]
pub struct View {
    /// The recording's last second with data.
    pub end: f64,
    /// The panels recorded, in page order.
    pub panels: Vec<Panel>,
    /// Why each panel of [`PANELS`] that is not in `panels` is absent.
    pub absent: BTreeMap<&'static str, String>,
    pub checkpoints: Vec<Window>,
    /// Sessions by (application_name, role): samples active, samples in all.
    pub sessions: Vec<Session>,
    /// On-CPU stacks per role.
    pub on_cpu: Vec<FoldedStack>,
    /// Off-CPU stacks per role, or on and off in one (µs) when both ran.
    pub off_cpu: Vec<FoldedStack>,
    /// `off_cpu` holds on- and off-CPU time together.
    pub combined: bool,
    /// The top queries' own stacks (the profile model's `query_id`
    /// samples), for their flame graphs; empty without the profile or the
    /// query timeline.
    pub query_stacks: Vec<QueryStacks>,
}

/// Flame graphs of queries drawn at most, most kernel time first.
pub const QUERY_FLAMES: usize = 5;

/// One query's stacks: on-CPU samples, and off-CPU µs rooted at their
/// state (D, S, runq).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryStacks {
    pub query_id: String,
    pub on_cpu: Vec<FoldedStack>,
    pub off_cpu: Vec<FoldedStack>,
}

/// The stacks of the report's first [`QUERY_FLAMES`] queries.
fn query_stacks(r: &Report, ev: &Evidence) -> Vec<QueryStacks> {
    use profile::SampleKind;
    let Ok(m) = profile::model(ev) else {
        return Vec::new();
    };
    let folded = |m: BTreeMap<Vec<String>, u64>, role: &str| -> Vec<FoldedStack> {
        m.into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(frames, samples)| FoldedStack {
                role: role.to_string(),
                frames,
                samples,
            })
            .collect()
    };
    type Stacks = BTreeMap<Vec<String>, u64>;
    // The top queries' samples, gathered in one pass over the model.
    let mut by_query: BTreeMap<&str, (Stacks, Stacks)> = r
        .queries
        .iter()
        .take(QUERY_FLAMES)
        .map(|q| (q.query_id.as_str(), Default::default()))
        .collect();
    for s in &m.samples {
        let Some((on, off)) = s
            .labels
            .iter()
            .find(|(k, _)| *k == "query_id")
            .and_then(|(_, v)| by_query.get_mut(v.as_str()))
        else {
            continue;
        };
        let names = s.frames.iter().map(|f| f.name.clone());
        match s.kind {
            SampleKind::OnCpu => *on.entry(names.collect()).or_default() += s.count,
            SampleKind::OffCpu(state) => {
                let frames = std::iter::once(state.to_string()).chain(names).collect();
                *off.entry(frames).or_default() += s.count;
            }
        }
    }
    r.queries
        .iter()
        .take(QUERY_FLAMES)
        .filter_map(|q| {
            let (on, off) = by_query.remove(q.query_id.as_str())?;
            Some(QueryStacks {
                query_id: q.query_id.clone(),
                on_cpu: folded(on, "backend"),
                off_cpu: folded(off, "backend"),
            })
        })
        .filter(|q| !q.on_cpu.is_empty() || !q.off_cpu.is_empty())
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub application_name: String,
    pub role: String,
    pub active: u64,
    pub samples: u64,
}

impl View {
    pub fn build(r: &Report, ev: &Evidence) -> View {
        let end = series::end_of(r, ev);
        let panels = series::build(r, ev, end);
        let absent = PANELS
            .iter()
            .filter(|(name, _)| !panels.iter().any(|p| p.name == *name))
            .map(|(name, _)| (*name, absent_reason(ev, name)))
            .collect();
        let combined = crate::evidence::offcpu::combined_stacks(ev);
        let (off_cpu, combined) = match (&ev.offcpu, combined.is_empty()) {
            (_, false) => (combined, true),
            (Some(o), true) => (o.stacks.clone(), false),
            (None, true) => (Vec::new(), false),
        };
        View {
            end,
            checkpoints: series::checkpoint_windows(ev, end),
            panels,
            absent,
            sessions: sessions(ev),
            on_cpu: ev.stacks().to_vec(),
            off_cpu,
            combined,
            query_stacks: query_stacks(r, ev),
        }
    }
}

/// Why a panel is missing from a recording.
fn absent_reason(ev: &Evidence, name: &str) -> String {
    let collector = match name {
        "throughput" | "latency" | "checkpoints" | "waits" | "replay-lag" => "pgstat",
        "states" => "procfs",
        "writeback" | "pressure" => "system",
        "syscalls" => "syscalls",
        _ => "",
    };
    if name == "replay-lag" && ev.recorded("pgstat") {
        "not recorded: no standby in the recording".into()
    } else if name == "pressure" && ev.recorded("system") {
        "not recorded: no /proc/pressure in this recording (a kernel without PSI, booted \
         psi=0, or a recording made before pgbelow read it)"
            .into()
    } else if name == "latency" && ev.recorded("pgstat") {
        // The statements' mean time comes from pg_stat_statements; pgstat
        // itself ran.
        "not recorded: pg_stat_statements is not installed in the database pgbelow connected to \
         (shared_preload_libraries = 'pg_stat_statements', then CREATE EXTENSION pg_stat_statements)"
            .into()
    } else if !collector.is_empty() && ev.recorded(collector) {
        format!("not recorded: collector {collector} ran but saw none of it")
    } else {
        format!("not recorded (collector {collector} was off or failed)")
    }
}

/// Sessions seen in pg_stat_activity by application and role, most samples
/// first (ties in name order), at most 20.
fn sessions(ev: &Evidence) -> Vec<Session> {
    let mut acc: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for s in &ev.waits {
        for r in s.rows.iter().filter(|r| r.role != Role::Observer) {
            let e = acc
                .entry((r.application_name.clone(), r.role.to_string()))
                .or_default();
            e.1 += r.samples;
            if r.state.as_deref() == Some("active") {
                e.0 += r.samples;
            }
        }
    }
    let mut rows: Vec<Session> = acc
        .into_iter()
        .map(|((application_name, role), (active, samples))| Session {
            application_name,
            role,
            active,
            samples,
        })
        .collect();
    rows.sort_by_key(|s| std::cmp::Reverse(s.samples));
    rows.truncate(20);
    rows
}
