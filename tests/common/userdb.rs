//! A PostgreSQL cluster started the way a user's is — initdb and pg_ctl of
//! the system's PostgreSQL, run as the `postgres` account — not by
//! pgbelow's lab or its provisioning code: attach-mode and connection tests
//! record it. [`UserCluster::builder`] sets it up (binaries, settings, the
//! server's environment, pg_hba.conf, files in the data directory such as
//! TLS certificates, a pid namespace of its own, a container of its own, a
//! standby of another); dropping it stops the server and removes its
//! directory.
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The system's PostgreSQL binaries (Debian: /usr/lib/postgresql/MAJOR/bin),
/// the newest major.
pub fn system_bin() -> PathBuf {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL from Debian (/usr/lib/postgresql)")
        .filter_map(|e| {
            let e = e.ok()?;
            let major = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
        .1
}

/// The PG* variables that would steer libpq or the server's tools: none
/// reaches the cluster's tools or psql here, and tests of how pgbelow reads
/// them start from a clean environment.
pub const PG_ENV: [&str; 16] = [
    "PGHOST",
    "PGHOSTADDR",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "PGPASSWORD",
    "PGPASSFILE",
    "PGSSLMODE",
    "PGSSLROOTCERT",
    "PGSSLCERT",
    "PGSSLKEY",
    "PGSERVICE",
    "PGOPTIONS",
    "PGCONNECT_TIMEOUT",
    "PGCHANNELBINDING",
    "PGAPPNAME",
];

/// `cmd` without any of [`PG_ENV`].
pub fn without_pg_env(cmd: &mut Command) -> &mut Command {
    for v in PG_ENV {
        cmd.env_remove(v);
    }
    cmd
}

/// A running cluster in a temp dir (`dir`: the data directory `data`, the
/// socket, `server.log`); see [`UserCluster::builder`].
pub struct UserCluster {
    pub bin: PathBuf,
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// `unshare` holding a server started in its own pid namespace.
    ns: Option<std::process::Child>,
    /// The server runs in a container: `dir` is its root file system.
    in_container: bool,
    /// The container's cgroup, removed after the server stopped.
    cgroup: Option<ContainerCgroup>,
}

/// What [`ClusterBuilder::prepare`] runs on the data directory.
type Prepare<'a> = Box<dyn FnOnce(&Path) + 'a>;

/// How to set up a [`UserCluster`]; [`ClusterBuilder::start`] starts it.
#[must_use]
pub struct ClusterBuilder<'a> {
    bin: Option<PathBuf>,
    settings: &'a [(&'a str, &'a str)],
    env: &'a [(&'a str, &'a Path)],
    initdb: &'a [&'a str],
    hba: Option<&'a str>,
    prepare: Option<Prepare<'a>>,
    pid_namespace: bool,
    shm_size: Option<&'a str>,
    private_files: &'a [(&'a Path, &'a Path)],
    primary: Option<&'a UserCluster>,
    container: bool,
}

impl<'a> ClusterBuilder<'a> {
    /// The binaries in `bin` (default: [`system_bin`]).
    pub fn bin(mut self, bin: &Path) -> Self {
        self.bin = Some(bin.to_path_buf());
        self
    }

    /// Server settings, `-c name=value` on its command line (after the
    /// harness's own, so they win: e.g. `listen_addresses`).
    pub fn settings(mut self, settings: &'a [(&'a str, &'a str)]) -> Self {
        self.settings = settings;
        self
    }

    /// Variables for the server's environment (e.g. LD_PRELOAD).
    pub fn env(mut self, env: &'a [(&'a str, &'a Path)]) -> Self {
        self.env = env;
        self
    }

