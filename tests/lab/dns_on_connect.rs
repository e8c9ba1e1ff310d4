//! Case `dns-on-connect` end to end on real PostgreSQL: the lab serves DNS
//! on 127.0.0.153:53 with a 200 ms delay, restarts the cluster in a mount
//! namespace of its own that sees private /etc/resolv.conf, /etc/hosts and
//! /etc/nsswitch.conf naming it, and runs pgbench -C -S over TCP with
//! log_hostname=on: every new backend waits in getnameinfo. Only the
//! affected run (CI time): the healthy baseline, the resolver answering at
//! once, is `dns_on_connect_found_attached`'s second recording. Nothing is
//! bound over the host's files and nothing listens on the resolver's
//! address afterwards. Root only (port 53, a mount namespace).
use crate::common;
use common::assert_torn_down;

const ID: &str = "dns-on-connect";

/// Bind mounts over /etc/resolv.conf this process's mount namespace sees.
fn resolv_binds() -> usize {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("/etc/resolv.conf"))
        .count()
}

#[test]
fn a_slow_resolver_delays_every_connection() {
    if common::skipped_unless_root("dns-on-connect needs root (port 53, a mount namespace)") {
        return;
    }
    let binds = resolv_binds();
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("200ms");
    let args = [
        "--duration",
        "4",
        "--scale",
        "1",
        "--collectors",
        "offcpu",
        "--dns-delay-ms",
        "200",
    ];
    let r = common::lab_scenario(ID, &args, &out);
    // Measured 203 ms per connection against the 20 ms bound (10×); the
    // resolver's delay sets it, not the machine's speed.
    let f = common::raised_with_margin(&r, ID, 5.0);
    assert_eq!(f["severity"], "critical", "{f}");
    let ev = &f["evidence"];
    assert_eq!(ev["resolver_frame"], "getnameinfo", "{ev}");
    assert_eq!(ev["log_hostname"], "on", "{ev}");
    assert!(ev["connections_waited"].as_u64().unwrap() >= 10, "{ev}");
    // pgbench -C's own figure agrees: each connection took the delay.
    assert!(
        ev["pgbench_connection_avg_ms"].as_f64().unwrap() >= 150.0,
        "{ev}"
    );
    let m = common::manifest(&out);
    assert_eq!(m["facts"]["dns"]["delay_ms"], 200, "{}", m["facts"]);
    assert_torn_down(&out);
    assert_eq!(
        resolv_binds(),
        binds,
        "a private /etc/resolv.conf leaked to the host"
    );
    std::net::UdpSocket::bind("127.0.0.153:53").expect("the lab's resolver still listens");
    eprintln!("200 ms resolver: {ev}");
}
