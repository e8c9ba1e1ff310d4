//! The recording's off-CPU files: written by collect::offcpu, read by
//! evidence (time off the CPU per state and stack).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Files collect::offcpu writes into the recording.
pub mod files {
    /// Per interval: `{"t","dt","by_pid":{"<pid>":{"D":s,"S":s,"runq":s}}}`.
    pub const STREAM: &str = "offcpu.jsonl";
    /// [`super::Summary`], written at the end.
    pub const SUMMARY: &str = "offcpu.json";
    /// Folded stacks, `role;state;root;…;leaf µs`.
    pub const FOLDED: &str = "offcpu.folded";
    /// The same time per process: [`super::PidStack`] lines (per-query stacks).
    pub const PID_STACKS: &str = "offcpu.stacks.jsonl";

    /// Off-CPU flame graph of one role.
    pub fn svg_for(role: &str) -> String {
        format!("offcpu-flamegraph-{role}.svg")
    }
}

/// One line of `offcpu.stacks.jsonl`: a process's off-CPU time in one
/// state and stack (named as in `offcpu.folded`, root first).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PidStack {
    pub pid: u32,
    pub state: String,
    pub us: u64,
    pub frames: Vec<String>,
}

/// The frame standing for user frames when no block of that kernel stack
/// had its user stack copied.
pub const NO_USER_STACK: &str = "[user stack not copied]";

/// States as the BPF program numbers them, named so in the streams.
pub const STATES: [&str; 3] = ["D", "S", "runq"];

/// `offcpu.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub mechanism: String,
    pub min_block_us: u64,
    pub duration_s: f64,
    /// Whether the kernel counted the BPF programs' run time.
    pub bpf_stats: bool,
    /// Time the BPF programs ran (in the context of every task on the machine).
    pub bpf_run_s: f64,
    pub bpf_runs: u64,
    /// CPU of the reader thread (unwinding, map reads).
    pub reader_cpu_s: f64,
    /// Blocks of at least min_block_us, and shorter ones (not measured).
    pub blocks: u64,
    pub short_blocks: u64,
    /// Blocks whose user stack was copied and unwound.
    pub user_stacks: u64,
    /// Blocks without a user stack: not in a system call (with the sys_exit
    /// hook: preempted in user code, page faults; with task_work: kernel
    /// threads only), copy budget spent, ring full, more than 8
    /// distinct blocks in one system call, stack unreadable.
    pub not_in_syscall: u64,
    pub no_budget: u64,
    pub ring_full: u64,
    pub pending_full: u64,
    pub copy_failed: u64,
    /// Blocks whose kernel stack could not be stored.
    pub kstack_lost: u64,
    pub roles: Vec<RoleSummary>,
    pub folded: String,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleSummary {
    pub role: String,
    pub pids: usize,
    /// Seconds off the CPU by state: "D", "S", "runq".
    pub off_cpu_s: BTreeMap<String, f64>,
    pub blocks: BTreeMap<String, u64>,
    pub flamegraph: Option<String>,
}

/// One line of `offcpu.jsonl`: blocks that ended in `(t - dt, t]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    pub t: f64,
    pub dt: f64,
    pub by_pid: BTreeMap<u32, BTreeMap<String, f64>>,
}
