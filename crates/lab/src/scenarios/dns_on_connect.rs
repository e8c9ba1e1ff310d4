//! `dns-on-connect`: every new connection waits on name resolution.
//! pgbench -C -S over TCP (a new connection per transaction, 4 clients)
//! against a server with `log_hostname = on`: PostgreSQL's
//! BackendInitialize (postmaster.c ≤ 16, backend_startup.c 17+) calls
//! getnameinfo on the client's address in the new child before it reads
//! the startup packet — no time limit, nothing in pg_stat_activity, no
//! wait event. With `--dns-via hba` a host name heads pg_hba.conf instead:
//! check_hostname's reverse lookup and its forward confirmation
//! (getaddrinfo) during authentication.
//!
//! The resolver is [`SlowResolver`], a std-only DNS server on
//! 127.0.0.153:53 that answers after `--dns-delay-ms`. The server sees it
//! through private copies of /etc/resolv.conf, /etc/hosts (no name for
//! 127.0.0.1, so the lookup goes to DNS) and /etc/nsswitch.conf (`hosts:
//! files dns`), bound over the host's in a mount namespace of the
//! server's own ([`crate::provision::Cluster::restart_with_private_mounts`]):
//! the host's files are never touched and the namespace vanishes with the
//! server. The copies live in the cluster's own (ledger-owned) directory;
//! the resolver is a fixture that stops at teardown (and on drop).
//! `--dns-delay-ms 0` is the healthy baseline: the same namespace and
//! lookups, answered at once.
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::fixture::Fixture;
use super::spec::{count_in, Flag};
use super::{Fixtures, LabOptions, Scenario, Spec};
use crate::error::fixable;
use crate::provision::{PrivateMounts, Topology};
use crate::workload::Plan;

/// Where the slow resolver listens (glibc has no port syntax: :53).
/// 127.0.0.153, not systemd-resolved's 127.0.0.53.
pub const NAMESERVER: &str = "127.0.0.153";
/// The name every reverse lookup returns (and whose A record is 127.0.0.1).
pub const CLIENT_NAME: &str = "client.pgbelow.test";
/// Default delay of every answer, ms.
pub const DEFAULT_DELAY_MS: u64 = 200;
/// The delay that means "never answer".
pub const NEVER: u64 = u64::MAX;

pub(crate) static DNS_DELAY_MS: Flag = Flag::value(
    "dns-delay-ms",
    "MS|never",
    "dns-on-connect: how long the lab's resolver waits before each answer (default 200; \
     0 is the healthy baseline; never: no answer, glibc gives up after its 1 s timeout)",
    |s| match s.trim() {
        "never" => Ok("never".into()),
        s => count_in(s, 0, 60_000),
    },
);

pub(crate) static DNS_VIA: Flag = Flag::value(
    "dns-via",
    "log_hostname|hba",
    "dns-on-connect: what makes the server resolve: log_hostname=on (the default), or a host \
     name as pg_hba.conf's first line (a reverse and a forward lookup in authentication)",
    |s| match s.trim() {
        v @ ("log_hostname" | "hba") => Ok(v.into()),
        _ => Err(format!("'{s}' is not log_hostname or hba")),
    },
);

/// `--dns-delay-ms` in ms ([`NEVER`] for never).
fn delay_ms(opts: &LabOptions) -> u64 {
    match opts.params.get::<String>("dns-delay-ms").as_deref() {
        Some("never") => NEVER,
        Some(v) => v.parse().unwrap_or(DEFAULT_DELAY_MS),
        None => DEFAULT_DELAY_MS,
    }
}

fn via_hba(opts: &LabOptions) -> bool {
    opts.params.get::<String>("dns-via").as_deref() == Some("hba")
}

pub struct DnsOnConnect;

static SPEC: Spec = Spec {
    name: "dns-on-connect",
    finding: Some("dns-on-connect"),
    description: "pgbench -C -S over TCP (a new connection per transaction, 4 clients, 8 s) \
                  against a server with log_hostname=on whose resolver (the lab's, on \
                  127.0.0.153:53, seen through private /etc files in the server's own mount \
                  namespace; root only, the host's files untouched) answers after 200 ms: every \
                  backend waits in getnameinfo before it exists anywhere. --dns-delay-ms 0 is \
                  the healthy baseline; --dns-via hba puts a host name in pg_hba.conf instead",
    pgbench: Some(Plan {
        name: "dns-on-connect",
        args: &["-C", "-S"],
        script: None,
    }),
    init: true,
    statements_per_transaction: 1,
    clients: 4,
    duration_s: 8,
    flags: &[&DNS_DELAY_MS, &DNS_VIA],
    tcp: true,
    ..Spec::BASE
};

