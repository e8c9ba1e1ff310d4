//! `network-retransmits`: the link to a standby loses packets and TCP sends
//! them again. On a synchronous standby's link the loss is in every
//! commit's path: the walsender's WAL segment that was lost is resent only
//! when the standby's ACKs say so (a duplicate ACK, which a quiet link that
//! waits for the standby's reply does not send) or when the retransmission
//! timeout fires — 200 ms at least on Linux — and the commits behind it
//! wait that long in `IPC:SyncRep`.
//!
//! Measured on the walsenders' own sockets (the pgstat collector reads
//! their `tcp_info` over sock_diag each sample): the segments retransmitted
//! (`tcpi_total_retrans`) over the segments sent (`tcpi_segs_out`) between
//! the recording's first and last sample, and the retransmission timeout.
//! The cost is the backends' wait for those standbys (their
//! `IPC:SyncRep` samples): a warning needs both the loss and commits
//! waiting on that link; loss on an asynchronous standby's link (lag, not
//! commit latency) is info.
//!
//! The clients' connections are read the same way (the server-side ends of
//! the established connections on the ports the postmaster listens on):
//! their lost segments hold the replies behind them, a cost the server
//! cannot see in its own waits. It is measured as the time the connections
//! spent getting lost segments through (timeout recovery, and a round trip
//! per other resent segment) over their connected time: a warning from
//! [`CLIENT_STALL_SHARE`], else info.
use serde_json::json;

use super::syncrep_network_latency::{commits, SYNCREP_WAIT};
use super::{Figure, Finding, Headline, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::recording::schema::pgstat::Replica;
use crate::round3;

pub const ID: &str = "network-retransmits";

/// Share of the segments sent that were sent again from which a link is
/// lossy. Measured here (2-vCPU VM, PostgreSQL 15.18, `lab run --scenario
/// network-retransmits --duration 5`, 4 clients): one packet in 20 dropped
/// each way resent 3.1 % of the walsender's segments (commits 1.98 ms
/// against 0.98 ms, 2,009 tps against 4,080), one in 50 resent 1.2–1.4 %
/// (1.44–1.54 ms); none without the drops (nor in the healthy corpus,
/// whose standby streams over a Unix socket). A healthy LAN or zone link
/// resends well under 0.1 %.
pub const WARN_SHARE: f64 = 0.01;
/// …from which it is critical; also when timeout recovery (Linux 6.7+)
/// held the link this share of the recording.
pub const CRITICAL_SHARE: f64 = 0.05;
/// Retransmissions needed: a couple on a quiet link are not a rate.
pub const MIN_RETRANS: u64 = 5;
/// The clients' connections spent this share of their connected time
/// getting lost segments through (a lower bound of the replies' delay):
/// a warning. Measured here (`tests/attach` `network_retransmits_to_clients_found_attached`:
/// pgbench -S over TCP at 200 tps, one packet in 20 dropped each way).
pub const CLIENT_STALL_SHARE: f64 = 0.01;
/// The commits wait on the link: this share of the busy backends' samples
/// in `IPC:SyncRep`.
pub const MIN_SYNCREP_SHARE: f64 = 0.10;

/// One standby's link over the recording.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub standby: String,
    pub sync: bool,
    pub retrans: u64,
    pub segs_out: u64,
    pub rto_ms: Option<f64>,
    pub samples: usize,
    /// The smoothed round trip, median of the samples, ms.
    pub rtt_ms: Option<f64>,
    /// Retransmission timeouts fired and the time spent recovering from
    /// them, ms, over the span (Linux 6.7+).
    pub rto_count: Option<u64>,
    pub rto_time_ms: Option<u64>,
    /// Of the segments sent again, those the receiver reported it already
    /// had (D-SACK, `tcpi_dsack_dups`), over the span; None when not
    /// recorded (before 2026-12-01, a kernel before 4.19).
    pub dsack: Option<u64>,
    /// Seconds between the first and last sample.
    pub span_s: f64,
}

