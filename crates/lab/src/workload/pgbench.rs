//! Running pgbench: initialisation, the timed run with live `-P 1` progress,
//! and the final summary.
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use super::progress::{parse_progress_line, parse_summary, Progress, Summary};
use crate::error::fixable;

/// What a timed run executes: pgbench's own options and, for `-f`, the
/// script's text (written to a temp file named after `name`).
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub name: &'static str,
    pub args: &'static [&'static str],
    pub script: Option<&'static str>,
}

/// Where pgbench connects.
#[derive(Clone, Debug)]
pub struct PgbenchTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub dbname: String,
}

impl PgbenchTarget {
    fn args(&self) -> Vec<String> {
        vec![
            "-h".into(),
            self.host.clone(),
            "-p".into(),
            self.port.to_string(),
            "-U".into(),
            self.user.clone(),
        ]
    }
}

/// The pgbench binary: `$PGBELOW_PGBENCH` if set, else on PATH, else the
/// newest under /usr/lib/postgresql.
pub fn find_pgbench() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PGBELOW_PGBENCH") {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(fixable(
                format!(
                    "PGBELOW_PGBENCH={} is not an executable pgbench",
                    p.display()
                ),
                "point PGBELOW_PGBENCH at pgbench, or unset it to use the one on PATH",
            ))
        };
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("pgbench");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            let p = e.path().join("bin/pgbench");
            p.is_file().then_some((major, p))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).ok_or_else(|| {
        fixable(
            "pgbench not found on PATH or under /usr/lib/postgresql",
            "apt-get install postgresql-contrib (Debian ships pgbench there), or put pgbench on PATH",
        )
    })
}

pub struct Pgbench {
    pub bin: PathBuf,
}

impl Pgbench {
    pub fn locate() -> Result<Pgbench> {
        Ok(Pgbench {
            bin: find_pgbench()?,
        })
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        // Own process group: a terminal Ctrl-C reaches pgbelow, which stops pgbench itself.
        c.process_group(0);
        c.env_remove("PGOPTIONS");
        c
    }

    /// `pgbench --version`'s line, e.g. "pgbench (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)".
    pub fn version(&self) -> Result<String> {
        let out = self
            .command()
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.bin.display()))?;
        if !out.status.success() {
            anyhow::bail!("{} --version failed ({})", self.bin.display(), out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `pgbench -i -s SCALE` (quiet). Fails with pgbench's own error text.
    pub fn init(&self, target: &PgbenchTarget, scale: u32) -> Result<()> {
        let mut cmd = self.command();
        cmd.arg("-i")
            .arg("-q")
            .arg("-s")
            .arg(scale.to_string())
            .args(target.args())
            .arg(&target.dbname)
            .stdin(Stdio::null());
        // A stop request ends the load at once.
        let out = crate::interrupt::output(&mut cmd, None)
            .with_context(|| format!("running {}", self.bin.display()))?;
        if !out.status.success() {
            anyhow::bail!(
                "pgbench -i failed: {}",
                last_error_line(&String::from_utf8_lossy(&out.stderr))
            );
        }
        Ok(())
    }

    /// Start the timed run; progress arrives through [`Running::progress`].
    pub fn start(
        &self,
        target: &PgbenchTarget,
        plan: &Plan,
        clients: u32,
        duration_s: u32,
    ) -> Result<Running> {
        self.start_with(target, plan, clients, duration_s, None)
    }

    /// [`Pgbench::start`] with `PGOPTIONS` for pgbench's sessions
    /// (e.g. `-c synchronous_commit=local`), leaving the server's settings alone.
    pub fn start_with(
        &self,
        target: &PgbenchTarget,
        plan: &Plan,
        clients: u32,
        duration_s: u32,
        pgoptions: Option<&str>,
    ) -> Result<Running> {
        let threads =
            clients.min(std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
        let mut cmd = self.command();
        if let Some(o) = pgoptions {
            cmd.env("PGOPTIONS", o);
        }
        let script = match plan.script {
            Some(text) => {
                let p = std::env::temp_dir().join(format!(
                    "pgbelow-{}-{}.sql",
                    std::process::id(),
                    plan.name
                ));
                // Noted first: a killed run's is removed by the next start.
                let noted =
                    crate::ledger::note(crate::ledger::Object::TempFile { path: p.clone() });
                std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
                cmd.arg("-f").arg(&p);
                Some((p, noted))
            }
            None => None,
        };
        cmd.args(plan.args)
            .arg("-c")
            .arg(clients.to_string())
            .arg("-j")
            .arg(threads.max(1).to_string())
            .arg("-T")
            .arg(duration_s.to_string())
            .arg("-P")
            .arg("1")
            .arg("-n")
            .args(target.args())
            .arg(&target.dbname)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let stderr = child.stderr.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let (tx, rx) = channel();
        let err_thread = std::thread::spawn(move || {
            let mut other = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                match parse_progress_line(&line) {
                    Some(p) => {
                        if tx.send(p).is_err() {
                            break;
                        }
                    }
                    None => other.push(line),
                }
            }
            other
        });
        let out_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        Ok(Running {
            script,
            child: Some(child),
            progress: rx,
            err_thread: Some(err_thread),
            out_thread: Some(out_thread),
        })
    }
}

pub fn last_error_line(stderr: &str) -> String {
    // The server's FATAL line names the cause; pgbench's own last line often does not.
    let lines: Vec<&str> = stderr.lines().collect();
    lines
        .iter()
        .rev()
        .find(|l| l.contains("FATAL"))
        .or_else(|| lines.iter().rev().find(|l| l.contains("error")))
        .or(lines.last())
        .copied()
        .unwrap_or("no output")
        .trim()
        .to_string()
}

/// A pgbench run in progress.
pub struct Running {
    /// The `-f` script file (and its ledger entry), removed when the run is dropped.
    script: Option<(PathBuf, crate::ledger::Noted)>,
    child: Option<Child>,
    progress: Receiver<Progress>,
    err_thread: Option<JoinHandle<Vec<String>>>,
    out_thread: Option<JoinHandle<String>>,
}

impl Running {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Progress lines that arrived since the last call.
    pub fn progress(&self) -> Vec<Progress> {
        self.progress.try_iter().collect()
    }

    /// Has pgbench exited?
    pub fn finished(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Ask pgbench to stop early (SIGINT: it prints its summary and exits).
    pub fn interrupt(&mut self) {
        if let Some(c) = &self.child {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        }
    }

    /// Wait for pgbench and parse its summary. Progress not yet taken is returned too.
    pub fn wait(mut self) -> Result<(Summary, Vec<Progress>)> {
        let status = self.child.take().expect("child").wait()?;
        let other = self
            .err_thread
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        let stdout = self
            .out_thread
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        let rest: Vec<Progress> = self.progress.try_iter().collect();
        let summary = parse_summary(stdout.as_bytes());
        if !status.success() && summary.transactions.is_none() {
            anyhow::bail!("pgbench failed: {}", last_error_line(&other.join("\n")));
        }
        Ok((summary, rest))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some((p, noted)) = self.script.take() {
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {}
                _ => crate::ledger::strike(noted),
            }
        }
    }
}

/// Is this path an executable pgbench? (for doctor's checks)
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_line_of_a_real_failed_connection() {
        let stderr = std::fs::read_to_string(format!(
            "{}/tests/fixtures/pgbench/baddb.stderr",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../..")
        ))
        .unwrap();
        let l = last_error_line(&stderr);
        assert!(l.contains("database \"nosuchdb\" does not exist"), "{l}");
    }
}
