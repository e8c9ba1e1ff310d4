//! Initialised data directories kept between lab runs: a run copies one
//! (≈ 0.7 s for pgbench scale 10) where it would run initdb, create the
//! `bench` database and `pgbench -i` (≈ 4.6 s on a 2-core VM).
//!
//! A template is a cleanly stopped data directory as those steps left it,
//! with initdb's own postgresql.conf (each run appends its settings to a
//! copy) and only the WAL segment that holds the shutdown checkpoint: the
//! segments the shutdown recycled for later use are removed, so a run
//! creates its WAL segments on demand as one straight after `pgbench -i`
//! did, rather than writing into recycled files (which would change what
//! the WAL and fsync scenarios measure).
//!
//! Kept in `$XDG_CACHE_HOME/pgbelow/clusters/<key>` (`~/.cache/...` when
//! unset), the key naming the PostgreSQL build, the pgbench that filled it
//! and the scale. A template is built in a `.tmp-<pid>` directory beside
//! them and renamed into place, so a killed build never leaves a half
//! template (a later build removes the dead one's directory); at most
//! [`KEEP_BYTES`] of templates are kept, the least recently used removed first.
//! `PGBELOW_LAB_TEMPLATES=off` runs initdb every time.
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use super::cluster::Cluster;
use super::install::PgInstall;

/// Environment variable that turns templates off (`off` or `0`).
pub const ENV: &str = "PGBELOW_LAB_TEMPLATES";
/// Bytes of templates kept (each is the size of its data: 46 MB for the
/// `bench` database alone, 196 MB at scale 10): room for the lab's test
/// suite's 15 or so without rebuilding any.
pub const KEEP_BYTES: u64 = 3 << 30;
/// Bumped when what a template holds changes, so old ones are not used.
const FORMAT: u32 = 1;

/// Whether lab runs use templates (on unless [`ENV`] says off).
pub fn enabled() -> bool {
    !matches!(
        std::env::var(ENV).as_deref().map(str::trim),
        Ok("off" | "0" | "no" | "false")
    )
}

/// Whether a `--set` of this setting would change what initdb, `CREATE
/// DATABASE` or `pgbench -i` write (a template is made under the
/// defaults): the table access method, tablespace and TOAST compression,
/// and the ages at which VACUUM (`pgbench -i` runs one) freezes.
pub fn shapes_data(setting: &str) -> bool {
    let s = setting.to_ascii_lowercase();
    s.starts_with("default_") || s.starts_with("vacuum_")
}

/// What a template was made of: the server build, the tool that filled it
/// and how ("bench" database only, or `pgbench -i -s N`).
pub struct Key {
    pub install: String,
    pub filler: String,
}

impl Key {
    pub fn new(install: &PgInstall, filler: String) -> Key {
        let bin = install.bin("postgres");
        // A rebuilt binary at the same path (an upgrade) is another key.
        let stamp = std::fs::metadata(&bin)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        Key {
            install: format!(
                "{} {} {stamp} format {FORMAT}",
                install.version,
                bin.display()
            ),
            filler,
        }
    }

    /// The directory name: readable, and unique by a digest of the rest.
    fn dir_name(&self, major: u32) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(format!("{}\n{}", self.install, self.filler));
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        format!("pg{major}-{hex}")
    }
}

/// The cache's root directory.
fn root() -> Result<PathBuf> {
    Ok(super::npm::user_cache()?.join("clusters"))
}

/// The data directory of the template for `key`, built now with `fill`
/// (run on a started cluster made by initdb) when there is none yet.
pub fn ensure(
    install: &PgInstall,
    key: &Key,
    status: &dyn Fn(&str),
    fill: impl FnOnce(&Cluster) -> Result<()>,
) -> Result<PathBuf> {
    let root = root()?;
    let dir = root.join(key.dir_name(install.major));
    let data = dir.join("data");
    if data.join("PG_VERSION").is_file() {
        // Its mtime orders the least recently used for removal.
        let _ = std::fs::File::open(&dir).and_then(|f| f.set_modified(SystemTime::now()));
        return Ok(data);
    }
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    remove_dead_builds(&root);
    status(&format!(
        "making a template cluster in {} (once for this build and data)",
        dir.display()
    ));
    let tmp = root.join(format!(".tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let built = build(install, key, &tmp, fill);
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {}
        // Another run built the same template meanwhile: use theirs.
        Err(_) if data.join("PG_VERSION").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e).with_context(|| format!("renaming {} into place", tmp.display()));
        }
    }
    evict(&root, KEEP_BYTES);
    Ok(data)
}