impl Link {
    /// Segments lost: sent again, less those the receiver reported it
    /// already had. A standby or client slow to acknowledge (a CPU
    /// starved, throttled) makes the sender probe its last segment again
    /// (a tail loss probe after about two round trips): measured here with
    /// the standby's processes at 2 % of a CPU, 74 segments resent in 8 s,
    /// every one reported back as a duplicate, none lost.
    pub fn lost(&self) -> u64 {
        self.retrans.saturating_sub(self.dsack.unwrap_or(0))
    }

    /// Lost segments over the segments sent.
    pub fn share(&self) -> f64 {
        self.lost() as f64 / self.segs_out.max(1) as f64
    }

    /// Segments sent again over the segments sent, lost or not.
    pub fn resent_share(&self) -> f64 {
        self.retrans as f64 / self.segs_out.max(1) as f64
    }

    /// Seconds the link spent getting lost segments through, a lower
    /// bound: the time in timeout recovery the kernel counted (6.7+), and
    /// one round trip for each other resent segment (a duplicate ACK or a
    /// loss probe must come back before it is sent again).
    pub fn stall_s(&self) -> f64 {
        let fast = self.lost().saturating_sub(self.rto_count.unwrap_or(0));
        self.rto_time_ms.unwrap_or(0) as f64 / 1000.0
            + fast as f64 * self.rtt_ms.unwrap_or(0.0) / 1000.0
    }

    /// `fields` with the link's counts of segments sent, resent and lost
    /// added: the figures every finding's evidence gives.
    fn with_counts(&self, mut fields: serde_json::Value) -> serde_json::Value {
        if let Some(m) = fields.as_object_mut() {
            m.extend([
                ("retransmitted".to_string(), json!(self.retrans)),
                ("segments_sent".to_string(), json!(self.segs_out)),
                (
                    "retransmitted_share".to_string(),
                    json!(round3(self.resent_share())),
                ),
                ("reported_duplicate".to_string(), json!(self.dsack)),
                ("lost".to_string(), json!(self.lost())),
                ("lost_share".to_string(), json!(round3(self.share()))),
            ]);
        }
        fields
    }

    fn json(&self) -> serde_json::Value {
        self.with_counts(json!({
            "standby": self.standby,
            "sync": self.sync,
            "rto_ms": self.rto_ms,
            "rtt_ms": self.rtt_ms,
            "timeouts": self.rto_count,
            "timeout_recovery_ms": self.rto_time_ms,
            "stall_s_at_least": round3(self.stall_s()),
            "samples": self.samples,
        }))
    }
}

/// The walsenders' TCP links seen with their counters; Err: why none
/// could be measured, and whether that is "not applicable" (true).
pub fn links(ev: &Evidence) -> Result<Vec<Link>, (String, bool)> {
    if !ev.recorded("pgstat") && ev.server.is_empty() {
        return Err((
            "pg_stat_replication was not recorded: add the pgstat collector (--collectors \
             …,pgstat), which reads the walsenders' sockets"
                .into(),
            false,
        ));
    }
    // Each standby's samples that read its counters, and whether it is
    // synchronous.
    type Seen<'a> = (Vec<(f64, &'a Replica)>, bool);
    let mut by: std::collections::BTreeMap<String, Seen> = Default::default();
    for s in &ev.server {
        for r in &s.replication {
            if r.client_addr.is_none() {
                continue;
            }
            let e = by.entry(r.application_name.clone()).or_default();
            e.1 |= matches!(r.sync_state.as_deref(), Some("sync" | "quorum"));
            if r.retrans.is_some() && r.segs_out.is_some() {
                e.0.push((s.t, r));
            }
        }
    }
    if by.is_empty() {
        return Err((
            "no standby streams over TCP (none in pg_stat_replication, or on a Unix socket): \
             there is no network link to lose packets"
                .into(),
            true,
        ));
    }
    let mut out = Vec::new();
    for (standby, (v, sync)) in by {
        let (Some(&(t0, first)), Some(&(t1, last))) = (v.first(), v.last()) else {
            continue;
        };
        let mut rtts: Vec<f64> = v.iter().filter_map(|(_, r)| r.rtt_ms).collect();
        rtts.sort_by(f64::total_cmp);
        // A counter's growth between the first and last sample.
        let delta = |f: fn(&Replica) -> Option<u64>| Some(f(last)?.saturating_sub(f(first)?));
        out.push(Link {
            standby,
            sync,
            retrans: delta(|r| r.retrans).unwrap_or(0),
            segs_out: delta(|r| r.segs_out).unwrap_or(0),
            rto_ms: v.iter().filter_map(|(_, r)| r.rto_ms).reduce(f64::max),
            samples: v.len(),
            rtt_ms: rtts.get(rtts.len() / 2).copied(),
            rto_count: delta(|r| r.rto_count),
            rto_time_ms: delta(|r| r.rto_time_ms),
            dsack: delta(|r| r.dsack_dups),
            span_s: t1 - t0,
        });
    }
    if out.is_empty() {
        return Err((
            "the walsenders' retransmission counters were not recorded (a recording from \
             before pgbelow read them, or their sockets could not be read: root or the \
             server's account)"
                .into(),
            false,
        ));
    }
    Ok(out)
}

