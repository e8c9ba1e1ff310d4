//! `fd-exhaustion`: the server's open-files limit lowered while it runs
//! (`prlimit --nofile=64:64` on the postmaster, as the server's own user:
//! what a supervisor or an operator's `prlimit` does), below the file cache
//! PostgreSQL sized at its start (max_files_per_process, 1000). Every
//! process forked after inherits the limit. One session counts the rows of
//! a table of 200 hash partitions in a loop (a parallel plan: parallel
//! costs 0) beside pgbench -S: opening the partitions' files fd.c meets
//! EMFILE, releases cached files and retries ("out of file descriptors: Too
//! many open files; release and retry"), and the parallel query's dynamic
//! shared memory segment cannot be opened ("could not open shared memory
//! segment …: Too many open files"): the statement fails. `--nofile 0`
//! (the limit the server started with) is the healthy baseline. The limit
//! goes with the lab's server.
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::kit::SideSession;
use super::spec::{count_in, Flag};
use super::{kit, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::collect::session::Session;
use crate::workload::Plan;

/// The open-files limit by default.
pub const DEFAULT_NOFILE: u64 = 64;
/// Partitions of the counted table: more files than the limit.
pub const PARTITIONS: u32 = 200;
/// The side session's statement.
pub const COUNT: &str = "select count(*) from fd_parts";
/// The pause between counts.
pub const PAUSE_MS: u64 = 100;
/// A parallel plan for the count, whatever its size: its DSM segment is a
/// file descriptor too.
const SETTINGS: &[(&str, &str)] = &[
    ("max_parallel_workers_per_gather", "2"),
    ("parallel_setup_cost", "0"),
    ("parallel_tuple_cost", "0"),
    ("min_parallel_table_scan_size", "0"),
];

pub(crate) static NOFILE: Flag = Flag::value(
    "nofile",
    "N",
    "fd-exhaustion: the open-files limit set on the running postmaster (prlimit, soft and \
     hard; default 64; 0 keeps the limit it started with, the healthy baseline)",
    |s| match s.trim() {
        "0" => Ok("0".into()),
        _ => count_in(s, 16, 1 << 20),
    },
);

fn nofile(opts: &LabOptions) -> u64 {
    opts.params.get("nofile").unwrap_or(DEFAULT_NOFILE)
}

pub struct FdExhaustion;

static SPEC: Spec = Spec {
    name: "fd-exhaustion",
    finding: Some("fd-exhaustion"),
    description: "One session counts a table of 200 hash partitions in a loop (a parallel plan) \
                  beside pgbench -S (1 client, 8 s), the running postmaster's open-files limit \
                  lowered to 64 (prlimit, as the server's user): backends meet EMFILE, release \
                  cached files to retry, and the count's dynamic shared memory segment cannot be \
                  opened. --nofile 0 (the limit it started with) is the healthy baseline",
    pgbench: Some(Plan {
        name: "fd-exhaustion",
        args: &["-S"],
        script: None,
    }),
    init: true,
    statements_per_transaction: 1,
    clients: 1,
    duration_s: 8,
    flags: &[&NOFILE],
    ..Spec::BASE
};

/// The counted table: [`PARTITIONS`] hash partitions, 40,000 rows.
pub fn setup_sql() -> String {
    format!(
        "create table fd_parts (id int, v text) partition by hash (id);\n\
         do $$ begin for i in 0..{last} loop execute format('create table fd_parts_%s \
         partition of fd_parts for values with (modulus {PARTITIONS}, remainder %s)', i, i); \
         end loop; end $$;\n\
         insert into fd_parts select g, md5(g::text) from generate_series(1, 40000) g;\n\
         analyze fd_parts;",
        last = PARTITIONS - 1
    )
}

/// `prlimit --pid PID --nofile=N:N` as the owner of `data_dir` (lowering
/// another user's limit would need CAP_SYS_RESOURCE; its own user may).
fn lower_limit(pid: u32, n: u64, data_dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let meta =
        std::fs::metadata(data_dir).with_context(|| format!("reading {}", data_dir.display()))?;
    let mut cmd = std::process::Command::new("prlimit");
    cmd.args(["--pid", &pid.to_string(), &format!("--nofile={n}:{n}")]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && meta.uid() != 0 {
        cmd.uid(meta.uid()).gid(meta.gid());
    }
    let out = cmd
        .output()
        .context("running prlimit (util-linux): apt-get install util-linux")?;
    if !out.status.success() {
        bail!(
            "prlimit --pid {pid} --nofile={n}:{n} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Scenario for FdExhaustion {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        Ok(opts.with_settings(SETTINGS))
    }

    fn prepare(&self, lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        (lab.status)(&format!("a table of {PARTITIONS} hash partitions"));
        lab.psql("bench", &setup_sql())?;
        let n = nofile(lab.opts);
        let primary = lab.primary();
        if n > 0 {
            let pid = primary.postmaster_pid();
            (lab.status)(&format!(
                "lowering the running postmaster's open-files limit to {n}"
            ));
            lower_limit(pid, n, primary.data_dir())?;
        }
        Ok(Prepared {
            facts: vec![(
                "fd_exhaustion",
                serde_json::json!({
                    "nofile": n,
                    "partitions": PARTITIONS,
                    "statement": COUNT,
                    "pause_ms": PAUSE_MS,
                }),
            )],
            keep: Vec::new(),
        })
    }

    /// The counts in a loop beside pgbench, until pgbench ends.
    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        let pause = Duration::from_millis(PAUSE_MS);
        let count = SideSession::start(lab.dsn(), "pgbelow-fd-count", COUNT, pause);
        kit::drive_pgbench_beside(lab, session, count, "the counts")
    }
}
