//! `pgbelow watch --all` (root): one agent for every postmaster on the host.
//! Two clusters started as a user would (one with cluster_name), then a
//! third in a pid namespace of its own (as in a container): each one's
//! series carry its data_directory, port and cluster labels on one
//! /metrics whose families are each declared once (promtool agrees); a
//! stopped cluster's series go, a new one's come; on SIGTERM the agent
//! exits 0 and leaves no BPF program behind. Other postmasters on the host
//! (other tests') may be watched too: only these clusters' series are
//! asserted.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::userdb::{free_port, UserCluster};

const WINDOW: u64 = 5;

fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// The sample lines of `family` whose labels include `data_directory="DIR"`.
fn series_of<'a>(body: &'a str, family: &str, dir: &str) -> Vec<&'a str> {
    let key = format!("data_directory=\"{dir}\"");
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&key))
        .collect()
}

fn data_dir(c: &UserCluster) -> String {
    c.data().display().to_string()
}

/// The labels watch --all gives `c`'s series, as they open the label set.
fn labels(c: &UserCluster, cluster: Option<&str>) -> String {
    let mut l = format!("data_directory=\"{}\",port=\"{}\"", data_dir(c), c.port);
    if let Some(name) = cluster {
        l += &format!(",cluster=\"{name}\"");
    }
    l
}

/// Format check by Debian's promtool (scripts/setup installs it; skipped
/// outside CI when missing).
fn promtool_check(body: &str) {
    if Command::new("promtool").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is missing in CI: scripts/setup installs prometheus"
        );
        eprintln!("promtool not found: the exposition's format is checked by hand only");
        return;
    }
    common::promtool_check(body);
}

/// Each family's HELP and TYPE once, whatever number of servers.
fn declared_once(body: &str) {
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for l in body.lines() {
        if l.starts_with("# HELP ") || l.starts_with("# TYPE ") {
            *seen.entry(l.split(' ').nth(2).unwrap()).or_default() += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 2).collect();
    assert!(twice.is_empty(), "declared more than once: {twice:?}");
}

#[test]
fn watch_all_follows_the_hosts_clusters() {
    let t_start = Instant::now();
    let logs = tempfile::tempdir().unwrap();
    let named = UserCluster::builder()
        .settings(&[("cluster_name", "alpha")])
        .initdb(&["--no-sync"])
        .start();
    let plain = UserCluster::builder().initdb(&["--no-sync"]).start();
    let bpf_before: std::collections::BTreeSet<u64> = common::bpf_programs().into_keys().collect();
    let port = free_port();
    let log = logs.path().join("watch.log");
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("pgbelow"))
        .args(["watch", "--all", "--window", &WINDOW.to_string()])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let watch_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let wait_for = |secs: u64, what: &str, f: &dyn Fn(&str) -> bool| -> String {
        let t0 = Instant::now();
        loop {
            if let Some(m) = scrape(port).filter(|m| f(m)) {
                return m;
            }
            assert!(
                t0.elapsed().as_secs() <= secs,
                "timed out after {secs} s waiting for {what}\nlast scrape:\n{}\nwatch log:\n{}",
                scrape(port).unwrap_or_default(),
                watch_log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let windowed = |m: &str, c: &UserCluster| {
        series_of(m, "pgbelow_windows_total", &data_dir(c))
            .iter()
            .any(|l| !l.ends_with(" 0"))
    };

    // Both clusters, a window each, labelled; one family declaration each.
    let m = wait_for(3 * WINDOW, "a window of both clusters", &|m| {
        windowed(m, &named) && windowed(m, &plain)
    });
    for (c, name) in [(&named, Some("alpha")), (&plain, None)] {
        let want = format!("pgbelow_postgres_up{{{}}} 1", labels(c, name));
        assert!(m.lines().any(|l| l == want), "no {want} in\n{m}");
        let up = series_of(&m, "pgbelow_collector_up", &data_dir(c));
        // The default collectors: syscalls, procfs, pgstat, system.
        assert_eq!(up.len(), 4, "{up:?}");
        assert!(
            up.iter().all(|l| l.ends_with(" 1")),
            "{up:?}\n{}",
            watch_log()
        );
        let info = series_of(&m, "pgbelow_postgres_info", &data_dir(c));
        assert!(info.iter().any(|l| l.contains("version=\"")), "{info:?}");
        assert!(!info.iter().any(|l| l.contains("container=")), "{info:?}");
    }
    assert!(
        !series_of(&m, "pgbelow_windows_total", &data_dir(&plain))[0].contains("cluster="),
        "an unset cluster_name is no label"
    );
    assert_eq!(m.matches("\nprocess_cpu_seconds_total ").count(), 1, "{m}");
    declared_once(&m);
    promtool_check(&m);

    // One stops: its series go within two windows, the other's stay.
    plain.stop();
    let t_stop = Instant::now();
    let m = wait_for(2 * WINDOW, "the stopped cluster's series to go", &|m| {
        !m.contains(&format!("data_directory=\"{}\"", data_dir(&plain)))
    });
    let gone_s = t_stop.elapsed().as_secs_f64();
    assert!(!series_of(&m, "pgbelow_postgres_up", &data_dir(&named)).is_empty());

    // A third, in a pid namespace of its own as in a container: found, with
    // its pids mapped (postmaster.pid names its namespace's pid).
    let ns = UserCluster::builder()
        .pid_namespace(true)
        .initdb(&["--no-sync"])
        .start();
    assert_ne!(Some(ns.postmaster_pid()), ns.host_postmaster_pid());
    let want = format!("pgbelow_postgres_up{{{}}} ", labels(&ns, None));
    let m = wait_for(2 * WINDOW, "the new cluster's series", &|m| {
        m.lines().any(|l| l.starts_with(&want))
    });
    declared_once(&m);
    promtool_check(&m);

    // SIGTERM: exit 0, every program it loaded unloaded.
    // SAFETY: kill has no preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed().as_secs() > 30 {
            let _ = child.kill();
            panic!("watch --all did not stop on SIGTERM:\n{}", watch_log());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "watch exited {status:?}:\n{}",
        watch_log()
    );
    let (_, loaded) = common::bpf_leaked(&bpf_before);
    assert!(loaded.is_empty(), "BPF programs left loaded: {loaded:?}");
    let log_text = watch_log();
    assert!(
        log_text.contains("alpha (port") && log_text.contains("its series are dropped"),
        "{log_text}"
    );

    // The clusters go with the test: no postgres of theirs left.
    let pms: Vec<u32> = [&named, &ns]
        .iter()
        .filter_map(|c| c.host_postmaster_pid())
        .collect();
    drop((named, plain, ns));
    for pm in pms {
        assert!(
            !common::alive(u64::from(pm)),
            "postmaster {pm} still running"
        );
    }
    eprintln!(
        "watch --all: a stopped cluster's series gone after {gone_s:.1} s; the test took {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
}
