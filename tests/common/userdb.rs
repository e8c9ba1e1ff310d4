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

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl UserCluster {
    /// initdb and start, with `settings` (`-c name=value`) and `env` for the
    /// server (e.g. LD_PRELOAD).
    pub fn start(settings: &[(&str, &str)], env: &[(&str, &Path)]) -> UserCluster {
        let bin = system_bin();
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
        let data = dir.path().join("data");
        let out = as_postgres(&bin, "initdb")
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut opts = format!(
            "-k {} -p {port} -c listen_addresses='' -c log_checkpoints=on",
            dir.path().display()
        );
        for (k, v) in settings {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        let mut ctl = as_postgres(&bin, "pg_ctl");
        ctl.args(["-w", "-t", "60", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(dir.path().join("server.log"))
            .args(["-o", &opts, "start"])
            .stdout(Stdio::null());
        // runuser resets most of the environment; `env` passes these through.
        if !env.is_empty() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "env"]);
            for (k, v) in env {
                c.arg(format!("{k}={}", v.display()));
            }
            c.arg(bin.join("pg_ctl"))
                .args(["-w", "-t", "60", "-D"])
                .arg(&data)
                .arg("-l")
                .arg(dir.path().join("server.log"))
                .args(["-o", &opts, "start"])
                .stdout(Stdio::null());
            ctl = c;
        }
        let st = ctl.status().unwrap();
        let c = UserCluster { bin, dir, port };
        assert!(
            st.success(),
            "pg_ctl start failed: {}",
            std::fs::read_to_string(c.dir.path().join("server.log")).unwrap_or_default()
        );
        c
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
