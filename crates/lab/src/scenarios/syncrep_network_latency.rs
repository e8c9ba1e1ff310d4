//! `syncrep-network-latency`: the `syncrep-commit` workload (one INSERT per
//! transaction) on a primary with one synchronous standby that is a
//! network round trip away, as a replica in another zone: every commit
//! waits in `SyncRep` for the standby's flush, so commit latency is the
//! round trip, not the disk.
//!
//! The standby streams over TCP (127.0.0.1, its `primary_conninfo` switched
//! from the Unix socket once it runs; every other client uses the socket).
//! [`NetDelay`] holds each packet of that connection in user space for
//! half the round trip and then lets it go: two iptables rules in the
//! OUTPUT chain of `lo` (the primary's port as destination and as source)
//! send the packets to an NFQUEUE that a thread of pgbelow reads, as this
//! kernel has no `sch_netem` (a `tc qdisc … netem delay` would be the
//! usual tool). The rules are written to the cleanup ledger before they
//! are added and carry `--queue-bypass`: if pgbelow dies, packets pass
//! undelayed until the next start removes the rules. `--rtt-ms 0` runs the
//! same TCP standby without a delay (the healthy baseline).
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::spec::Flag;
use super::{Fixture, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::error::fixable;
use crate::ledger;
use crate::provision::SyncMode;
use crate::workload::Plan;

/// Round trip added by default: a replica in another zone or region.
/// Measured here: tcp_info's minimum round trip 20.5 ms with 20 ms added
/// (commits 34.7 ms) against 0.01 ms without (commits 4.8–12.3 ms).
pub const DEFAULT_RTT_MS: u32 = 20;
pub const DEFAULT_CLIENTS: u32 = 4;
/// How long the standby may take to stream over TCP after the switch.
const SWITCH_WAIT: Duration = Duration::from_secs(30);

pub(crate) const PLAN: Plan = Plan {
    name: "syncrep-network-latency",
    args: &[],
    script: Some(super::syncrep_commit::SCRIPT),
};

/// A fixable error unless pgbelow runs as root.
pub(crate) fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(fixable(
            "the syncrep-network-latency scenario needs root: it adds iptables rules that queue \
             the standby's packets to pgbelow (NFQUEUE) to delay them",
            "run `sudo pgbelow lab run --scenario syncrep-network-latency …`, or --rtt-ms 0 for \
             the baseline without a delay",
        ));
    }
    Ok(())
}

/// `iptables-legacy` when there is one (this kernel's NFQUEUE target is
/// the x_tables one), else `iptables`.
pub(crate) fn iptables() -> Result<&'static str> {
    for tool in ["iptables-legacy", "iptables"] {
        let found = std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return Ok(tool);
        }
    }
    Err(fixable(
        "iptables is not installed: the syncrep-network-latency scenario queues the standby's \
         packets with an iptables NFQUEUE rule",
        "apt-get install -y iptables (scripts/setup does), or run with --rtt-ms 0",
    ))
}

/// Packets of the TCP connections to (and from) one local port held for
/// `delay` each way by a thread reading an NFQUEUE.
pub struct NetDelay {
    pub port: u16,
    pub delay: Duration,
    pub queue: u16,
    tool: &'static str,
    rules: Vec<(Vec<String>, ledger::Noted)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(u64, u64)>>,
    /// Packets delayed, once stopped.
    pub packets: u64,
    /// One packet in `drop_every` is dropped (0: none): a lossy link.
    pub drop_every: u64,
    /// Packets dropped, once stopped.
    pub dropped: u64,
}

impl std::fmt::Debug for NetDelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NetDelay(port {}, {:?} each way, queue {})",
            self.port, self.delay, self.queue
        )
    }
}

impl NetDelay {
    /// Delay every TCP packet to and from `127.0.0.1:port` on `lo` by
    /// `delay`; on error nothing is left.
    pub fn start(port: u16, delay: Duration) -> Result<NetDelay> {
        NetDelay::start_lossy(port, delay, 0)
    }

