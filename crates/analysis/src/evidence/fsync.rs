//! Flush latency in the kernel (the fsync collector): per role and system
//! call, the calls and their log2 µs histogram, with percentiles read from
//! it. Reads `fsync.json`.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::recording::schema::fsync::{Summary, BUCKETS, FILE};
use crate::round3;

/// Calls of one role in one system call, histograms summed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleFlushes {
    pub role: String,
    pub syscall: String,
    pub pids: usize,
    pub count: u64,
    pub errors: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Calls per log2 µs bucket: `[0]` < 2 µs, `[i]` in [2^i, 2^(i+1)) µs.
    pub buckets: Vec<u64>,
}

/// What the report shows and the rules read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FsyncSection {
    pub mechanism: String,
    pub duration_s: f64,
    pub bpf_run_s: f64,
    pub bpf_runs: u64,
    pub lost: u64,
    /// By role, then system call.
    pub roles: Vec<RoleFlushes>,
}

/// Bucket `i`'s bounds in µs.
pub fn bucket_bounds_us(i: usize) -> (f64, f64) {
    let lo = if i == 0 { 0.0 } else { (1u64 << i) as f64 };
    (lo, (1u64 << (i + 1)) as f64)
}

/// The `q` quantile in ms, linear inside its bucket; capped at `max_ms`.
pub fn quantile_ms(buckets: &[u64], q: f64, max_ms: f64) -> f64 {
    let total = buckets.iter().fold(0u64, |a, n| a.saturating_add(*n));
    if total == 0 {
        return 0.0;
    }
    let want = (q * total as f64).max(1.0);
    let mut seen = 0.0;
    for (i, &n) in buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if seen + n as f64 >= want {
            let (lo, hi) = bucket_bounds_us(i);
            let us = lo + (hi - lo) * (want - seen) / n as f64;
            return (us / 1e3).min(max_ms.max(lo / 1e3));
        }
        seen += n as f64;
    }
    max_ms
}

impl FsyncSection {
    pub fn from_summary(s: &Summary) -> FsyncSection {
        // pids, count, errors, sum µs, max µs, buckets
        type Acc = (usize, u64, u64, u64, u64, Vec<u64>);
        let mut by: BTreeMap<(&str, &str), Acc> = BTreeMap::new();
        for c in &s.calls {
            let e = by.entry((&c.role, &c.syscall)).or_default();
            e.0 += 1;
            // Saturating: a damaged file may hold any numbers.
            e.1 = e.1.saturating_add(c.count);
            e.2 = e.2.saturating_add(c.errors);
            e.3 = e.3.saturating_add(c.sum_us);
            e.4 = e.4.max(c.max_us);
            // And any length: at most BUCKETS.
            for (i, &n) in c.buckets.iter().take(BUCKETS).enumerate() {
                if e.5.len() <= i {
                    e.5.resize(i + 1, 0);
                }
                e.5[i] = e.5[i].saturating_add(n);
            }
        }
        let roles = by
            .into_iter()
            .map(
                |((role, syscall), (pids, count, errors, sum, max, buckets))| {
                    let max_ms = max as f64 / 1e3;
                    RoleFlushes {
                        role: role.to_string(),
                        syscall: syscall.to_string(),
                        pids,
                        count,
                        errors,
                        mean_ms: round3(sum as f64 / 1e3 / count.max(1) as f64),
                        p50_ms: round3(quantile_ms(&buckets, 0.5, max_ms)),
                        p99_ms: round3(quantile_ms(&buckets, 0.99, max_ms)),
                        max_ms: round3(max_ms),
                        buckets,
                    }
                },
            )
            .collect();
        FsyncSection {
            mechanism: s.mechanism.clone(),
            duration_s: s.duration_s,
            bpf_run_s: s.bpf_run_s,
            bpf_runs: s.bpf_runs,
            lost: s.lost,
            roles,
        }
    }

    /// The flushes of `roles` in `syscalls`, merged into one row.
    pub fn merged(&self, roles: &[&str], syscalls: &[&str]) -> Option<RoleFlushes> {
        let rows: Vec<&RoleFlushes> = self
            .roles
            .iter()
            .filter(|r| roles.contains(&r.role.as_str()) && syscalls.contains(&r.syscall.as_str()))
            .collect();
        let count = rows.iter().fold(0u64, |a, r| a.saturating_add(r.count));
        if count == 0 {
            return None;
        }
        let mut buckets = vec![0u64; rows.iter().map(|r| r.buckets.len()).max().unwrap_or(0)];
        for r in &rows {
            for (i, n) in r.buckets.iter().enumerate() {
                buckets[i] = buckets[i].saturating_add(*n);
            }
        }
        let max_ms = rows.iter().map(|r| r.max_ms).fold(0.0, f64::max);
        let sum_ms: f64 = rows.iter().map(|r| r.mean_ms * r.count as f64).sum();
        Some(RoleFlushes {
            role: roles.join("+"),
            syscall: syscalls.join("+"),
            pids: rows.iter().map(|r| r.pids).sum(),
            count,
            errors: rows.iter().fold(0u64, |a, r| a.saturating_add(r.errors)),
            mean_ms: round3(sum_ms / count as f64),
            p50_ms: round3(quantile_ms(&buckets, 0.5, max_ms)),
            p99_ms: round3(quantile_ms(&buckets, 0.99, max_ms)),
            max_ms,
            buckets,
        })
    }
}

pub fn load(dir: &std::path::Path, notes: &mut Vec<String>) -> Option<FsyncSection> {
    let s: Summary = super::json_file(dir, FILE, notes)?;
    Some(FsyncSection::from_summary(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_fall_in_their_bucket() {
        // 90 calls in [1, 2) ms (bucket 10: 1024–2048 µs), 10 in [16, 32) ms.
        let mut b = vec![0u64; 15];
        b[10] = 90;
        b[14] = 10;
        let p50 = quantile_ms(&b, 0.5, 30.0);
        assert!((1.024..2.048).contains(&p50), "{p50}");
        let p99 = quantile_ms(&b, 0.99, 30.0);
        assert!((16.384..=30.0).contains(&p99), "{p99}");
        // Never above the measured maximum.
        assert!(quantile_ms(&b, 0.99, 20.0) <= 20.0);
        assert_eq!(quantile_ms(&[], 0.5, 1.0), 0.0);
    }

    /// A real lab run (pg_wal on a 1 MB/s device, PostgreSQL 15.18): the
    /// section's rows from `fsync.json`, percentiles inside their buckets.
    #[test]
    fn reads_a_real_recording() {
        let ev = crate::analyse::fixture("pg15-wal-slow-fsync");
        let f = ev.fsync.as_ref().unwrap();
        let b = f
            .roles
            .iter()
            .find(|r| r.role == "backend" && r.syscall == "fdatasync")
            .unwrap();
        assert_eq!((b.pids, b.count), (4, 773));
        assert_eq!(b.buckets.iter().sum::<u64>(), b.count);
        assert!(b.p50_ms < b.p99_ms && b.p99_ms <= b.max_ms, "{b:?}");
        let m = f.merged(&["backend", "walwriter"], &["fdatasync"]).unwrap();
        assert_eq!(m.count, 777);
        assert!(m.p50_ms > 4.0 && m.p50_ms < 8.2, "{m:?}");
    }
}
