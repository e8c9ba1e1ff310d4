//! A throw-away PostgreSQL cluster: initdb, start, run SQL, tear down.
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::account::Account;
use super::install::PgInstall;
use super::procs;
use crate::error::fixable;

/// The database superuser of every cluster.
const SUPERUSER: &str = "postgres";
/// Environment variable naming a library to `LD_PRELOAD` into the lab
/// server (postmaster and all its children), and nothing else pgbelow runs.
pub const SERVER_LD_PRELOAD_ENV: &str = "PGBELOW_SERVER_LD_PRELOAD";
const START_TIMEOUT: Duration = Duration::from_secs(60);
const FAST_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);
const IMMEDIATE_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at starting when the chosen port is taken in the meantime.
const PORT_ATTEMPTS: usize = 3;
/// Lines of server log quoted in errors.
const LOG_TAIL: usize = 8;

/// Settings that pgbelow manages itself and a `--set` may not override.
const RESERVED: &[&str] = &[
    "port",
    "listen_addresses",
    "unix_socket_directories",
    "logging_collector",
    "data_directory",
    "config_file",
    "hba_file",
    "ident_file",
    "include",
    "include_if_exists",
    "include_dir",
];

/// How to set up a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// `--set GUC=VALUE` pairs, appended to postgresql.conf in order.
    pub settings: Vec<(String, String)>,
    /// Turn `log_checkpoints` on.
    pub log_checkpoints: bool,
}

/// A running throw-away cluster. Dropping it stops it and deletes its files.
#[derive(Debug)]
pub struct Cluster {
    install: PgInstall,
    pub(super) account: Account,
    /// The temp dir's ledger entry, struck off once it is gone.
    noted: Option<crate::ledger::Noted>,
    pub(super) root: PathBuf,
    pub(super) data_dir: PathBuf,
    log_path: PathBuf,
    port: u16,
    pid: u32,
    child: Option<Child>,
    stopped: bool,
    /// What the postmaster sees in a mount namespace of its own
    /// ([`Cluster::restart_with_private_mounts`]).
    private: Option<PrivateMounts>,
}

/// What a server restarted in a mount namespace of its own sees instead
/// of the host's: nothing of it is mounted on the host.
#[derive(Clone, Debug, Default)]
pub struct PrivateMounts {
    /// Bytes of a private tmpfs on /dev/shm (as a container's `--shm-size`).
    pub shm: Option<u64>,
    /// Files bound over the host's, `(source, target)`: the server reads
    /// `source` where it opens `target` (e.g. a private /etc/resolv.conf).
    pub files: Vec<(PathBuf, PathBuf)>,
}

impl Cluster {
    /// initdb into a fresh temp dir, start the server on a free 127.0.0.1
    /// port and a unix socket in that dir, and wait until it accepts
    /// connections. A setting the server rejects is a fixable error naming it.
    pub fn start(install: &PgInstall, opts: &ClusterOptions) -> Result<Cluster> {
        validate_settings(&opts.settings)?;
        let mut c = Cluster::empty(install)?;
        // On error `c` is dropped here, which stops and deletes everything.
        c.initdb()?;
        c.configure_and_launch(opts)?;
        Ok(c)
    }

    /// [`Cluster::start`] from a copy of a template's data directory
    /// ([`super::template`]) instead of initdb.
    pub fn start_from(install: &PgInstall, opts: &ClusterOptions, data: &Path) -> Result<Cluster> {
        validate_settings(&opts.settings)?;
        let mut c = Cluster::empty(install)?;
        copy_data(data, &c.data_dir, &c.account)?;
        // Written back before the server starts: the copy's pages are dirty
        // and no checkpoint of the server fsyncs files it did not write, so
        // they would be written back in the measured run (≈ 30 s later) and
        // a scenario's eviction (posix_fadvise drops clean pages only) would
        // leave them cached — a cold start that read from the cache.
        sync_fs(&c.data_dir)?;
        c.configure_and_launch(opts)?;
        Ok(c)
    }

