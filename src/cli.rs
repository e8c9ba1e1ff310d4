//! Command-line interface: the only place that knows about flags.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "pgbelow",
    version,
    about = "Find why PostgreSQL is slow when the cause lies below the database",
    long_about = "pgbelow reproduces, records and diagnoses PostgreSQL performance problems whose cause lies in \
                  syscalls, timers, clocks, the page cache or the kernel, from evidence counted in the kernel."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Provision a PostgreSQL, run a scenario under the collectors, diagnose, tear down.
    #[command(subcommand)]
    Lab(LabCommand),
    /// Record a running PostgreSQL (read-only) for a while, then diagnose.
    Record(RecordArgs),
    /// Re-analyse a saved recording.
    Report(ReportArgs),
    /// Compare two recordings (before/after a setting, a patch, a version).
    Compare(CompareArgs),
    /// Check this machine and probe a lab PostgreSQL; the main job, no arguments needed.
    Doctor(DoctorArgs),
}

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Run a scenario.
    Run(LabRunArgs),
    /// List the built-in scenarios.
    List,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ScenarioArg {
    SelectOnly,
    Tpcb,
    ExplainTiming,
    SyncrepCommit,
    DropMany,
    CheckpointStall,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SeverityArg {
    Info,
    Warning,
    Critical,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MechanismArg {
    Ebpf,
    PerfTracepoint,
}

#[derive(Args, Debug)]
pub struct Output {
    /// Report format printed on stdout.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Exit 1 when a finding of this severity or worse is raised.
    #[arg(long, value_enum)]
    pub fail_on: Option<SeverityArg>,
}

#[derive(Args, Debug)]
pub struct Collection {
    /// Collectors to run: a comma-separated list, `all`, or `none` (baseline runs).
    #[arg(long, value_name = "LIST")]
    pub collectors: Option<String>,
    /// Force how syscalls are counted (default: eBPF, perf tracepoints if BPF is unavailable).
    #[arg(long, value_enum)]
    pub syscall_mechanism: Option<MechanismArg>,
    /// Recording directory (default: ./pgbelow-runs/<name>-<time>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct LabRunArgs {
    /// Built-in scenario (see `pgbelow lab list`).
    #[arg(long, value_enum)]
    pub scenario: ScenarioArg,
    /// PostgreSQL major version (10–18): the system's if it matches, else fetched from npm.
    #[arg(long, value_name = "MAJOR", conflicts_with = "pg_bin")]
    pub pg: Option<u32>,
    /// Directory holding initdb, pg_ctl and postgres.
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
    /// A server setting for the lab cluster, repeatable.
    #[arg(long = "set", value_name = "GUC=VALUE", value_parser = parse_guc)]
    pub set: Vec<(String, String)>,
    /// Seconds of workload (default 20; checkpoint-stall: 60, so that a timed
    /// checkpoint runs under load).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=86400))]
    pub duration: Option<u32>,
    /// pgbench clients (default 1; syncrep-commit: 8).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub clients: Option<u32>,
    /// pgbench scale factor.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub scale: u32,
    /// Local streaming standbys beside the primary (standby1, standby2, …).
    /// Default 0; syncrep-commit defaults to 2 (with --sync first).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub standbys: Option<u32>,
    /// How the primary waits for its standbys: `first` (FIRST N (…), the
    /// default), `quorum` (ANY N (…)), or `async`. Needs --standbys.
    #[arg(long, value_enum)]
    pub sync: Option<SyncArg>,
    /// A server setting for every standby, repeatable (after the primary's --set, which they inherit).
    #[arg(long = "standby-set", value_name = "GUC=VALUE", value_parser = parse_guc)]
    pub standby_set: Vec<(String, String)>,
    /// After the recorded run, the scenario's sweep: syncrep-commit runs the
    /// workload at each synchronous_commit level and reports tps per level.
    #[arg(long)]
    pub sweep: bool,
    /// drop-many: tables to create and drop (default 300).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000000))]
    pub tables: Option<u32>,
    /// drop-many: leave the tables empty (no row: no cached size on the standby).
    #[arg(long)]
    pub empty_tables: bool,
    /// drop-many: drop all tables in one transaction instead of one per transaction.
    #[arg(long)]
    pub one_transaction: bool,
    /// checkpoint-stall: write bandwidth of the data device, MB/s (default 4).
    #[arg(long, value_name = "MBPS", value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub write_limit: Option<u32>,
    /// checkpoint-stall: dirty page cap of the data device, MB (default 128).
    #[arg(long, value_name = "MB", value_parser = clap::value_parser!(u32).range(1..=1000000))]
    pub dirty_cap: Option<u32>,
    #[command(flatten)]
    pub collection: Collection,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SyncArg {
    Quorum,
    First,
    Async,
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Pid of the postmaster to observe (first line of $PGDATA/postmaster.pid).
    #[arg(long)]
    pub pid: u32,
    /// libpq connection string for the server's counters (read-only session).
    #[arg(long, value_name = "CONNSTR")]
    pub dsn: Option<String>,
    /// Seconds to record (Ctrl-C stops early with a valid recording).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=86400))]
    pub duration: u32,
    #[command(flatten)]
    pub collection: Collection,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A recording directory.
    pub dir: PathBuf,
    /// Write the report to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub out: Output,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The "before" recording.
    pub dir_a: PathBuf,
    /// The "after" recording.
    pub dir_b: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Recording directory for the probes.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seconds of each probe's workload.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=600))]
    pub duration: u32,
    /// Probe this PostgreSQL major instead of the system's.
    #[arg(long, value_name = "MAJOR")]
    pub pg: Option<u32>,
    #[arg(long, value_enum)]
    pub syscall_mechanism: Option<MechanismArg>,
    #[arg(long, value_enum)]
    pub fail_on: Option<SeverityArg>,
}

fn parse_guc(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not GUC=VALUE (e.g. --set statement_timeout=10s)"))?;
    let k = k.trim();
    if k.is_empty()
        || !k
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Err(format!("'{k}' is not a setting name"));
    }
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guc_pairs() {
        assert_eq!(
            parse_guc("statement_timeout=10s").unwrap(),
            ("statement_timeout".into(), "10s".into())
        );
        assert_eq!(parse_guc("a.b=x=y").unwrap(), ("a.b".into(), "x=y".into()));
        assert!(parse_guc("novalue").is_err());
        assert!(parse_guc("bad name=1").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
