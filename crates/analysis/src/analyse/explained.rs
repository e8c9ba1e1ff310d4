//! How much of the backends' time the findings explain: each raised
//! finding claims the slices of the account its cause fills (its rule's
//! [`Rule::claims`]), a slice counted once however many claim it; a
//! finding whose cost lies inside the CPU slice (a function's share of the
//! profile) claims its impact's seconds there. What no finding claims is
//! said as two figures: time waiting (run queue, blocked, sleeping on a
//! wait that is not idle) that no check explains, with its largest slices,
//! and time on a CPU, which is the statements' own work unless a rule says
//! otherwise.
use serde::{Deserialize, Serialize};

use super::{Finding, Rule};
use crate::evidence::account::{RoleAccount, Top};

/// What a rule's cause fills in the backends' account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// A whole slice by key (`runq`, `D:writeback`, …).
    Slice(&'static str),
    /// One wait event of an S slice (`Lock:extend`).
    Event(&'static str),
    /// A part of the on-CPU slice, as the profile split it
    /// (`kernel:reclaim`): a cost paid on a CPU.
    CpuPart(&'static str),
    /// The share of a slice the finding's evidence field (0–1) says is its
    /// cause's (refaults among the reads from storage): what another
    /// finding claimed first is not claimed again.
    SliceShare(&'static str, &'static str),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explained {
    /// The backends' busy process-seconds (the account's total less idle).
    pub busy_s: f64,
    pub explained_s: f64,
    /// Of the busy time.
    pub explained_share: f64,
    pub by_finding: Vec<Claimed>,
    /// Busy time waiting (not on a CPU) that no finding claims.
    pub unexplained_waiting_s: f64,
    pub unexplained_waiting_share: f64,
    /// Its largest slices, most first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub largest: Vec<Unexplained>,
    /// Busy time on a CPU that no finding claims: the statements' work.
    pub on_cpu_unclaimed_share: f64,
    /// Busy time waiting for the client inside a transaction (Client
    /// waits: the application's or the network's time, not the server's).
    #[serde(default)]
    pub client_share: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claimed {
    pub id: String,
    pub s: f64,
    pub share: f64,
    /// The slices or events claimed, or `impact` (its measured share).
    pub slices: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unexplained {
    pub key: String,
    pub s: f64,
    pub share: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<Top>,
}

/// Slices that are the server waiting rather than working (the client's
/// turn, `S:Client`, is neither).
fn waiting(key: &str) -> bool {
    !matches!(key, "cpu" | "S:idle" | CLIENT)
}

/// The backends waiting for their client inside a transaction.
const CLIENT: &str = "S:Client";

/// The findings against the backends' account; None without a busy time
/// (no pg_stat_activity samples to tell idle apart) or with none.
pub fn explain(
    backends: &RoleAccount,
    findings: &[Finding],
    rules: &[Box<dyn Rule>],
) -> Option<Explained> {
    let busy = backends.busy_s.filter(|b| *b > 0.0)?;
    let mut taken_slices: Vec<&str> = Vec::new();
    // Seconds of a slice claimed by shares, until one claims it whole.
    let mut shared: std::collections::BTreeMap<&str, f64> = Default::default();
    let mut taken_events: Vec<&str> = Vec::new();
    let mut taken_parts: Vec<&str> = Vec::new();
    let mut cpu_claimed = 0.0;
    let mut by_finding = Vec::new();
    for f in findings {
        let claims = rules
            .iter()
            .find(|r| r.id() == f.id)
            .map_or(&[][..], |r| r.claims());
        let mut s = 0.0;
        let mut what = Vec::new();
        for c in claims {
            match *c {
                Claim::Slice(k) if !taken_slices.contains(&k) => {
                    let v = backends.s(k) - shared.get(k).copied().unwrap_or(0.0);
                    if v > 0.0 {
                        taken_slices.push(k);
                        s += v;
                        what.push(k.to_string());
                    }
                }
                Claim::Event(e) if !taken_events.contains(&e) => {
                    let v: f64 = backends
                        .slices
                        .iter()
                        .filter_map(|sl| sl.events.get(e))
                        .sum();
                    if v > 0.0 {
                        taken_events.push(e);
                        s += v;
                        what.push(e.to_string());
                    }
                }
                Claim::SliceShare(k, field) if !taken_slices.contains(&k) => {
                    let share = f.evidence[field].as_f64().unwrap_or(0.0).clamp(0.0, 1.0);
                    let before = shared.get(k).copied().unwrap_or(0.0);
                    let v = (share * backends.s(k)).min(backends.s(k) - before);
                    if v > 0.0 {
                        shared.insert(k, before + v);
                        s += v;
                        what.push(format!("{k} ({:.0} %)", share * 100.0));
                    }
                }
                Claim::CpuPart(p) if !taken_parts.contains(&p) => {
                    let part = backends
                        .slice("cpu")
                        .and_then(|c| c.parts.get(p))
                        .copied()
                        .unwrap_or(0.0);
                    let v = part.min(backends.s("cpu") - cpu_claimed);
                    if v > 0.0 {
                        taken_parts.push(p);
                        cpu_claimed += v;
                        s += v;
                        what.push(format!("cpu {p}"));
                    }
                }
                _ => {}
            }
        }
        // A cost inside the CPU slice: the impact's share of the CPU.
        if claims.is_empty() {
            if let Some(i) = f.impact.as_ref().filter(|i| i.of == "the backends' CPU") {
                let v = (i.share * backends.s("cpu")).min(backends.s("cpu") - cpu_claimed);
                if v > 0.0 {
                    cpu_claimed += v;
                    s += v;
                    what.push("cpu (impact)".into());
                }
            }
        }
        if s > 0.0 {
            by_finding.push(Claimed {
                id: f.id.clone(),
                s: crate::round3(s),
                share: crate::round3(s / busy),
                slices: what,
            });
        }
    }
    let explained: f64 = by_finding.iter().map(|c| c.s).sum::<f64>().min(busy);
    let mut largest: Vec<Unexplained> = backends
        .slices
        .iter()
        .filter(|sl| waiting(&sl.key) && !taken_slices.contains(&sl.key.as_str()))
        .map(|sl| {
            let claimed: f64 = sl
                .events
                .iter()
                .filter(|(e, _)| taken_events.contains(&e.as_str()))
                .map(|(_, v)| v)
                .sum::<f64>()
                + shared.get(sl.key.as_str()).copied().unwrap_or(0.0);
            let s = (sl.s - claimed).max(0.0);
            Unexplained {
                key: sl.key.clone(),
                s: crate::round3(s),
                share: crate::round3(s / busy),
                top: sl
                    .top
                    .iter()
                    .filter(|t| !taken_events.contains(&t.what.as_str()))
                    .cloned()
                    .collect(),
            }
        })
        .filter(|u| u.s > 0.0)
        .collect();
    largest.sort_by(|a, b| b.s.total_cmp(&a.s).then_with(|| a.key.cmp(&b.key)));
    let waiting_s: f64 = largest.iter().map(|u| u.s).sum();
    largest.truncate(3);
    let cpu_left = (backends.s("cpu") - cpu_claimed).max(0.0);
    Some(Explained {
        busy_s: crate::round3(busy),
        explained_s: crate::round3(explained),
        explained_share: crate::round3(explained / busy),
        by_finding,
        unexplained_waiting_s: crate::round3(waiting_s),
        unexplained_waiting_share: crate::round3(waiting_s / busy),
        largest,
        on_cpu_unclaimed_share: crate::round3(cpu_left / busy),
        client_share: crate::round3(backends.s(CLIENT) / busy),
    })
}

/// The findings most severe first and, within a severity, by the share of
/// the backends' busy time each explains on its own, most first (then by
/// id): two causes at once are read in the order of what they cost, and
/// [`explain`] then gives a slice two of them claim to the larger. Without
/// a busy time the order is left as it is.
pub fn rank(backends: &RoleAccount, findings: &mut [Finding], rules: &[Box<dyn Rule>]) {
    let alone = |f: &Finding| {
        explain(backends, std::slice::from_ref(f), rules)
            .and_then(|e| e.by_finding.first().map(|c| c.s))
            .unwrap_or(0.0)
    };
    let mut keyed: Vec<(f64, Finding)> = findings.iter().map(|f| (alone(f), f.clone())).collect();
    keyed.sort_by(|(a, f), (b, g)| {
        g.severity
            .cmp(&f.severity)
            .then_with(|| b.total_cmp(a))
            .then_with(|| f.id.cmp(&g.id))
    });
    for (slot, (_, f)) in findings.iter_mut().zip(keyed) {
        *slot = f;
    }
}

impl Explained {
    /// The verdict's second line.
    pub fn line(&self) -> String {
        // A share of -0.0 (an explained claim of nothing) printed "-0 %".
        let pct = |x: f64| format!("{:.0} %", if x <= 0.0 { 0.0 } else { x * 100.0 });
        let mut s = format!(
            "findings explain {} of the backends' busy time ({:.1} s)",
            pct(self.explained_share),
            self.busy_s
        );
        s.push_str(&format!(
            "; {} is waiting no check explains",
            pct(self.unexplained_waiting_share)
        ));
        if let Some(u) = self.largest.first() {
            s.push_str(&format!(" (largest: {} {}", u.key, pct(u.share)));
            if let Some(t) = u.top.first() {
                s.push_str(&format!(", {}", t.what));
            }
            s.push(')');
        }
        s.push_str(&format!(
            "; {} on a CPU, the statements' own work as far as the checks tell",
            pct(self.on_cpu_unclaimed_share)
        ));
        if self.client_share >= 0.005 {
            s.push_str(&format!(
                "; {} waiting for the client inside transactions",
                pct(self.client_share)
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::role::Role;

    fn explained(name: &str) -> (Explained, Vec<Finding>) {
        let ev = crate::analyse::fixture(name);
        let (_, findings) = crate::analyse::diagnose(&ev);
        let acc = crate::evidence::account::build(&ev).unwrap();
        let e = explain(
            acc.role(Role::Backend).unwrap(),
            &findings,
            &crate::analyse::rules(),
        )
        .unwrap();
        (e, findings)
    }

    // Real lab runs: `lab run --scenario disk-read-latency --pg 15` with the
    // 150-IOPS limit and without.
    #[test]
    fn the_slow_reads_finding_explains_the_time_it_names() {
        let (e, _) = explained("pg15-disk-read-latency-150");
        assert!(e.explained_share >= 0.8, "{e:#?}");
        assert_eq!(e.by_finding[0].id, "disk-read-latency", "{e:#?}");
        assert_eq!(e.by_finding[0].slices, ["D:data-file read"], "{e:#?}");
        assert!(e.unexplained_waiting_share < 0.2, "{e:#?}");
        let line = e.line();
        assert!(line.starts_with("findings explain 9"), "{line}");
    }

    #[test]
    fn without_findings_nothing_is_explained_and_the_waiting_is_named() {
        let (e, findings) = explained("pg15-disk-read-latency-unlimited");
        assert!(findings.is_empty(), "{findings:#?}");
        assert_eq!(e.explained_s, 0.0);
        // 4 clients and pgbench on 2 CPUs: the backends wait for a CPU.
        assert_eq!(e.largest[0].key, "runq", "{e:#?}");
        assert!(e.line().contains("largest: runq"), "{}", e.line());
    }

    // `lab run --scenario memory-cgroup-reclaim --pg 15 --collectors
    // procfs,system,pgstat,syscalls,profile` (160 MB): the reclaim the
    // backends did on a CPU is the finding's; the lab's cost is mostly the
    // refaults' reads, so the claim is small.
    #[test]
    fn a_cost_paid_on_a_cpu_is_claimed_from_the_profiles_split() {
        let (e, findings) = explained("pg15-memcg-limit-160-profile");
        let c = e
            .by_finding
            .iter()
            .find(|c| c.id == "memory-cgroup-reclaim")
            .unwrap_or_else(|| panic!("{e:#?} {findings:#?}"));
        assert!(c.slices.iter().any(|s| s == "cpu kernel:reclaim"), "{c:#?}");
        assert!(c.s > 0.0 && c.share < 0.1, "{c:#?}");
    }

    // Two causes at once, a real lab run: `lab run --scenario
    // disk-read-latency --also noisy-neighbour --hogs 8 --read-iops 1000
    // --pg 15 --collectors procfs,system,pgstat,syscalls`. Both critical;
    // the backends lost more to the reads (about 50 s blocked) than to the
    // run queue (about 23 s): the reads come first, and no second is
    // claimed twice.
    #[test]
    fn two_causes_are_ranked_by_the_time_each_explains() {
        let ev = crate::analyse::fixture("pg15-disk-read-latency-1000-hogs-8");
        let (_, mut findings) = crate::analyse::diagnose(&ev);
        let ids = |f: &[Finding]| f.iter().map(|f| f.id.clone()).collect::<Vec<_>>();
        // By id alone, cpu-saturation would come first.
        assert_eq!(ids(&findings), ["cpu-saturation", "disk-read-latency"]);
        let acc = crate::evidence::account::build(&ev).unwrap();
        let b = acc.role(Role::Backend).unwrap();
        let rules = crate::analyse::rules();
        rank(b, &mut findings, &rules);
        assert_eq!(ids(&findings), ["disk-read-latency", "cpu-saturation"]);
        let e = explain(b, &findings, &rules).unwrap();
        let shares: Vec<f64> = e.by_finding.iter().map(|c| c.share).collect();
        assert!(shares[0] > 2.0 * shares[1], "{e:#?}");
        assert!(shares.iter().sum::<f64>() <= 1.0, "{e:#?}");
        let claimed: Vec<&String> = e.by_finding.iter().flat_map(|c| &c.slices).collect();
        let mut unique = claimed.clone();
        unique.dedup();
        assert_eq!(claimed.len(), unique.len(), "{e:#?}");
    }

    // The memory cgroup's refaults among the reads from storage: its
    // finding claims that share of the blocked reading, and a finding that
    // claims the slice whole takes only the rest.
    #[test]
    fn a_share_of_a_slice_is_claimed_once() {
        let ev = crate::analyse::fixture("pg15-disk-read-latency-1000-hogs-8");
        let (_, findings) = crate::analyse::diagnose(&ev);
        let acc = crate::evidence::account::build(&ev).unwrap();
        let b = acc.role(Role::Backend).unwrap();
        let reads = b.s("D:data-file read");
        let mut memcg = findings[0].clone();
        memcg.id = "memory-cgroup-reclaim".into();
        memcg.evidence = serde_json::json!({"refault_share_of_reads": 0.25});
        let disk = findings
            .iter()
            .find(|f| f.id == "disk-read-latency")
            .unwrap()
            .clone();
        let e = explain(b, &[memcg, disk], &crate::analyse::rules()).unwrap();
        let s = |id: &str| e.by_finding.iter().find(|c| c.id == id).unwrap().s;
        assert!(
            (s("memory-cgroup-reclaim") - 0.25 * reads).abs() < 0.01,
            "{e:#?}"
        );
        assert!(
            (s("disk-read-latency") - 0.75 * reads).abs() < 0.01,
            "{e:#?}"
        );
        assert!(
            !e.largest.iter().any(|u| u.key == "D:data-file read"),
            "{e:#?}"
        );
    }

    // `pg15-memcg-limit-160-profile` (above): nearly every read from
    // storage was a refault; the finding claims the blocked reading too.
    #[test]
    fn the_refaults_reads_are_the_memory_limits() {
        let (e, _) = explained("pg15-memcg-limit-160-profile");
        let c = e
            .by_finding
            .iter()
            .find(|c| c.id == "memory-cgroup-reclaim")
            .unwrap();
        assert!(
            c.slices.iter().any(|s| s.starts_with("D:data-file read (")),
            "{c:#?}"
        );
    }

    #[test]
    fn a_slice_claimed_twice_counts_once() {
        let ev = crate::analyse::fixture("pg15-disk-read-latency-150");
        let (_, findings) = crate::analyse::diagnose(&ev);
        let twice: Vec<Finding> = findings.iter().chain(&findings).cloned().collect();
        let acc = crate::evidence::account::build(&ev).unwrap();
        let b = acc.role(Role::Backend).unwrap();
        let once = explain(b, &findings, &crate::analyse::rules()).unwrap();
        let again = explain(b, &twice, &crate::analyse::rules()).unwrap();
        assert_eq!(once.explained_s, again.explained_s);
        assert!(again.explained_share <= 1.0);
    }
}