    /// initdb into a fresh temp dir; nothing runs yet.
    pub(super) fn initdb_only(install: &PgInstall) -> Result<Cluster> {
        let c = Cluster::empty(install)?;
        c.initdb()?;
        Ok(c)
    }

    /// A fresh temp dir for a cluster whose data dir is still to be made
    /// (by initdb, or by a base backup for a standby). Nothing runs yet.
    pub(super) fn empty(install: &PgInstall) -> Result<Cluster> {
        let account = Account::server()?;
        check_reachable(&account, install)?;

        let (root, noted) = new_temp_dir()?;
        let c = Cluster {
            install: install.clone(),
            account,
            data_dir: root.join("data"),
            log_path: root.join("server.log"),
            root: root.clone(),
            noted: Some(noted),
            port: 0,
            pid: 0,
            child: None,
            stopped: false,
            private: None,
        };
        // From here on, dropping `c` removes the dir.
        let account = &c.account;
        if let Some(b) = root.parent().and_then(|p| account.blocking_dir(p)) {
            return Err(fixable(
                format!(
                    "the {} account cannot enter {}, which holds the cluster's temp dir",
                    account.name,
                    b.display()
                ),
                "set TMPDIR=/tmp",
            ));
        }
        // sun_path holds 107 bytes.
        let socket_len = root.join(".s.PGSQL.65535").as_os_str().len();
        if socket_len > 107 {
            return Err(fixable(
                format!(
                    "temp dir {} is too long a path for a unix socket",
                    root.display()
                ),
                "set TMPDIR=/tmp",
            ));
        }
        account.chown(&root)?;
        Ok(c)
    }

    /// The ledger's record of this cluster.
    fn ledger_object(&self) -> crate::ledger::Object {
        crate::ledger::Object::Cluster {
            dir: self.root.clone(),
            data_dir: self.data_dir.clone(),
            postmaster_pid: self.child.as_ref().map(Child::id),
        }
    }

    /// Append pgbelow's own settings and `opts.settings` to the data dir's
    /// postgresql.conf, then start the server and wait until it is ready.
    pub(super) fn configure_and_launch(&mut self, opts: &ClusterOptions) -> Result<()> {
        validate_settings(&opts.settings)?;
        self.port = free_port()?;
        self.append_conf(&base_conf(self.port, &self.root, opts.log_checkpoints))?;
        self.append_conf(&settings_conf(&opts.settings))?;
        self.launch(&opts.settings)
    }

    /// Shut the server down (fast) and keep its files, for a cold copy.
    pub(super) fn shutdown_for_copy(&mut self) -> Result<()> {
        let mut child = self.child.take().context("the server is not running")?;
        self.shutdown(&mut child);
        Ok(())
    }

    /// Move pg_wal into `dir` (on another filesystem: files are copied) and
    /// leave a symlink in its place, the server stopped meanwhile. `dir`
    /// must be absent or empty, its parent writable by root.
    pub fn move_wal_to(&mut self, dir: &Path) -> Result<()> {
        self.shutdown_for_copy()?;
        let wal = self.data_dir.join("pg_wal");
        let account = &self.account;
        copy_tree(&wal, dir, &|p| account.chown(p))
            .with_context(|| format!("copying {} to {}", wal.display(), dir.display()))?;
        std::fs::remove_dir_all(&wal).with_context(|| format!("removing {}", wal.display()))?;
        std::os::unix::fs::symlink(dir, &wal)
            .with_context(|| format!("linking {} to {}", wal.display(), dir.display()))?;
        self.relaunch()
    }

    /// Start again after [`Cluster::shutdown_for_copy`], same configuration.
    pub(super) fn relaunch(&mut self) -> Result<()> {
        self.launch(&[])
    }

    /// Stop the server and start it again as it was: shared buffers empty,
    /// the files' pages read from the kernel again.
    pub fn restart(&mut self) -> Result<()> {
        self.shutdown_for_copy()?;
        self.relaunch()
    }

