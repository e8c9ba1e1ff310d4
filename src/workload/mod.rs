//! Workloads: built-in scenarios driven by the system's pgbench.

pub mod pgbench;
pub mod progress;

use serde::{Deserialize, Serialize};

pub use pgbench::{find_pgbench, Pgbench, PgbenchTarget, Running};
pub use progress::{parse_progress_line, parse_summary, Progress, Summary};

/// A built-in workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    SelectOnly,
    Tpcb,
    ExplainTiming,
    SyncrepCommit,
    DropMany,
    CheckpointStall,
    SnapshotScaling,
    RelationExtension,
    CgroupCpuThrottling,
    WalFsyncLatency,
    MemoryCgroupReclaim,
    SubtransactionOverflow,
    ReplayWithoutPrefetch,
    NoHugePages,
    NoisyNeighbour,
}

impl Scenario {
    pub const ALL: [Scenario; 15] = [
        Scenario::SelectOnly,
        Scenario::Tpcb,
        Scenario::ExplainTiming,
        Scenario::SyncrepCommit,
        Scenario::DropMany,
        Scenario::CheckpointStall,
        Scenario::SnapshotScaling,
        Scenario::RelationExtension,
        Scenario::CgroupCpuThrottling,
        Scenario::WalFsyncLatency,
        Scenario::MemoryCgroupReclaim,
        Scenario::SubtransactionOverflow,
        Scenario::ReplayWithoutPrefetch,
        Scenario::NoHugePages,
        Scenario::NoisyNeighbour,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::SelectOnly => "select-only",
            Scenario::Tpcb => "tpcb",
            Scenario::ExplainTiming => "explain-timing",
            Scenario::SyncrepCommit => "syncrep-commit",
            Scenario::DropMany => "drop-many",
            Scenario::CheckpointStall => "checkpoint-stall",
            Scenario::SnapshotScaling => "snapshot-scaling",
            Scenario::RelationExtension => "relation-extension",
            Scenario::CgroupCpuThrottling => "cgroup-cpu-throttling",
            Scenario::WalFsyncLatency => "wal-fsync-latency",
            Scenario::MemoryCgroupReclaim => "memory-cgroup-reclaim",
            Scenario::SubtransactionOverflow => "subtransaction-overflow",
            Scenario::ReplayWithoutPrefetch => "replay-without-prefetch",
            Scenario::NoHugePages => "no-huge-pages",
            Scenario::NoisyNeighbour => "noisy-neighbour",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn description(self) -> &'static str {
        match self {
            Scenario::SelectOnly => {
                "pgbench -S -M prepared: one indexed SELECT per transaction; shows per-statement \
                 syscall costs such as setitimer with statement_timeout (seed 000)"
            }
            Scenario::Tpcb => {
                "pgbench's built-in TPC-B-like transaction (7 statements, simple protocol)"
            }
            Scenario::ExplainTiming => {
                "EXPLAIN ANALYZE vs EXPLAIN (ANALYZE, TIMING OFF) vs the plain query over \
                 generate_series and a table scan, each in rounds until --duration: timing overhead per \
                 row, clock cost, clock syscalls in the backend (seed 002). --scale S: a table of \
                 S×100k rows, generate_series of S×200k"
            }
            Scenario::SyncrepCommit => {
                "pgbench -f: one INSERT per transaction (commit) into a table of its own, on a primary \
                 with 2 synchronous standbys (FIRST 2) unless --standbys/--sync say otherwise: commits \
                 wait in SyncRepWaitForLSN; counts epoll syscalls per commit (seed 003). --sweep: then \
                 tps at synchronous_commit = off, local, remote_write, on, remote_apply"
            }
            Scenario::DropMany => {
                "primary + 1 synchronous standby (synchronous_commit=remote_apply): create --tables N \
                 one-row tables (--empty-tables: empty), drop them one per transaction \
                 (--one-transaction: all in one); ms per DROP = the standby's replay cost, startup \
                 process profiled, replay lag sampled (seed 004). Standby shared_buffers: \
                 --standby-set shared_buffers=… (default 2GB). --sweep: then ms and startup CPU per \
                 drop over --sweep-tables × --sweep-standby-shared-buffers, with the growth exponents"
            }
            Scenario::CheckpointStall => {
                "pgbench -f upsert over a growing hot table (8 clients) whose files sit on an ext4 \
                 loop device limited to 4 MB/s of writes with a 128 MB bdi dirty cap (root only; \
                 all removed afterwards); shared_buffers=2GB, checkpoint_timeout=30s, \
                 *_flush_after=0: checkpoints drain a large dirty backlog and tps dips (seed 001). \
                 Override with --set (e.g. checkpoint_flush_after=256kB)"
            }
            Scenario::SnapshotScaling => {
                "pgbench -S -M prepared on 2 clients while --idle-connections N (default 1000) \
                 further connections sit idle (max_connections set to fit): up to PostgreSQL 13 \
                 every snapshot walks all connected backends, idle ones included, so the backends' \
                 CPU goes to GetSnapshotData and tps falls with N; 14 does not"
            }
            Scenario::RelationExtension => {
                "pgbench -f: 4 clients each COPY the same 10,000 rows into one table, over and \
                 over (autovacuum=off): the table grows as fast as they load, each new block under \
                 the relation's extension lock (Lock:extend waits); up to PostgreSQL 15 one 8 kB \
                 pwrite per block, 16 extends in bulk (fallocate)"
            }
            Scenario::CgroupCpuThrottling => {
                "pgbench -S -M prepared, 2 clients, 15 s, against a cluster moved into a cpu cgroup \
                 with a CFS quota of 0.25 CPU per 100 ms period (root only; the cgroup is removed \
                 afterwards): the quota is spent early in each period and every server process waits \
                 runnable for the next one. --cpu-quota CPUS sets it, --cpu-quota 0 runs without one \
                 (the healthy baseline)"
            }
            Scenario::WalFsyncLatency => {
                "pgbench's TPC-B-like transaction, 4 clients, 15 s, with pg_wal moved onto an ext4 loop \
                 device limited to 1 MB/s of writes and a 16 MB dirty cap (root only; all removed \
                 afterwards): each commit waits for its WAL flush (IO:WALSync). --write-limit MBPS / \
                 --dirty-cap MB set the limits; --write-limit 100000 is the same device unthrottled \
                 (the baseline)"
            }
            Scenario::MemoryCgroupReclaim => {
                "pgbench's TPC-B-like transaction, 4 clients, 15 s, scale 10, shared_buffers=128MB, \
                 against a cluster moved into a memory cgroup limited to 160 MB after the load (root \
                 only; the cgroup is removed afterwards): the limit counts shared_buffers and the page \
                 cache, so every charge at the limit reclaims first and evicted table pages are read \
                 back from disk. --memory-limit SIZE sets it (below shared_buffers: the OOM killer takes \
                 a backend and the postmaster restarts them all), --memory-limit 0 runs without one \
                 (the healthy baseline)"
            }
            Scenario::SubtransactionOverflow => {
                "primary + 1 async standby (synchronous_commit=off, autovacuum=off): a session on the \
                 primary holds a transaction with --savepoints N subtransactions (default 100 > the 64 \
                 a backend caches), 20,000 rows then get new xids (100,000 transactions), and 4 \
                 pgbench clients on the standby read 1,000 of them per statement for 15 s while a \
                 writer keeps consuming xids: the overflowed snapshots send each visibility check to \
                 pg_subtrans (LWLock:SubtransSLRU/SubtransBuffer waits, pg_stat_slru reads). \
                 --savepoints 50 is the healthy baseline"
            }
            Scenario::ReplayWithoutPrefetch => {
                "primary + 1 standby with shared_buffers=16MB: pgbench -f, 2 clients, 20 s, update \
                 random rows of a 500k-row table (4 indexed columns changed, full_page_writes=off) \
                 while the lab evicts the standby's relation files from the page cache every \
                 second: up to PostgreSQL 14 the startup process reads each block it replays with \
                 one synchronous pread and replay falls behind; 15 prefetches them \
                 (recovery_prefetch=try, posix_fadvise). --standby-set recovery_prefetch=off \
                 turns 15's off"
            }
            Scenario::NoHugePages => {
                "pgbench -f: 50 clients, 10 s, each reads a random 0.1 % of the blocks (TABLESAMPLE \
                 SYSTEM) of an unlogged table that fills shared_buffers (2GB), one row per 8 kB page, \
                 so every backend touches pages all over the shared memory and builds its own page tables over it (VmPTE, \
                 PageTables, minor faults). --huge-pages off (the default) maps it in 4 kB pages; \
                 --huge-pages on reserves vm.nr_hugepages for the cluster (root; restored \
                 afterwards) and sets huge_pages=on, the healthy baseline. The issue's size: \
                 --set shared_buffers=8GB --clients 200"
            }
            Scenario::NoisyNeighbour => {
                "pgbench -S -M prepared, 2 clients, 15 s, beside --hogs N busy loops outside the \
                 cluster (default 2 per CPU; processes named pgbelow-hog, killed at the end): the \
                 backends wait on the run queue for CPUs the loops hold. --hogs 0 runs without them \
                 (the healthy baseline)"
            }
        }
    }

