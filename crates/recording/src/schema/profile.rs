//! The recording's on-CPU profile files: written by collect::profile, read
//! by evidence and the report (which draws its flame graphs as the
//! recording's are drawn).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Files collect::profile writes into the recording.
pub mod files {
    /// Per-interval counts: `{"t","dt","samples","other","lost","unattributed"}`.
    pub const STREAM: &str = "profile.jsonl";
    /// [`super::Summary`], written at the end.
    pub const SUMMARY: &str = "profile.json";
    /// Folded stacks, `role;root;…;leaf count`.
    pub const FOLDED: &str = "profile.folded";
    /// One [`super::PidStack`] per line: the stacks per process, with each
    /// frame's binary (what the pprof export labels and maps).
    pub const PID_STACKS: &str = "profile.stacks.jsonl";
    /// Flame graph of all roles.
    pub const SVG_ALL: &str = "flamegraph.svg";

    /// Flame graph of one role.
    pub fn svg_for(role: &str) -> String {
        format!("flamegraph-{role}.svg")
    }
}

/// `profile.json`: totals, quality of the stacks, and where the flame graphs are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub mechanism: String,
    pub hz: u64,
    pub cpus: usize,
    pub duration_s: f64,
    /// Samples of the cluster's processes (what the stacks count).
    pub samples: u64,
    /// Samples of other processes and of idle CPUs, dropped.
    pub other_samples: u64,
    /// Samples of processes that exited before pgbelow could tell whose they were.
    pub unattributed: u64,
    /// Samples the kernel dropped because a ring was full.
    pub lost: u64,
    /// User frames (weighted by samples) and how many no symbol covered.
    pub user_frames: u64,
    pub unresolved_user_frames: u64,
    pub unresolved_share: f64,
    pub kernel_frames: u64,
    pub unresolved_kernel_frames: u64,
    pub kernel_symbols: bool,
    /// Share of samples whose user stack reached `main`/`_start`/a thread
    /// start: the rest were cut short (unwind data missing, stack copy too small).
    pub rooted_share: f64,
    pub mean_user_depth: f64,
    pub roles: Vec<RoleSummary>,
    /// Modules with frames, most frames first.
    pub modules: Vec<ModuleSummary>,
    pub folded: String,
    pub flamegraph: Option<String>,
    /// Problems, one line each with its fix.
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleSummary {
    pub role: String,
    pub pids: usize,
    pub samples: u64,
    pub user_frames: u64,
    pub unresolved_user_frames: u64,
    pub flamegraph: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModuleSummary {
    pub path: String,
    /// Whether the file has `.symtab` (or DWARF); None if it could not be read.
    pub symtab: Option<bool>,
    /// Its GNU build id in hex, as read when it was parsed for unwinding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    pub frames: u64,
    pub unresolved: u64,
}

/// One line of `profile.stacks.jsonl`: a distinct stack of one process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PidStack {
    pub pid: u32,
    pub samples: u64,
    /// Root first: user frames, then kernel frames (named as in `profile.folded`).
    pub frames: Vec<Frame>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frame {
    pub name: String,
    /// The binary the frame is in, as /proc/PID/maps names it;
    /// `[kernel.kallsyms]` for kernel frames; absent for anonymous memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// Suffix of kernel frames in folded stacks (the convention inferno colours).
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Module name of kernel frames, as perf and pprof name it.
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";

/// One line of `profile.jsonl`: counts in `(t - dt, t]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    pub t: f64,
    pub dt: f64,
    pub samples: u64,
    pub other: u64,
    pub lost: u64,
    pub unattributed: u64,
    /// The cluster's samples per process in the interval (what per-query
    /// attribution joins with the query timeline; absent in recordings
    /// made before it existed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_pid: BTreeMap<u32, u64>,
}

/// inferno's options for pgbelow's flame graphs: titled, frames coloured
/// by name (stable across graphs), deterministic output.
pub fn flame_options(title: &str, subtitle: &str) -> inferno::flamegraph::Options<'static> {
    use inferno::flamegraph::color::{MultiPalette, Palette};
    let mut o = inferno::flamegraph::Options::default();
    o.title = title.to_string();
    o.subtitle = Some(subtitle.to_string());
    o.count_name = "samples".into();
    o.colors = Palette::Multi(MultiPalette::Perl);
    o.hash = true;
    o.deterministic = true;
    o
}