    /// Stop the server and start it again in a mount namespace of its own
    /// whose /dev/shm is a private tmpfs of `bytes` (as a container's
    /// `--shm-size`): unshare(CLONE_NEWNS), the mounts made private, the
    /// tmpfs mounted, before the switch to the server account. Nothing is
    /// mounted on the host: the namespace and its tmpfs vanish with the
    /// server's last process. Root only.
    pub fn restart_with_private_shm(&mut self, bytes: u64) -> Result<()> {
        self.restart_with_private_mounts(PrivateMounts {
            shm: Some(bytes),
            files: Vec::new(),
        })
    }

    /// Stop the server and start it again in a mount namespace of its own
    /// with `mounts` (a private /dev/shm, files bound over the host's):
    /// unshare(CLONE_NEWNS), the mounts made private, then these, before
    /// the switch to the server account. The host's files are untouched;
    /// the namespace vanishes with the server's last process. Root only.
    pub fn restart_with_private_mounts(&mut self, mounts: PrivateMounts) -> Result<()> {
        if !self.account.switch {
            return Err(fixable(
                "private mounts for the lab server (a /dev/shm, /etc files) need a mount \
                 namespace, which needs root",
                "run pgbelow as root (sudo)",
            ));
        }
        self.shutdown_for_copy()?;
        self.private = Some(mounts);
        self.relaunch()
    }

    /// Pid of the postmaster (from postmaster.pid).
    pub fn postmaster_pid(&self) -> u32 {
        self.pid
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.root
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log (stderr of the postmaster).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The database superuser name.
    pub fn user(&self) -> &str {
        SUPERUSER
    }

    /// The binaries this cluster runs.
    pub fn install(&self) -> &PgInstall {
        &self.install
    }

    /// libpq key=value connection string over the unix socket.
    pub fn conninfo(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user={} dbname={}",
            conn_value(&self.root.to_string_lossy()),
            self.port,
            conn_value(SUPERUSER),
            conn_value(dbname)
        )
    }

    /// Server version, e.g. "13.23".
    pub fn version(&self) -> &str {
        &self.install.version
    }