    /// More initdb options (e.g. `--no-sync`, `--locale=C`).
    pub fn initdb(mut self, args: &'a [&'a str]) -> Self {
        self.initdb = args;
        self
    }

    /// pg_hba.conf's whole text (default: initdb's, trust for all).
    pub fn hba(mut self, hba: &'a str) -> Self {
        self.hba = Some(hba);
        self
    }

    /// Runs on the data directory, as root, before the start (e.g. writes
    /// TLS certificates); the directory is the `postgres` account's again
    /// afterwards.
    pub fn prepare(mut self, prepare: impl FnOnce(&Path) + 'a) -> Self {
        self.prepare = Some(Box::new(prepare));
        self
    }

    /// Start the server in a pid namespace of its own, as in a container:
    /// its pids (pg_backend_pid(), postmaster.pid) are not this host's.
    pub fn pid_namespace(mut self, on: bool) -> Self {
        self.pid_namespace = on;
        self
    }

    /// Start the server in a mount namespace of its own whose /dev/shm is
    /// a private tmpfs of `size` (`64M`: a container's `--shm-size`); the
    /// namespace and its tmpfs go with the server, nothing is mounted on
    /// the host.
    pub fn shm_size(mut self, size: &'a str) -> Self {
        self.shm_size = Some(size);
        self
    }

    /// Start the server in a mount namespace of its own where each
    /// `(source, target)` file is bound over the host's target (e.g. a
    /// private /etc/resolv.conf); the host's files are untouched. In a
    /// [`ClusterBuilder::container`], copied to target in its root instead.
    pub fn private_files(mut self, files: &'a [(&'a Path, &'a Path)]) -> Self {
        self.private_files = files;
        self
    }

    /// The shell commands that make the namespace's mounts, if any.
    fn mounts(&self) -> Option<String> {
        let shm = self.shm_size.map(|size| {
            format!("mount -t tmpfs -o size={size},mode=1777 pgbelow-test-shm /dev/shm")
        });
        let binds = self.private_files.iter().map(|(src, dst)| {
            format!(
                "mount --bind {} {}",
                shell_quoted(&src.display().to_string()),
                shell_quoted(&dst.display().to_string())
            )
        });
        let all: Vec<String> = shm.into_iter().chain(binds).collect();
        (!all.is_empty()).then(|| all.join(" && "))
    }

    /// Start the server as in a container (without a container runtime):
    /// in pid, mount, network, IPC, UTS and cgroup namespaces of its own,
    /// chrooted to a root file system made in `dir` (a copy of the
    /// install at /opt/pg — an npm build, whose lib/ and share/ sit beside
    /// bin/ — and of the host libraries it links, busybox as /bin/sh, a
    /// `postgres` account, /dev nodes, a tmpfs /dev/shm of 64 MB or
    /// [`ClusterBuilder::shm_size`], the data directory at /data, the
    /// socket in /tmp, no TCP listener), in a cpu cgroup named as Docker's
    /// (`docker-<64 hex>.scope`, [`UserCluster::container_id`]). The
    /// environment of [`ClusterBuilder::env`] names paths in that root.
    pub fn container(mut self, on: bool) -> Self {
        self.container = on;
        self
    }

    /// A streaming standby of `primary` (pg_basebackup) instead of initdb.
    pub fn standby_of(mut self, primary: &'a UserCluster) -> Self {
        self.primary = Some(primary);
        self
    }

    /// Set up the data directory and start the server.
    pub fn start(self) -> UserCluster {
        let mounts = self.mounts();
        let bin = match (self.bin, self.primary) {
            (Some(b), _) => b,
            (None, Some(p)) => p.bin.clone(),
            (None, None) => system_bin(),
        };
        let mut c = UserCluster::new_dir(&bin);
        if self.container {
            make_rootfs(c.dir.path(), &bin, self.private_files);
            c.in_container = true;
        }
        match self.primary {
            Some(p) => p.base_backup(&c),
            None => {
                // A container's root has no locales but C.
                let locale: &[&str] = if self.container { &["--locale=C"] } else { &[] };
                initdb(&bin, &[locale, self.initdb].concat(), &c.data());
            }
        }
        if let Some(hba) = self.hba {
            std::fs::write(c.data().join("pg_hba.conf"), hba).unwrap();
        }
        if let Some(prepare) = self.prepare {
            prepare(&c.data());
        }
        let st = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(c.data())
            .status()
            .unwrap();
        assert!(st.success());
        if self.container {
            c.start_in_container(self.shm_size.unwrap_or("64M"), self.settings, self.env);
        } else if self.pid_namespace || mounts.is_some() {
            c.start_in_namespace(
                self.pid_namespace,
                mounts.as_deref(),
                self.settings,
                self.env,
            );
        } else {
            c.pg_ctl_start(self.settings, self.env);
        }
        c
    }
}

