//! A PostgreSQL cluster started the way a user's is — initdb and pg_ctl of
//! the system's PostgreSQL, run as the `postgres` account — not by
//! pgbelow's lab or its provisioning code: attach-mode tests record it.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The system's PostgreSQL binaries (Debian: /usr/lib/postgresql/MAJOR/bin).
pub fn system_bin() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL from Debian (/usr/lib/postgresql)")
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    dirs.sort();
    dirs.pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

pub struct UserCluster {
    pub bin: PathBuf,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
    c
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl UserCluster {
    /// initdb and start the system's PostgreSQL, with `settings`
    /// (`-c name=value`) and `env` for the server (e.g. LD_PRELOAD).
    pub fn start(settings: &[(&str, &str)], env: &[(&str, &Path)]) -> UserCluster {
        UserCluster::start_in(&system_bin(), settings, env)
    }

    /// [`UserCluster::start`] with the binaries in `bin`.
    pub fn start_in(bin: &Path, settings: &[(&str, &str)], env: &[(&str, &Path)]) -> UserCluster {
        let c = UserCluster::new_dir(bin);
        let out = as_postgres(bin, "initdb")
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(c.data())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c.pg_ctl_start(settings, env);
        c
    }

    /// A streaming standby of `self` (pg_basebackup -R), started with `settings`.
    pub fn standby(&self, settings: &[(&str, &str)]) -> UserCluster {
        let s = UserCluster::new_dir(&self.bin);
        // The npm builds ship the server only; any newer pg_basebackup
        // backs up an older server.
        let tools = if self.bin.join("pg_basebackup").is_file() {
            self.bin.clone()
        } else {
            system_bin()
        };
        let out = as_postgres(&tools, "pg_basebackup")
            .args(["-X", "stream", "-c", "fast", "-U", "postgres", "-h"])
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string(), "-D"])
            .arg(s.data())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_basebackup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Written here rather than by -R: a newer pg_basebackup's
        // primary_conninfo names options an older server's libpq refuses.
        let auto = s.data().join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto).unwrap_or_default();
        conf.push_str(&format!(
            "primary_conninfo = 'host={} port={} user=postgres application_name=standby1'\n",
            self.dir.path().display(),
            self.port
        ));
        std::fs::write(&auto, conf).unwrap();
        std::fs::write(s.data().join("standby.signal"), "").unwrap();
        let st = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(s.data())
            .status()
            .unwrap();
        assert!(st.success());
        s.pg_ctl_start(settings, &[]);
        s
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
        }
    }

    /// Stop the server (fast shutdown), keeping its data directory.
    pub fn stop(&self) {
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

    fn pg_ctl_start(&self, settings: &[(&str, &str)], env: &[(&str, &Path)]) {
        let mut opts = format!(
            "-k {} -p {} -c listen_addresses='' -c log_checkpoints=on",
            self.dir.path().display(),
            self.port
        );
        for (k, v) in settings {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        // runuser resets the environment; `env` passes these through.
        let mut ctl = Command::new("runuser");
        ctl.args(["-u", "postgres", "--", "env"]);
        for (k, v) in env {
            ctl.arg(format!("{k}={}", v.display()));
        }
        ctl.arg(self.bin.join("pg_ctl"))
            .args(["-w", "-t", "60", "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-o", &opts, "start"])
            .stdout(Stdio::null());
        let st = ctl.status().unwrap();
        assert!(
            st.success(),
            "pg_ctl start failed: {}",
            std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
        );
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn postmaster_pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).unwrap();
        text.lines().next().unwrap().trim().parse().unwrap()
    }

    pub fn dsn(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db}",
            self.dir.path().display(),
            self.port
        )
    }

    /// pgbench against `db` with `args`, the connection options added.
    pub fn pgbench_cmd(&self, db: &str, args: &[&str]) -> Command {
        let mut c = Command::new(pgbelow::workload::find_pgbench().expect("pgbench"));
        c.args(args).arg("-h").arg(self.dir.path()).args([
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
            "pgbench {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }

    /// psql -c (or a script on stdin), as the client would.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(self.dsn(db))
            .args(["-c", sql])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// A psql session running `script` in the background.
    pub fn psql_script(&self, db: &str, script: &str) -> std::process::Child {
        let path = self
            .dir
            .path()
            .join(format!("script-{}.sql", rand_suffix()));
        std::fs::write(&path, script).unwrap();
        Command::new("psql")
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

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

impl Drop for UserCluster {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin, "pg_ctl")
            .args(["-w", "-t", "30", "-m", "immediate", "-D"])
            .arg(self.data())
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