    /// Run `sql` with `psql -X -q -A -t -v ON_ERROR_STOP=1` against `dbname`
    /// and return its stdout.
    pub fn psql(&self, dbname: &str, sql: &str) -> Result<String> {
        let mut cmd = self.install.command("psql");
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.conninfo(dbname))
            .args(["-f", "-"])
            .env("PGCONNECT_TIMEOUT", "10");
        // Input on a thread, so a large result cannot block us while we still write.
        let out = match crate::interrupt::output(&mut cmd, Some(sql.to_string())) {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(fixable(
                    "psql not found (pgbelow runs SQL with it)",
                    "apt-get install postgresql-client",
                ))
            }
            Err(e) => return Err(anyhow!(e).context("running psql")),
        };
        if !out.status.success() {
            bail!(
                "psql on database {dbname} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8(out.stdout).context("psql printed non-UTF-8 output")
    }

    /// Stop the server (fast shutdown, then immediate, then SIGKILL) and
    /// delete the temp dir. Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let mut problems = Vec::new();
        if let Some(mut child) = self.child.take() {
            self.shutdown(&mut child);
        }
        // Server processes run with the data dir as cwd: whatever is left
        // (orphans of a killed postmaster) is found that way.
        let left = procs::pids_with_cwd(&self.data_dir);
        if !left.is_empty() {
            for &p in &left {
                procs::signal(p, libc::SIGKILL);
            }
            let still = procs::wait_gone(&left, KILL_TIMEOUT);
            if !still.is_empty() {
                problems.push(format!("processes {still:?} survived SIGKILL"));
            }
        }
        match std::fs::remove_dir_all(&self.root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                problems.push(format!("removing {}: {e}", self.root.display()))
            }
            _ => {}
        }
        if problems.is_empty() {
            if let Some(n) = self.noted.take() {
                crate::ledger::strike(n);
            }
            Ok(())
        } else {
            bail!(
                "tearing down the cluster in {}: {}",
                self.root.display(),
                problems.join("; ")
            )
        }
    }

    /// Stop the server with a fast shutdown, move its data directory to
    /// `to`, then tear down the rest as [`Cluster::stop`] does. Fails unless
    /// the server shut down cleanly.
    pub(super) fn stop_keeping_data(&mut self, to: &Path) -> Result<()> {
        let mut child = self.child.take().context("the cluster is not running")?;
        procs::signal(child.id(), libc::SIGINT);
        if !procs::wait_child(&mut child, FAST_SHUTDOWN_TIMEOUT) {
            self.child = Some(child);
            bail!(
                "the server in {} did not shut down",
                self.data_dir.display()
            );
        }
        let moved = move_data(&self.data_dir, to, &self.account)
            .with_context(|| format!("moving {} to {}", self.data_dir.display(), to.display()));
        self.stop()?;
        moved
    }

    fn shutdown(&self, child: &mut Child) {
        if procs::wait_child(child, Duration::ZERO) {
            return;
        }
        let pid = child.id();
        // A second Ctrl-C skips the fast shutdown (and ends one under way).
        if !crate::interrupt::forced() {
            procs::signal(pid, libc::SIGINT); // fast shutdown
            if procs::wait_child_unless(child, FAST_SHUTDOWN_TIMEOUT, crate::interrupt::forced) {
                return;
            }
        }
        if crate::interrupt::forced() {
            eprintln!(
                "pgbelow: second interrupt: immediate shutdown of {}",
                self.data_dir.display()
            );
        }
        procs::signal(pid, libc::SIGQUIT); // immediate shutdown
        if procs::wait_child(child, IMMEDIATE_SHUTDOWN_TIMEOUT) {
            return;
        }
        // Backends run in their own process groups (PostgreSQL setsid()s
        // them), so kill them by cwd as well as the postmaster's group.
        let kids = procs::pids_with_cwd(&self.data_dir);
        procs::signal_group(pid, libc::SIGKILL);
        for p in kids {
            procs::signal(p, libc::SIGKILL);
        }
        let _ = child.wait();
    }

    /// A command for an install binary, run as the server account in the
    /// temp dir with C locale (messages we parse stay in English).
    pub(super) fn server_command(&self, name: &str) -> Command {
        let mut cmd = self.install.command(name);
        self.account.apply(&mut cmd);
        cmd.current_dir(&self.root)
            .env("LC_ALL", "C")
            .env_remove("PGDATA")
            .stdin(Stdio::null());
        cmd
    }

    fn initdb(&self) -> Result<()> {
        let mut cmd = self.server_command("initdb");
        cmd.arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "-N",
        ]);
        let out = crate::interrupt::output(&mut cmd, None)
            .with_context(|| format!("running {}", self.install.bin("initdb").display()))?;
        if !out.status.success() {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            bail!(
                "initdb of PostgreSQL {} failed ({}): {}",
                self.install.version,
                out.status,
                tail(&text, LOG_TAIL)
            );
        }
        Ok(())
    }

    pub(super) fn append_conf(&self, text: &str) -> Result<()> {
        let path = self.data_dir.join("postgresql.conf");
        let mut f = OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))
    }

    fn launch(&mut self, settings: &[(String, String)]) -> Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let log = File::create(&self.log_path)
                .with_context(|| format!("creating {}", self.log_path.display()))?;
            self.account.chown(&self.log_path)?;
            let mut cmd = self.server_command("postgres");
            if self.private.is_some() {
                // The account switch moves into pre_exec, after the mounts
                // (which need root); std's would come before it.
                cmd = self.install.command("postgres");
                cmd.current_dir(&self.root)
                    .env("LC_ALL", "C")
                    .env_remove("PGDATA")
                    .stdin(Stdio::null());
            }
            // Test/diagnostic hook: a library preloaded into the server only
            // (e.g. one that turns clock reads into system calls, to reproduce
            // a clocksource without vDSO support). Must be readable by the
            // server account.
            if let Some(lib) = std::env::var_os(SERVER_LD_PRELOAD_ENV).filter(|v| !v.is_empty()) {
                cmd.env("LD_PRELOAD", lib);
            }
            cmd.arg("-D")
                .arg(&self.data_dir)
                .stdout(log.try_clone()?)
                .stderr(log);
            // If pgbelow is killed outright (SIGKILL, OOM), the postmaster gets
            // SIGQUIT (immediate shutdown) instead of running on unowned. std runs
            // this after the uid switch, which would otherwise clear it.
            // Its own process group: a terminal's Ctrl-C reaches pgbelow,
            // which lifts I/O limits before it stops the server, not the
            // server directly.
            match &self.private {
                // SAFETY: prctl is async-signal-safe; no allocation in the closure.
                None => unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT as libc::c_ulong);
                        libc::setpgid(0, 0);
                        Ok(())
                    });
                },
                Some(m) => {
                    let (uid, gid) = (self.account.uid, self.account.gid);
                    let shm = m
                        .shm
                        .map(|b| std::ffi::CString::new(format!("size={b},mode=1777")))
                        .transpose()?;
                    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes());
                    let binds = m
                        .files
                        .iter()
                        .map(|(src, dst)| Ok((c(src)?, c(dst)?)))
                        .collect::<Result<Vec<_>, std::ffi::NulError>>()?;
                    // SAFETY: only async-signal-safe system calls; the
                    // strings were made before the fork.
                    unsafe {
                        cmd.pre_exec(move || {
                            private_mounts_then_switch(shm.as_deref(), &binds, uid, gid)
                        });
                    }
                }
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("starting {}", self.install.bin("postgres").display()))?;
            self.child = Some(child);
            if let Some(n) = &self.noted {
                crate::ledger::update(n, self.ledger_object());
            }
            match self.wait_ready()? {
                None => return Ok(()),
                Some(status) => {
                    self.child = None;
                    let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
                    if attempt < PORT_ATTEMPTS
                        && log.contains("could not bind")
                        && log.contains("already in use")
                    {
                        self.port = free_port()?;
                        self.append_conf(&format!("port = {}\n", self.port))?;
                        continue;
                    }
                    return Err(self.startup_error(&log, settings, status));
                }
            }
        }
    }

    /// Wait until the server accepts connections (`Ok(None)`), or exits
    /// (`Ok(Some(status))`).
    fn wait_ready(&mut self) -> Result<Option<ExitStatus>> {
        let pid_file = self.data_dir.join("postmaster.pid");
        let socket = self.root.join(format!(".s.PGSQL.{}", self.port));
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let child = self.child.as_mut().context("no postmaster")?;
            if let Some(status) = child.try_wait()? {
                return Ok(Some(status));
            }
            if let Some(pid) = ready_pid(&pid_file) {
                if UnixStream::connect(&socket).is_ok() {
                    self.pid = pid;
                    return Ok(None);
                }
            }
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
                bail!(
                    "PostgreSQL {} did not accept connections within {} s; its log ends: {}",
                    self.install.version,
                    START_TIMEOUT.as_secs(),
                    tail(&log, LOG_TAIL)
                );
            }
            if crate::interrupt::sleep(Duration::from_millis(25)) {
                bail!("interrupted while PostgreSQL was starting");
            }
        }
    }

    fn startup_error(
        &self,
        log: &str,
        settings: &[(String, String)],
        status: ExitStatus,
    ) -> anyhow::Error {
        let version = &self.install.version;
        if let Some(r) = rejected_setting(log, settings) {
            let fix = if r.line.contains("unrecognized configuration parameter") {
                format!(
                    "remove --set {}={}: PostgreSQL {version} has no such setting",
                    r.name, r.value
                )
            } else if let Some(hint) = &r.hint {
                format!("pass --set {}=VALUE with a valid value ({hint})", r.name)
            } else {
                format!(
                    "pass --set {}=VALUE with a value PostgreSQL {version} accepts",
                    r.name
                )
            };
            return fixable(
                format!(
                    "PostgreSQL {version} rejected --set {}={}: {}",
                    r.name, r.value, r.line
                ),
                fix,
            );
        }
        anyhow!(
            "PostgreSQL {version} exited while starting ({status}); its log ends: {}",
            tail(log, LOG_TAIL)
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("pgbelow: {msg}");
        }
    }
}