/// The server's client connections as one link (summed deltas of the
/// samples after the first), with their connected seconds; None when they
/// were not read (no TCP listener seen, an older recording).
pub fn clients(ev: &Evidence) -> Option<(Link, f64)> {
    let v: Vec<(f64, &crate::recording::schema::pgstat::ClientsTcp)> = ev
        .server
        .iter()
        .filter_map(|s| s.clients_tcp.as_ref().map(|c| (s.t, c)))
        .collect();
    let (first, last) = (v.first()?, v.last()?);
    let mut link = Link {
        standby: "clients".into(),
        sync: false,
        retrans: 0,
        segs_out: 0,
        rto_ms: None,
        samples: v.len(),
        rtt_ms: None,
        rto_count: None,
        rto_time_ms: None,
        dsack: None,
        span_s: last.0 - first.0,
    };
    let mut connected = 0.0;
    let mut rtts = Vec::new();
    for w in v.windows(2) {
        let (dt, c) = (w[1].0 - w[0].0, w[1].1);
        link.retrans += c.retrans;
        link.segs_out += c.segs_out;
        if let Some(ms) = c.rto_time_ms {
            *link.rto_time_ms.get_or_insert(0) += ms;
        }
        if let Some(d) = c.dsack {
            *link.dsack.get_or_insert(0) += d;
        }
        connected += dt * f64::from(c.sockets);
        rtts.extend(c.rtt_ms);
    }
    rtts.sort_by(f64::total_cmp);
    link.rtt_ms = rtts.get(rtts.len() / 2).copied();
    // Nothing sent to a client over TCP: no share to tell (a listener only,
    // clients on Unix sockets), not a clean 0 %.
    (link.segs_out > 0).then_some((link, connected))
}

/// The link that lost the most, by share.
fn worst(ev: &Evidence) -> Option<Link> {
    worst_of(&links(ev).ok()?).cloned()
}

fn worst_of(all: &[Link]) -> Option<&Link> {
    all.iter().max_by(|a, b| a.share().total_cmp(&b.share()))
}

/// The link that lost the most among the standbys' and the clients'.
fn worst_any(ev: &Evidence) -> Option<Link> {
    worst(ev)
        .into_iter()
        .chain(clients(ev).map(|(l, _)| l))
        .max_by(|a, b| a.share().total_cmp(&b.share()))
}

fn retransmitted_pct(ev: &Evidence) -> Option<f64> {
    worst_any(ev).map(|l| round3(100.0 * l.share()))
}