/// A DNS server on UDP `127.0.0.153:53` that answers every query after a
/// delay (settable while it runs): a PTR with [`CLIENT_NAME`], that
/// name's A with 127.0.0.1, its AAAA with no address, anything else
/// NXDOMAIN. Answers wait side by side (a sender thread sleeps to each
/// one's deadline), not behind one another. Stops on drop: nothing
/// listens afterwards.
pub struct SlowResolver {
    delay_ms: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl SlowResolver {
    /// Listen on [`NAMESERVER`]:53 (root: a port below 1024).
    pub fn start(delay_ms: u64) -> Result<SlowResolver> {
        let addr = format!("{NAMESERVER}:53");
        let sock = UdpSocket::bind(&addr).map_err(|e| {
            fixable(
                format!("the lab's resolver cannot listen on UDP {addr}: {e}"),
                "run as root, and stop whatever listens on that address \
                 (`ss -ulpn 'sport = :53'`)",
            )
        })?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))?;
        let out = sock.try_clone()?;
        let mut r = SlowResolver {
            delay_ms: Arc::new(AtomicU64::new(delay_ms)),
            answered: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>, SocketAddr)>();
        let (delay, stop) = (r.delay_ms.clone(), r.stop.clone());
        let receiver = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let d = delay.load(Ordering::Relaxed);
                if d == NEVER {
                    continue;
                }
                if let Some(reply) = answer(&buf[..n]) {
                    let at = Instant::now() + Duration::from_millis(d);
                    if tx.send((at, reply, peer)).is_err() {
                        break;
                    }
                }
            }
        });
        let answered = r.answered.clone();
        let sender = std::thread::spawn(move || {
            // Ends once the receiver is gone and the queue drained.
            while let Ok((at, reply, peer)) = rx.recv() {
                std::thread::sleep(at.saturating_duration_since(Instant::now()));
                if out.send_to(&reply, peer).is_ok() {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        r.threads = vec![receiver, sender];
        Ok(r)
    }

    /// Answer after `ms` from now on ([`NEVER`]: not at all).
    pub fn set_delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Answers sent so far.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Stop listening and wait for both threads (the queued answers are sent).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for SlowResolver {
    fn drop(&mut self) {
        self.stop();
    }
}

const TYPE_A: u16 = 1;
const TYPE_PTR: u16 = 12;
const TYPE_AAAA: u16 = 28;

/// The reply to one DNS query (RFC 1035 §4.1), or None if it is not one.
pub fn answer(q: &[u8]) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    // The question: labels up to the root, then type and class.
    let mut i = 12;
    let mut name = Vec::new();
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        name.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    q.get(i + 3)?;
    let qtype = u16::from_be_bytes([q[i], q[i + 1]]);
    let question = &q[12..i + 4];
    let name = name.join(".");
    let (rcode, rdata): (u8, Option<(u16, Vec<u8>)>) = match qtype {
        TYPE_PTR if name.ends_with(".in-addr.arpa") || name.ends_with(".ip6.arpa") => {
            (0, Some((TYPE_PTR, encode_name(CLIENT_NAME))))
        }
        TYPE_A if name == CLIENT_NAME => (0, Some((TYPE_A, vec![127, 0, 0, 1]))),
        TYPE_AAAA if name == CLIENT_NAME => (0, None),
        _ => (3, None),
    };
    let mut r = Vec::with_capacity(question.len() + 64);
    r.extend_from_slice(&q[0..2]);
    // QR, the opcode and RD echoed, AA; RA, the rcode.
    r.push(0x80 | (q[2] & 0x79) | 0x04);
    r.push(0x80 | rcode);
    r.extend_from_slice(&[0, 1, 0, u8::from(rdata.is_some()), 0, 0, 0, 0]);
    r.extend_from_slice(question);
    if let Some((t, data)) = rdata {
        // The name as a pointer to the question's (offset 12).
        r.extend_from_slice(&[0xc0, 12]);
        r.extend_from_slice(&t.to_be_bytes());
        r.extend_from_slice(&[0, 1, 0, 0, 0, 0]);
        r.extend_from_slice(&(data.len() as u16).to_be_bytes());
        r.extend_from_slice(&data);
    }
    Some(r)
}

fn encode_name(name: &str) -> Vec<u8> {
    let mut v = Vec::new();
    for l in name.trim_end_matches('.').split('.') {
        v.push(l.len() as u8);
        v.extend_from_slice(l.as_bytes());
    }
    v.push(0);
    v
}

/// The private /etc files the server sees, written into `dir`: a
/// resolv.conf naming only [`NAMESERVER`] (1 s timeout, one attempt), a
/// hosts with no name for 127.0.0.1, the host's nsswitch.conf with
/// `hosts: files dns`. `(source, target)` pairs for
/// [`PrivateMounts::files`]; a target the host lacks is left out (a bind
/// needs one), resolv.conf excepted.
pub fn private_etc(dir: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let nss = std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default();
    let mut nss: Vec<String> = nss
        .lines()
        .filter(|l| !l.trim_start().starts_with("hosts:"))
        .map(str::to_string)
        .collect();
    nss.push("hosts: files dns".into());
    let files = [
        (
            "resolv.conf",
            format!("nameserver {NAMESERVER}\noptions timeout:1 attempts:1\n"),
        ),
        // Not even `::1 localhost`: glibc's files backend answers
        // 127.0.0.1 from an IPv6 loopback line.
        (
            "hosts",
            "# pgbelow: no names, every lookup goes to DNS\n".to_string(),
        ),
        ("nsswitch.conf", nss.join("\n") + "\n"),
    ];
    let mut binds = Vec::new();
    for (name, text) in files {
        let (src, dst) = (
            dir.join(format!("pgbelow-{name}")),
            Path::new("/etc").join(name),
        );
        if name != "resolv.conf" && !dst.exists() {
            continue;
        }
        std::fs::write(&src, text).with_context(|| format!("writing {}", src.display()))?;
        binds.push((src, dst));
    }
    Ok(binds)
}

/// The lab's resolver as a fixture: stopped at teardown.
struct Resolver {
    resolver: SlowResolver,
    delay_ms: u64,
    via: &'static str,
}

impl Fixture for Resolver {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some((
            "dns",
            serde_json::json!({
                "nameserver": NAMESERVER,
                "delay_ms": (self.delay_ms != NEVER).then_some(self.delay_ms),
                "never_answers": self.delay_ms == NEVER,
                "via": self.via,
            }),
        ))
    }

    fn teardown(&mut self) -> Result<()> {
        self.resolver.stop();
        Ok(())
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Scenario for DnsOnConnect {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(fixable(
                "the dns-on-connect scenario needs root: it serves DNS on port 53 and starts \
                 the server in a mount namespace of its own with private /etc files",
                "run `sudo pgbelow lab run --scenario dns-on-connect …`",
            ));
        }
        let log_hostname = if via_hba(opts) { "off" } else { "on" };
        Ok(opts.with_settings(&[("log_hostname", log_hostname)]))
    }

    /// The resolver, then the server again in its own mount namespace
    /// with the private /etc files (and, for hba, the host-name line).
    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        let delay = delay_ms(opts);
        let via = if via_hba(opts) { "hba" } else { "log_hostname" };
        host.push(Resolver {
            resolver: SlowResolver::start(delay)?,
            delay_ms: delay,
            via,
        });
        let primary = topo.primary_mut();
        let files = private_etc(primary.socket_dir())?;
        if via == "hba" {
            let hba = primary.data_dir().join("pg_hba.conf");
            let text = std::fs::read_to_string(&hba)
                .with_context(|| format!("reading {}", hba.display()))?;
            // Before initdb's lines: every TCP connection checks it first.
            std::fs::write(&hba, format!("host all all {CLIENT_NAME} trust\n{text}"))
                .with_context(|| format!("writing {}", hba.display()))?;
        }
        status(&format!(
            "restarting the server with a private /etc/resolv.conf ({NAMESERVER}, answers after {})",
            if delay == NEVER {
                "never".to_string()
            } else {
                format!("{delay} ms")
            }
        ));
        primary.restart_with_private_mounts(PrivateMounts { shm: None, files })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query as glibc's res_mkquery builds it: id, RD, one question.
    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend(encode_name(name));
        q.extend(qtype.to_be_bytes());
        q.extend([0, 1]);
        q
    }

    #[test]
    fn answers_ptr_a_aaaa_and_nxdomain() {
        let q = query("1.0.0.127.in-addr.arpa", TYPE_PTR);
        let r = answer(&q).unwrap();
        assert_eq!(&r[0..2], &[0x12, 0x34]);
        assert_eq!(r[2] & 0x80, 0x80, "a response");
        assert_eq!(r[2] & 0x01, 0x01, "RD echoed");
        assert_eq!(r[3] & 0x0f, 0, "NOERROR");
        assert_eq!(&r[6..8], &[0, 1], "one answer");
        assert_eq!(&r[12..q.len()], &q[12..]);
        let rdata = &r[q.len() + 12..];
        assert_eq!(rdata, encode_name(CLIENT_NAME).as_slice());
        assert_eq!(
            u16::from_be_bytes([r[q.len() + 10], r[q.len() + 11]]) as usize,
            rdata.len()
        );

        let r = answer(&query("Client.PGBELOW.test", TYPE_A)).unwrap();
        assert_eq!(&r[r.len() - 4..], &[127, 0, 0, 1]);
        let q = query(CLIENT_NAME, TYPE_AAAA);
        let r = answer(&q).unwrap();
        assert_eq!((r[3] & 0x0f, r[7], r.len()), (0, 0, q.len()));
        let r = answer(&query("example.org", TYPE_A)).unwrap();
        assert_eq!((r[3] & 0x0f, r[7]), (3, 0), "NXDOMAIN");
        // Not a query: a response, or truncated.
        let mut resp = query("example.org", TYPE_A);
        resp[2] |= 0x80;
        assert!(answer(&resp).is_none());
        assert!(answer(&query("example.org", TYPE_A)[..14]).is_none());
    }

    #[test]
    fn delay_flag_reads_never_and_numbers() {
        assert_eq!((DNS_DELAY_MS.parse)("never"), Ok("never".into()));
        assert_eq!((DNS_DELAY_MS.parse)("200"), Ok("200".into()));
        assert!((DNS_DELAY_MS.parse)("soon").is_err());
        assert!((DNS_VIA.parse)("hba").is_ok());
        assert!((DNS_VIA.parse)("dns").is_err());
    }
}
