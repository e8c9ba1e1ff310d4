//! The profile section as text (the model is in `crate::evidence::profile`).
use std::fmt::Write as _;

pub use crate::evidence::profile::*;

/// The text rendering.
pub fn render(s: &ProfileSection, out: &mut String) {
    let _ = writeln!(
        out,
        "On-CPU profile: {} samples of the cluster's processes in {:.1} s at {} Hz, {} lost; {:.0}% of user frames unresolved, {:.0}% of stacks unwound to main",
        s.samples,
        s.duration_s,
        s.hz,
        s.lost,
        s.unresolved_share * 100.0,
        s.rooted_share * 100.0
    );
    let _ = writeln!(out, "  how: {}", s.mechanism);
    if let Some(f) = &s.flamegraph {
        let _ = writeln!(out, "  flame graph: {f}  (folded stacks: {})", s.folded);
    }
    for n in &s.notes {
        let _ = writeln!(out, "  ! {n}");
    }
    for r in &s.roles {
        let _ = writeln!(
            out,
            "\n  {}: {} samples ({:.0}%), {} process{}, {:.0}% of user frames unresolved{}",
            r.role,
            r.samples,
            r.share * 100.0,
            r.pids,
            if r.pids == 1 { "" } else { "es" },
            r.unresolved_share * 100.0,
            r.flamegraph
                .as_ref()
                .map_or(String::new(), |f| format!("; flame graph {f}"))
        );
        let rows = |title: &str, rows: &[FrameRow], out: &mut String| {
            let _ = writeln!(out, "    {title}");
            for row in rows {
                let _ = writeln!(
                    out,
                    "      {:>5.1}%  {:>7}  {}",
                    row.share * 100.0,
                    row.samples,
                    row.name
                );
            }
        };
        if !r.common_root.is_empty() {
            let _ = writeln!(
                out,
                "    common root ({:.0}% of samples): {}",
                r.common_root_share * 100.0,
                r.common_root.join(" → ")
            );
        }
        rows(
            "on the stack (inclusive, below the common root):",
            &r.top_functions,
            out,
        );
        rows("on the CPU (leaf frames):", &r.top_leaves, out);
        let _ = writeln!(out, "    top stacks (leaf ← callers):");
        for st in &r.top_stacks {
            let shown = super::leaf_first(&st.frames, STACK_FRAMES_SHOWN);
            let _ = writeln!(
                out,
                "      {:>5.1}%  {:>7}  {}",
                st.share * 100.0,
                st.samples,
                shown
            );
        }
    }
}

/// Frames shown of a stack in the text report, leaf first.
pub(crate) const STACK_FRAMES_SHOWN: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::schema::profile::RoleSummary;
    use crate::recording::schema::profile::Summary;

    const FOLDED: &str = "\
backend;main;PostmasterMain;PostgresMain;exec_bind_message;hash_search 3
backend;main;PostmasterMain;PostgresMain;exec_execute_message;ExecScan 5
backend;main;PostmasterMain;PostgresMain;__libc_recv;entry_SYSCALL_64_[k];tcp_recvmsg_[k] 2
walwriter;main;WalWriterMain;[postgres+0x1a2b] 1
bad line
";

    #[test]
    fn folded_parses_and_ranks() {
        let stacks = parse_folded(FOLDED);
        assert_eq!(stacks.len(), 4);
        let summary = Summary {
            samples: 11,
            hz: 99,
            folded: "profile.folded".into(),
            roles: vec![RoleSummary {
                role: "backend".into(),
                pids: 1,
                samples: 10,
                user_frames: 45,
                unresolved_user_frames: 0,
                flamegraph: Some("flamegraph-backend.svg".into()),
            }],
            ..Default::default()
        };
        let s = from_parts(&summary, &stacks);
        assert_eq!(s.roles[0].role, "backend");
        assert_eq!(s.roles[0].samples, 10);
        assert_eq!(
            s.roles[0].common_root,
            vec!["main", "PostmasterMain", "PostgresMain"]
        );
        assert_eq!(s.roles[0].common_root_share, 1.0);
        // Ties rank by name.
        let top: Vec<(&str, f64)> = s.roles[0]
            .top_functions
            .iter()
            .map(|r| (r.name.as_str(), r.share))
            .collect();
        assert_eq!(top[..2], [("ExecScan", 0.5), ("exec_execute_message", 0.5)]);
        assert_eq!(s.roles[0].top_leaves[0].name, "ExecScan");
        assert_eq!(s.roles[0].top_stacks[0].samples, 5);
        assert_eq!(s.roles[1].role, "walwriter");
        let mut text = String::new();
        render(&s, &mut text);
        assert!(
            text.contains("ExecScan ← exec_execute_message ← PostgresMain"),
            "{text}"
        );
        assert!(
            text.contains("flame graph flamegraph-backend.svg"),
            "{text}"
        );
        assert!(
            text.contains("common root (100% of samples): main → PostmasterMain → PostgresMain"),
            "{text}"
        );
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ProfileSection>(&json).unwrap(), s);
    }
}