/// ", N of them lost: the receiver reported the other M as duplicates"
/// when it did (empty when it reported none, or it was not recorded).
fn duplicates_words(l: &Link) -> String {
    match l.dsack {
        Some(d) if d > 0 => format!(
            ", {} of them lost: the receiver reported the other {d} as duplicates (D-SACK), \
             resent on a late acknowledgement",
            l.lost()
        ),
        _ => String::new(),
    }
}

/// Past the loss bound with enough lost segments to be a rate.
fn lossy(l: &Link) -> bool {
    l.share() >= WARN_SHARE && l.lost() >= MIN_RETRANS
}

/// The finding on the clients' connections, when they lose packets.
fn clients_finding(ev: &Evidence) -> Option<Finding> {
    let (l, connected) = clients(ev).filter(|(l, _)| lossy(l))?;
    let stall_share = l.stall_s() / connected.max(1e-9);
    let evidence = l.with_counts(json!({
        "link": "clients",
        "rtt_ms": l.rtt_ms,
        "timeout_recovery_ms": l.rto_time_ms,
        "stall_s_at_least": round3(l.stall_s()),
        "connected_s": round3(connected),
        "stall_share_of_connected": round3(stall_share),
        "samples": l.samples,
    }));
    let remedy = "Find where the path to the clients loses packets: `ss -ti state established \
                  '( sport = :5432 )'` on the server (retrans, rto), `nstat -az TcpRetransSegs \
                  TcpExtTCPTimeouts`, the interfaces' drop and error counters (`ip -s link`), \
                  a saturated or policed path (a NAT gateway, a load balancer, a VPN), MTU \
                  mismatches. Each segment lost at the end of a reply waits for its \
                  retransmission timeout (200 ms at least on Linux) before the client sees it: \
                  the statement was fast, the reply was late."
        .to_string();
    let loss = format!(
        "{} of {} segments the server sent to its clients were sent again ({:.1} %{}); the \
         connections spent at least {:.2} s getting lost segments through ({}, and a {} round \
         trip for each other lost segment): {:.1} % of their {:.0} connected seconds",
        l.retrans,
        l.segs_out,
        100.0 * l.resent_share(),
        duplicates_words(&l),
        l.stall_s(),
        l.rto_time_ms
            .map(|ms| format!("{ms} ms of timeout recovery"))
            .unwrap_or_else(|| "timeouts not counted by this kernel".into()),
        l.rtt_ms
            .map(|r| format!("{r:.2} ms"))
            .unwrap_or_else(|| "(unknown)".into()),
        100.0 * stall_share,
        connected
    );
    let costly = stall_share >= CLIENT_STALL_SHARE;
    Some(Finding {
        id: ID.into(),
        severity: if costly {
            Severity::Warning
        } else {
            Severity::Info
        },
        impact: costly
            .then(|| {
                Impact::new(
                    stall_share,
                    "the client connections' time, in which they were getting lost segments \
                     through (a lower bound of the replies' delay)",
                    format!(
                        "at least {:.2} s of {connected:.0} connection-seconds",
                        l.stall_s()
                    ),
                )
            })
            .flatten(),
        title: if costly {
            "Replies to the clients wait for packets lost on the way".into()
        } else {
            "The clients' connections lose packets; little time was lost to it".into()
        },
        summary: format!(
            "{loss}. Their statements' time in the server does not show it: the delay is on \
             the wire, after the reply was sent."
        ),
        evidence,
        remedy,
    })
}

pub struct NetworkRetransmits;

