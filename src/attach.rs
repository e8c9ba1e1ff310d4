//! `pgbelow record`: observe a running cluster pgbelow did not start.
//! Strictly read-only: kernel counters on its processes, and SELECTs on
//! statistics views over a read-only session when `--dsn` is given.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use crate::collect::pgstat::ServerConn;
use crate::collect::session::Session;
use crate::collect::syscalls::Mechanism;
use crate::collect::Context;
use crate::error::fixable;
use crate::interrupt;
use crate::procinfo;
use crate::recording::manifest::RELEVANT_SETTINGS;
use crate::recording::{files, this_host_manifest, Status};

#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// The postmaster; found from the connection when absent.
    pub pid: Option<u32>,
    /// libpq connection string; absent: the PG* environment, if it names a server.
    pub dsn: Option<String>,
    pub duration_s: u32,
    pub collectors: Vec<String>,
    pub syscall_mechanism: Option<Mechanism>,
    pub sampling: crate::collect::Sampling,
    pub out: Option<PathBuf>,
    pub show_progress: bool,
    /// With `pid` and no `dsn`: connect through the socket the server's
    /// postmaster.pid names (`watch --all` tries that itself, once).
    pub pid_file_connection: bool,
    /// Read the server log back this many seconds before the start
    /// (`--since`; None or 0: not at all).
    pub log_since_s: Option<u32>,
}

/// Version of the binary a pid runs, from `<exe> --version` (read-only).
fn exe_version(pid: u32) -> Option<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let out = std::process::Command::new(&exe)
        .arg("--version")
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout);
    // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    s.split_whitespace().nth(2).map(String::from)
}

/// The environment names a server (PGHOST, PGPORT, …): `record` without
/// `--dsn` then connects with it, as psql would.
pub fn env_names_server() -> bool {
    crate::connect::SERVER_ENV
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
}

/// The postmaster of the server `conn` reached, when it runs on this host:
/// the parent of the connection's backend, else the pid in
/// `data_directory`'s `postmaster.pid`; each checked against what the
/// server says (the backend's title names this session's user and
/// database; the postmaster's working directory is `data_directory`), so a
/// pid from another host or pid namespace is not taken for a local one.
/// A socket reached through a container's root (`/proc/N/root/…`) is
/// that container's server: its pids are read in N's pid namespace and its
/// data directory in N's root. `Ok((pid, how it was found))`, or why
/// neither way worked.
pub fn find_postmaster(conn: &mut ServerConn) -> std::result::Result<(u32, String), String> {
    // A socket reached through another process's root (a container's
    // /tmp as /proc/N/root/tmp): the server's pids are that process's pid
    // namespace's and its paths are in that root.
    let through = conn
        .server
        .strip_prefix("socket ")
        .and_then(|s| proc_root_of(std::path::Path::new(s)));
    let backend = through
        .and_then(|n| crate::pidns::host_pid_in_ns_of(n, conn.backend_pid))
        .unwrap_or(conn.backend_pid);
    let ident = conn.text("select session_user::text || ' ' || current_database()::text");
    let data_dir = conn.text("select current_setting('data_directory')");
    // The postmaster's cwd is its data directory (unknown: not checked).
    let same_dir = |pm: u32| -> bool {
        let (Some(d), Ok(cwd)) = (&data_dir, std::fs::read_link(format!("/proc/{pm}/cwd"))) else {
            return true;
        };
        let d = match through {
            Some(n) => PathBuf::from(format!("/proc/{n}/root")).join(d.trim_start_matches('/')),
            None => PathBuf::from(d),
        };
        std::fs::canonicalize(d).map_or(true, |d| d == cwd)
    };
    let mut why = Vec::new();
    match procinfo::read_ppid(backend) {
        None => why.push(format!(
            "this connection's backend (pid {} on the server) is not a process here",
            conn.backend_pid
        )),
        Some(pm) => {
            let title = procinfo::read_title(backend).unwrap_or_default();
            let ours = ident
                .as_ref()
                .is_none_or(|id| title.contains(&format!(" {id} ")));
            if ours && procinfo::looks_like_postmaster(pm) && same_dir(pm) {
                return Ok((
                    pm,
                    format!("the parent of this connection's backend, pid {backend}"),
                ));
            }
            why.push(format!(
                "pid {backend} here is not this connection's backend under a postmaster"
            ));
        }
    }
    match &data_dir {
        None => why.push(
            "data_directory is not readable by this role (superuser or pg_read_all_settings)"
                .into(),
        ),
        Some(d) => match procinfo::postmaster_of_data_dir(std::path::Path::new(d)) {
            Ok(pm) => {
                let file = std::path::Path::new(d).join("postmaster.pid");
                return Ok((pm, format!("from {}", file.display())));
            }
            Err(e) => why.push(e),
        },
    }
    Err(why.join("; "))
}

