//! `dns-on-connect`: new connections wait on name resolution. With
//! `log_hostname = on` every new backend resolves the client's address
//! (getnameinfo in BackendInitialize, before the startup packet is read:
//! no pg_stat_activity row, no wait event, no time limit); a host name in
//! pg_hba.conf costs a reverse and a forward lookup (check_hostname's
//! getnameinfo and getaddrinfo) during authentication, for every TCP
//! connection that reaches that line. A slow or unreachable resolver then
//! adds its delay to every connection.
//!
//! Measured where the process waits: the offcpu collector's blocks of the
//! server's processes whose user stack is in the resolver (glibc's
//! getnameinfo/getaddrinfo … res_context_send … poll), or, when the user
//! stack was not copied, whose kernel stack is in poll(): PostgreSQL's
//! own waits use epoll (WaitEventSetWait) on Linux, so a poll() in a
//! server process is glibc's resolver (a bare poll of a process named
//! with another role, a walreceiver's libpq, is left out). (libpq inside a backend —
//! dblink, postgres_fdw — and LDAP authentication also poll; their
//! blocks would count here.) Each process with such a block is one
//! connection that waited. Decided on the measured cost: the ms each
//! connection spent waiting and the client-seconds lost per second.
use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::{Figure, Finding, Gauge, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::offcpu::{PidStack, NO_USER_STACK};
use crate::role::Role;
use crate::round3;

pub const ID: &str = "dns-on-connect";

/// User frames of glibc's resolver and PostgreSQL's wrappers around it,
/// as unwound on Linux (`__GI_getnameinfo`, `__GI___res_context_send`,
/// compared without the leading `__GI_`/underscores).
pub const RESOLVER_FRAMES: &[&str] = &[
    "getnameinfo",
    "getaddrinfo",
    "gethostbyaddr_r",
    "gethostbyname2_r",
    "res_context_send",
    "res_context_query",
    "res_nquery",
    "pg_getnameinfo_all",
    "pg_getaddrinfo_all",
];
/// Kernel frames of poll(), which the server's own waits never use.
pub const POLL_FRAMES: &[&str] = &[
    "__x64_sys_poll_[k]",
    "__x64_sys_ppoll_[k]",
    "__arm64_sys_ppoll_[k]",
    "do_sys_poll_[k]",
];
/// Milliseconds of resolution per connection from which it is slow.
/// Measured here (2 vCPU, PostgreSQL 15.18, pgbench -C -S over TCP,
/// `lab run --scenario dns-on-connect`): 4–5 ms per connection with the
/// lab's resolver answering at once (the resolver, pgbench and 4 clients'
/// backends sharing 2 loaded CPUs), 201 ms with it answering after
/// 200 ms. A resolver in the same data centre answers a PTR in 0.2–2 ms.
pub const WARN_MS: f64 = 20.0;
/// …and the waits must cost this many client-seconds per second of the
/// recording (5 % of one client's time) over at least `MIN_CONNECTIONS`
/// (a few: a resolver that never answers lets 4 clients connect about
/// once a second each — measured 9 connections in 5.5 s at 1006 ms each,
/// `--dns-delay-ms never`).
pub const MIN_LOST_S_PER_S: f64 = 0.05;
pub const MIN_CONNECTIONS: usize = 3;
/// Critical from this per connection (a resolver timing out costs ≥ 1 s),
/// or from this many client-seconds per second.
pub const CRITICAL_MS: f64 = 100.0;
pub const CRITICAL_LOST_S_PER_S: f64 = 0.5;

/// Without leading underscores and glibc's internal `__GI_` prefix.
fn plain(frame: &str) -> &str {
    let f = frame.trim_start_matches('_');
    f.strip_prefix("GI_").unwrap_or(f).trim_start_matches('_')
}

/// The resolver frame of a block: the outermost of [`RESOLVER_FRAMES`]
/// in its user stack, `poll` for a poll() without a user stack, None for
/// any other block.
fn resolver_frame(s: &PidStack) -> Option<&str> {
    if let Some(f) = s.frames.iter().find(|f| {
        let p = plain(f);
        RESOLVER_FRAMES.contains(&p) && !p.starts_with("pg_")
    }) {
        return Some(plain(f));
    }
    (s.frames.iter().any(|f| f == NO_USER_STACK)
        && s.frames.iter().any(|f| POLL_FRAMES.contains(&f.as_str())))
    .then_some("poll")
}

/// Which lookup the stack is: hba's (authentication) or log_hostname's.
fn lookup_kind(s: &PidStack) -> &'static str {
    let auth = s.frames.iter().any(|f| {
        matches!(
            f.as_str(),
            "ClientAuthentication" | "hba_getauthmethod" | "check_hba" | "check_hostname"
        )
    });
    match (auth, s.frames.iter().any(|f| plain(f) == "getaddrinfo")) {
        (_, true) => "pg_hba.conf host name (forward lookup)",
        (true, false) => "pg_hba.conf host name (reverse lookup)",
        (false, false) if s.frames.iter().any(|f| f == NO_USER_STACK) => "unknown (no user stack)",
        _ => "log_hostname (reverse lookup)",
    }
}

