//! A backend that exits between two ticks of a session and is named while it
//! is a zombie (exited, not yet reaped by the postmaster) keeps its syscalls
//! under a client role.
//!
//! Under CPU load the postmaster can be slow to reap an exited backend; a
//! session tick that named it in that window read an empty title (the kernel
//! drops an exiting process's memory, and with it the title) and filed the
//! backend as "other" for good, so a backend living less than one interval
//! could end up with no syscalls under any client role. Here the postmaster
//! is stopped while the backend exits, which holds that window open.
use std::time::{Duration, Instant};

use pgbelow::collect::session::Session;
use pgbelow::collect::Context;
use pgbelow::procinfo::Role;
use pgbelow::provision::{Cluster, ClusterOptions, PgInstall};
use pgbelow::recording::{this_host_manifest, Status};

/// The state letter of /proc/PID/stat; None once the process is reaped.
fn state(pid: u32) -> Option<char> {
    pgbelow::collect::procfs::parse::parse_stat_state(
        &std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?,
    )
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Stops a process with SIGSTOP and continues it when dropped (also when
/// the test panics, so that the cluster can shut down).
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Stopped {
        // SAFETY: kill has no memory preconditions; the pid is our cluster's
        // live postmaster.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        wait_for("postmaster stopped", || state(pid) == Some('T'));
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_backend_named_while_a_zombie_keeps_its_syscalls_under_a_client_role() {
    let install = PgInstall::system().unwrap();
    let cluster = Cluster::start(&install, &ClusterOptions::default()).unwrap();
    let postmaster = cluster.postmaster_pid();
    let d = tempfile::tempdir().unwrap();
    let mut manifest = this_host_manifest("lab");
    manifest.postgres.postmaster_pid = postmaster;
    let mut s = Session::start(
        d.path().join("rec"),
        manifest,
        Context::new(postmaster),
        &["syscalls".to_string()],
        Vec::new(),
    )
    .unwrap();
    let sc = &s.writer().manifest.collectors[0];
    if sc.status == "failed" {
        eprintln!("syscall counts unavailable here: {:?}", sc.reason);
        return;
    }
    // A backend born after the session started, not named by any tick yet.
    let mut client =
        postgres::Client::connect(&cluster.conninfo("postgres"), postgres::NoTls).unwrap();
    let backend = client
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get::<_, i32>(0) as u32;
    client
        .batch_execute("EXPLAIN ANALYZE SELECT count(*) FROM generate_series(1, 1000)")
        .unwrap();
    let stopped = Stopped::new(postmaster);
    drop(client);
    wait_for("the backend exited", || state(backend) == Some('Z'));
    // The backend is a zombie its stopped parent cannot reap.
    s.tick().unwrap();
    assert_eq!(state(backend), Some('Z'), "still unreaped during the tick");
    drop(stopped);
    wait_for("the postmaster reaped the backend", || {
        state(backend).is_none()
    });
    let dir = s.finish(Status::Complete, None).unwrap();

    let rec = pgbelow::evidence::Evidence::load(&dir).unwrap();
    let named = rec.processes.get(&backend);
    eprintln!("backend {backend} named {named:?}");
    let role = rec.role_of(backend);
    // The postmaster forked it: a backend, however short its life.
    assert_eq!(
        role,
        Role::Backend,
        "a child of the postmaster whose title could not be read is a backend, not {role}: {named:?}"
    );
    assert_eq!(
        named.map(|p| p.title.as_str()),
        Some(pgbelow::collect::session::SHORT_LIVED_BACKEND),
        "{named:?}"
    );
    // Its counts are complete: they run to its exit.
    let calls = rec
        .syscall_totals(None)
        .remove(&backend)
        .expect("the backend's syscalls were counted");
    assert_eq!(calls.get("exit_group"), Some(&1), "{calls:?}");
    let by_role = rec.syscalls_by_role(None);
    let under_clients: u64 = by_role
        .iter()
        .filter(|(r, _)| matches!(r, Role::Backend | Role::ShortLived))
        .map(|(_, c)| c.total())
        .sum();
    assert!(under_clients >= calls.values().sum::<u64>(), "{by_role:?}");
}