/// Copy a tree of plain files (pg_wal: segments, archive_status), each
/// entry then given to `chown`.
fn copy_tree(from: &Path, to: &Path, chown: &dyn Fn(&Path) -> Result<()>) -> Result<()> {
    std::fs::create_dir_all(to)?;
    chown(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &dest, chown)?;
        } else {
            std::fs::copy(e.path(), &dest)?;
            chown(&dest)?;
        }
    }
    Ok(())
}

/// A fresh `pgbelow-*` directory (mode 0700) in the temp dir, noted in the
/// ledger before it is made.
fn new_temp_dir() -> Result<(PathBuf, crate::ledger::Noted)> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let root = base.join(format!("pgbelow-{}", random_suffix()));
        let noted = crate::ledger::note(crate::ledger::Object::Cluster {
            dir: root.clone(),
            data_dir: root.join("data"),
            postmaster_pid: None,
        });
        match std::fs::DirBuilder::new().mode(0o700).create(&root) {
            Ok(()) => {
                // The umask may have narrowed it; 0700 exactly.
                std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
                return Ok((root, noted));
            }
            Err(e) => {
                crate::ledger::strike(noted);
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(
                        anyhow!(e).context(format!("creating a temp dir in {}", base.display()))
                    );
                }
            }
        }
    }
    bail!("no free temp dir name in {}", base.display())
}