/// The process whose root `path` is reached through (`/proc/N/root/…`).
fn proc_root_of(path: &std::path::Path) -> Option<u32> {
    use std::path::Component;
    let mut c = path.components();
    if c.next()? != Component::RootDir || c.next()?.as_os_str() != "proc" {
        return None;
    }
    let n = c.next()?.as_os_str().to_str()?.parse().ok()?;
    (c.next()?.as_os_str() == "root").then_some(n)
}

/// What a server writes to `postmaster.pid` (its first lines, in the order
/// PostgreSQL's `LOCK_FILE_LINE_*` numbers them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PidFile {
    /// The postmaster, as its pid namespace numbers it.
    pub pid: u32,
    /// The data directory, as the server names it (its own file system).
    pub data_dir: String,
    /// Unix time the postmaster started.
    pub start: Option<i64>,
    pub port: Option<u16>,
    /// The first Unix socket directory (empty: no Unix socket).
    pub socket_dir: Option<String>,
    /// The first TCP listen address (`*`, `localhost`; empty: none).
    pub listen: Option<String>,
    /// `starting`, `ready`, `stopping`, `standby` once the postmaster wrote it.
    pub status: Option<String>,
}

/// Parse a `postmaster.pid`; None when it names no pid or no data
/// directory (a file being written, or not one).
pub fn parse_pid_file(r: impl std::io::BufRead) -> Option<PidFile> {
    let lines: Vec<String> = r.lines().map_while(Result::ok).take(8).collect();
    let field = |i: usize| lines.get(i).map(|l| l.trim().to_string());
    let pid = field(0)?.parse().ok()?;
    let data_dir = field(1).filter(|d| !d.is_empty())?;
    Some(PidFile {
        pid,
        data_dir,
        start: field(2).and_then(|s| s.parse().ok()),
        port: field(3).and_then(|s| s.parse().ok()),
        socket_dir: field(4),
        listen: field(5),
        status: field(7).filter(|s| !s.is_empty()),
    })
}

/// A connection string for the postmaster `pid` from what its
/// `postmaster.pid` names (port, first socket directory) and the name of
/// the account it runs as (the bootstrap superuser initdb names after it),
/// seen through /proc/PID/root so that a containerised server's paths and
/// accounts are its own. None when the file cannot be read or names no
/// socket directory.
pub fn dsn_from_postmaster_pid(pid: u32) -> Option<String> {
    let f = std::fs::File::open(format!("/proc/{pid}/cwd/postmaster.pid")).ok()?;
    dsn_from_pid_file(pid, &parse_pid_file(std::io::BufReader::new(f))?)
}

