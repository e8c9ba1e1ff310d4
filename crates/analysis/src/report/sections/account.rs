//! The account of time as text: the backends' slices as a table (with
//! what measured each and its largest stacks or waits), the other roles a
//! line each.
use std::fmt::Write;

pub use crate::evidence::account::{Account, Point, RoleAccount, Slice, Top};
use crate::role::Role;

/// A slice's name for a reader.
pub fn label(key: &str) -> String {
    match key {
        "cpu" => "on CPU".into(),
        "runq" => "run queue (runnable, no CPU)".into(),
        "S" => "sleeping (S)".into(),
        "S:idle" => "idle".into(),
        "other" => "stopped, zombie".into(),
        k => match k.split_once(':') {
            Some(("D", c)) => format!("blocked (D): {c}"),
            Some(("S", t)) => format!("waiting (S): {t}"),
            _ => k.into(),
        },
    }
}

/// A slice's parts (the on-CPU slice as the profile split it), largest
/// first: name, seconds, share of the role's whole.
pub fn parts(s: &Slice) -> Vec<(String, f64, f64)> {
    let mut v: Vec<(String, f64, f64)> = s
        .parts
        .iter()
        .map(|(k, x)| {
            let share = if s.s > 0.0 { s.share * x / s.s } else { 0.0 };
            (k.replace(':', ": "), *x, share)
        })
        .collect();
    v.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    v
}

fn pct(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

fn row(s: &Slice, busy: Option<f64>, o: &mut String) {
    let of_busy = match busy {
        Some(b) if b > 0.0 && s.key != "S:idle" => pct(s.s / b),
        _ => "—".into(),
    };
    let top = s
        .top
        .first()
        .map_or(String::new(), |t| format!("  {}", t.what));
    let _ = writeln!(
        o,
        "  {:<34} {:>9.1} s {:>5} {:>6}{top}",
        label(&s.key),
        s.s,
        pct(s.share),
        of_busy
    );
    for (name, v, share) in parts(s) {
        let of_busy = match busy {
            Some(b) if b > 0.0 => pct(v / b),
            _ => "—".into(),
        };
        let _ = writeln!(
            o,
            "    {:<32} {:>9.1} s {:>5} {:>6}",
            name,
            v,
            pct(share),
            of_busy
        );
    }
}

fn others_line(r: &RoleAccount, o: &mut String) {
    let mut v: Vec<&Slice> = r.slices.iter().filter(|s| s.share >= 0.01).collect();
    v.sort_by(|a, b| b.s.total_cmp(&a.s));
    let parts: Vec<String> = v
        .iter()
        .take(4)
        .map(|s| format!("{} {}", label(&s.key), pct(s.share)))
        .collect();
    let _ = writeln!(
        o,
        "  {} ({}, {:.1} s): {}",
        r.role.as_str(),
        r.processes,
        r.total_s,
        parts.join(", ")
    );
}

/// The machine's PSI under the backends' slices: the kernel's word on
/// the time lost to waiting, whoever waited.
fn pressure_line(p: &crate::evidence::system::PressureShares, o: &mut String) {
    let pct = |some: Option<f64>, full: Option<f64>| match (some, full) {
        (Some(s), Some(f)) => format!("{:.1} % (all tasks {:.1} %)", s * 100.0, f * 100.0),
        (Some(s), None) => format!("{:.1} %", s * 100.0),
        _ => "not told".into(),
    };
    let _ = writeln!(
        o,
        "  the machine's pressure (PSI, {:.0} s): some task waited for a CPU {}, for memory {}, \
         for I/O {} of the time",
        p.covered_s,
        pct(p.cpu_some, p.cpu_full),
        pct(p.memory_some, p.memory_full),
        pct(p.io_some, p.io_full),
    );
}

pub fn render(a: &Account, o: &mut String) {
    let Some(b) = a.role(Role::Backend) else {
        if let Some(why) = &a.backends_unread {
            let _ = writeln!(o, "\nWhere the backends' time went: not measured — {why}");
            if let Some(p) = &a.pressure {
                pressure_line(p, o);
            }
        }
        return;
    };
    let busy = b
        .busy_s
        .map_or("busy time not told apart from idle".into(), |s| {
            format!("{s:.1} s busy")
        });
    let _ = writeln!(
        o,
        "\nWhere the backends' time went ({} process{}, {:.1} process-seconds, {busy}; \
         states at {:.0} Hz, on CPU and run queue counted exactly{})",
        b.processes,
        if b.processes == 1 { "" } else { "es" },
        b.total_s,
        a.hz,
        a.waits_hz.map_or(String::new(), |h| format!(
            ", sleep split by pg_stat_activity at {h:.1} looks/s"
        ))
    );
    if let Some(why) = &a.backends_unread {
        let head = if a.incomplete() {
            "incomplete"
        } else {
            "left out"
        };
        let _ = writeln!(o, "  {head}: {why}");
    }
    let _ = writeln!(
        o,
        "  {:<34} {:>11} {:>5} {:>6}  largest stack or wait",
        "", "", "all", "busy"
    );
    let mut slices: Vec<&Slice> = b.slices.iter().collect();
    slices.sort_by(|x, y| y.s.total_cmp(&x.s).then_with(|| x.key.cmp(&y.key)));
    for s in slices {
        row(s, b.busy_s, o);
    }
    if let Some(p) = &a.pressure {
        pressure_line(p, o);
    }
    let others: Vec<&RoleAccount> = a.roles.iter().filter(|r| r.role != Role::Backend).collect();
    if !others.is_empty() {
        let _ = writeln!(o, "  other roles:");
        for r in others {
            let _ = write!(o, "  ");
            others_line(r, o);
        }
    }
}