/// Six characters from [a-z0-9], different for each call.
fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    let mut x = h.finish();
    let mut s = String::new();
    for _ in 0..6 {
        let d = (x % 36) as u32;
        s.push(char::from_digit(d, 36).unwrap_or('x'));
        x /= 36;
    }
    s
}

/// The postmaster pid once postmaster.pid says the server is ready.
fn ready_pid(pid_file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(pid_file).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let status = lines.get(7)?.trim();
    if status == "ready" || status == "standby" {
        lines.first()?.trim().parse().ok()
    } else {
        None
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))
        .context("finding a free TCP port on 127.0.0.1")?;
    Ok(l.local_addr()?.port())
}

fn check_reachable(account: &Account, install: &PgInstall) -> Result<()> {
    if !account.switch {
        return Ok(());
    }
    if let Some(b) = account.blocking_dir(&install.bin_dir) {
        return Err(fixable(
            format!(
                "the {} account (PostgreSQL's, as pgbelow runs as root) cannot enter {}, on the way to {}",
                account.name,
                b.display(),
                install.bin_dir.display()
            ),
            format!(
                "chmod o+x {}, or put the binaries under /opt or /usr/local",
                b.display()
            ),
        ));
    }
    let postgres = install.bin_dir.join("postgres");
    if !account.may_execute(&postgres) {
        return Err(fixable(
            format!(
                "the {} account may not execute {}",
                account.name,
                postgres.display()
            ),
            format!("chmod o+rx {}", postgres.display()),
        ));
    }
    Ok(())
}

pub(super) fn validate_settings(settings: &[(String, String)]) -> Result<()> {
    for (name, value) in settings {
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '$')
            && !name.ends_with('.')
            && !name.contains("..");
        if !valid_name {
            return Err(fixable(
                format!("--set {name:?}: not a PostgreSQL setting name"),
                "pass --set GUC=VALUE with a setting name such as work_mem",
            ));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str()) {
            return Err(fixable(
                format!("--set {name}: pgbelow sets {lower} itself"),
                format!("remove --set {name}={value}"),
            ));
        }
        if value.contains(['\n', '\r', '\0']) {
            return Err(fixable(
                format!("--set {name}: the value contains a line break or NUL"),
                format!("pass --set {name}=VALUE on one line"),
            ));
        }
    }
    Ok(())
}

/// A value for postgresql.conf: single-quoted, `'` doubled, `\` escaped.
pub(super) fn conf_quote(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "''"))
}