/// [`dsn_from_postmaster_pid`] from the file already read.
pub fn dsn_from_pid_file(pid: u32, file: &PidFile) -> Option<String> {
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let port = file.port?;
    let sock = file.socket_dir.as_deref().filter(|s| !s.is_empty())?;
    // Through the server's root when it has its own (a container's
    // /var/run/postgresql); the plain path when it shares ours.
    let same_root = {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(&root), std::fs::metadata("/")) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        }
    };
    let host = if same_root {
        PathBuf::from(sock)
    } else {
        root.join(sock.trim_start_matches('/'))
    };
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    })?;
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let user = passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.get(2)?.parse::<u32>().ok()? == uid).then(|| f[0].to_string())
        })
        .unwrap_or_else(|| "postgres".into());
    // Quoted only where needed, so the line printed reads as typed.
    let q = |v: &str| {
        if v.is_empty() || v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
            crate::connect::conninfo::quote(v)
        } else {
            v.to_string()
        }
    };
    Some(format!(
        "host={} port={port} user={} dbname=postgres",
        q(&host.display().to_string()),
        q(&user)
    ))
}

/// The capabilities to observe another user's processes that this process
/// lacks: CAP_SYS_PTRACE (their /proc/PID/exe) and CAP_DAC_READ_SEARCH
/// (postmaster.pid).
fn observe_missing() -> Vec<crate::privilege::Cap> {
    use crate::privilege::{Cap, Caps};
    Caps::current().missing(&[Cap::SysPtrace, Cap::DacReadSearch])
}

/// The fix for a missing privilege to observe another user's processes:
/// those capabilities, or all of the least set when it lacks none of them
/// and is still refused.
fn observe_fix() -> String {
    let missing = observe_missing();
    crate::privilege::fix(if missing.is_empty() {
        &crate::privilege::LEAST
    } else {
        &missing
    })
}

/// Whether this process may look at `pid` at all: another user's
/// /proc/PID/exe needs root (or CAP_SYS_PTRACE). Without it every check
/// would fail with a misleading "not a postmaster".
fn check_access(pid: u32) -> Result<()> {
    match std::fs::read_link(format!("/proc/{pid}/exe")) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            let owner = std::fs::metadata(format!("/proc/{pid}")).map_or(String::new(), |m| {
                use std::os::unix::fs::MetadataExt;
                format!(", owned by uid {}", m.uid())
            });
            Err(crate::error::unprivileged(
                format!(
                    "cannot observe pid {pid}{owner}: /proc/{pid}/exe: permission denied (pgbelow runs as uid {me}, not root)"
                ),
                observe_fix(),
            ))
        }
        _ => Ok(()),
    }
}

pub fn run(opts: &RecordOptions) -> Result<crate::recording::Recorded> {
    let (session, pid) = attach(opts, true)?;
    record_for(opts, session, pid)
}

