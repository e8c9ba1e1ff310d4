//! The lab's scenarios end to end, one module per scenario (named after
//! it): `pgbelow lab run` provisions real PostgreSQL, runs the case and its
//! fix, and the finding is raised on one and not the other. Every run
//! holds the one-measured-run-at-a-time lock (`common::exclusive`) for its
//! whole length: the lab provisions and measures in one command.
#[path = "../common/mod.rs"]
mod common;

mod aio_workers_saturated;
mod bench;
mod cgroup_cpu_throttling;
mod checkpoint_stall;
mod disk_io_errors;
mod disk_read_latency;
mod dns_on_connect;
mod drop_many;
mod explain_timing;
mod fd_exhaustion;
mod filesystem_full;
mod matrix;
mod memory_cgroup_reclaim;
mod network_retransmits;
mod no_huge_pages;
mod noisy_neighbour;
mod offcpu;
mod oom_kill_restart;
mod relation_extension;
mod replay_without_prefetch;
mod select_only;
mod shm_too_small;
mod snapshot_scaling;
mod subtransaction_overflow;
mod swap_activity;
mod syncrep_commit;
mod syncrep_network_latency;
mod thp_compaction_stall;
mod two_causes;
mod wal_fsync_latency;