/// A value for a libpq key=value string, quoted when needed.
pub(super) fn conn_value(v: &str) -> String {
    if !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

fn base_conf(port: u16, socket_dir: &Path, log_checkpoints: bool) -> String {
    let mut s = String::from("\n# added by pgbelow\n");
    s.push_str("listen_addresses = '127.0.0.1'\n");
    s.push_str(&format!("port = {port}\n"));
    s.push_str(&format!(
        "unix_socket_directories = {}\n",
        conf_quote(&socket_dir.to_string_lossy())
    ));
    s.push_str("logging_collector = off\n");
    if log_checkpoints {
        s.push_str("log_checkpoints = on\n");
    }
    s
}

fn settings_conf(settings: &[(String, String)]) -> String {
    let mut s = String::new();
    if !settings.is_empty() {
        s.push_str("# --set\n");
    }
    for (name, value) in settings {
        s.push_str(&format!("{name} = {}\n", conf_quote(value)));
    }
    s
}

/// A setting the server's log says it rejected.
#[derive(Debug, PartialEq, Eq)]
struct Rejected {
    name: String,
    value: String,
    /// The log line from its severity on, e.g. `LOG:  invalid value …`.
    line: String,
    hint: Option<String>,
}

/// The first of `settings` named as `parameter "NAME"` in `log`.
fn rejected_setting(log: &str, settings: &[(String, String)]) -> Option<Rejected> {
    let lines: Vec<&str> = log.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(start) = line.find("parameter \"") else {
            continue;
        };
        let rest = &line[start + "parameter \"".len()..];
        let Some(end) = rest.find('"') else {
            continue;
        };
        let mentioned = &rest[..end];
        let Some((name, value)) = settings
            .iter()
            .rev() // the last of repeated names is the one in force
            .find(|(n, _)| n.eq_ignore_ascii_case(mentioned))
        else {
            continue;
        };
        let hint = lines.get(i + 1).and_then(|l| {
            l.find("HINT:")
                .map(|h| l[h + "HINT:".len()..].trim().to_string())
        });
        return Some(Rejected {
            name: name.clone(),
            value: value.clone(),
            line: from_severity(line).to_string(),
            hint,
        });
    }
    None
}

/// In the child before exec: a mount namespace of its own, every mount in
/// it private (nothing propagates back to the host), a tmpfs mounted with
/// `shm` on /dev/shm if given, each `(source, target)` of `binds` bound
/// over its target; then the switch to `uid`/`gid` (no supplementary
/// groups), the parent-death signal (a credential change clears it) and a
/// process group of its own, as for any lab server.
fn private_mounts_then_switch(
    shm: Option<&std::ffi::CStr>,
    binds: &[(std::ffi::CString, std::ffi::CString)],
    uid: u32,
    gid: u32,
) -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    // SAFETY: plain system calls on NUL-terminated strings.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(err());
        }
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(err());
        }
        if let Some(opts) = shm {
            if libc::mount(
                c"pgbelow-shm".as_ptr(),
                c"/dev/shm".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            ) != 0
            {
                return Err(err());
            }
        }
        for (src, dst) in binds {
            if libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(err());
            }
        }
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            return Err(err());
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGQUIT as libc::c_ulong);
        libc::setpgid(0, 0);
    }
    Ok(())
}

/// A log line without its `log_line_prefix`.
fn from_severity(line: &str) -> &str {
    ["LOG:", "FATAL:", "ERROR:", "WARNING:", "PANIC:"]
        .iter()
        .filter_map(|s| line.find(s))
        .min()
        .map_or(line.trim(), |i| line[i..].trim())
}

/// The last `n` non-empty lines of `text`, joined with " | " (one line).
pub(super) fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return "(empty)".to_string();
    }
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Write back every dirty page of the filesystem holding `dir`.
pub(super) fn sync_fs(dir: &Path) -> Result<()> {
    let f = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    // SAFETY: syncfs on a descriptor we own.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("syncfs of {}", dir.display()));
    }
    Ok(())
}

