//! Report section from `procfs.jsonl`: per role, CPU, time in R/S/D,
//! where processes were blocked (D) with their kernel stacks, and the top
//! wait channels.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::File;
use std::io::BufReader;

use serde::{Deserialize, Serialize};

use crate::collect::procfs::{ProcfsSample, STREAM};
use crate::procinfo::Role;
use crate::recording::reader::parse_jsonl;
use crate::recording::Loaded;

const TOP_FRAMES: usize = 8;
const TOP_STACKS: usize = 5;
const TOP_WCHANS: usize = 5;
const TOP_BLOCKED: usize = 10;
/// Frames shown per stack in the text report (innermost first).
const STACK_DEPTH: usize = 12;
/// Frames on every syscall's stack, left out of the text rendering.
const SYSCALL_ENTRY: &[&str] = &[
    "entry_SYSCALL_64_after_hwframe",
    "entry_SYSCALL_64",
    "do_syscall_64",
    "el0_svc",
    "el0t_64_sync",
    "el0t_64_sync_handler",
    "el0_svc_common.constprop.0",
    "do_el0_svc",
    "invoke_syscall",
];

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcfsSection {
    /// Sampling rate asked for.
    pub hz: f64,
    /// Recording seconds covered, [from, to].
    pub window_s: [f64; 2],
    /// Sampling rounds taken (≈ hz × duration unless the sampler fell behind).
    pub ticks: u64,
    pub stack_reads: u64,
    /// What limits this section (a degraded collector, a damaged stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub truncated_lines: usize,
    pub roles: BTreeMap<Role, RoleProcfs>,
    /// Where processes were blocked in D, every role, most time first:
    /// "4 backends in D for 9 s in jbd2_journal_start".
    pub blocked: Vec<FrameRow>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleProcfs {
    /// Processes of this role sampled.
    pub pids: usize,
    pub cpu_s: f64,
    /// Seconds runnable but waiting for a CPU.
    pub runq_s: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub vcsw: u64,
    pub nvcsw: u64,
    /// Process-seconds per state: "R", "S", "D", "other".
    pub state_s: BTreeMap<String, f64>,
    /// Where this role's processes spent their time off CPU, most first.
    pub frames: Vec<FrameRow>,
    /// Kernel stacks while blocked (D), most time first.
    pub blocked_stacks: Vec<StackRow>,
    /// Wait channels (any sleeping state), most time first.
    pub wchans: Vec<WchanRow>,
    /// With standbys: this role's processes and CPU per node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_node: BTreeMap<String, NodeProcfs>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeProcfs {
    pub pids: usize,
    pub cpu_s: f64,
}

/// Per role, per node: distinct pids and CPU seconds (multi-server recordings).
fn split_by_node(
    samples: &[ProcfsSample],
    rec: &Loaded,
) -> BTreeMap<Role, BTreeMap<String, NodeProcfs>> {
    let mut acc: BTreeMap<Role, BTreeMap<String, (BTreeSet<u32>, f64)>> = BTreeMap::new();
    let mut add = |pid: u32, cpu_s: f64| {
        if let Some(node) = rec.node_of(pid) {
            let e = acc
                .entry(rec.role_of(pid))
                .or_default()
                .entry(node.to_string())
                .or_default();
            e.0.insert(pid);
            e.1 += cpu_s;
        }
    };
    for smp in samples {
        // Idle processes show only in the state rows, busy ones in the deltas.
        for row in &smp.rows {
            for pid in &row.pids {
                add(*pid, 0.0);
            }
        }
        for (pid, d) in &smp.procs {
            add(*pid, d.cpu_s);
        }
    }
    acc.into_iter()
        .map(|(role, nodes)| {
            let nodes = nodes
                .into_iter()
                .map(|(n, (pids, cpu))| {
                    (
                        n,
                        NodeProcfs {
                            pids: pids.len(),
                            cpu_s: round_ms(cpu),
                        },
                    )
                })
                .collect();
            (role, nodes)
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameRow {
    pub role: Role,
    pub state: String,
    pub frame: String,
    /// Distinct processes seen there.
    pub pids: usize,
    /// The most of them there at once (in one sampling round).
    #[serde(default)]
    pub max_pids: u64,
    /// Process-seconds.
    pub s: f64,
    /// Seconds with at least one process there.
    pub wall_s: f64,
    /// Syscalls the processes were blocked in, most samples first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StackRow {
    /// Function names, innermost first.
    pub frames: Vec<String>,
    pub samples: u64,
    /// Process-seconds.
    pub s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WchanRow {
    pub wchan: String,
    pub s: f64,
}

/// The samples of `procfs.jsonl` in `rec` (a cut last line is skipped and counted).
pub fn load(rec: &Loaded) -> anyhow::Result<(Vec<ProcfsSample>, usize)> {
    let path = rec.dir.join(STREAM);
    let Ok(f) = File::open(&path) else {
        return Ok((Vec::new(), 0));
    };
    let mut truncated = 0;
    let v = parse_jsonl(
        BufReader::new(f),
        &path.display().to_string(),
        &mut truncated,
    )?;
    Ok((v, truncated))
}

/// The section, or `None` when the recording has no procfs data.
pub fn build(rec: &Loaded) -> Option<ProcfsSection> {
    let note = rec
        .manifest
        .collectors
        .iter()
        .find(|c| c.name == "procfs" && c.status != "ok")
        .map(|c| {
            c.reason
                .clone()
                .unwrap_or_else(|| format!("procfs collector {}", c.status))
        });
    match load(rec) {
        Ok((samples, _)) if samples.is_empty() => note.map(|n| ProcfsSection {
            note: Some(n),
            ..ProcfsSection::default()
        }),
        Ok((samples, truncated)) => {
            let mut s = summarize(&samples, |pid| rec.role_of(pid));
            if !rec.manifest.postgres.nodes.is_empty() {
                for (role, nodes) in split_by_node(&samples, rec) {
                    if let Some(r) = s.roles.get_mut(&role) {
                        r.by_node = nodes;
                    }
                }
            }
            s.note = note;
            s.truncated_lines = truncated;
            Some(s)
        }
        Err(e) => Some(ProcfsSection {
            note: Some(format!("{e:#}")),
            ..ProcfsSection::default()
        }),
    }
}

#[derive(Default)]
struct FrameAcc {
    pids: BTreeSet<u32>,
    max_pids: u64,
    s: f64,
    wall_s: f64,
    syscalls: BTreeMap<String, u64>,
}

/// Aggregate samples; `role_of` names the role of a pid in the per-process deltas.
pub fn summarize(samples: &[ProcfsSample], role_of: impl Fn(u32) -> Role) -> ProcfsSection {
    let mut out = ProcfsSection {
        hz: samples.first().map_or(0.0, |s| s.hz),
        window_s: [
            samples.first().map_or(0.0, |s| round_ms(s.t - s.dt)),
            samples.last().map_or(0.0, |s| s.t),
        ],
        ..ProcfsSection::default()
    };
    let mut role_pids: BTreeMap<Role, BTreeSet<u32>> = BTreeMap::new();
    let mut frames: BTreeMap<(Role, String, String), FrameAcc> = BTreeMap::new();
    let mut stacks: BTreeMap<Role, BTreeMap<String, (u64, f64)>> = BTreeMap::new();
    let mut wchans: BTreeMap<Role, BTreeMap<String, f64>> = BTreeMap::new();
    for smp in samples {
        out.ticks += smp.ticks;
        out.stack_reads += smp.stack_reads;
        let per_tick = if smp.ticks == 0 {
            0.0
        } else {
            smp.dt / smp.ticks as f64
        };
        for row in &smp.rows {
            role_pids.entry(row.role).or_default().extend(&row.pids);
            let r = out.roles.entry(row.role).or_default();
            let bucket = match row.state.as_str() {
                "R" | "S" | "D" => row.state.clone(),
                _ => "other".to_string(),
            };
            *r.state_s.entry(bucket).or_default() += row.s;
            if row.state != "R" {
                let f = frames
                    .entry((row.role, row.state.clone(), row.frame.clone()))
                    .or_default();
                f.pids.extend(&row.pids);
                f.max_pids = f.max_pids.max(row.max_pids);
                f.s += row.s;
                f.wall_s += row.wall_s;
                for (name, n) in &row.syscalls {
                    *f.syscalls.entry(name.clone()).or_default() += n;
                }
            }
            if row.state == "D" {
                let st = stacks.entry(row.role).or_default();
                for (folded, n) in &row.stacks {
                    let e = st.entry(folded.clone()).or_default();
                    e.0 += n;
                    e.1 += *n as f64 * per_tick;
                }
            }
            if row.state != "R" {
                let w = wchans.entry(row.role).or_default();
                for (name, n) in &row.wchans {
                    *w.entry(name.clone()).or_default() += *n as f64 * per_tick;
                }
            }
        }
        for (pid, d) in &smp.procs {
            let role = role_of(*pid);
            role_pids.entry(role).or_default().insert(*pid);
            let r = out.roles.entry(role).or_default();
            r.cpu_s += d.cpu_s;
            r.runq_s += d.runq_s;
            r.read_bytes += d.read_bytes;
            r.write_bytes += d.write_bytes;
            r.vcsw += d.vcsw;
            r.nvcsw += d.nvcsw;
        }
    }
    let mut all_rows: Vec<FrameRow> = frames
        .into_iter()
        .map(|((role, state, frame), f)| {
            let mut sc: Vec<(String, u64)> = f.syscalls.into_iter().collect();
            sc.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            FrameRow {
                role,
                state,
                frame,
                pids: f.pids.len(),
                max_pids: f.max_pids,
                s: round_ms(f.s),
                wall_s: round_ms(f.wall_s),
                syscalls: sc.into_iter().map(|(n, _)| n).collect(),
            }
        })
        .collect();
    all_rows.sort_by(|a, b| b.s.total_cmp(&a.s));
    out.blocked = all_rows
        .iter()
        .filter(|r| r.state == "D" && r.role != Role::Observer)
        .take(TOP_BLOCKED)
        .cloned()
        .collect();
    for (role, r) in out.roles.iter_mut() {
        r.pids = role_pids.get(role).map_or(0, BTreeSet::len);
        r.cpu_s = round_us(r.cpu_s);
        r.runq_s = round_us(r.runq_s);
        for v in r.state_s.values_mut() {
            *v = round_ms(*v);
        }
        r.frames = all_rows
            .iter()
            .filter(|f| f.role == *role)
            .take(TOP_FRAMES)
            .cloned()
            .collect();
        let mut st: Vec<StackRow> = stacks
            .remove(role)
            .unwrap_or_default()
            .into_iter()
            .map(|(folded, (samples, s))| StackRow {
                frames: folded.rsplit(';').map(String::from).collect(),
                samples,
                s: round_ms(s),
            })
            .collect();
        st.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| a.frames.cmp(&b.frames))
        });
        st.truncate(TOP_STACKS);
        r.blocked_stacks = st;
        let mut w: Vec<WchanRow> = wchans
            .remove(role)
            .unwrap_or_default()
            .into_iter()
            .map(|(wchan, s)| WchanRow {
                wchan,
                s: round_ms(s),
            })
            .collect();
        w.sort_by(|a, b| b.s.total_cmp(&a.s));
        w.truncate(TOP_WCHANS);
        r.wchans = w;
    }
    out
}

/// Append the text rendering of the section to `out`.
pub fn render(s: &ProcfsSection, out: &mut String) {
    let _ = writeln!(
        out,
        "Process states (procfs, {} Hz, {:.1}–{:.1} s, {} rounds)",
        s.hz, s.window_s[0], s.window_s[1], s.ticks
    );
    if let Some(n) = &s.note {
        let _ = writeln!(out, "  note: {n}");
    }
    if s.roles.is_empty() {
        let _ = writeln!(out, "  no process samples");
        return;
    }
    let _ = writeln!(
        out,
        "  {:<28} {:>4} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9}",
        "role", "pids", "cpu s", "runq s", "R s", "S s", "D s", "other s", "read MB", "write MB"
    );
    let st = |r: &RoleProcfs, k: &str| r.state_s.get(k).copied().unwrap_or(0.0);
    for (role, r) in &s.roles {
        let _ = writeln!(
            out,
            "  {:<28} {:>4} {:>8.3} {:>7.3} {:>8.1} {:>8.1} {:>8.1} {:>7.1} {:>9.1} {:>9.1}",
            role.as_str(),
            r.pids,
            r.cpu_s,
            r.runq_s,
            st(r, "R"),
            st(r, "S"),
            st(r, "D"),
            st(r, "other"),
            r.read_bytes as f64 / 1e6,
            r.write_bytes as f64 / 1e6,
        );
    }
    let split: Vec<String> = s
        .roles
        .iter()
        .filter(|(_, r)| r.by_node.len() > 1)
        .map(|(role, r)| {
            let nodes: Vec<String> = r
                .by_node
                .iter()
                .map(|(n, x)| {
                    format!(
                        "{n} {} pid{} {:.3} s",
                        x.pids,
                        if x.pids == 1 { "" } else { "s" },
                        x.cpu_s
                    )
                })
                .collect();
            format!("    {:<26} {}", role.as_str(), nodes.join(" · "))
        })
        .collect();
    if !split.is_empty() {
        let _ = writeln!(out, "  CPU by node (roles on more than one server):");
        for l in split {
            let _ = writeln!(out, "{l}");
        }
    }
    if !s.blocked.is_empty() {
        let _ = writeln!(out, "  Blocked in D (uninterruptible):");
        for b in &s.blocked {
            let sc = if b.syscalls.is_empty() {
                String::new()
            } else {
                format!(" [{}]", b.syscalls.join(","))
            };
            let _ = writeln!(
                out,
                "    {} {} in D for {:.1} s ({:.1} process-s, up to {} at once) in {}{}",
                b.pids,
                plural(b.role, b.pids),
                b.wall_s,
                b.s,
                b.max_pids,
                or_unknown(&b.frame),
                sc
            );
        }
    }
    let any_stacks = s.roles.values().any(|r| !r.blocked_stacks.is_empty());
    if any_stacks {
        let _ = writeln!(out, "  Top kernel stacks while blocked (D):");
        for (role, r) in &s.roles {
            for st in &r.blocked_stacks {
                // The syscall entry frames are on every stack: not shown.
                let shown: Vec<&str> = st
                    .frames
                    .iter()
                    .map(String::as_str)
                    .filter(|f| !SYSCALL_ENTRY.contains(f))
                    .collect();
                let mut frames: Vec<&str> = shown.iter().take(STACK_DEPTH).copied().collect();
                if shown.len() > STACK_DEPTH {
                    frames.push("…");
                }
                let _ = writeln!(
                    out,
                    "    {:<28} {:>7.1} s  {}",
                    role.as_str(),
                    st.s,
                    frames.join(" ← ")
                );
            }
        }
    }
    let any_wchans = s.roles.values().any(|r| !r.wchans.is_empty());
    if any_wchans {
        let _ = writeln!(out, "  Top wait channels (process-s):");
        for (role, r) in &s.roles {
            let list: Vec<String> = r
                .wchans
                .iter()
                .map(|w| format!("{} {:.1}", w.wchan, w.s))
                .collect();
            if !list.is_empty() {
                let _ = writeln!(out, "    {:<28} {}", role.as_str(), list.join(", "));
            }
        }
    }
}

fn or_unknown(frame: &str) -> &str {
    if frame.is_empty() {
        "(unknown)"
    } else {
        frame
    }
}

fn plural(role: Role, n: usize) -> String {
    let name = role.as_str();
    if n == 1 {
        name.to_string()
    } else {
        match role {
            Role::Backend => "backends".into(),
            Role::Checkpointer => "checkpointers".into(),
            _ => format!("{name} processes"),
        }
    }
}

fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round_us(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::procfs::{ProcDelta, StateRow};

    fn row(
        role: Role,
        state: &str,
        frame: &str,
        pids: &[u32],
        samples: u64,
        stack: Option<&str>,
    ) -> StateRow {
        StateRow {
            role,
            state: state.into(),
            frame: frame.into(),
            samples,
            s: samples as f64 * 0.1,
            wall_s: (samples / pids.len() as u64) as f64 * 0.1,
            pids: pids.to_vec(),
            max_pids: pids.len() as u64,
            stacks: stack
                .map(|s| BTreeMap::from([(s.to_string(), samples)]))
                .unwrap_or_default(),
            wchans: if state == "R" {
                BTreeMap::new()
            } else {
                BTreeMap::from([(frame.to_string(), samples)])
            },
            syscalls: if state == "D" {
                BTreeMap::from([("fsync".to_string(), samples)])
            } else {
                BTreeMap::new()
            },
        }
    }

    fn samples() -> Vec<ProcfsSample> {
        let stack = "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_fsync;do_fsync;ext4_sync_file;jbd2_log_wait_commit";
        (1..=9)
            .map(|i| ProcfsSample {
                t: i as f64,
                dt: 1.0,
                hz: 10.0,
                ticks: 10,
                stack_reads: 40,
                rows: vec![
                    row(
                        Role::Backend,
                        "D",
                        "jbd2_log_wait_commit",
                        &[11, 12, 13, 14],
                        40,
                        Some(stack),
                    ),
                    row(Role::Checkpointer, "R", "", &[20], 5, None),
                    row(Role::Checkpointer, "S", "do_epoll_wait", &[20], 5, None),
                ],
                procs: BTreeMap::from([
                    (
                        11,
                        ProcDelta {
                            cpu_s: 0.01,
                            write_bytes: 8192,
                            vcsw: 10,
                            ..Default::default()
                        },
                    ),
                    (
                        20,
                        ProcDelta {
                            cpu_s: 0.5,
                            ..Default::default()
                        },
                    ),
                ]),
            })
            .collect()
    }

    #[test]
    fn four_backends_in_d_for_nine_seconds_is_one_row() {
        let s = summarize(&samples(), |pid| {
            if pid == 20 {
                Role::Checkpointer
            } else {
                Role::Backend
            }
        });
        assert_eq!(s.window_s, [0.0, 9.0]);
        assert_eq!(s.ticks, 90);
        let b = &s.blocked[0];
        assert_eq!(
            (b.role, b.pids, b.wall_s, b.s),
            (Role::Backend, 4, 9.0, 36.0)
        );
        assert_eq!(b.frame, "jbd2_log_wait_commit");
        assert_eq!(b.syscalls, ["fsync"]);
        let be = &s.roles[&Role::Backend];
        assert_eq!(be.pids, 4);
        assert_eq!(be.state_s["D"], 36.0);
        assert_eq!(be.cpu_s, 0.09);
        assert_eq!(be.write_bytes, 9 * 8192);
        assert_eq!(be.blocked_stacks[0].frames[0], "jbd2_log_wait_commit");
        assert_eq!(be.blocked_stacks[0].s, 36.0);
        let ck = &s.roles[&Role::Checkpointer];
        assert_eq!((ck.state_s["R"], ck.state_s["S"]), (4.5, 4.5));
        assert_eq!(ck.cpu_s, 4.5);
        assert_eq!(ck.wchans[0].wchan, "do_epoll_wait");
        let mut text = String::new();
        render(&s, &mut text);
        assert!(
            text.contains(
                "4 backends in D for 9.0 s (36.0 process-s, up to 4 at once) in jbd2_log_wait_commit [fsync]"
            ),
            "{text}"
        );
        assert!(
            text.contains("jbd2_log_wait_commit ← ext4_sync_file ← do_fsync"),
            "{text}"
        );
        // It round-trips through report.json.
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ProcfsSection>(&j).unwrap(), s);
    }

    #[test]
    fn empty_input_gives_an_empty_section() {
        let s = summarize(&[], |_| Role::Other);
        assert!(s.roles.is_empty() && s.blocked.is_empty());
        let mut text = String::new();
        render(&s, &mut text);
        assert!(text.contains("no process samples"));
    }

    // A real primary + standby recording (drop-many on 13): roles on both
    // servers are split per node, and the split adds up to the role's CPU.
    #[test]
    fn roles_on_several_servers_are_split_per_node() {
        let rec = crate::analyse::fixture("pg13-drop-many-sweep");
        let s = build(&rec).unwrap();
        let ckpt = &s.roles[&Role::Checkpointer];
        assert_eq!(
            ckpt.by_node.keys().collect::<Vec<_>>(),
            ["primary", "standby1"],
            "{ckpt:?}"
        );
        assert!(ckpt.by_node.values().all(|n| n.pids == 1));
        for r in s.roles.values().filter(|r| !r.by_node.is_empty()) {
            let sum: f64 = r.by_node.values().map(|n| n.cpu_s).sum();
            assert!((sum - r.cpu_s).abs() < 0.01, "{sum} vs {}", r.cpu_s);
        }
        let startup = &s.roles[&Role::Startup];
        assert_eq!(startup.by_node.keys().collect::<Vec<_>>(), ["standby1"]);
        let mut text = String::new();
        render(&s, &mut text);
        assert!(text.contains("CPU by node"), "{text}");
        assert!(text.contains("primary 1 pid"), "{text}");
        // One server: no split.
        let one = build(&crate::analyse::fixture("pg15-checkpoint-stall")).unwrap();
        assert!(one.roles.values().all(|r| r.by_node.is_empty()));
    }
}
