//! `syncrep-network-latency`: commits wait a network round trip to a
//! synchronous standby (a replica in another zone or region): with
//! `synchronous_commit` at `on` or `remote_write`, each commit returns only
//! once the standby acknowledged its WAL, so commit latency is at least the
//! round trip, however fast the disks.
//!
//! Decided on latency, not on the wait share: backends of a healthy
//! primary with a synchronous standby next door also spend most of their
//! samples in `IPC:SyncRep` (47–89 % measured here, at a 0.03–1.2 ms
//! round trip), because a commit's flush on the standby is the longest step of a
//! one-INSERT transaction. What separates is the round trip the kernel
//! measures on the walsender's TCP socket (`tcp_info.tcpi_rtt`, read by
//! the pgstat collector over sock_diag) against the commit's latency: the
//! round trip is the part of each commit that a standby in the same zone,
//! or a weaker `synchronous_commit`, takes away.
use serde_json::json;

use super::{Figure, Finding, Impact, Measure, Rule, Severity};
use crate::evidence::Evidence;
use crate::round3;

pub const ID: &str = "syncrep-network-latency";

/// A backend waiting for synchronous standbys to confirm its commit.
pub const SYNCREP_WAIT: &str = "IPC:SyncRep";
/// Round trip (ms) from which the network is the commit's cost. Measured
/// here (2-vCPU VM, PostgreSQL 15, `lab run --scenario
/// syncrep-network-latency`, 4 clients): the smoothed round trip 0.2–2 ms
/// on loopback under load without a delay (the standby's answer in it), the
/// minimum 0.01–0.05 ms; 24–31 ms and 20+ ms with 10 ms added each way. Within a zone a
/// round trip is 0.1–0.5 ms, across zones 0.5–2 ms, across regions 10 ms
/// and more.
pub const WARN_RTT_MS: f64 = 2.0;
/// …and the round trip must be this share of the commit's latency: a slow
/// link under slow commits (a slow disk, a lock) is not what they wait for.
/// Measured with 20 ms added: 60 % of a 34.5 ms commit (both servers'
/// WAL flushes the rest), and below 50 % in one run of five when the
/// shared disk's flushes slowed; a quarter of every commit on the wire is
/// a cost either way.
pub const MIN_SHARE: f64 = 0.25;
/// The round trip is then nearly all of it.
const CRITICAL_SHARE: f64 = 0.9;
/// Samples in the wait, and commits, needed for the figures to mean anything.
const MIN_SAMPLES: u64 = 20;
const MIN_COMMITS: u64 = 50;

/// The synchronous standbys' round trip as the walsenders' sockets showed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rtt {
    /// Median of the samples' floors, ms (of the slowest standby a commit
    /// waits for): see [`floor`].
    pub ms: f64,
    pub standby: String,
    pub samples: usize,
    /// Samples whose floor was the smoothed round trip's lower edge, above
    /// the kernel's minimum: the path slowed within the minimum's window.
    pub above_min: usize,
}

/// One sample's round-trip floor, ms, and whether the smoothed round
/// trip's lower edge set it. The kernel's minimum (`tcpi_min_rtt`) leaves
/// out the standby's time to answer (a delayed ACK riding on its reply),
/// but it is the minimum over 5 minutes (`net.ipv4.tcp_min_rtt_wlen`): a
/// link that slowed while the standby was connected keeps the old minimum
/// that long. The smoothed round trip less twice its mean deviation
/// (`tcpi_rtt − 2·tcpi_rttvar`) is what the last round trips stayed
/// above: measured 15–23 ms with 20 ms added mid-connection (minimum
/// 0.015 ms), 0–0.5 ms on a clean link under load, where the standby's
/// answers spread the samples, and 0 next door with the standby's
/// processes starved to 2–10 % of a CPU (srtt 0.7–2.4 ms, rttvar 1.3–4.1
/// ms: a slow standby answers late unevenly, a slow link evenly). The
/// higher of the two; before rttvar was recorded, the minimum, else the
/// smoothed round trip. Without the minimum (Linux before 4.10) the edge
/// alone, not said to be above it.
fn floor(r: &crate::recording::schema::pgstat::Replica) -> Option<(f64, bool)> {
    let edge = r
        .rtt_ms
        .zip(r.rttvar_ms)
        .map(|(a, v)| (a - 2.0 * v).max(0.0));
    match (r.min_rtt_ms, edge) {
        (Some(m), Some(e)) => Some((m.max(e), e > m)),
        (Some(m), None) => Some((m, false)),
        (None, Some(e)) => Some((e, false)),
        (None, None) => r.rtt_ms.map(|a| (a, false)),
    }
}

