//! The procfs section as text (the model is in `crate::evidence::procfs`).
use std::fmt::Write as _;

pub use crate::evidence::procfs::*;
use crate::role::Role;

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
        "  {:<28} {:>4} {:>8} {:>7} {:>8} {:>8} {:>8} {:>7} {:>9} {:>10}",
        "role", "pids", "cpu s", "runq s", "R s", "S s", "D s", "other s", "read MB", "write() MB"
    );
    let st = |r: &RoleProcfs, k: &str| r.state_s.get(k).copied().unwrap_or(0.0);
    let mb = |b: Option<u64>| b.map_or("—".to_string(), |b| format!("{:.1}", b as f64 / 1e6));
    for (role, r) in &s.roles {
        // The postmaster's /proc/PID/io adds every child it reaped: its
        // figures would count the backends' I/O a second time.
        let reaps = *role == Role::Postmaster;
        let _ = writeln!(
            out,
            "  {:<28} {:>4} {:>8.3} {:>7.3} {:>8.1} {:>8.1} {:>8.1} {:>7.1} {:>9} {:>10}",
            role.as_str(),
            r.pids,
            r.cpu_s,
            r.runq_s,
            st(r, "R"),
            st(r, "S"),
            st(r, "D"),
            st(r, "other"),
            mb(Some(r.read_bytes).filter(|_| !reaps)),
            mb(r.written_bytes.filter(|_| !reaps)),
        );
    }
    if let Some(x) = s.exited_cpu_s {
        let runq = s
            .exited_runq_s
            .map_or("—".to_string(), |r| format!("{r:.3}"));
        let _ = writeln!(
            out,
            "  {:<28} {:>4} {x:>8.3} {runq:>7}   (children that lived between two reads: CPU from \
             the postmaster's count of those it reaped{})",
            "exited unread",
            "—",
            if s.exited_runq_s.is_some() {
                ", run queue from the kernel's count at each exit"
            } else {
                "; their run-queue wait was not measured (no BPF)"
            }
        );
    }
    // /proc/PID/io write_bytes is accounted when a page cache folio turns
    // dirty, its whole size: measured on 6.18/ext4, 200 writes of 8 kB
    // into a cached file counted 38.6 MB against 1.6 MB written.
    let _ = writeln!(
        out,
        "  read MB: bytes read from storage (/proc/PID/io read_bytes); write() MB: bytes passed \
         to write calls (wchar: files, sockets, pipes); the postmaster's are not shown (its \
         /proc/PID/io adds the I/O of every child it reaped). What the machine wrote out to its \
         devices is the system section's pgpgout (/proc/vmstat)"
    );
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

/// Frames shown per stack in the text report (innermost first).
pub(crate) const STACK_DEPTH: usize = 12;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::schema::procfs::ProcfsSample;
    use crate::recording::schema::procfs::{ProcDelta, StateRow};
    use std::collections::BTreeMap;

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
                wchar: true,
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
                            written_bytes: 4096,
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
                mem: BTreeMap::new(),
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
        assert_eq!(be.written_bytes, Some(9 * 4096));
        // Read and wrote nothing: 0, not "not measured".
        assert_eq!(s.roles[&Role::Checkpointer].written_bytes, Some(0));
        // A recording made before wchar was read says nothing of it.
        let old: Vec<ProcfsSample> = samples()
            .into_iter()
            .map(|mut x| {
                x.wchar = false;
                x
            })
            .collect();
        let o = summarize(&old, |_| Role::Backend);
        assert_eq!(o.roles[&Role::Backend].written_bytes, None);
        let mut text = String::new();
        render(&o, &mut text);
        assert!(text.contains("write() MB"), "{text}");
        assert!(!text.contains("dirtied"), "{text}");
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

    /// The postmaster's `exited_cpu_s` (backends that lived between two
    /// reads) is summed apart from the roles' own CPU and printed as a row.
    #[test]
    fn children_that_exited_unread_are_a_row_of_their_own() {
        let role = |pid: u32| match pid {
            1 => Role::Postmaster,
            20 => Role::Checkpointer,
            _ => Role::Backend,
        };
        assert_eq!(summarize(&samples(), role).exited_cpu_s, None);
        let mut smp = samples();
        for (i, x) in [(0, 1.25), (3, 0.5)] {
            smp[i].procs.insert(
                1,
                ProcDelta {
                    cpu_s: 0.01,
                    exited_cpu_s: x,
                    ..Default::default()
                },
            );
        }
        let s = summarize(&smp, role);
        assert_eq!(s.exited_cpu_s, Some(1.75));
        assert_eq!(s.roles[&Role::Postmaster].cpu_s, 0.02);
        let mut out = String::new();
        render(&s, &mut out);
        assert!(
            out.lines()
                .any(|l| l.starts_with("  exited unread") && l.contains(" 1.750 ")),
            "{out}"
        );
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
