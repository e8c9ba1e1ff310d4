//! `shm-too-small`: a cluster whose postmaster sees a 64 MB /dev/shm — a
//! private tmpfs in a mount namespace of its own, as Docker's default
//! `--shm-size` — while one session runs a parallel hash join (2 workers,
//! work_mem=256MB, a 2-million-row table joined to itself) in a loop beside
//! pgbench -S. With dynamic_shared_memory_type=posix each dynamic shared
//! memory segment is a file in /dev/shm, sized with posix_fallocate
//! (dsm_impl.c, Linux, PostgreSQL 9.4+; 15's retries EINTR), so the shared
//! hash table's growth fails with "could not resize shared memory segment
//! … No space left on device" and the statement fails. `--shm-size 1GB`
//! (ample) is the healthy baseline: the same namespace, a larger tmpfs.
//!
//! The mount is made in the server's own mount namespace
//! ([`crate::provision::Cluster::restart_with_private_shm`]): the host's
//! /dev/shm is untouched and the namespace vanishes with the server's
//! last process, so there is nothing for the cleanup ledger but the
//! cluster itself.
use std::time::Duration;

use anyhow::Result;

use super::kit::SideSession;
use super::memory_cgroup::parse_memory_limit;
use super::spec::Flag;
use super::{kit, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::collect::session::Session;
use crate::error::fixable;
use crate::provision::Topology;
use crate::workload::Plan;

/// The postmaster's /dev/shm by default, MB: Docker's default `--shm-size`.
pub const DEFAULT_SHM_MB: u64 = 64;
/// Rows of the joined table (≈ 70 MB on disk; the shared hash table of a
/// parallel hash join on it needs more than 64 MB of DSM).
pub const ROWS: u64 = 2_000_000;
/// What lets the planner choose a parallel hash join with 2 workers and
/// keeps the hash in one batch (in DSM, not in temp files).
const SETTINGS: &[(&str, &str)] = &[
    ("max_parallel_workers_per_gather", "2"),
    ("work_mem", "256MB"),
    ("parallel_setup_cost", "0"),
    ("parallel_tuple_cost", "0"),
    ("dynamic_shared_memory_type", "posix"),
];
const JOIN: &str = "select count(*) from shm_join a join shm_join b using (id)";

pub(crate) static SHM_SIZE: Flag = Flag::value(
    "shm-size",
    "SIZE",
    "shm-too-small: the lab server's /dev/shm, a private tmpfs in its own mount namespace \
     (`64MB`, `1GB`, a bare number is MB; default 64MB, Docker's default; 1GB is the healthy \
     baseline; 0: the host's /dev/shm)",
    |s| parse_memory_limit(s).map(|mb| mb.to_string()),
);

fn shm_mb(opts: &LabOptions) -> u64 {
    opts.params.get("shm-size").unwrap_or(DEFAULT_SHM_MB)
}

pub struct ShmTooSmall;

static SPEC: Spec = Spec {
    name: "shm-too-small",
    finding: Some("shm-too-small"),
    description:
        "A parallel hash join (2 workers, work_mem=256MB, a 2-million-row table joined to \
                  itself) in a loop beside pgbench -S (1 client, 8 s), the server's /dev/shm a \
                  64 MB tmpfs in a mount namespace of its own (root only; nothing mounted on the \
                  host): the shared hash table's DSM segments do not fit and the statements fail \
                  with \"could not resize shared memory segment … No space left on device\". \
                  --shm-size 1GB (ample) is the healthy baseline",
    pgbench: Some(Plan {
        name: "shm-too-small",
        args: &["-S"],
        script: None,
    }),
    init: true,
    statements_per_transaction: 1,
    clients: 1,
    duration_s: 8,
    flags: &[&SHM_SIZE],
    ..Spec::BASE
};

impl Scenario for ShmTooSmall {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        // SAFETY: geteuid has no preconditions.
        if shm_mb(opts) > 0 && unsafe { libc::geteuid() } != 0 {
            return Err(fixable(
                "the shm-too-small scenario needs root: it starts the server in a mount namespace \
                 of its own with a private tmpfs on /dev/shm",
                "run `sudo pgbelow lab run --scenario shm-too-small …`, or --shm-size 0 for the \
                 host's /dev/shm",
            ));
        }
        Ok(opts.with_settings(SETTINGS))
    }

    /// The server again, in its own mount namespace with the small /dev/shm.
    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        _host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        let mb = shm_mb(opts);
        if mb == 0 {
            return Ok(());
        }
        status(&format!(
            "restarting the server with a private {mb} MB /dev/shm"
        ));
        topo.primary_mut().restart_with_private_shm(mb << 20)
    }

    fn prepare(&self, lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        lab.psql(
            "bench",
            &format!(
                "create table shm_join with (autovacuum_enabled = off) as \
                 select g as id, g as v from generate_series(1, {ROWS}) g;\n\
                 analyze shm_join;"
            ),
        )?;
        Ok(Prepared {
            facts: vec![(
                "shm_join",
                serde_json::json!({"rows": ROWS, "shm_mb": shm_mb(lab.opts), "query": JOIN}),
            )],
            keep: Vec::new(),
        })
    }

    /// The join in a loop beside pgbench, until pgbench ends.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        let join = SideSession::start(lab.dsn(), "pgbelow-shm-join", JOIN, Duration::ZERO);
        kit::drive_pgbench_beside(lab, session, join, "the parallel join")
    }
}