impl Rule for NetworkRetransmits {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "segments the server lost to a standby or its clients (sent again, less \
                     those the receiver reported it had), % of those sent",
            value: retransmitted_pct,
            metric: None,
        })
    }

    fn measure(&self, ev: &Evidence) -> Measure {
        match (links(ev), clients(ev)) {
            (Err(_), Some(_)) | (Ok(_), _) => Measure::Figure(Figure::above(
                "segments lost on the server's TCP links (standbys, clients): sent again, \
                 less those the receiver reported it already had",
                retransmitted_pct(ev).unwrap_or(0.0),
                "%",
                WARN_SHARE * 100.0,
            )),
            (Err((why, true)), None) => Measure::NotApplicable(format!(
                "{why}, and the server sent nothing to a client over TCP during the recording"
            )),
            (Err((why, false)), None) => Measure::Missing(why),
        }
    }

    fn held_back(&self, ev: &Evidence) -> Option<String> {
        let l = worst_any(ev)?;
        (l.lost() < MIN_RETRANS).then(|| {
            format!(
                "{} segment(s) lost of {}: fewer than {MIN_RETRANS}, not a rate",
                l.lost(),
                l.segs_out
            )
        })
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let measured = links(ev).unwrap_or_default();
        let Some(l) = worst_of(&measured).filter(|l| lossy(l)) else {
            return clients_finding(ev);
        };
        let all: Vec<serde_json::Value> = measured.iter().map(Link::json).collect();
        let c = commits(ev);
        let syncrep_share = c
            .as_ref()
            .map(|c| c.syncrep_samples as f64 / c.busy_samples.max(1) as f64);
        let waited = l.sync && syncrep_share.is_some_and(|s| s >= MIN_SYNCREP_SHARE);
        let evidence = l.with_counts(json!({
            "standby": l.standby,
            "sync": l.sync,
            "rto_ms": l.rto_ms,
            "links": all,
            "syncrep_share_of_busy": syncrep_share.map(round3),
            "syncrep_ms_per_commit": c.as_ref().map(|c| round3(c.syncrep_ms_per_commit())),
            "commit_latency_ms": c.as_ref().map(|c| round3(c.latency_ms)),
            "commits": c.as_ref().map(|c| c.n),
        }));
        let remedy = "Find where the link to the standby loses packets: `ss -ti` on the \
                      primary (retrans, rto), `nstat -az TcpRetransSegs TcpExtTCPTimeouts`, the \
                      interfaces' drop and error counters (`ip -s link`), a saturated or \
                      policed path, a flaky NIC or cable, MTU mismatches. While it lasts, a \
                      synchronous standby on that link holds every commit for each lost \
                      segment's retransmission timeout: name another standby first in \
                      synchronous_standby_names, use a quorum (ANY), or lower \
                      synchronous_commit for the sessions that can take it."
            .to_string();
        let loss = format!(
            "{} of {} segments the walsender for {} sent were sent again ({:.1} %{}{})",
            l.retrans,
            l.segs_out,
            l.standby,
            100.0 * l.resent_share(),
            l.rto_ms
                .map(|r| format!(", retransmission timeout up to {r:.0} ms"))
                .unwrap_or_default(),
            duplicates_words(l)
        );
        if !waited {
            return Some(Finding {
                id: ID.into(),
                severity: Severity::Info,
                impact: None,
                title: "The link to a standby loses packets; commits did not wait on it".into(),
                summary: format!(
                    "{loss}. {}",
                    if l.sync {
                        "The standby is synchronous, but the backends spent little of their \
                         time waiting for it in the recording."
                    } else {
                        "The standby is asynchronous: the loss delays its replay (lag), not \
                         the commits."
                    }
                ),
                evidence,
                remedy,
            });
        }
        let share = syncrep_share.unwrap_or(0.0);
        let span = l.span_s.max(1e-9);
        let rto_share = l.rto_time_ms.unwrap_or(0) as f64 / 1000.0 / span;
        let severity = if l.share() >= CRITICAL_SHARE || rto_share >= CRITICAL_SHARE {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let c = c.expect("commits measured");
        Some(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                l.stall_s() / span,
                "the recording's time, in which the link to that standby was getting lost \
                 segments through (a lower bound: commits behind them wait)",
                format!(
                    "at least {:.2} s of {:.0} s: {} timeout recovery, and a {} round trip for \
                     each other resent segment",
                    l.stall_s(),
                    span,
                    l.rto_time_ms
                        .map(|ms| format!("{ms} ms of"))
                        .unwrap_or_else(|| "no count of (a kernel before 6.7)".into()),
                    l.rtt_ms
                        .map(|r| format!("{r:.2} ms"))
                        .unwrap_or_else(|| "(unknown)".into())
                ),
            ),
            title: "Commits wait for packets lost on the link to a synchronous standby".into(),
            summary: format!(
                "{loss}. The standby is synchronous: a lost segment is resent once a duplicate \
                 ACK or a loss probe comes back (a round trip) or its timeout fires ({}), and \
                 the commits behind it wait — the backends spent {:.0} % of their busy samples \
                 in {SYNCREP_WAIT}, {:.1} ms per commit (commit latency {:.1} ms, {}).",
                match (l.rto_count, l.rto_time_ms) {
                    (Some(n), Some(ms)) => format!("{n} timeout(s), {ms} ms recovering"),
                    _ => "timeouts not counted by this kernel".into(),
                },
                share * 100.0,
                c.syncrep_ms_per_commit(),
                c.latency_ms,
                c.latency_source
            ),
            evidence,
            remedy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::fixture;

    // Real lab runs on PostgreSQL 15.18 (system), this 2-vCPU VM: `pgbelow
    // lab run --scenario network-retransmits --duration 5 --collectors
    // pgstat [--drop-every 0]` (one INSERT per commit, 4 clients, the
    // synchronous standby over TCP, one packet in 20 dropped each way).
    #[test]
    fn warning_when_commits_wait_on_a_lossy_link() {
        let rec = fixture("pg15-network-retransmits-20");
        let f = NetworkRetransmits.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Warning);
        let ev = &f.evidence;
        assert_eq!(ev["sync"], true);
        let share = ev["retransmitted_share"].as_f64().unwrap();
        assert!((2.0 * WARN_SHARE..CRITICAL_SHARE).contains(&share), "{ev}");
        let l = worst(&rec).unwrap();
        // Every loss repaired without a timeout (6.18 counts them: none).
        assert_eq!((l.rto_count, l.rto_time_ms), (Some(0), Some(0)), "{l:?}");
        assert!(l.stall_s() > 0.05, "{l:?}");
        assert!(f.impact.is_some());
        assert!(ev["syncrep_share_of_busy"].as_f64().unwrap() >= MIN_SYNCREP_SHARE);
    }

    #[test]
    fn clear_on_the_same_link_without_loss_and_info_for_an_async_standby() {
        let rec = fixture("pg15-network-retransmits-0");
        assert!(NetworkRetransmits.evaluate(&rec).is_none());
        match NetworkRetransmits.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past() && m.value == 0.0, "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        // The lossy link, were the standby asynchronous: lag, not commits.
        let mut asynchronous = fixture("pg15-network-retransmits-20");
        for s in &mut asynchronous.server {
            for r in &mut s.replication {
                r.sync_state = Some("async".into());
            }
        }
        let f = NetworkRetransmits.evaluate(&asynchronous).expect("info");
        assert_eq!(f.severity, Severity::Info);
        // A standby on a Unix socket has no link to lose packets on.
        let mut unix = fixture("pg15-network-retransmits-0");
        for s in &mut unix.server {
            for r in &mut s.replication {
                r.client_addr = None;
            }
        }
        assert!(matches!(
            NetworkRetransmits.measure(&unix),
            Measure::NotApplicable(_)
        ));
    }

    // Attached (PostgreSQL 15.18, 2026-11-30, tests/attach
    // `network_retransmits_to_clients_found_attached`): pgbench -S over TCP
    // on 127.0.0.1 at 200 tps, 4 clients, one packet in 20 dropped each way
    // on the server's port (…-20), and the same without drops (…-0).
    #[test]
    fn the_clients_connections_lossy_and_clean() {
        let rec = fixture("pg15-network-retransmits-clients-20");
        let (l, connected) = clients(&rec).expect("clients read");
        assert!(l.share() >= 2.0 * WARN_SHARE, "{l:?}");
        assert!(connected > 10.0, "{connected}");
        let f = NetworkRetransmits.evaluate(&rec).expect("finding");
        assert_eq!(f.evidence["link"], "clients", "{}", f.evidence);
        let stall = f.evidence["stall_share_of_connected"].as_f64().unwrap();
        let expect = if stall >= CLIENT_STALL_SHARE {
            Severity::Warning
        } else {
            Severity::Info
        };
        assert_eq!(f.severity, expect, "{}", f.evidence);
        assert_eq!(f.impact.is_some(), expect == Severity::Warning);
        // No standby at all: the figure is the clients'.
        assert!(links(&rec).is_err());
        match NetworkRetransmits.measure(&rec) {
            Measure::Figure(m) => assert!(m.past(), "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        let clean = fixture("pg15-network-retransmits-clients-0");
        assert!(NetworkRetransmits.evaluate(&clean).is_none());
        let (l, _) = clients(&clean).expect("clients read");
        assert_eq!(l.retrans, 0, "{l:?}");
        assert!(l.segs_out > 100, "{l:?}");
    }

    // Attached by hand (PostgreSQL 15.18, 2026-12-01): a synchronous
    // standby on 127.0.0.1 whose processes had 2 % of a CPU (a cpu cgroup
    // quota), one INSERT per commit from 4 pgbench clients. The walsender
    // resent 70 segments in 8 s, each a probe after the standby's late
    // acknowledgement, and the standby reported every one as a duplicate
    // (`nstat`: TcpRetransSegs = TCPLossProbes = TCPDSACKRecv = 74 in a
    // run of its own). Before the D-SACKs were read this raised a warning,
    // "Commits wait for packets lost on the link".
    #[test]
    fn resends_the_standby_already_had_are_not_losses() {
        let rec = fixture("pg15-network-retransmits-slow-standby");
        let l = worst(&rec).unwrap();
        assert!(l.retrans >= MIN_RETRANS, "{l:?}");
        assert!(l.resent_share() >= WARN_SHARE, "{l:?}");
        assert_eq!(l.lost(), 0, "{l:?}");
        assert!(NetworkRetransmits.evaluate(&rec).is_none());
        match NetworkRetransmits.measure(&rec) {
            Measure::Figure(m) => assert!(!m.past() && m.value == 0.0, "{m:?}"),
            Measure::Missing(why) | Measure::NotApplicable(why) => panic!("{why}"),
        }
        // Read as before the D-SACKs were recorded, it is the warning.
        let mut old = rec.clone();
        for s in &mut old.server {
            for r in &mut s.replication {
                r.dsack_dups = None;
            }
        }
        let f = NetworkRetransmits.evaluate(&old).expect("the old reading");
        assert_eq!(f.severity, Severity::Warning);
    }

    #[test]
    fn share_of_segments() {
        let l = Link {
            standby: "s".into(),
            sync: true,
            retrans: 30,
            segs_out: 1000,
            rto_ms: Some(204.0),
            samples: 8,
            rtt_ms: Some(0.5),
            rto_count: Some(10),
            rto_time_ms: Some(1200),
            dsack: None,
            span_s: 5.0,
        };
        assert!((l.share() - 0.03).abs() < 1e-9);
        // 10 of the 30 by timeout (1.2 s in all), 20 each a 0.5 ms round trip.
        assert!(
            (l.stall_s() - (1.2 + 20.0 * 0.0005)).abs() < 1e-9,
            "{}",
            l.stall_s()
        );
        let none = Link {
            segs_out: 0,
            retrans: 0,
            ..l.clone()
        };
        assert_eq!(none.share(), 0.0);
        // 12 of the 30 reported back as duplicates: 18 lost.
        let probed = Link {
            dsack: Some(12),
            ..l
        };
        assert_eq!(probed.lost(), 18);
        assert!((probed.share() - 0.018).abs() < 1e-9);
        assert!((probed.resent_share() - 0.03).abs() < 1e-9);
        assert!(
            (probed.stall_s() - (1.2 + 8.0 * 0.0005)).abs() < 1e-9,
            "{}",
            probed.stall_s()
        );
    }
}