fn build(
    install: &PgInstall,
    key: &Key,
    tmp: &Path,
    fill: impl FnOnce(&Cluster) -> Result<()>,
) -> Result<()> {
    std::fs::create_dir(tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut cluster = Cluster::initdb_only(install)?;
    let conf = cluster.data_dir().join("postgresql.conf");
    let pristine = std::fs::read(&conf).with_context(|| format!("reading {}", conf.display()))?;
    cluster.configure_and_launch(&Default::default())?;
    fill(&cluster)?;
    let data = tmp.join("data");
    cluster.stop_keeping_data(&data)?;
    std::fs::write(data.join("postgresql.conf"), pristine)
        .with_context(|| format!("writing {}", data.display()))?;
    let _ = std::fs::remove_file(data.join("postmaster.opts"));
    trim_wal(&data.join(wal_dir(install.major)))?;
    std::fs::write(
        tmp.join("KEY"),
        format!("{}\n{}\n", key.install, key.filler),
    )?;
    // On disk before it is renamed into place: a crash leaves no torn template.
    super::cluster::sync_fs(tmp)
}

fn wal_dir(major: u32) -> &'static str {
    if major >= 10 {
        "pg_wal"
    } else {
        "pg_xlog"
    }
}

/// Keep only the oldest WAL segment: after a clean shutdown it is the one
/// holding the shutdown checkpoint (older ones were removed or recycled
/// under later names, which are the rest).
fn trim_wal(wal: &Path) -> Result<()> {
    let mut segments: Vec<String> = std::fs::read_dir(wal)
        .with_context(|| format!("reading {}", wal.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.len() == 24 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect();
    segments.sort();
    if segments.is_empty() {
        bail!("{} holds no WAL segment", wal.display());
    }
    for s in &segments[1..] {
        std::fs::remove_file(wal.join(s))
            .with_context(|| format!("removing {}", wal.join(s).display()))?;
    }
    Ok(())
}

/// `.tmp-<pid>` directories of builds whose process is gone.
fn remove_dead_builds(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(".tmp-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Remove the least recently used templates until the rest fit in `keep`
/// bytes; the most recently used one always stays.
fn evict(root: &Path, keep: u64) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut kept: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    kept.sort();
    let sizes: Vec<u64> = kept.iter().map(|(_, p)| bytes_under(p)).collect();
    let mut total: u64 = sizes.iter().sum();
    for ((_, p), size) in kept.iter().zip(&sizes).take(kept.len().saturating_sub(1)) {
        if total <= keep {
            break;
        }
        if std::fs::remove_dir_all(p).is_ok() {
            total -= size;
        }
    }
}

/// Bytes of the regular files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_shape_the_data_are_told_apart() {
        for s in [
            "default_table_access_method",
            "Default_Tablespace",
            "vacuum_freeze_min_age",
        ] {
            assert!(shapes_data(s), "{s}");
        }
        // autovacuum: the run's own setting governs what runs in it.
        for s in [
            "shared_buffers",
            "statement_timeout",
            "autovacuum",
            "io_method",
        ] {
            assert!(!shapes_data(s), "{s}");
        }
    }

    #[test]
    fn only_the_oldest_segment_is_kept() {
        let d = tempfile::tempdir().unwrap();
        for n in [
            "00000001000000000000000B",
            "00000001000000000000000A",
            "00000001000000000000000C",
        ] {
            std::fs::write(d.path().join(n), b"x").unwrap();
        }
        std::fs::create_dir(d.path().join("archive_status")).unwrap();
        std::fs::write(d.path().join("00000002.history"), b"x").unwrap();
        trim_wal(d.path()).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "00000001000000000000000A",
                "00000002.history",
                "archive_status"
            ]
        );
    }

    #[test]
    fn the_least_recently_used_go_first() {
        let d = tempfile::tempdir().unwrap();
        for (i, n) in ["a", "b", "c"].iter().enumerate() {
            let p = d.path().join(n);
            std::fs::create_dir_all(p.join("data")).unwrap();
            std::fs::write(p.join("data").join("f"), vec![0u8; 1000]).unwrap();
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + i as u64);
            std::fs::File::open(&p).unwrap().set_modified(t).unwrap();
        }
        std::fs::create_dir(d.path().join(".tmp-1")).unwrap();
        evict(d.path(), 2_000);
        assert_eq!(names(d.path()), [".tmp-1", "b", "c"]);
        // The newest stays even when it alone is over.
        evict(d.path(), 10);
        assert_eq!(names(d.path()), [".tmp-1", "c"]);
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        left
    }
}