/// Find the postmaster (from `--pid` or the connection), fill the manifest
/// and start the collectors on a new recording in `opts.out`: what `record`
/// does once and `watch` once per window. `announce`: say on stderr how
/// the postmaster was found.
pub fn attach(opts: &RecordOptions, announce: bool) -> Result<(Session, u32)> {
    // "" is a connection from the environment alone, as libpq reads it.
    let conninfo = opts
        .dsn
        .clone()
        .or_else(|| env_names_server().then(String::new));
    if opts.pid.is_none() && conninfo.is_none() {
        return Err(fixable(
            "record needs the server to observe: no --dsn, no PGHOST/PGPORT/PGUSER/PGDATABASE in the environment, and no --pid",
            "pass --dsn 'host=/var/run/postgresql port=5432 user=postgres dbname=postgres' (pgbelow finds the postmaster from it), or --pid $(head -1 $PGDATA/postmaster.pid)",
        ));
    }
    if let Some(pid) = opts.pid {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(fixable(
                format!("no process with pid {pid}"),
                "pass the postmaster's pid: head -1 $PGDATA/postmaster.pid",
            ));
        }
    }
    if let Some(pid) = opts.pid {
        check_access(pid)?;
    }
    crate::collect::preflight(&opts.collectors, true)?;
    if announce {
        // One line per capability of the least set this process lacks: what
        // degrades and the fix (collectors degrade rather than stop the run).
        for line in crate::privilege::missing_lines(crate::privilege::Caps::current()) {
            eprintln!("pgbelow: {line}");
        }
    }
    if let Some(pid) = opts.pid.filter(|p| !procinfo::looks_like_postmaster(*p)) {
        return Err(fixable(
            format!("pid {pid} is not a PostgreSQL postmaster"),
            "pass the postmaster's pid (the first line of $PGDATA/postmaster.pid), not a backend's",
        ));
    }
    // The one connection that fills the manifest (the pgstat collector,
    // when selected, opens its own and names its backend the observer):
    // from --dsn or the environment; with --pid alone, through the socket
    // postmaster.pid names, as psql would with -h/-p from that file. If
    // that cannot log in (peer authentication as another account, a
    // password), record without the server's counters and say how to
    // include them.
    let (conninfo, conn) = match conninfo {
        Some(dsn) => {
            let spec = crate::connect::ConnSpec::resolve(Some(&dsn))?;
            let conn = ServerConn::connect_spec(&spec)?;
            (Some(dsn), Some(conn))
        }
        None => match opts
            .pid
            .filter(|_| opts.pid_file_connection)
            .and_then(dsn_from_postmaster_pid)
        {
            Some(dsn) => match crate::connect::ConnSpec::resolve(Some(&dsn))
                .and_then(|spec| ServerConn::connect_spec(&spec))
            {
                Ok(conn) => {
                    if announce {
                        eprintln!(
                            "pgbelow: recording the postmaster pid {}, connecting with \"{dsn}\" \
                             (from its postmaster.pid)",
                            opts.pid.unwrap_or_default()
                        );
                    }
                    (Some(dsn), Some(conn))
                }
                Err(e) => {
                    if announce {
                        eprintln!(
                            "pgbelow: note: no connection with \"{dsn}\" (from postmaster.pid): {}; \
                             recording without the server's counters (pass --dsn with a role \
                             that can log in to include them)",
                            format!("{e:#}").replace('\n', " ")
                        );
                    }
                    (None, None)
                }
            },
            None => (None, None),
        },
    };
    let mut manifest = this_host_manifest("attach");
    let pid = if let Some(mut conn) = conn {
        let found = find_postmaster(&mut conn);
        let pid = match (opts.pid, found) {
            (Some(pid), Ok((pm, _))) if pm != pid => {
                return Err(fixable(
                    format!(
                        "the connection reaches the server with postmaster pid {pm}, but --pid is {pid}"
                    ),
                    "make --pid and --dsn (or PGHOST/PGPORT) name the same server, or drop --pid",
                ));
            }
            (Some(pid), _) => pid,
            (None, Ok((pm, how))) => {
                if announce {
                    eprintln!("pgbelow: recording the postmaster pid {pm} ({how})");
                }
                pm
            }
            (None, Err(why)) => {
                let at = conn.server.clone();
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } != 0
                    && (why.contains("ermission denied") || !observe_missing().is_empty())
                {
                    return Err(crate::error::unprivileged(
                        format!(
                            "cannot find the postmaster of the server at {at} ({why}): pgbelow is not root and lacks the capabilities to see other users' processes"
                        ),
                        observe_fix(),
                    ));
                }
                return Err(fixable(
                    format!("cannot find the postmaster of the server at {at} among this host's processes ({why}): pgbelow must run on the database host"),
                    "run pgbelow on the database server's host; for a server in a container (another pid namespace), pass --pid with its postmaster's pid as this host sees it",
                ));
            }
        };
        manifest.postgres.settings = conn.settings(RELEVANT_SETTINGS)?;
        manifest.postgres.version = Some(conn.version.clone());
        manifest.postgres.major = Some(conn.major);
        drop(conn);
        pid
    } else {
        let pid = opts.pid.unwrap_or_default();
        manifest.postgres.version = exe_version(pid);
        manifest.postgres.major = manifest
            .postgres
            .version
            .as_deref()
            .and_then(|v| v.split('.').next()?.parse().ok());
        pid
    };
    manifest.postgres.postmaster_pid = pid;
    if let Ok(exe) = std::fs::read_link(format!("/proc/{}/exe", pid)) {
        manifest.postgres.bin_dir = exe.parent().map(|p| p.display().to_string());
    }
    // The postmaster works in its data directory.
    if let Ok(cwd) = std::fs::read_link(format!("/proc/{}/cwd", pid)) {
        manifest.postgres.data_dir = Some(cwd.display().to_string());
    }
    // The container it runs in, whichever collectors run (the system
    // collector notes it too).
    if let Some(c) = crate::collect::container::of_process(pid) {
        manifest.facts.insert(
            crate::recording::schema::system::CONTAINER.into(),
            serde_json::to_value(c)?,
        );
    }
    let out = opts.out.clone().unwrap_or_else(|| {
        let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
        PathBuf::from("pgbelow-runs").join(format!("record-{}-{stamp}", pid))
    });
    if out.join(files::MANIFEST).exists() {
        return Err(fixable(
            format!("{} already holds a recording", out.display()),
            "pass another --out DIR, or remove that one",
        ));
    }
    let mut ctx = Context::new(pid);
    ctx.dsn = conninfo;
    ctx.bin_dir = manifest.postgres.bin_dir.as_ref().map(PathBuf::from);
    ctx.major = manifest.postgres.major;
    ctx.syscall_mechanism = opts.syscall_mechanism;
    ctx.sampling = opts.sampling;
    ctx.log_history_s = opts.log_since_s.filter(|s| *s > 0);
    let session = Session::start(out, manifest, ctx, &opts.collectors, Vec::new())?;
    Ok((session, pid))
}

