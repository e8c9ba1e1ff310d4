//! `aio-workers-saturated`: 4 pgbench clients each fetching 200 random
//! rows of pgbench_accounts by a bitmap heap scan (scale 10,
//! shared_buffers=16MB) on PostgreSQL 18 with `io_method=worker` and one
//! I/O worker, every read of a data file reaching the disk
//! (`debug_io_direct=data`: O_DIRECT, no page cache, as a working set far
//! larger than memory would be). A bitmap heap scan reads through a read
//! stream: 18 hands its reads to the I/O workers (up to
//! effective_io_concurrency ahead) and the backend waits in
//! `IO:AioIoCompletion`; one worker executes the four backends' reads one
//! after the other, so they queue behind it. (A plain index scan's
//! single-block reads stay in the backend, `IO:DataFileRead`: pgbench -S
//! does not queue.) `--io-workers 8` runs the same workload with enough
//! workers (the healthy baseline); `--set io_method=sync` another.
//!
//! Measured here (2 vCPUs, ext4 on virtio, 18.4, psql/pgbench by hand):
//! 14–15 transactions a second with one worker, 51 with eight, 43 with
//! io_method=sync.
//!
//! No host state changes: the worker count is a server setting
//! (`io_workers`, changeable on reload in 18). Before 18 there are no I/O
//! workers and the run is the plain cold-read workload (the rule says the
//! case does not apply); before 16 there is no `debug_io_direct` and the
//! reads are served from the page cache.
use anyhow::Result;

use super::spec::{count_in, Flag};
use super::{LabOptions, Scenario, Spec};
use crate::workload::Plan;

/// One worker: the saturated side. (PostgreSQL's default is 3.)
pub const DEFAULT_IO_WORKERS: u32 = 1;
pub const DEFAULT_CLIENTS: u32 = 4;
/// 200 random rows by a bitmap heap scan: ~200 single-block reads through
/// a read stream per transaction (index scans are off for the session so
/// the planner takes the bitmap; 18's index scans read synchronously).
const SCRIPT: &str = "set enable_indexscan = off;\n\
select sum(abalance) from pgbench_accounts \
where aid = any(array(select (random() * 999999 + 1)::int from generate_series(1, 200)));\n";
pub const DEFAULT_DURATION_S: u32 = 20;
/// Small enough that the scale-10 tables (≈ 160 MB) are read from disk.
const SETTINGS: &[(&str, &str)] = &[("shared_buffers", "16MB")];

fn parse_io_workers(s: &str) -> Result<String, String> {
    count_in(s, 1, 32)
}

static IO_WORKERS: Flag = Flag::value(
    "io-workers",
    "N",
    "aio-workers-saturated: I/O workers of PostgreSQL 18's io_method=worker (default 1; 8: \
     enough for the 4 clients, the healthy baseline)",
    parse_io_workers,
);

pub struct AioWorkersSaturated;

static SPEC: Spec = Spec {
    name: "aio-workers-saturated",
    finding: Some("aio-workers-saturated"),
    description: "PostgreSQL 18 (--pg 18): 4 pgbench clients each fetching 200 random rows by a \
                  bitmap heap scan, 20 s, scale 10, shared_buffers=16MB, every data file read \
                  going to the disk (debug_io_direct=data) and io_method=worker with \
                  io_workers=1: the backends' reads queue behind the one busy I/O worker in \
                  IO:AioIoCompletion. \
                  --io-workers N sets the workers (8: the healthy baseline); --set \
                  io_method=sync another baseline. Before 18 the case does not exist",
    pgbench: Some(Plan {
        name: "aio-workers-saturated",
        args: &[],
        script: Some(SCRIPT),
    }),
    init: true,
    statements_per_transaction: 2,
    clients: DEFAULT_CLIENTS,
    duration_s: DEFAULT_DURATION_S,
    flags: &[&IO_WORKERS],
    ..Spec::BASE
};

impl Scenario for AioWorkersSaturated {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    /// The settings the server version has: direct reads from 16, the
    /// worker count from 18 (io_workers is unknown before and would stop
    /// the server from starting; 19 sizes a pool instead).
    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        let major = opts.pg.install(&|_| {})?.major;
        let workers = opts
            .params
            .get::<u32>("io-workers")
            .unwrap_or(DEFAULT_IO_WORKERS)
            .to_string();
        let mut settings: Vec<(&str, &str)> = SETTINGS.to_vec();
        if major >= 16 {
            settings.push(("debug_io_direct", "data"));
        }
        // 19 replaced the fixed count by a pool between io_min_workers and
        // io_max_workers: both at the count, a pool that cannot grow.
        if major >= 19 {
            settings.push(("io_min_workers", &workers));
            settings.push(("io_max_workers", &workers));
        } else if major >= 18 {
            settings.push(("io_workers", &workers));
        }
        Ok(opts.with_settings(&settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_counts() {
        assert_eq!(parse_io_workers("8"), Ok("8".into()));
        assert!(parse_io_workers("0").is_err());
        assert!(parse_io_workers("many").is_err());
    }
}
