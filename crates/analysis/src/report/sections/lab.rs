//! The lab scenarios' own summaries as text (the data is in
//! `crate::recording::summaries`).
use crate::recording::summaries::{DropSummary, DropSweep, Fit, Sweep};

/// The sweep as a text table (the seed's layout).
pub fn render_syncrep_sweep(s: &Sweep, o: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "\nsynchronous_commit sweep ({} clients, one INSERT per commit{})",
        s.clients,
        s.sync
            .as_deref()
            .map(|x| format!(", standbys: {x}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        o,
        "  {:<14} {:>10} {:>12} {:>8}",
        "level", "tps", "latency ms", "vs off"
    );
    let off = s
        .levels
        .iter()
        .find(|l| l.synchronous_commit == "off")
        .map(|l| l.tps);
    for l in &s.levels {
        let rel = match off {
            Some(b) if b > 0.0 => format!("{:.2}", l.tps / b),
            _ => "-".into(),
        };
        let lat = l
            .latency_avg_ms
            .map_or("-".to_string(), |x| format!("{x:.3}"));
        let _ = writeln!(
            o,
            "  {:<14} {:>10.1} {:>12} {:>8}",
            l.synchronous_commit, l.tps, lat, rel
        );
    }
}
/// The drop-many result as text: ms per DROP, the baseline, the lag.
pub fn render_drop_many(d: &DropSummary, o: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "\ndrop-many ({} DROPs of {} tables, {}, synchronous_commit={})",
        d.drops,
        if d.empty { "empty" } else { "one-row" },
        if d.one_transaction {
            "one transaction"
        } else {
            "one per transaction"
        },
        d.synchronous_commit
    );
    let _ = writeln!(
        o,
        "  ms per DROP: mean {:.3}, median {:.3}, p90 {:.3}; primary-only (local) median {:.3} ({} drops)",
        d.ms_per_drop, d.ms_per_drop_median, d.ms_per_drop_p90, d.baseline_ms_per_drop, d.baseline_drops
    );
    if let Some(l) = &d.replay_lag {
        let ms = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1} ms"));
        let bytes = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.0} B"));
        let _ = writeln!(
            o,
            "  replay lag (pg_stat_replication, {} samples at {} Hz): replay_lag max {}, mean {}; \
             write-replay max {}, mean {}",
            l.samples,
            l.hz,
            ms(l.replay_lag_ms_max),
            ms(l.replay_lag_ms_mean),
            bytes(l.lag_bytes_max.map(|b| b as f64)),
            bytes(l.lag_bytes_mean),
        );
    }
}
/// The sweep as a text table, then the fits in words.
pub fn render_drop_sweep(s: &DropSweep, o: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        o,
        "\ndrop-many sweep ({} tables, {}, synchronous_commit={})",
        if s.empty { "empty" } else { "one-row" },
        if s.one_transaction {
            "all drops in one transaction"
        } else {
            "one DROP per transaction"
        },
        s.synchronous_commit
    );
    let _ = writeln!(
        o,
        "  {:>7} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>10}",
        "tables",
        "standby sb",
        "ms/drop",
        "base ms",
        "replay ms",
        "startup ms",
        "startup ms",
        "max lag"
    );
    let _ = writeln!(
        o,
        "  {:>7} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>10}",
        "", "", "(client)", "(local)", "per drop", "CPU/drop", "CPU total", "ms"
    );
    for p in &s.points {
        let lag = p
            .replay_lag
            .as_ref()
            .and_then(|l| l.replay_lag_ms_max)
            .map_or("-".to_string(), |x| format!("{x:.1}"));
        let _ = writeln!(
            o,
            "  {:>7} {:>10} {:>10.3} {:>10.3} {:>10.3} {:>11.3} {:>11.1} {:>10}",
            p.tables,
            p.standby_shared_buffers,
            p.ms_per_drop,
            p.baseline_ms_per_drop,
            p.replay_ms_per_drop,
            p.startup_cpu_ms_per_drop,
            p.startup_cpu_ms_total,
            lag
        );
    }
    let line = |o: &mut String, f: &Fit| {
        let _ = writeln!(
            o,
            "  {} vs {} at {}: exponent {:.2} ({}, {} points)",
            f.y, f.x, f.fixed, f.exponent, f.growth, f.points
        );
    };
    if !s.vs_tables.is_empty() || !s.vs_shared_buffers.is_empty() {
        let _ = writeln!(o, "  growth (least squares on log-log; y ∝ x^exponent):");
    }
    for f in s.vs_tables.iter().chain(&s.vs_shared_buffers) {
        line(o, f);
    }
    let _ = writeln!(o, "  {}", s.summary);
}
