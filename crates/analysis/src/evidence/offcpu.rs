//! Off-CPU time of a recording, per role: seconds by state (D, S, runq),
//! the stacks that hold the most, and per interval per pid (the rules'
//! exact D time). Reads `offcpu.json`, `offcpu.folded` and `offcpu.jsonl`.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::profile::{parse_folded, FoldedStack};
use super::Evidence;
use crate::recording::schema::offcpu::{Summary, Tick};
use crate::round3;

/// Stacks shown per role.
pub const TOP_STACKS: usize = 10;

/// What the offcpu collector recorded.
#[derive(Clone, Debug, Default)]
pub struct OffCpu {
    pub summary: Summary,
    /// `role;state;frames… µs` lines: `frames[0]` is the state, weights in µs.
    pub stacks: Vec<FoldedStack>,
    /// The same per process; empty in recordings made before
    /// `offcpu.stacks.jsonl` existed.
    pub pid_stacks: Vec<crate::recording::schema::offcpu::PidStack>,
    pub ticks: Vec<Tick>,
}

impl OffCpu {
    /// Off-CPU seconds in `state` of `pid` in blocks that ended in `(from, to]`.
    pub fn seconds(&self, pid: u32, state: &str, from: f64, to: f64) -> f64 {
        self.ticks
            .iter()
            .filter(|t| t.t > from && t.t - t.dt < to)
            .filter_map(|t| t.by_pid.get(&pid)?.get(state))
            .sum()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OffcpuSection {
    pub mechanism: String,
    pub min_block_ms: f64,
    pub duration_s: f64,
    /// Run time of the BPF programs (all CPUs), and as a share of one CPU.
    pub bpf_run_s: f64,
    pub bpf_cpu_share: f64,
    pub reader_cpu_s: f64,
    /// Blocks of at least min_block_ms, and the share that got a user stack.
    pub blocks: u64,
    pub user_stack_share: f64,
    pub folded: String,
    pub notes: Vec<String>,
    /// Most off-CPU time first.
    pub roles: Vec<RoleOffcpu>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleOffcpu {
    pub role: String,
    pub pids: usize,
    /// Seconds on the CPU (profile samples ÷ frequency), when the profile
    /// recorded too: beside `off_cpu_s`, where the role's time went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_cpu_s: Option<f64>,
    /// Seconds off the CPU by state: "D", "S", "runq".
    pub off_cpu_s: BTreeMap<String, f64>,
    pub blocks: BTreeMap<String, u64>,
    pub flamegraph: Option<String>,
    pub top_stacks: Vec<OffStack>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OffStack {
    pub state: String,
    pub seconds: f64,
    /// Of the role's off-CPU seconds in all states.
    pub share: f64,
    /// Root first: user frames, then kernel frames (`_[k]`).
    pub frames: Vec<String>,
}

/// The section, when the recording has off-CPU data; with each role's
/// on-CPU seconds when the profile recorded too.
pub fn build(rec: &Evidence) -> Option<OffcpuSection> {
    let mut s = from_parts(rec.offcpu.as_ref()?);
    if let Some(p) = rec.profile.as_ref().filter(|p| p.summary.hz > 0) {
        for r in &mut s.roles {
            let samples = p
                .summary
                .roles
                .iter()
                .find(|x| x.role == r.role)
                .map_or(0, |x| x.samples);
            r.on_cpu_s = Some(round3(samples as f64 / p.summary.hz as f64));
        }
    }
    Some(s)
}

/// On- and off-CPU stacks in one folded set, in µs, for a flame graph of
/// where each role's time went: `frames[0]` is `on-CPU` (a profile sample
/// weighs 1/hz s) or `off-CPU D` / `off-CPU S` / `off-CPU runq`. Empty
/// unless both the profile and offcpu recorded. Off-CPU holds only blocks
/// of at least the collector's minimum, so short sleeps are missing.
pub fn combined_stacks(rec: &Evidence) -> Vec<FoldedStack> {
    let (Some(p), Some(o)) = (&rec.profile, &rec.offcpu) else {
        return Vec::new();
    };
    if p.summary.hz == 0 {
        return Vec::new();
    }
    let us_per_sample = 1e6 / p.summary.hz as f64;
    let on = p.stacks.iter().map(|s| FoldedStack {
        role: s.role.clone(),
        frames: std::iter::once("on-CPU".to_string())
            .chain(s.frames.iter().cloned())
            .collect(),
        samples: (s.samples as f64 * us_per_sample).round() as u64,
    });
    let off = o
        .stacks
        .iter()
        .filter(|s| !s.frames.is_empty())
        .map(|s| FoldedStack {
            role: s.role.clone(),
            frames: std::iter::once(format!("off-CPU {}", s.frames[0]))
                .chain(s.frames[1..].iter().cloned())
                .collect(),
            samples: s.samples,
        });
    on.chain(off).collect()
}

pub fn from_parts(o: &OffCpu) -> OffcpuSection {
    let s = &o.summary;
    let mut by_role: BTreeMap<&str, Vec<&FoldedStack>> = BTreeMap::new();
    for st in &o.stacks {
        by_role.entry(&st.role).or_default().push(st);
    }
    let roles = s
        .roles
        .iter()
        .map(|r| {
            let total: f64 = r.off_cpu_s.values().sum();
            let mut stacks: Vec<&FoldedStack> =
                by_role.get(r.role.as_str()).cloned().unwrap_or_default();
            stacks.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.frames.cmp(&b.frames)));
            let top_stacks = stacks
                .iter()
                .take(TOP_STACKS)
                .map(|st| {
                    let seconds = st.samples as f64 / 1e6;
                    OffStack {
                        state: st.frames.first().cloned().unwrap_or_default(),
                        seconds: round3(seconds),
                        share: if total > 0.0 {
                            round3(seconds / total)
                        } else {
                            0.0
                        },
                        frames: st.frames.iter().skip(1).cloned().collect(),
                    }
                })
                .collect();
            RoleOffcpu {
                role: r.role.clone(),
                pids: r.pids,
                on_cpu_s: None,
                off_cpu_s: r
                    .off_cpu_s
                    .iter()
                    .map(|(k, v)| (k.clone(), round3(*v)))
                    .collect(),
                blocks: r.blocks.clone(),
                flamegraph: r.flamegraph.clone(),
                top_stacks,
            }
        })
        .collect();
    OffcpuSection {
        mechanism: s.mechanism.clone(),
        min_block_ms: s.min_block_us as f64 / 1000.0,
        duration_s: s.duration_s,
        bpf_run_s: s.bpf_run_s,
        bpf_cpu_share: if s.duration_s > 0.0 {
            (s.bpf_run_s / s.duration_s * 1e4).round() / 1e4
        } else {
            0.0
        },
        reader_cpu_s: s.reader_cpu_s,
        blocks: s.blocks,
        user_stack_share: if s.blocks > 0 {
            round3(
                1.0 - (s.not_in_syscall + s.no_budget + s.ring_full + s.pending_full) as f64
                    / s.blocks as f64,
            )
        } else {
            0.0
        },
        folded: s.folded.clone(),
        notes: s.notes.clone(),
        roles,
    }
}

/// Reads the collector's files; None when it did not run.
pub fn load(dir: &std::path::Path, cut: &mut usize, notes: &mut Vec<String>) -> Option<OffCpu> {
    use crate::recording::schema::offcpu::files;
    let summary: Summary = super::json_file(dir, files::SUMMARY, notes)?;
    // Only a regular file of this recording, bounded (a crafted summary
    // could name `/dev/zero`, `../…` or a FIFO).
    let folded = super::folded_file(dir, files::SUMMARY, &summary.folded, notes);
    let stacks = match folded.map(|p| crate::recording::reader::read_small(&p)) {
        None => Vec::new(),
        Some(Ok(b)) => parse_folded(&String::from_utf8_lossy(&b)),
        Some(Err(e)) => {
            notes.push(format!("{}: {e}", summary.folded));
            Vec::new()
        }
    };
    let ticks = crate::recording::reader::read_stream(dir, files::STREAM, cut, notes);
    let mut pid_cut = 0;
    let pid_stacks =
        crate::recording::reader::read_stream(dir, files::PID_STACKS, &mut pid_cut, notes);
    Some(OffCpu {
        summary,
        stacks,
        pid_stacks,
        ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real select-only run on PostgreSQL 13 with profile and offcpu:
    /// the combined set is both collectors' stacks, each side's weights
    /// preserved (a sample weighs 1/99 s), and the section puts each role's
    /// on-CPU seconds beside its off-CPU ones.
    #[test]
    fn on_and_off_cpu_together() {
        let ev = crate::analyse::fixture("pg13-select-only-on-off-cpu");
        let (p, o) = (ev.profile.as_ref().unwrap(), ev.offcpu.as_ref().unwrap());
        let all = combined_stacks(&ev);
        assert_eq!(all.len(), p.stacks.len() + o.stacks.len());
        let sum = |f: &dyn Fn(&FoldedStack) -> bool| -> u64 {
            all.iter().filter(|s| f(s)).map(|s| s.samples).sum()
        };
        let on_us = sum(&|s| s.frames[0] == "on-CPU");
        let samples: u64 = p.stacks.iter().map(|s| s.samples).sum();
        let want = samples as f64 * 1e6 / p.summary.hz as f64;
        assert!(
            (on_us as f64 - want).abs() <= all.len() as f64,
            "{on_us} µs vs {want}"
        );
        let off_us = sum(&|s| s.frames[0].starts_with("off-CPU "));
        assert_eq!(off_us, o.stacks.iter().map(|s| s.samples).sum::<u64>());
        assert!(all.iter().all(|s| s.frames[0] == "on-CPU"
            || ["off-CPU D", "off-CPU S", "off-CPU runq"].contains(&s.frames[0].as_str())));

        let s = build(&ev).unwrap();
        let backend = s.roles.iter().find(|r| r.role == "backend").unwrap();
        let on = backend.on_cpu_s.unwrap();
        let role = p
            .summary
            .roles
            .iter()
            .find(|r| r.role == "backend")
            .unwrap();
        assert_eq!(on, round3(role.samples as f64 / 99.0), "{backend:?}");
        assert!(on > 0.5, "{backend:?}");
        // A role the profile never sampled ran for 0 s, not unknown.
        assert!(s.roles.iter().all(|r| r.on_cpu_s.is_some()));
        // Without the profile: not known.
        let mut no_profile = crate::analyse::fixture("pg13-select-only-on-off-cpu");
        no_profile.profile = None;
        assert!(combined_stacks(&no_profile).is_empty());
        assert!(build(&no_profile)
            .unwrap()
            .roles
            .iter()
            .all(|r| r.on_cpu_s.is_none()));
    }
}