/// Synchronous standbys seen, and their round trip if any socket was read;
/// Err: why not.
const NO_SYNC_STANDBY: &str = "no synchronous standby in pg_stat_replication";

pub fn rtt(ev: &Evidence) -> Result<Rtt, String> {
    if !ev.recorded("pgstat") && ev.server.is_empty() {
        return Err(
            "pg_stat_replication was not recorded: add the pgstat collector \
                    (--collectors …,pgstat), which samples it with the walsenders' round trips"
                .into(),
        );
    }
    type Seen = (Vec<(f64, bool)>, Option<String>, bool);
    let mut by: std::collections::BTreeMap<String, Seen> = Default::default();
    for s in &ev.server {
        for r in &s.replication {
            if !matches!(r.sync_state.as_deref(), Some("sync" | "quorum")) {
                continue;
            }
            let e = by.entry(r.application_name.clone()).or_default();
            e.0.extend(floor(r));
            if r.rtt_error.is_some() {
                e.1 = r.rtt_error.clone();
            }
            e.2 |= r.client_addr.is_none();
        }
    }
    if by.is_empty() {
        return Err(format!(
            "{NO_SYNC_STANDBY}: commits wait for none (synchronous_standby_names is empty, or \
             its standbys are not connected)"
        ));
    }
    let mut best: Option<Rtt> = None;
    let mut why = Vec::new();
    for (name, (mut v, err, unix)) in by {
        if v.is_empty() {
            why.push(match (err, unix) {
                (Some(e), _) => format!("{name}: {e}"),
                (None, true) => {
                    format!("{name} streams over a Unix socket: there is no network between them")
                }
                (None, false) => format!(
                    "{name}: its walsender's round trip was not recorded (a recording from before \
                     pgbelow read it)"
                ),
            });
            continue;
        }
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let ms = v[v.len() / 2].0;
        if best.as_ref().is_none_or(|b| ms > b.ms) {
            best = Some(Rtt {
                ms: round3(ms),
                standby: name,
                samples: v.len(),
                above_min: v.iter().filter(|x| x.1).count(),
            });
        }
    }
    best.ok_or_else(|| why.join("; "))
}

/// The backends' commits and where their time went.
#[derive(Clone, Debug, PartialEq)]
pub struct Commits {
    pub n: u64,
    pub source: String,
    /// Session-seconds in `IPC:SyncRep`, its samples and all busy samples.
    pub syncrep_s: f64,
    pub syncrep_samples: u64,
    pub busy_samples: u64,
    /// Latency per commit: pgbench's, else busy session-seconds per commit.
    pub latency_ms: f64,
    pub latency_source: String,
}

impl Commits {
    pub fn syncrep_ms_per_commit(&self) -> f64 {
        self.syncrep_s * 1000.0 / self.n.max(1) as f64
    }
}