/// The connections' waits on the resolver over the recording.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolverWait {
    /// Seconds blocked (sleeping, S or D) in the resolver, all processes.
    pub wait_s: f64,
    /// Processes with such a block: connections that waited.
    pub connections: usize,
    /// Those processes' whole time off the CPU.
    pub their_off_cpu_s: f64,
    /// Seconds by resolver frame, and by lookup.
    pub by_frame: BTreeMap<String, f64>,
    pub by_lookup: BTreeMap<String, f64>,
    pub duration_s: f64,
}

impl ResolverWait {
    pub fn ms_per_connection(&self) -> Option<f64> {
        (self.connections > 0).then(|| self.wait_s * 1000.0 / self.connections as f64)
    }

    /// Client-seconds spent waiting per second of the recording.
    pub fn lost_s_per_s(&self) -> f64 {
        self.wait_s / self.duration_s.max(1e-9)
    }

    pub fn connections_per_s(&self) -> f64 {
        self.connections as f64 / self.duration_s.max(1e-9)
    }
}

/// The resolver waits; None without the offcpu collector's per-process stacks.
pub fn resolver_wait(ev: &Evidence) -> Option<ResolverWait> {
    let o = ev.offcpu.as_ref()?;
    if o.pid_stacks.is_empty() {
        return None;
    }
    let mut w = ResolverWait {
        wait_s: 0.0,
        connections: 0,
        their_off_cpu_s: 0.0,
        by_frame: BTreeMap::new(),
        by_lookup: BTreeMap::new(),
        duration_s: ev
            .manifest
            .duration_s
            .unwrap_or(o.summary.duration_s)
            .max(1e-9),
    };
    // A process named with another role (a walreceiver's libpq) is no
    // connection being set up: its bare polls are not counted.
    let not_connection = |pid: u32| {
        ev.processes
            .get(&pid)
            .is_some_and(|p| !matches!(p.role, Role::Backend | Role::ShortLived | Role::Other))
    };
    let mut pids = BTreeSet::new();
    for s in &o.pid_stacks {
        // Waiting for the answer; time on the run queue is the CPU's.
        if s.state == "runq" {
            continue;
        }
        if let Some(f) = resolver_frame(s).filter(|f| *f != "poll" || !not_connection(s.pid)) {
            let sec = s.us as f64 / 1e6;
            w.wait_s += sec;
            *w.by_frame.entry(f.to_string()).or_default() += sec;
            *w.by_lookup.entry(lookup_kind(s).to_string()).or_default() += sec;
            pids.insert(s.pid);
        }
    }
    w.connections = pids.len();
    w.their_off_cpu_s = o
        .pid_stacks
        .iter()
        .filter(|s| pids.contains(&s.pid))
        .map(|s| s.us as f64 / 1e6)
        .sum();
    Some(w)
}

fn ms_per_connection(ev: &Evidence) -> Option<f64> {
    resolver_wait(ev)?.ms_per_connection().map(round3)
}

fn seconds_per_connection(ev: &Evidence) -> Option<f64> {
    resolver_wait(ev)?.ms_per_connection().map(|ms| ms / 1000.0)
}

/// What makes the server resolve, from its settings: log_hostname.
fn log_hostname(ev: &Evidence) -> Option<&str> {
    ev.manifest
        .postgres
        .settings
        .get("log_hostname")
        .map(String::as_str)
}

fn unmeasured(ev: &Evidence) -> String {
    let why = match &ev.offcpu {
        Some(_) => {
            "the offcpu collector recorded no per-process stacks (a recording older than \
                    offcpu.stacks.jsonl)"
        }
        None => {
            "the offcpu collector did not run: it times each wait of the server's processes \
                 with its stacks (record with --collectors …,offcpu; root, or CAP_BPF and \
                 CAP_PERFMON)"
        }
    };
    match log_hostname(ev) {
        Some("on") => format!(
            "{why}; log_hostname is on, so every new connection resolves the client's address"
        ),
        _ => why.to_string(),
    }
}

pub struct DnsOnConnect;