/// Tick the session once a second for `opts.duration_s` (or until a stop
/// is asked, or the postmaster exits), then close the recording.
pub fn record_for(
    opts: &RecordOptions,
    session: Session,
    pid: u32,
) -> Result<crate::recording::Recorded> {
    record_for_each_tick(opts, session, pid, &mut |_| false)
}

/// [`record_for`], calling `on_tick` after each second's samples are
/// written (watch's live counters).
pub fn record_for_each_tick(
    opts: &RecordOptions,
    mut session: Session,
    pid: u32,
    on_tick: &mut dyn FnMut(&Session) -> bool,
) -> Result<crate::recording::Recorded> {
    let bar = if opts.show_progress {
        let b = ProgressBar::new(u64::from(opts.duration_s));
        b.set_style(
            ProgressStyle::with_template(
                "recording pid {msg} {elapsed:>3} [{bar:30}] {pos}/{len}s",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.set_message(pid.to_string());
        b
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let mut outcome = Ok(());
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < f64::from(opts.duration_s) {
        n += 1;
        let next = started + Duration::from_secs(n);
        if interrupt::sleep(next.saturating_duration_since(Instant::now())) {
            break;
        }
        if let Err(e) = session.tick() {
            outcome = Err(e);
            break;
        }
        // The caller may end the recording here (watch: a trigger tripped).
        let done = on_tick(&session);
        bar.set_position(n);
        if !std::path::Path::new(&format!("/proc/{}", pid)).exists() {
            outcome = Err(anyhow::anyhow!(
                "the postmaster (pid {}) exited during the recording",
                pid
            ));
            break;
        }
        if done {
            break;
        }
    }
    bar.finish_and_clear();
    let (st, err) = match &outcome {
        Ok(()) if interrupt::requested() => (Status::Interrupted, None),
        Ok(()) => (Status::Complete, None),
        Err(e) => (Status::Failed, Some(format!("{e:#}"))),
    };
    let dir = session.finish(st, err)?;
    Ok(crate::recording::Recorded {
        dir,
        follow_up: outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_reached_through_another_process_root() {
        let of = |p: &str| proc_root_of(std::path::Path::new(p));
        assert_eq!(of("/proc/4242/root/tmp/.s.PGSQL.5432"), Some(4242));
        assert_eq!(of("/proc/4242/root"), Some(4242));
        assert_eq!(of("/proc/self/root/tmp"), None);
        assert_eq!(of("/proc/4242/cwd/tmp"), None);
        assert_eq!(of("/var/run/postgresql/.s.PGSQL.5432"), None);
        assert_eq!(of("proc/4242/root/tmp"), None);
    }
}