pub fn commits(ev: &Evidence) -> Option<Commits> {
    let (n, source, _) = super::syncrep_wait_syscalls::commits(ev)?;
    let w = ev.backend_wait(SYNCREP_WAIT);
    let (syncrep_s, samples, busy, busy_s) = (w.wait_s, w.samples, w.busy_samples, w.busy_s);
    if n == 0 || busy == 0 {
        return None;
    }
    let (latency_ms, latency_source) = match ev.workload.as_ref().and_then(|w| w.latency_avg_ms) {
        Some(ms) => (ms, "pgbench's average latency".to_string()),
        None => (
            busy_s * 1000.0 / n as f64,
            "the backends' busy session-seconds per commit (pg_stat_activity)".to_string(),
        ),
    };
    Some(Commits {
        n,
        source,
        syncrep_s,
        syncrep_samples: samples,
        busy_samples: busy,
        latency_ms,
        latency_source,
    })
}

fn rtt_ms(ev: &Evidence) -> Option<f64> {
    rtt(ev).ok().map(|r| r.ms)
}

pub struct SyncrepNetworkLatency;

impl Rule for SyncrepNetworkLatency {
    fn id(&self) -> &'static str {
        ID
    }

    fn claims(&self) -> &'static [super::explained::Claim] {
        use super::explained::Claim;
        &[Claim::Event("IPC:SyncRep")]
    }

    fn headline(&self) -> Option<super::Headline> {
        Some(super::Headline {
            figure: "round trip to the synchronous standby, ms",
            value: rtt_ms,
            metric: None,
        })
    }

    /// The round trip against `WARN_RTT_MS`.
    fn measure(&self, ev: &Evidence) -> Measure {
        match rtt(ev) {
            Ok(r) => Measure::Figure(Figure::above(
                "round trip to the synchronous standby (tcp_info)",
                r.ms,
                "ms",
                WARN_RTT_MS,
            )),
            // pg_stat_replication was read and named no synchronous standby.
            Err(why) if !ev.server.is_empty() && why.starts_with(NO_SYNC_STANDBY) => {
                Measure::NotApplicable(why)
            }
            Err(why) => Measure::Missing(why),
        }
    }

    fn evaluate(&self, ev: &Evidence) -> Option<Finding> {
        let r = rtt(ev).ok()?;
        let c = commits(ev)?;
        let syncrep_ms = c.syncrep_ms_per_commit();
        // What the round trip adds to each commit: no more than the commit
        // waited for the standby, nor than the round trip itself.
        let added = r.ms.min(syncrep_ms);
        let share = added / c.latency_ms.max(1e-9);
        if r.ms < WARN_RTT_MS
            || added < WARN_RTT_MS
            || share < MIN_SHARE
            || c.syncrep_samples < MIN_SAMPLES
            || c.n < MIN_COMMITS
        {
            return None;
        }
        let severity = if share >= CRITICAL_SHARE {
            Severity::Critical
        } else {
            Severity::Warning
        };
        let level = ev
            .manifest
            .postgres
            .settings
            .get("synchronous_commit")
            .map(|v| format!(" synchronous_commit is {v}."))
            .unwrap_or_default();
        let lags = ev
            .server
            .iter()
            .flat_map(|s| &s.replication)
            .filter(|x| x.application_name == r.standby)
            .filter_map(|x| x.flush_lag_s)
            .fold(None::<f64>, |m, x| Some(m.map_or(x, |m| m.max(x))));
        let lag = lags
            .map(|s| {
                format!(
                    " pg_stat_replication's flush_lag reached {:.1} ms.",
                    s * 1000.0
                )
            })
            .unwrap_or_default();
        Some(Finding {
            id: ID.into(),
            severity,
            impact: Impact::new(
                share,
                "commit latency",
                format!(
                    "the walsender's TCP round trip to {} ({:.1} ms, tcp_info's floor) against {:.1} ms \
                     per commit ({})",
                    r.standby, r.ms, c.latency_ms, c.latency_source
                ),
            ),
            title: "Commits wait a network round trip to the synchronous standby".into(),
            summary: format!(
                "Each commit waited for standby {standby} {rtt:.1} ms away (the floor of the \
                 round trips on the walsender's socket, median of {k} samples{slowed}): {pct:.0}% \
                 of the {lat:.1} ms a commit took ({lsrc}). The backends spent {sr:.1} ms per \
                 commit in {SYNCREP_WAIT} ({srs} of {busy} busy samples) over {n} commits \
                 ({src}).{lag}{level}",
                standby = r.standby,
                rtt = r.ms,
                k = r.samples,
                slowed = if 2 * r.above_min > r.samples {
                    format!(
                        "; in {} of them the smoothed round trip less twice its deviation was \
                         above the kernel's minimum, which keeps 5 minutes of the past: the link \
                         slowed while the standby was connected",
                        r.above_min
                    )
                } else {
                    String::new()
                },
                pct = share * 100.0,
                lat = c.latency_ms,
                lsrc = c.latency_source,
                sr = syncrep_ms,
                srs = c.syncrep_samples,
                busy = c.busy_samples,
                n = c.n,
                src = c.source,
            ),
            evidence: json!({
                "rtt_ms": r.ms,
                "rtt_samples": r.samples,
                "rtt_samples_above_kernel_min": r.above_min,
                "standby": r.standby,
                "commit_latency_ms": round3(c.latency_ms),
                "syncrep_ms_per_commit": round3(syncrep_ms),
                "added_ms_per_commit": round3(added),
                "syncrep_samples": c.syncrep_samples,
                "busy_samples": c.busy_samples,
                "commits": c.n,
                "flush_lag_s_max": lags.map(round3),
                "bound_ms": WARN_RTT_MS,
            }),
            remedy: "Every commit waits for the standby's acknowledgement across the network. \
                     Where a transaction can afford to lose its last commit on a primary crash, \
                     set synchronous_commit = local (or remote_write, which still waits a round \
                     trip but not the standby's flush) for it alone (`SET LOCAL \
                     synchronous_commit = local`, or per role/database); put a synchronous \
                     standby in the primary's zone and keep the far one asynchronous; or with \
                     several standbys use a quorum (`synchronous_standby_names = 'ANY 1 (near, \
                     far)'`) so the nearest answers. Batch small transactions so fewer commits \
                     pay the round trip. Prove it with `pgbelow compare` of a recording before \
                     and after."
                .into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Status};

    // Real lab runs: `pgbelow lab run --scenario syncrep-network-latency
    // --pg 15` (20 ms added) and `--rtt-ms 0` (the same TCP standby).
    #[test]
    fn fires_on_the_delayed_standby() {
        let ev = fixture("pg15-syncrep-network-latency-20ms");
        let f = SyncrepNetworkLatency.evaluate(&ev).expect("finding");
        let rtt = f.evidence["rtt_ms"].as_f64().unwrap();
        assert!(rtt >= 5.0 * WARN_RTT_MS, "{rtt} ms");
        assert!(f.impact.as_ref().unwrap().share >= MIN_SHARE, "{f:?}");
        assert!(f.remedy.contains("synchronous_commit"), "{}", f.remedy);
    }

    /// Attached (tests/attach `syncrep_network_latency_found_attached_to_the_primary`):
    /// 10 ms added each way once the standby streamed. The kernel's
    /// minimum stayed at the clean path's 0.016 ms; the smoothed round
    /// trip went to 23–28 ms with a deviation of 3.7–4.8 ms.
    #[test]
    fn fires_on_a_delay_that_started_while_the_standby_was_connected() {
        let ev = fixture("pg15-syncrep-network-latency-20ms-midway");
        let f = SyncrepNetworkLatency.evaluate(&ev).expect("finding");
        let rtt = f.evidence["rtt_ms"].as_f64().unwrap();
        assert!(rtt >= 5.0 * WARN_RTT_MS, "{rtt} ms");
        let r = super::rtt(&ev).unwrap();
        assert!(2 * r.above_min > r.samples, "{r:?}");
        assert!(
            f.summary.contains("slowed while the standby"),
            "{}",
            f.summary
        );
        // The minimum alone (as before rttvar was recorded) misses it.
        let mut old = ev.clone();
        for s in &mut old.server {
            for x in &mut s.replication {
                x.rttvar_ms = None;
            }
        }
        assert!(super::rtt(&old).unwrap().ms < 0.1, "{:?}", super::rtt(&old));
        assert!(SyncrepNetworkLatency.evaluate(&old).is_none());
    }

    #[test]
    fn silent_on_the_same_standby_attached_without_a_delay() {
        let ev = fixture("pg15-syncrep-network-latency-attached-0ms");
        let (c, f) = SyncrepNetworkLatency.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        let r = super::rtt(&ev).unwrap();
        assert!(r.ms < 0.25 * WARN_RTT_MS, "{r:?}");
    }

    #[test]
    fn silent_on_the_standby_next_door() {
        let ev = fixture("pg15-syncrep-network-latency-0ms");
        let (c, f) = SyncrepNetworkLatency.check(&ev);
        assert!(f.is_none(), "{f:?}");
        assert_eq!(c.status, Status::Clear, "{c:?}");
        // Commits wait in SyncRep all the same: the share does not separate.
        let k = commits(&ev).unwrap();
        let share = k.syncrep_samples as f64 / k.busy_samples as f64;
        assert!(share > 0.3, "{k:?}");
        assert!(rtt(&ev).unwrap().ms < WARN_RTT_MS, "{:?}", rtt(&ev));
    }

    #[test]
    fn silent_on_the_syncrep_commit_recordings() {
        // seed 003's runs: their standbys stream over the Unix socket (or
        // the recording predates the round trip): nothing to decide on.
        for name in ["pg13-syncrep-commit", "pg15-syncrep-commit"] {
            let ev = fixture(name);
            assert!(SyncrepNetworkLatency.evaluate(&ev).is_none(), "{name}");
            assert!(
                matches!(SyncrepNetworkLatency.measure(&ev), Measure::Missing(_)),
                "{name}"
            );
        }
    }

    #[test]
    fn not_measured_without_the_socket_or_a_synchronous_standby() {
        let mut ev = fixture("pg15-syncrep-network-latency-20ms");
        for s in &mut ev.server {
            for r in &mut s.replication {
                r.rtt_ms = None;
                r.min_rtt_ms = None;
                r.rtt_error = Some("reading walsender 1's socket: Permission denied".into());
            }
        }
        match SyncrepNetworkLatency.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("Permission denied"), "{why}"),
            m => panic!("{m:?}"),
        }
        assert!(SyncrepNetworkLatency.evaluate(&ev).is_none());
        let mut ev = fixture("pg15-syncrep-network-latency-20ms");
        for s in &mut ev.server {
            for r in &mut s.replication {
                r.sync_state = Some("async".into());
            }
        }
        match SyncrepNetworkLatency.measure(&ev) {
            Measure::NotApplicable(why) => assert!(why.contains("no synchronous standby"), "{why}"),
            m => panic!("{m:?}"),
        }
        let mut ev = fixture("pg15-syncrep-network-latency-20ms");
        ev.server.clear();
        ev.rec.manifest.collectors.retain(|c| c.name != "pgstat");
        match SyncrepNetworkLatency.measure(&ev) {
            Measure::Missing(why) => assert!(why.contains("pgstat collector"), "{why}"),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_far_standby_under_slow_commits_is_not_their_cost() {
        let mut ev = fixture("pg15-syncrep-network-latency-20ms");
        let c = commits(&ev).unwrap();
        // The same round trip under commits ten times as slow (a slow disk,
        // a lock): the round trip is no longer what they wait for.
        if let Some(w) = ev.rec.workload.as_mut() {
            w.latency_avg_ms = Some(c.latency_ms * 10.0);
        }
        assert!(rtt(&ev).unwrap().ms >= WARN_RTT_MS);
        assert!(SyncrepNetworkLatency.evaluate(&ev).is_none());
    }
}
