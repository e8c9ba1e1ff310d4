//! The off-CPU section as text (the model is in `crate::evidence::offcpu`).
use std::fmt::Write as _;

pub use crate::evidence::offcpu::*;

/// The text rendering.
pub fn render(s: &OffcpuSection, out: &mut String) {
    let _ = writeln!(
        out,
        "\nOff-CPU time: {} blocks of at least {} ms in {:.1} s; {:.0}% with a user stack; BPF ran {:.3} s ({:.2}% of one CPU), reader {:.3} s CPU",
        s.blocks,
        s.min_block_ms,
        s.duration_s,
        s.user_stack_share * 100.0,
        s.bpf_run_s,
        s.bpf_cpu_share * 100.0,
        s.reader_cpu_s
    );
    let _ = writeln!(out, "  how: {}", s.mechanism);
    let _ = writeln!(out, "  folded stacks (µs): {}", s.folded);
    for n in &s.notes {
        let _ = writeln!(out, "  ! {n}");
    }
    for r in &s.roles {
        let get = |k: &str| r.off_cpu_s.get(k).copied().unwrap_or(0.0);
        let _ = writeln!(
            out,
            "\n  {}: {} process{},{} off the CPU D {:.3} s, S {:.3} s, runq {:.3} s{}",
            r.role,
            r.pids,
            if r.pids == 1 { "" } else { "es" },
            r.on_cpu_s
                .map_or(String::new(), |s| format!(" on the CPU {s:.3} s,")),
            get("D"),
            get("S"),
            get("runq"),
            r.flamegraph
                .as_ref()
                .map_or(String::new(), |f| format!("; flame graph {f}"))
        );
        for st in &r.top_stacks {
            let shown = super::leaf_first(&st.frames, super::profile::STACK_FRAMES_SHOWN);
            let _ = writeln!(
                out,
                "    {:>4} {:>8.3} s {:>5.1}%  {}",
                st.state,
                st.seconds,
                st.share * 100.0,
                shown
            );
        }
    }
}