/// A command run to its end that must succeed.
pub trait RunOk {
    /// Its output; panics with its stdout and stderr when it failed.
    fn run_ok(&mut self, what: &str) -> Output;
}

impl RunOk for Command {
    fn run_ok(&mut self, what: &str) -> Output {
        let o = self.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            o.status.success(),
            "{what} failed: {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }
}

/// What `initdb -A trust -U postgres --no-sync ARGS -D DATA` writes: run
/// once per binary and arguments and kept in the build's tmp dir, then
/// copied (`cp -a`, 0.1 s) for each cluster instead of run again (1.3-1.5 s
/// a cluster on this 2-core VM). --no-sync: initdb's final fsync of every
/// file changes nothing about the cluster and cost 1-2.5 s per start.
fn initdb(bin: &Path, args: &[&str], data: &Path) {
    use std::sync::Mutex;
    static LOCK: Mutex<()> = Mutex::new(());
    let postgres = bin.join("postgres");
    let stamp = std::fs::metadata(&postgres)
        .and_then(|m| m.modified())
        .map(|t| format!("{t:?}"))
        .unwrap_or_default();
    let key = format!("{}\n{stamp}\n{}", postgres.display(), args.join("\n"));
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("initdb-{:016x}", fnv1a(&key)));
    {
        // One initdb per key, not one per test thread that wants it.
        let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if !kept.join("PG_VERSION").is_file() {
            // Made where the postgres account may write (the checkout may
            // be out of its reach), then kept by root; renamed into place
            // so that another binary never copies half of it.
            let tmp = tempfile::Builder::new()
                .prefix("pgbelow-usertest-initdb-")
                .tempdir()
                .unwrap();
            Command::new("chown")
                .args(["postgres:postgres"])
                .arg(tmp.path())
                .run_ok("chown");
            let made = tmp.path().join("data");
            as_postgres(bin, "initdb")
                .args(["-A", "trust", "-U", "postgres", "--no-sync"])
                .args(args)
                .arg("-D")
                .arg(&made)
                .run_ok("initdb");
            let part = kept.with_extension(format!("part-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&part);
            std::fs::create_dir_all(kept.parent().unwrap()).unwrap();
            Command::new("cp")
                .arg("-a")
                .arg(&made)
                .arg(&part)
                .run_ok("cp -a");
            if std::fs::rename(&part, &kept).is_err() {
                let _ = std::fs::remove_dir_all(&part);
            }
        }
    }
    Command::new("cp")
        .arg("-a")
        .arg(&kept)
        .arg(data)
        .run_ok("cp -a");
}

/// A stable 64-bit digest of a key (FNV-1a), for a directory name.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    let mut c = Command::new("runuser");
    without_pg_env(&mut c)
        .current_dir("/")
        .args(["-u", "postgres", "--"])
        .arg(bin.join(tool));
    c
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `arg` quoted for the shell pg_ctl starts the server with.
fn shell_quoted(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', "'\\''"))
}

impl UserCluster {
    /// How to set one up: see [`ClusterBuilder`].
    pub fn builder<'a>() -> ClusterBuilder<'a> {
        ClusterBuilder {
            bin: None,
            settings: &[],
            env: &[],
            initdb: &[],
            hba: None,
            prepare: None,
            pid_namespace: false,
            shm_size: None,
            private_files: &[],
            primary: None,
            container: false,
        }
    }

    /// initdb and start the system's PostgreSQL, with `settings`
    /// (`-c name=value`) and `env` for the server (e.g. LD_PRELOAD).
    pub fn start(settings: &[(&str, &str)], env: &[(&str, &Path)]) -> UserCluster {
        UserCluster::builder().settings(settings).env(env).start()
    }

    /// [`UserCluster::start`] with the binaries in `bin`.
    pub fn start_in(bin: &Path, settings: &[(&str, &str)], env: &[(&str, &Path)]) -> UserCluster {
        UserCluster::builder()
            .bin(bin)
            .settings(settings)
            .env(env)
            .start()
    }

    /// A streaming standby of `self` (pg_basebackup -R), started with `settings`.
    pub fn standby(&self, settings: &[(&str, &str)]) -> UserCluster {
        UserCluster::builder()
            .standby_of(self)
            .settings(settings)
            .start()
    }

    /// `self` backed up into `s`'s data directory as its standby.
    fn base_backup(&self, s: &UserCluster) {
        // The npm builds ship the server only; any newer pg_basebackup
        // backs up an older server.
        let tools = if self.bin.join("pg_basebackup").is_file() {
            self.bin.clone()
        } else {
            system_bin()
        };
        as_postgres(&tools, "pg_basebackup")
            .args(["-X", "stream", "-c", "fast", "-U", "postgres", "-h"])
            .arg(self.sock())
            .args(["-p", &self.port.to_string(), "-D"])
            .arg(s.data())
            .run_ok("pg_basebackup");
        // Written here rather than by -R: a newer pg_basebackup's
        // primary_conninfo names options an older server's libpq refuses.
        let auto = s.data().join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto).unwrap_or_default();
        conf.push_str(&format!(
            "primary_conninfo = 'host={} port={} user=postgres application_name=standby1'\n",
            self.sock().display(),
            self.port
        ));
        std::fs::write(&auto, conf).unwrap();
        std::fs::write(s.data().join("standby.signal"), "").unwrap();
    }

    fn new_dir(bin: &Path) -> UserCluster {
        let dir = tempfile::Builder::new()
            .prefix("pgbelow-usertest-")
            .tempdir()
            .unwrap();
        let st = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success());
        UserCluster {
            bin: bin.to_path_buf(),
            dir,
            port: free_port(),
            ns: None,
            in_container: false,
            cgroup: None,
        }
    }