    /// [`NetDelay::start`] that also drops one packet in `drop_every` (0:
    /// none), each way: the losses TCP must retransmit.
    pub fn start_lossy(port: u16, delay: Duration, drop_every: u64) -> Result<NetDelay> {
        crate::interrupt::check()?;
        require_root()?;
        let tool = iptables()?;
        // One queue per delayer: two in one process (tests on parallel
        // threads, a primary's clients and its standby) may not share one.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nth = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let queue = 4000 + ((std::process::id() + nth * 7919) % 20000) as u16;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("pgbelow-netdelay".into())
            .spawn(move || delayer(queue, delay, drop_every, &s, &tx))
            .context("starting the packet delay thread")?;
        let mut d = NetDelay {
            port,
            delay,
            queue,
            tool,
            rules: Vec::new(),
            stop,
            thread: Some(thread),
            packets: 0,
            drop_every,
            dropped: 0,
        };
        let bound = rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| Err("the delay thread did not start".into()));
        if let Err(e) = bound {
            let _ = d.teardown();
            return Err(fixable(
                format!("cannot read NFQUEUE {queue} to delay packets: {e}"),
                "run as root on a kernel with CONFIG_NETFILTER_NETLINK_QUEUE, or run with \
                 --rtt-ms 0",
            ));
        }
        let tag = format!("pgbelow-{}", std::process::id());
        for dir in ["--dport", "--sport"] {
            let rule: Vec<String> = [
                "-o",
                "lo",
                "-p",
                "tcp",
                "-d",
                "127.0.0.1",
                dir,
                &port.to_string(),
                "-m",
                "comment",
                "--comment",
                &tag,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &queue.to_string(),
                "--queue-bypass",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let noted = ledger::note(ledger::Object::Iptables {
                tool: tool.into(),
                chain: "OUTPUT".into(),
                rule: rule.clone(),
            });
            let out = std::process::Command::new(tool)
                .args(["-w", "-t", "filter", "-I", "OUTPUT"])
                .args(&rule)
                .output();
            d.rules.push((rule, noted));
            let failed = match out {
                Ok(o) if o.status.success() => None,
                Ok(o) => Some(String::from_utf8_lossy(&o.stderr).trim().to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = failed {
                let _ = d.teardown();
                return Err(anyhow::anyhow!(
                    "{tool} -I OUTPUT (queue the standby's packets): {why}"
                ));
            }
        }
        Ok(d)
    }
}

/// The thread: packets in, each let go `delay` after it arrived, in order,
/// but one in `drop_every` (0: none) dropped at once; (packets, dropped).
fn delayer(
    queue: u16,
    delay: Duration,
    drop_every: u64,
    stop: &AtomicBool,
    ready: &std::sync::mpsc::Sender<Result<(), String>>,
) -> (u64, u64) {
    let open = || -> std::io::Result<nfq::Queue> {
        let mut q = nfq::Queue::open()?;
        q.bind(queue)?;
        // Metadata only: the verdict lets the packet go unchanged.
        q.set_copy_range(queue, 0)?;
        q.set_queue_max_len(queue, 8192)?;
        // A full queue lets packets pass rather than drop them.
        q.set_fail_open(queue, true)?;
        q.set_nonblocking(true);
        Ok(q)
    };
    let mut q = match open() {
        Ok(q) => {
            let _ = ready.send(Ok(()));
            q
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return (0, 0);
        }
    };
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    let (mut packets, mut dropped) = (0u64, 0u64);
    let release = |q: &mut nfq::Queue, held: &mut VecDeque<(Instant, nfq::Message)>, all| {
        let now = Instant::now();
        while held.front().is_some_and(|(t, _)| all || *t <= now) {
            let (_, mut m) = held.pop_front().expect("front");
            m.set_verdict(nfq::Verdict::Accept);
            let _ = q.verdict(m);
        }
    };
    while !stop.load(Ordering::Relaxed) {
        match q.recv() {
            Ok(mut m) => {
                packets += 1;
                if drop_every > 0 && packets % drop_every == 0 {
                    dropped += 1;
                    m.set_verdict(nfq::Verdict::Drop);
                    let _ = q.verdict(m);
                } else {
                    held.push_back((Instant::now() + delay, m));
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
        release(&mut q, &mut held, false);
        let next = held
            .front()
            .map(|(t, _)| t.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::MAX);
        std::thread::sleep(next.min(Duration::from_micros(200)));
    }
    // Whatever arrived before the rules went: let it all through.
    while let Ok(m) = q.recv() {
        held.push_back((Instant::now(), m));
    }
    release(&mut q, &mut held, true);
    let _ = q.unbind(queue);
    (packets, dropped)
}

impl Fixture for NetDelay {
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        Some((
            "network_delay",
            serde_json::json!({
                "port": self.port,
                "delay_ms_each_way": self.delay.as_secs_f64() * 1000.0,
                "rtt_added_ms": self.delay.as_secs_f64() * 2000.0,
                "drop_every": self.drop_every,
                "nfqueue": self.queue,
                "iptables": self.tool,
            }),
        ))
    }

    /// Rules first (no packet is queued any more), then the thread lets
    /// what it holds go.
    fn teardown(&mut self) -> Result<()> {
        let mut err = None;
        for (rule, noted) in std::mem::take(&mut self.rules) {
            match ledger::remove_iptables_rule(self.tool, "OUTPUT", &rule) {
                Ok(_) => ledger::strike(noted),
                Err(e) => err = Some(e),
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            (self.packets, self.dropped) = t.join().unwrap_or((0, 0));
        }
        match err {
            Some(e) => Err(anyhow::anyhow!("removing the packet delay: {e}")),
            None => Ok(()),
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl Drop for NetDelay {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// `--rtt-ms 20`: 0 (no delay) to 2000.
fn parse_rtt_ms(s: &str) -> Result<String, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if n <= 2000 => Ok(n.to_string()),
        _ => Err(format!(
            "'{s}' is not a round trip: give 0 (no delay) to 2000 milliseconds"
        )),
    }
}

static RTT_MS: Flag = Flag::value(
    "rtt-ms",
    "MS",
    "syncrep-network-latency: round trip added between primary and standby, ms (default 20; 0: \
     none, the healthy baseline)",
    parse_rtt_ms,
);

fn rtt_ms(opts: &LabOptions) -> u32 {
    opts.params.get("rtt-ms").unwrap_or(DEFAULT_RTT_MS)
}

/// Point a running standby at the primary over TCP (`127.0.0.1:port`)
/// and wait until the primary sees it stream, synchronous, from there.
pub fn switch_to_tcp(
    standby: &crate::provision::Cluster,
    name: &str,
    primary: &crate::provision::Cluster,
) -> Result<()> {
    let conninfo = format!(
        "host=127.0.0.1 port={} user={} application_name={name}",
        primary.port(),
        primary.user()
    );
    standby.psql(
        "postgres",
        &format!("alter system set primary_conninfo = '{conninfo}'"),
    )?;
    standby.psql("postgres", "select pg_reload_conf()")?;
    let t0 = Instant::now();
    loop {
        crate::interrupt::check()?;
        let n = primary.psql(
            "postgres",
            &format!(
                "select count(*) from pg_stat_replication where application_name = '{name}' \
                 and client_addr is not null and state = 'streaming'"
            ),
        )?;
        if n.trim() == "1" {
            return Ok(());
        }
        if t0.elapsed() > SWITCH_WAIT {
            anyhow::bail!(
                "standby {name} did not stream over TCP (127.0.0.1:{}) within {} s",
                primary.port(),
                SWITCH_WAIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct SyncrepNetworkLatency;

static SPEC: Spec = Spec {
    name: "syncrep-network-latency",
    finding: Some("syncrep-network-latency"),
    description: "pgbench -f: one INSERT per transaction, 4 clients, on a primary with 1 \
                  synchronous standby streaming over TCP whose packets wait 10 ms each way (a 20 \
                  ms round trip, a replica in another zone; an iptables NFQUEUE rule on lo that \
                  pgbelow reads; root only; removed afterwards): every commit waits a round trip \
                  in SyncRep. --rtt-ms N sets the round trip, --rtt-ms 0 runs the same TCP \
                  standby without a delay (the healthy baseline)",
    pgbench: Some(PLAN),
    clients: DEFAULT_CLIENTS,
    standbys: 1,
    sync: SyncMode::First,
    flags: &[&RTT_MS],
    ..Spec::BASE
};

impl Scenario for SyncrepNetworkLatency {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if rtt_ms(opts) > 0 {
            require_root()?;
            iptables()?;
        }
        Ok(tcp_standby_options(opts))
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        prepare_tcp_standby(lab, host, rtt_ms(lab.opts), 0)
    }
}

/// The options with the standbys' walreceiver restarting at once after
/// the switch to TCP (unless `--standby-set` says otherwise).
pub(crate) fn tcp_standby_options(opts: &LabOptions) -> LabOptions {
    let mut o = opts.clone();
    if !o
        .replication
        .standby_set
        .iter()
        .any(|(k, _)| k == "wal_retrieve_retry_interval")
    {
        o.replication
            .standby_set
            .push(("wal_retrieve_retry_interval".into(), "100ms".into()));
    }
    o
}

/// The syncrep-commit table, then the packets of the primary's port held
/// `rtt` ms in all and one in `drop_every` dropped (either 0: not), then
/// the standbys streaming over TCP. The delay comes first: the
/// connection's first packets already wait, so the kernel's minimum round
/// trip is the delayed path's.
pub fn prepare_tcp_standby(
    lab: &Lab,
    host: &mut Fixtures,
    rtt: u32,
    drop_every: u64,
) -> Result<Prepared> {
    super::syncrep_commit::prepare(&lab.dsn(), lab.status)?;
    let primary = lab.primary();
    if rtt > 0 || drop_every > 0 {
        let d = NetDelay::start_lossy(
            primary.port(),
            Duration::from_secs_f64(f64::from(rtt) / 2000.0),
            drop_every,
        )?;
        (lab.status)(&format!(
            "packets to and from port {} wait {} ms each way{} (NFQUEUE {})",
            d.port,
            f64::from(rtt) / 2.0,
            if drop_every > 0 {
                format!(", one in {drop_every} dropped")
            } else {
                String::new()
            },
            d.queue
        ));
        host.push(d);
    }
    for s in lab.topo.standbys() {
        (lab.status)(&format!("{} streams over TCP (127.0.0.1)", s.name));
        switch_to_tcp(&s.cluster, &s.name, primary)?;
    }
    Ok(Prepared::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        assert_eq!(parse_rtt_ms("20"), Ok("20".into()));
        assert_eq!(parse_rtt_ms("0"), Ok("0".into()));
        assert!(parse_rtt_ms("-1").is_err());
        assert!(parse_rtt_ms("slow").is_err());
        assert!(parse_rtt_ms("5000").is_err());
    }
}
