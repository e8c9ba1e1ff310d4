//! The parts under the commands, on real processes: the collectors
//! (procfs, BPF syscalls, off-CPU, profile, clock, fsync, pgstat), the
//! connection and privilege checks, provisioning and replication
//! topologies. Few of them hold the measuring lock, so they share the
//! two test threads.
#[path = "../common/mod.rs"]
mod common;

mod clock;
mod fsync;
mod offcpu;
mod pgstat;
mod pgstat_timeline;
mod privilege;
mod procfs;
mod profile;
mod provision;
mod record_connect;
mod shortlived;
mod syscalls;
mod topology;