    /// Stop the server (fast shutdown), keeping its data directory.
    pub fn stop(&self) {
        assert!(self.ns.is_none(), "pg_ctl cannot stop a namespaced server");
        let st = as_postgres(&self.bin, "pg_ctl")
            .args(["-w", "-t", "60", "-m", "fast", "-D"])
            .arg(self.data())
            .arg("stop")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "pg_ctl stop");
    }

    /// Start it again after [`UserCluster::stop`].
    pub fn restart_stopped(&self, settings: &[(&str, &str)]) {
        self.pg_ctl_start(settings, &[]);
    }

    /// The server's options: the socket directory (`sock`, as the server
    /// names it), port and `settings`.
    fn server_args(&self, sock: &Path, settings: &[(&str, &str)]) -> Vec<String> {
        let mut args = vec![
            "-k".to_string(),
            sock.display().to_string(),
            "-p".into(),
            self.port.to_string(),
        ];
        let own = [("listen_addresses", ""), ("log_checkpoints", "on")];
        for (k, v) in own.iter().chain(settings) {
            args.extend(["-c".into(), format!("{k}={v}")]);
        }
        args
    }

    /// `runuser -u postgres -- env ENV`: the server's account, with `env`
    /// (runuser resets the environment; `env` passes these through); in
    /// a pid namespace of its own under `unshare` when `pid_namespace`; in
    /// a mount namespace of its own where the shell commands `mounts` ran
    /// (a private /dev/shm, files bound over the host's) when given.
    fn as_server(pid_namespace: bool, mounts: Option<&str>, env: &[(&str, &Path)]) -> Command {
        let unshared = pid_namespace || mounts.is_some();
        let mut c = Command::new(if unshared { "unshare" } else { "runuser" });
        if let Some(mounts) = mounts {
            // Private: the mounts never propagate to the host.
            c.args(["--mount", "--propagation", "private"]);
            c.args(["sh", "-c"])
                .arg(format!("{mounts} && exec \"$0\" \"$@\""));
            if pid_namespace {
                c.arg("unshare");
            }
        }
        if pid_namespace {
            // --kill-child: the namespace goes with its holder even if the
            // postmaster ignored the signal to stop.
            c.args(["--pid", "--fork", "--kill-child", "--mount-proc"]);
        }
        if unshared {
            c.arg("runuser");
        }
        without_pg_env(&mut c)
            .current_dir("/")
            .args(["-u", "postgres", "--", "env"]);
        for (k, v) in env {
            c.arg(format!("{k}={}", v.display()));
        }
        c
    }

    fn pg_ctl_start(&self, settings: &[(&str, &str)], env: &[(&str, &Path)]) {
        assert!(self.ns.is_none(), "pg_ctl cannot start a namespaced server");
        let opts: Vec<String> = self
            .server_args(&self.sock(), settings)
            .iter()
            .map(|a| shell_quoted(a))
            .collect();
        let st = UserCluster::as_server(false, None, env)
            .arg(self.bin.join("pg_ctl"))
            .args(["-w", "-t", "60", "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.log_path())
            .args(["-o", &opts.join(" "), "start"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "pg_ctl start failed: {}", self.log());
    }

    /// The server started under `unshare` (`--pid` and/or `--mount` with
    /// a private /dev/shm), held by that process until drop; ready once
    /// psql gets an answer.
    fn start_in_namespace(
        &mut self,
        pid_namespace: bool,
        mounts: Option<&str>,
        settings: &[(&str, &str)],
        env: &[(&str, &Path)],
    ) {
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = UserCluster::as_server(pid_namespace, mounts, env)
            .arg(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.data())
            .args(self.server_args(&self.sock(), settings))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare (util-linux)");
        self.ns = Some(child);
        self.wait_ready();
    }

    /// The server started in a container (see [`ClusterBuilder::container`])
    /// under `unshare`, which holds it until drop: its root is `dir`, moved
    /// into a Docker-like cpu cgroup first when the host has a v1 cpu
    /// hierarchy.
    fn start_in_container(&mut self, shm: &str, settings: &[(&str, &str)], env: &[(&str, &Path)]) {
        let log = std::fs::File::create(self.log_path()).unwrap();
        let cgroup = ContainerCgroup::new();
        let mut c = Command::new("sh");
        c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        c.args(["-c", r#"[ -z "$0" ] || echo $$ > "$0" && exec "$@""#]);
        c.arg(
            cgroup
                .as_ref()
                .map_or(PathBuf::new(), |g| g.dir.join("cgroup.procs")),
        );
        // --kill-child: the namespaces go with their holder even if the
        // postmaster ignored the signal to stop; private: no mount made
        // inside reaches the host.
        c.args([
            "unshare", "--pid", "--mount", "--net", "--ipc", "--uts", "--cgroup",
        ])
        .args(["--fork", "--kill-child", "--propagation", "private"]);
        // Its loopback up (PostgreSQL 13's statistics collector talks UDP
        // to localhost), its /proc and /dev/shm mounted from inside (pid 1
        // of the new namespace), then chrooted to the root as postgres.
        c.args([
            "sh",
            "-c",
            r#"set -e; root=$1; shm=$2; ug=$3; shift 3
hostname pgbelow-container
ip link set lo up
mount -t proc proc "$root/proc"
mount -t tmpfs -o "size=$shm,mode=1777" pgbelow-test-shm "$root/dev/shm"
exec chroot --userspec="$ug" --groups="${ug#*:}" "$root" "$@""#,
            "sh",
        ]);
        let (uid, gid) = postgres_ids();
        c.arg(self.dir.path())
            .arg(shm)
            .arg(format!("{uid}:{gid}"))
            .args(["/bin/busybox", "env", "-i"]);
        for (k, v) in env {
            c.arg(format!("{k}={}", v.display()));
        }
        c.args(["/opt/pg/bin/postgres", "-D", "/data"])
            .args(self.server_args(Path::new("/tmp"), settings))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.ns = Some(c.spawn().expect("unshare (util-linux)"));
        self.cgroup = cgroup;
        self.wait_ready();
    }

    /// Waits until psql gets an answer from a server started under
    /// `unshare`.
    fn wait_ready(&mut self) {
        let t0 = std::time::Instant::now();
        loop {
            let ready = without_pg_env(&mut Command::new("psql"))
                .args(["-X", "-q", "-d"])
                .arg(self.dsn("postgres"))
                .args(["-c", "select 1"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ready {
                break;
            }
            let exited = self.ns.as_mut().and_then(|ns| ns.try_wait().ok().flatten());
            assert!(
                t0.elapsed().as_secs() < 60 && exited.is_none(),
                "the namespaced server did not start ({exited:?}): {}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's socket directory (a container's /tmp as this host
    /// reaches it).
    pub fn sock(&self) -> PathBuf {
        if self.in_container {
            self.dir.path().join("tmp")
        } else {
            self.dir.path().to_path_buf()
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The postmaster's pid from postmaster.pid: in its own pid namespace
    /// when it has one (see [`UserCluster::host_postmaster_pid`]).
    pub fn postmaster_pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).unwrap();
        text.lines().next().unwrap().trim().parse().unwrap()
    }

    /// The postmaster's pid as this host sees it: the postgres process
    /// whose working directory is the data directory and whose parent is
    /// not a postgres.
    pub fn host_postmaster_pid(&self) -> Option<u32> {
        let data = std::fs::canonicalize(self.data()).ok()?;
        let is_postgres = |pid: &str| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|e| e.file_name().is_some_and(|n| n == "postgres"))
        };
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid = e.file_name().to_str()?.to_string();
            pid.parse::<u32>().ok()?;
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .to_string();
            (cwd == data && is_postgres(&pid) && !is_postgres(&ppid)).then(|| pid.parse().ok())?
        })
    }

    /// The 64-hex-digit id of a [`ClusterBuilder::container`]'s cgroup.
    pub fn container_id(&self) -> Option<&str> {
        self.cgroup.as_ref().map(|g| g.id.as_str())
    }

    pub fn dsn(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db}",
            self.sock().display(),
            self.port
        )
    }

    /// pgbench against `db` with `args`, the connection options added.
    pub fn pgbench_cmd(&self, db: &str, args: &[&str]) -> Command {
        let mut c = Command::new(pgbelow::workload::find_pgbench().expect("pgbench"));
        c.args(args).arg("-h").arg(self.sock()).args([
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
            db,
        ]);
        c
    }

    /// pgbench run to its end; its output (panics with its stderr on failure).
    pub fn pgbench(&self, db: &str, args: &[&str]) -> std::process::Output {
        let o = self.pgbench_cmd(db, args).output().unwrap();
        assert!(
            o.status.success(),
            "pgbench {args:?}: {}\nserver log:\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        o
    }

    /// psql -c (or a script on stdin), as the client would.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = without_pg_env(&mut Command::new("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.dsn(db))
            .args(["-c", sql])
            .run_ok(&format!("psql {sql}"));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// A psql session running `script` in the background.
    pub fn psql_script(&self, db: &str, script: &str) -> std::process::Child {
        let path = self
            .dir
            .path()
            .join(format!("script-{}.sql", rand_suffix()));
        std::fs::write(&path, script).unwrap();
        without_pg_env(&mut Command::new("psql"))
            .args(["-X", "-q", "-d"])
            .arg(self.dsn(db))
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
}

/// The `postgres` account's uid and gid on this host.
fn postgres_ids() -> (String, String) {
    let id = |opt: &str| {
        let o = Command::new("id").args([opt, "postgres"]).run_ok("id");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    (id("-u"), id("-g"))
}

/// The root file system of a [`ClusterBuilder::container`] made in
/// `root`: the install of `bin` copied to /opt/pg, every host library
/// its programs and modules link (as `ldd` finds them) at its own path,
/// busybox as /bin/sh, /etc/passwd and /etc/group with `postgres` (this
/// host's ids, so the data directory's owner is the same inside), an
/// /etc/hosts naming localhost,
/// /tmp, /proc and /dev/shm to mount on, the /dev nodes a server opens,
/// and `files` (`(source, target)`) copied to target.
fn make_rootfs(root: &Path, bin: &Path, files: &[(&Path, &Path)]) {
    let install = bin.parent().unwrap();
    assert!(
        install.join("lib").is_dir() && install.join("share").is_dir(),
        "a container needs an install with lib/ and share/ beside bin/ (an npm build): {}",
        install.display()
    );
    let inside = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    for d in ["opt", "etc", "tmp", "proc", "bin", "dev/shm"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    Command::new("cp")
        .arg("-a")
        .arg(install)
        .arg(root.join("opt/pg"))
        .run_ok("copy the install");
    let programs: Vec<PathBuf> = ["bin", "lib"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join("opt/pg").join(d)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    // ldd exits non-zero when one of them is no dynamic ELF file.
    let o = Command::new("ldd").args(&programs).output().expect("ldd");
    let libs: std::collections::BTreeSet<PathBuf> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let path = l.split_once("=>").map_or(l, |(_, p)| p);
            let path = Path::new(path.split_whitespace().next()?);
            (path.is_absolute() && !path.starts_with(root)).then(|| path.to_path_buf())
        })
        .collect();
    assert!(
        libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
        "no libc among the install's libraries: {libs:?}"
    );
    let busybox = Path::new("/bin/busybox");
    let copies = libs
        .iter()
        .map(|l| (l.as_path(), l.as_path()))
        .chain([(busybox, busybox)])
        .chain(files.iter().copied());
    for (src, dst) in copies {
        let dst = inside(dst);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(src, &dst).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    }
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    let (uid, gid) = postgres_ids();
    std::fs::write(
        root.join("etc/passwd"),
        format!("root:x:0:0:root:/:/bin/sh\npostgres:x:{uid}:{gid}:PostgreSQL:/data:/bin/sh\n"),
    )
    .unwrap();
    // Names resolved from files alone, as a container's /etc/hosts names
    // localhost.
    std::fs::write(
        root.join("etc/nsswitch.conf"),
        "passwd: files\ngroup: files\nhosts: files\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/hosts"),
        "127.0.0.1 localhost\n::1 localhost\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/group"),
        format!("root:x:0:\npostgres:x:{gid}:\n"),
    )
    .unwrap();
    for (name, minor) in [
        ("null", "3"),
        ("zero", "5"),
        ("random", "8"),
        ("urandom", "9"),
    ] {
        Command::new("mknod")
            .args(["-m", "666"])
            .arg(root.join("dev").join(name))
            .args(["c", "1", minor])
            .run_ok("mknod");
    }
}

/// A cpu cgroup named as Docker names a container's
/// (`docker-<64 hex>.scope`, under `pgbelow-test-ctr-PID-N` of the v1 cpu
/// hierarchy), made as a container runtime makes one; removed on drop,
/// any process left in it moved back to the root.
struct ContainerCgroup {
    parent: PathBuf,
    dir: PathBuf,
    id: String,
}

impl ContainerCgroup {
    /// None without a v1 cpu hierarchy.
    fn new() -> Option<ContainerCgroup> {
        let cpu = Path::new("/sys/fs/cgroup/cpu");
        if !cpu.join("cgroup.procs").exists() {
            return None;
        }
        let n = rand_suffix();
        let id = format!("{:032x}{n:032x}", std::process::id());
        let parent = cpu.join(format!("pgbelow-test-ctr-{}-{n}", std::process::id()));
        let dir = parent.join(format!("docker-{id}.scope"));
        std::fs::create_dir_all(&dir).unwrap();
        Some(ContainerCgroup { parent, dir, id })
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for p in procs.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/cpu/cgroup.procs", p);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

impl Drop for UserCluster {
    /// Stops the server (immediate shutdown); the data directory goes
    /// with `dir`.
    fn drop(&mut self) {
        if let Some(mut ns) = self.ns.take() {
            // pg_ctl would signal the namespace's pid on this host: signal
            // the postmaster by its host pid instead (SIGQUIT: immediate).
            if let Some(pm) = self.host_postmaster_pid() {
                // SAFETY: kill has no preconditions.
                unsafe { libc::kill(pm as libc::pid_t, libc::SIGQUIT) };
            }
            let t0 = std::time::Instant::now();
            while ns.try_wait().ok().flatten().is_none() && t0.elapsed().as_secs() < 30 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let _ = ns.kill();
            let _ = ns.wait();
            return;
        }
        let _ = as_postgres(&self.bin, "pg_ctl")
            .args(["-w", "-t", "30", "-m", "immediate", "-D"])
            .arg(self.data())
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