impl Rule for DnsOnConnect {
    fn id(&self) -> &'static str {
        ID
    }

    // The resolver's, not PostgreSQL's: no major changes the lookups
    // (17 moved BackendInitialize to backend_startup.c; 18 shows hba's
    // lookups as a pg_stat_activity row in 'starting').
    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "ms of name resolution per new connection",
            value: ms_per_connection,
            metric: Some(Gauge {
                name: "pgbelow_connection_dns_seconds_per_connection",
                help: "Seconds the server's new connections waited on name resolution (log_hostname, host names in pg_hba.conf) per connection that waited, over the last window (absent when none did).",
                value: seconds_per_connection,
            }),
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        match resolver_wait(ev) {
            None => Measure::Missing(unmeasured(ev)),
            Some(w) => Measure::Figure(Figure::above(
                "name resolution per new connection",
                w.ms_per_connection().map_or(0.0, round3),
                "ms",
                WARN_MS,
            )),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let w = resolver_wait(ev)?;
        let ms = w.ms_per_connection()?;
        if ms < WARN_MS {
            return None;
        }
        let lost = w.lost_s_per_s();
        let costly = lost >= MIN_LOST_S_PER_S && w.connections >= MIN_CONNECTIONS;
        let severity = match costly {
            false => Severity::Info,
            true if ms >= CRITICAL_MS || lost >= CRITICAL_LOST_S_PER_S => Severity::Critical,
            true => Severity::Warning,
        };
        let top = |m: &BTreeMap<String, f64>| {
            m.iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(k, _)| k.clone())
                .unwrap_or_default()
        };
        let (frame, lookup) = (top(&w.by_frame), top(&w.by_lookup));
        let setting = match log_hostname(ev) {
            Some(v) => format!(" log_hostname is {v}."),
            None => String::new(),
        };
        let share = w.wait_s / w.their_off_cpu_s.max(w.wait_s).max(1e-9);
        let connect_ms = ev.workload.as_ref().and_then(|w| w.connection_avg_ms);
        let setting = match connect_ms {
            Some(c) => format!("{setting} pgbench's average connection time was {c:.1} ms."),
            None => setting,
        };
        let summary = if costly {
            format!(
                "New connections waited {ms:.1} ms each on name resolution ({n} connections, \
                 {cps:.1}/s × {ms:.0} ms = {lost:.2} client-seconds lost per second), mostly \
                 in {frame} — {lookup}; a resolver nearby answers in 0.2–2 ms. The wait comes \
                 {when}.{setting}",
                when = if lookup.starts_with("log_hostname") {
                    "before the connection exists anywhere in PostgreSQL (no pg_stat_activity \
                     row, no wait event, no timeout)"
                } else {
                    "during authentication, before the connection has a pg_stat_activity row \
                     (no wait event; authentication_timeout bounds it)"
                },
                n = w.connections,
                cps = w.connections_per_s(),
            )
        } else {
            format!(
                "Each new connection waits {ms:.1} ms on name resolution (in {frame} — \
                 {lookup}), but only {n} connections in {d:.0} s waited ({lost:.3} \
                 client-seconds per second): it costs little at this connection rate and \
                 every client that connects pays it.{setting}",
                n = w.connections,
                d = w.duration_s,
            )
        };
        Some(Finding {
            id: ID.into(),
            severity,
            impact: costly
                .then(|| {
                    Impact::new(
                        share,
                        "the new connections' time off the CPU",
                        format!(
                            "offcpu: {:.2} s blocked in the resolver of {:.2} s off the CPU by \
                             {} connections",
                            w.wait_s, w.their_off_cpu_s, w.connections
                        ),
                    )
                })
                .flatten(),
            title: "New connections wait on name resolution".into(),
            summary,
            evidence: json!({
                "ms_per_connection": round3(ms),
                "connections_waited": w.connections,
                "connections_per_s": round3(w.connections_per_s()),
                "resolver_wait_s": round3(w.wait_s),
                "lost_client_s_per_s": round3(lost),
                "resolver_frame": frame,
                "lookup": lookup,
                "by_frame_s": w.by_frame.iter().map(|(k, v)| (k.clone(), round3(*v))).collect::<BTreeMap<_, _>>(),
                "log_hostname": log_hostname(ev),
                "pgbench_connection_avg_ms": connect_ms,
                "bound_ms": WARN_MS,
            }),
            remedy: "Every new connection waits for the resolver. Turn log_hostname off (logs \
                     and pg_stat_activity keep client_addr; client_hostname is lost), and \
                     replace host names in pg_hba.conf with addresses or CIDR ranges; or make \
                     resolution fast and local (a caching resolver such as nscd or \
                     systemd-resolved, PTR records for the client subnets, the clients in \
                     /etc/hosts). A connection pooler avoids a connection per transaction. On \
                     PostgreSQL 18 and later, log_connections = setup_durations logs each connection's \
                     setup time to confirm."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Measure, Status};

    // Real lab runs: `pgbelow lab run --scenario dns-on-connect --pg 15
    // --duration 4 --collectors offcpu,syscalls,pgstat` with the lab's
    // resolver answering after 200 ms and at once (`--dns-delay-ms 0`).
    #[test]
    fn fires_on_the_slow_resolver() {
        let ev = fixture("pg15-dns-on-connect-200ms");
        let f = DnsOnConnect.evaluate(&ev).expect("finding");
        assert_eq!(f.severity, Severity::Critical, "{f:?}");
        let ms = f.evidence["ms_per_connection"].as_f64().unwrap();
        assert!((150.0..300.0).contains(&ms), "{ms} ms per connection");
        assert_eq!(f.evidence["resolver_frame"], "getnameinfo", "{f:?}");
        assert_eq!(f.evidence["log_hostname"], "on", "{f:?}");
        assert!(f.impact.is_some(), "{f:?}");
        assert!(f.summary.contains("client-seconds"), "{}", f.summary);
    }

    #[test]
    fn clear_when_the_resolver_answers_at_once() {
        let ev = fixture("pg15-dns-on-connect-0ms");
        let (c, f) = DnsOnConnect.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        // The same lookups happen, one per connection: only their time
        // tells the two apart.
        let w = resolver_wait(&ev).unwrap();
        assert!(w.connections >= 20, "{w:?}");
        assert!(w.ms_per_connection().unwrap() < WARN_MS / 2.0, "{w:?}");
    }

    #[test]
    fn not_measurable_without_offcpu() {
        let mut ev = fixture("pg15-dns-on-connect-200ms");
        ev.offcpu = None;
        match DnsOnConnect.measure(&ev) {
            Measure::Missing(why) => {
                assert!(why.contains("offcpu collector"), "{why}");
                assert!(why.contains("log_hostname is on"), "{why}");
            }
            m => panic!("{m:?}"),
        }
        assert!(DnsOnConnect.evaluate(&ev).is_none());
    }

    #[test]
    fn a_slow_resolver_few_connect_to_costs_little() {
        let mut ev = fixture("pg15-dns-on-connect-200ms");
        // The same blocks of two connections, the window stretched to a
        // minute: each still waits 200 ms, the clients lose nearly nothing.
        let keep: BTreeSet<u32> = {
            let o = ev.offcpu.as_ref().unwrap();
            let pids: BTreeSet<u32> = o
                .pid_stacks
                .iter()
                .filter(|s| resolver_frame(s).is_some())
                .map(|s| s.pid)
                .collect();
            pids.into_iter().take(2).collect()
        };
        let o = ev.offcpu.as_mut().unwrap();
        o.pid_stacks.retain(|s| keep.contains(&s.pid));
        ev.rec.manifest.duration_s = Some(60.0);
        let w = resolver_wait(&ev).unwrap();
        assert!(w.ms_per_connection().unwrap() >= WARN_MS, "{w:?}");
        assert!(w.lost_s_per_s() < MIN_LOST_S_PER_S, "{w:?}");
        let f = DnsOnConnect.evaluate(&ev).expect("info");
        assert_eq!(f.severity, Severity::Info, "{f:?}");
        assert!(f.impact.is_none());
    }

    #[test]
    fn frames_are_read_without_glibc_prefixes() {
        let s = |frames: &[&str]| PidStack {
            pid: 1,
            state: "S".into(),
            us: 1000,
            frames: frames.iter().map(|f| f.to_string()).collect(),
        };
        let ptr = s(&[
            "pg_getnameinfo_all",
            "__GI_getnameinfo",
            "__GI___res_context_send",
            "__GI___poll",
            "__x64_sys_poll_[k]",
        ]);
        assert_eq!(resolver_frame(&ptr), Some("getnameinfo"));
        assert_eq!(lookup_kind(&ptr), "log_hostname (reverse lookup)");
        let bare = s(&[NO_USER_STACK, "__x64_sys_poll_[k]", "do_sys_poll_[k]"]);
        assert_eq!(resolver_frame(&bare), Some("poll"));
        let epoll = s(&["WaitEventSetWait", "epoll_wait", "__x64_sys_epoll_wait_[k]"]);
        assert_eq!(resolver_frame(&epoll), None);
    }
}