    /// pgbench arguments for the run itself.
    pub fn pgbench_args(self) -> &'static [&'static str] {
        match self {
            Scenario::SelectOnly
            | Scenario::SnapshotScaling
            | Scenario::CgroupCpuThrottling
            | Scenario::NoisyNeighbour => &["-S", "-M", "prepared"],
            Scenario::Tpcb
            | Scenario::ExplainTiming
            | Scenario::SyncrepCommit
            | Scenario::DropMany
            | Scenario::CheckpointStall
            | Scenario::RelationExtension
            | Scenario::WalFsyncLatency
            | Scenario::MemoryCgroupReclaim
            | Scenario::ReplayWithoutPrefetch => &[],
            Scenario::SubtransactionOverflow => &["-M", "prepared"],
            Scenario::NoHugePages => &["-M", "prepared"],
        }
    }

    /// A custom pgbench script (`-f`) the run uses, if any.
    pub fn pgbench_script(self) -> Option<&'static str> {
        match self {
            Scenario::SyncrepCommit => Some(crate::scenarios::syncrep_commit::SCRIPT),
            Scenario::CheckpointStall => Some(crate::scenarios::checkpoint_stall::SCRIPT),
            Scenario::RelationExtension => Some(crate::scenarios::relation_extension::SCRIPT),
            Scenario::SubtransactionOverflow => {
                Some(crate::scenarios::subtransaction_overflow::SCRIPT)
            }
            Scenario::ReplayWithoutPrefetch => Some(crate::scenarios::replay_prefetch::SCRIPT),
            Scenario::NoHugePages => Some(crate::scenarios::no_huge_pages::SCRIPT),
            _ => None,
        }
    }

    /// Whether the lab runs `pgbench -i` first (else the scenario prepares its own tables).
    pub fn pgbench_init(self) -> bool {
        matches!(
            self,
            Scenario::SelectOnly
                | Scenario::Tpcb
                | Scenario::SnapshotScaling
                | Scenario::CgroupCpuThrottling
                | Scenario::WalFsyncLatency
                | Scenario::MemoryCgroupReclaim
                | Scenario::NoisyNeighbour
        )
    }

    /// Whether pgbench drives this scenario (the others have their own driver).
    pub fn uses_pgbench(self) -> bool {
        !matches!(self, Scenario::ExplainTiming | Scenario::DropMany)
    }

    /// Statements the server executes per pgbench transaction, so rules can
    /// compute per-statement ratios (each one arms statement_timeout).
    pub fn statements_per_transaction(self) -> u64 {
        match self {
            Scenario::SelectOnly
            | Scenario::ExplainTiming
            | Scenario::SyncrepCommit
            | Scenario::DropMany
            | Scenario::CheckpointStall
            | Scenario::SnapshotScaling
            | Scenario::RelationExtension
            | Scenario::CgroupCpuThrottling
            | Scenario::SubtransactionOverflow
            | Scenario::ReplayWithoutPrefetch
            | Scenario::NoHugePages
            | Scenario::NoisyNeighbour => 1,
            // BEGIN, 3 UPDATE, SELECT, INSERT, END
            Scenario::Tpcb | Scenario::WalFsyncLatency | Scenario::MemoryCgroupReclaim => 7,
        }
    }
}

pub use crate::recording::summaries::WorkloadSummary;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_round_trip() {
        for s in Scenario::ALL {
            assert_eq!(Scenario::parse(s.name()), Some(s));
        }
        assert_eq!(Scenario::parse("nope"), None);
    }
}