/// Copy a template's data directory to `to` (which must not exist), owned
/// by `account`, modes kept.
/// `from` renamed to `to`, or copied where `to` is on another filesystem
/// (the temp dir on a tmpfs /tmp, the template cache on disk, as on
/// Debian 13: the rename failed with EXDEV and no lab run had a template).
/// A copied source goes with its cluster's temp dir.
fn move_data(from: &Path, to: &Path, account: &Account) -> Result<()> {
    match std::fs::rename(from, to) {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy_data(from, to, account),
        r => Ok(r?),
    }
}

fn copy_data(from: &Path, to: &Path, account: &Account) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(from).with_context(|| format!("reading {}", from.display()))?;
    std::fs::create_dir(to).with_context(|| format!("creating {}", to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    account.chown(to)?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type()?;
        if ft.is_dir() {
            copy_data(&src, &dst, account)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else {
            std::fs::copy(&src, &dst)
                .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
            account.chown(&dst)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn quotes_conf_values() {
        assert_eq!(conf_quote("10s"), "'10s'");
        assert_eq!(conf_quote("it's"), "'it''s'");
        assert_eq!(conf_quote(r"a\b"), r"'a\\b'");
        assert_eq!(
            settings_conf(&set(&[("search_path", "\"$user\", public")])),
            "# --set\nsearch_path = '\"$user\", public'\n"
        );
    }

    #[test]
    fn quotes_conninfo_values() {
        assert_eq!(conn_value("/tmp/pgbelow-x"), "/tmp/pgbelow-x");
        assert_eq!(conn_value("my db"), "'my db'");
        assert_eq!(conn_value("o'k"), r"'o\'k'");
        assert_eq!(conn_value(""), "''");
    }

    #[test]
    fn rejects_bad_setting_names_and_reserved_ones() {
        assert!(validate_settings(&set(&[("work_mem", "64MB"), ("my.opt", "1")])).is_ok());
        for bad in ["", "1x", "a b", "x=y", "a\nb", "x.", "a..b"] {
            let e = validate_settings(&set(&[(bad, "1")])).unwrap_err();
            assert!(crate::error::find_fixable(&e).is_some(), "{bad:?}");
        }
        let e = validate_settings(&set(&[("Port", "5")])).unwrap_err();
        assert!(e.to_string().contains("Port"), "{e}");
        assert!(validate_settings(&set(&[("work_mem", "1\n2")])).is_err());
    }

    #[test]
    fn finds_the_rejected_setting_in_a_log() {
        // Lines as PostgreSQL 15 writes them.
        let log = "2025-11-22 03:40:01.123 UTC [4242] LOG:  invalid value for parameter \"shared_buffers\": \"banana\"\n\
                   2025-11-22 03:40:01.123 UTC [4242] HINT:  Valid units for this parameter are \"B\", \"kB\", \"MB\", \"GB\", and \"TB\".\n\
                   2025-11-22 03:40:01.123 UTC [4242] FATAL:  configuration file \"/tmp/x/data/postgresql.conf\" contains errors\n";
        let r = rejected_setting(
            log,
            &set(&[("work_mem", "1MB"), ("Shared_Buffers", "banana")]),
        )
        .unwrap();
        assert_eq!(r.name, "Shared_Buffers");
        assert_eq!(
            r.line,
            "LOG:  invalid value for parameter \"shared_buffers\": \"banana\""
        );
        assert!(r.hint.unwrap().starts_with("Valid units"));
        assert_eq!(rejected_setting(log, &set(&[("work_mem", "1MB")])), None);
    }

    #[test]
    fn tail_is_one_line() {
        assert_eq!(tail("a\n\nb\nc\n", 2), "b | c");
        assert_eq!(tail("", 2), "(empty)");
    }

    #[test]
    fn reads_ready_pid() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("postmaster.pid");
        std::fs::write(&f, "123\n/d\n1\n5432\n/tmp\n127.0.0.1\n  1 2\nstarting\n").unwrap();
        assert_eq!(ready_pid(&f), None);
        std::fs::write(&f, "123\n/d\n1\n5432\n/tmp\n127.0.0.1\n  1 2\nready   \n").unwrap();
        assert_eq!(ready_pid(&f), Some(123));
        assert_eq!(ready_pid(&d.path().join("none")), None);
    }
}
