//! `syncrep-wait-syscalls` (seed 003): before PostgreSQL 14, a commit that
//! waits for synchronous standbys (`SyncRepWaitForLSN` → `WaitLatch`) builds
//! and frees an epoll set on every wait — `epoll_create1`, 2× `epoll_ctl`,
//! `close` per commit — and freeing a set takes the kernel's global
//! `epmutex`, contended across backends. Raised from the backends' measured
//! epoll syscalls per committed transaction while commits waited for
//! standbys; the profile, when there is one, corroborates with the share of
//! backend samples under `SyncRepWaitForLSN` and in epoll/mutex kernel code.
use serde_json::json;

use super::{Change, Figure, Finding, Gauge, Headline, Impact, Measure, Rule};
use crate::evidence::profile::FoldedStack;
use crate::evidence::Evidence;
use crate::recording::schema::profile::KERNEL_SUFFIX;
use crate::role::Role;
use crate::round3;

pub const ID: &str = "syncrep-wait-syscalls";

/// Below this many commits a ratio says little. 200 commits put a ratio
/// of ~1 within a few percent; the CI's shared disk once cut a 6 s lab run
/// to 492 commits (10 ms WAL fsyncs) with epoll_create1 at 0.94 per commit.
const MIN_COMMITS: u64 = 200;
/// epoll_create1 per commit that counts as "a set per commit wait". Not
/// every commit waits: with concurrent committers the standbys have often
/// confirmed a backend's LSN before it checks, and SyncRepWaitForLSN returns
/// without WaitLatch (measured 0.82 per commit attached on CI, 0.94–0.98 in
/// the lab; PostgreSQL 14+ and healthy servers: 0.001). Half the commits
/// waiting is the bound.
const MIN_CREATE_PER_COMMIT: f64 = 0.5;
/// epoll_ctl per commit (2 per wait: the latch and postmaster-death fds).
const MIN_CTL_PER_COMMIT: f64 = 1.0;
/// The measured cost of the per-commit epoll sets — the backends' CPU in
/// building and freeing them (profile), or the commit time spent blocked on
/// their locks (offcpu) — that makes it a warning. Counts alone never do:
/// on 2 CPUs the set-up measured 2.5 % of the backends' CPU (5.6 µs of a
/// 3.9 ms commit), where the seed's 64 CPUs spent 20 % of their cycles in
/// the kernel mutex code behind it (__mutex_lock_slowpath 12 %,
/// mutex_spin_on_owner 7.7 %).
const WARN_COST: f64 = 0.05;
/// The same cost that makes it critical.
const CRITICAL_COST: f64 = 0.2;

pub struct SyncrepWait;

/// Committed transactions in the recording and where the number came from.
pub(crate) fn commits(rec: &Evidence) -> Option<(u64, String, (f64, f64))> {
    if let Some(w) = &rec.workload {
        if w.transactions > 0 {
            return Some((
                w.transactions,
                format!("{} transactions (one commit each)", w.tool),
                (w.t_start, w.t_end),
            ));
        }
    }
    let first = rec.pgstat.first()?;
    let last = rec.pgstat.last()?;
    (last.t > first.t).then(|| {
        let (n, source) = super::statements::client_transactions(first, last);
        (n, source, (first.t, last.t))
    })
}

/// Whether the commits waited for standbys: the recording's topology says
/// so, the primary's pg_stat_replication names synchronous standbys
/// (attached), or the profile caught backends in SyncRepWaitForLSN.
fn waited_for_standbys(rec: &Evidence, prof: Option<&ProfileShares>) -> bool {
    let repl = rec.manifest.postgres.replication.as_ref();
    let sync_topology = repl.is_some_and(|r| r.sync != "async");
    let sync_in_profile = prof.is_some_and(|p| p.syncrep > 0);
    let sync_in_server = rec.server.iter().any(|s| {
        s.replication
            .iter()
            .any(|r| matches!(r.sync_state.as_deref(), Some("sync" | "quorum")))
    });
    sync_topology || sync_in_profile || sync_in_server
}

/// Why the backends' epoll sets, however many, are not commit waits'
/// (`ctl` epoll_ctl calls over `n` commits); None when they are.
fn not_commit_waits(
    rec: &Evidence,
    n: u64,
    ctl: u64,
    prof: Option<&ProfileShares>,
) -> Option<String> {
    let per = ctl as f64 / n.max(1) as f64;
    if per < MIN_CTL_PER_COMMIT {
        return Some(format!(
            "{per:.2} epoll_ctl per commit, fewer than the {MIN_CTL_PER_COMMIT} a set built per \
             commit wait makes: the epoll sets are not WaitLatch's"
        ));
    }
    (!waited_for_standbys(rec, prof)).then(|| {
        "no commit was seen waiting for a synchronous standby (none in the recording's \
         topology or pg_stat_replication, no SyncRepWaitForLSN in the profile): the epoll sets \
         are someone else's"
            .into()
    })
}

/// Backend samples of the profile: total, under SyncRepWaitForLSN, in epoll
/// functions, in mutex code (kernel), with any kernel frame.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileShares {
    pub samples: u64,
    pub syncrep: u64,
    pub epoll: u64,
    pub mutex: u64,
    pub kernel: u64,
}

impl ProfileShares {
    pub fn from_stacks(stacks: &[FoldedStack]) -> ProfileShares {
        let mut s = ProfileShares::default();
        for st in stacks.iter().filter(|s| s.role == "backend") {
            let n = st.samples;
            s.samples += n;
            let has = |f: &dyn Fn(&str) -> bool| st.frames.iter().any(|x| f(x));
            if has(&|x| x == "SyncRepWaitForLSN") {
                s.syncrep += n;
            }
            if has(&|x| x.contains("epoll") || x.contains("eventpoll")) {
                s.epoll += n;
            }
            if has(&|x| x.ends_with(KERNEL_SUFFIX) && x.contains("mutex")) {
                s.mutex += n;
            }
            if has(&|x| x.ends_with(KERNEL_SUFFIX)) {
                s.kernel += n;
            }
        }
        s
    }

    fn share(&self, n: u64) -> f64 {
        round3(n as f64 / self.samples.max(1) as f64)
    }
}

/// Kernel time of the per-commit epoll set-up: the backends' on-CPU
/// samples in kernel epoll code (profile), and their off-CPU time in
/// stacks through it (offcpu: the global epmutex), per commit.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EpollSetup {
    /// The backends' profile samples in the set-up (the seconds' source).
    #[serde(skip)]
    pub on_cpu_samples: u64,
    pub on_cpu_kernel_s: f64,
    pub on_cpu_us_per_commit: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_cpu_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_cpu_us_per_commit: Option<f64>,
}

/// Kernel functions of building, filling and freeing an epoll set (not
/// of waiting in one: `ep_poll`, `do_epoll_wait`).
const EPOLL_SETUP: &[&str] = &[
    "epoll_create",
    "epoll_ctl",
    "ep_insert",
    "ep_remove",
    "ep_free",
    "ep_clear_and_put",
    "eventpoll_release",
];

fn in_epoll_setup(frames: &[String]) -> bool {
    let kernel = |x: &&String| x.ends_with(KERNEL_SUFFIX);
    frames
        .iter()
        .filter(kernel)
        .any(|x| EPOLL_SETUP.iter().any(|f| x.contains(f)))
        && !frames
            .iter()
            .filter(kernel)
            .any(|x| x.contains("epoll_wait") || x.contains("ep_poll"))
}

/// What the per-commit epoll sets cost, as a share: of the backends' CPU
/// (their profile samples in the set-up) and of the commit latency
/// (offcpu's blocked time in the set-up per commit, against pgbench's
/// latency). None when neither was measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SetupCost {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_of_backend_cpu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_of_commit_latency: Option<f64>,
}

impl SetupCost {
    /// The larger of the measured shares.
    fn share(&self) -> f64 {
        self.share_of_backend_cpu
            .into_iter()
            .chain(self.share_of_commit_latency)
            .fold(0.0, f64::max)
    }
}

fn setup_cost(
    rec: &Evidence,
    setup: Option<&EpollSetup>,
    prof: Option<&ProfileShares>,
) -> Option<SetupCost> {
    let setup = setup?;
    let cpu = prof.map(|p| p.share(setup.on_cpu_samples));
    let latency_us = rec
        .workload
        .as_ref()
        .and_then(|w| w.latency_avg_ms)
        .filter(|l| *l > 0.0)
        .map(|l| l * 1000.0);
    let wait = setup
        .off_cpu_us_per_commit
        .zip(latency_us)
        .map(|(us, lat)| round3(us / lat));
    (cpu.is_some() || wait.is_some()).then_some(SetupCost {
        share_of_backend_cpu: cpu,
        share_of_commit_latency: wait,
    })
}

fn epoll_setup(rec: &Evidence, commits: u64) -> Option<EpollSetup> {
    let hz = rec.profile.as_ref()?.summary.hz;
    if hz == 0 || commits == 0 {
        return None;
    }
    let samples: u64 = rec
        .stacks()
        .iter()
        .filter(|s| s.role == "backend" && in_epoll_setup(&s.frames))
        .map(|s| s.samples)
        .sum();
    let on = samples as f64 / hz as f64;
    let off = rec.offcpu.as_ref().map(|o| {
        o.stacks
            .iter()
            .filter(|s| s.role == "backend" && in_epoll_setup(&s.frames))
            .map(|s| s.samples as f64 / 1e6)
            .sum::<f64>()
    });
    let per = |s: f64| (s / commits as f64 * 1e6 * 10.0).round() / 10.0;
    Some(EpollSetup {
        on_cpu_samples: samples,
        on_cpu_kernel_s: round3(on),
        on_cpu_us_per_commit: per(on),
        off_cpu_s: off.map(round3),
        off_cpu_us_per_commit: off.map(per),
    })
}

/// epoll sets the backends created (`epoll_create1`, or `epoll_create` in
/// old libcs).
fn epoll_creates(b: &crate::recording::reader::RoleSyscalls) -> u64 {
    b.get("epoll_create1") + b.get("epoll_create")
}

/// The rule's key figure: the backends' epoll sets created per committed
/// transaction (≈ 1 before 14, ≈ 0 from 14 on, waits or not). None without
/// commits or backend syscall counts.
fn epoll_create_per_commit(rec: &Evidence) -> Option<f64> {
    let (n, _, _) = commits(rec)?;
    let by_role = rec.syscalls_by_role(None);
    let b = by_role.get(&Role::Backend)?;
    (n > 0).then(|| round3(epoll_creates(b) as f64 / n as f64))
}

fn profile_shares(rec: &Evidence) -> Option<ProfileShares> {
    let s = ProfileShares::from_stacks(rec.stacks());
    (s.samples > 0).then_some(s)
}

/// 14's WaitLatch() keeps one long-lived WaitEventSet.
const FIX: Change = Change {
    major: 14,
    commit: "3347c982ba",
    what: "WaitLatch() keeps one long-lived WaitEventSet: no epoll set built and freed per commit wait",
};

/// `watch`'s gauge: the backends' epoll_create1 calls per commit the
/// server counted (xact_commit between the window's first and last pgstat
/// samples), unrounded; 0 calls where no backend syscall was counted.
fn window_epoll_create1_per_commit(rec: &Evidence) -> Option<f64> {
    let (a, b) = (rec.pgstat.first()?, rec.pgstat.last()?);
    // Less the start-up transactions of connections and parallel workers,
    // which wait for no standby.
    let commits = b
        .commits?
        .saturating_sub(a.commits?)
        .saturating_sub(b.startup_commits_since(a));
    let by_role = rec.syscalls_by_role(None);
    let calls = by_role
        .get(&Role::Backend)
        .map_or(0, |b| b.get("epoll_create1"));
    (commits > 0).then(|| calls as f64 / commits as f64)
}

impl Rule for SyncrepWait {
    fn id(&self) -> &'static str {
        ID
    }

    fn headline(&self) -> Option<Headline> {
        Some(Headline {
            figure: "backends' epoll_create1 per commit",
            value: epoll_create_per_commit,
            metric: Some(Gauge {
                name: "pgbelow_epoll_create1_per_commit",
                help:
                    "Backends' epoll_create1 calls per committed transaction over the last window.",
                value: window_epoll_create1_per_commit,
            }),
        })
    }

    fn changes(&self) -> &'static [Change] {
        &[FIX]
    }

    fn measure(&self, rec: &Evidence) -> Measure {
        let Some((n, _, _)) = commits(rec) else {
            return Measure::Missing(
                "commits were not counted: add the pgstat collector (with a connection) or run a workload"
                    .into(),
            );
        };
        if n < MIN_COMMITS {
            return Measure::Missing(format!(
                "{n} commits, fewer than the {MIN_COMMITS} needed for a rate per commit"
            ));
        }
        match rec.syscalls_by_role(None).get(&Role::Backend) {
            Some(b) => Measure::Figure(Figure::above(
                "backend epoll_create1 per commit",
                round3(epoll_creates(b) as f64 / n as f64),
                "",
                MIN_CREATE_PER_COMMIT,
            )),
            None => Measure::Missing(rec.no_backend_syscalls()),
        }
    }

    fn held_back(&self, rec: &Evidence) -> Option<String> {
        let (n, _, _) = commits(rec)?;
        let by_role = rec.syscalls_by_role(None);
        let ctl = by_role.get(&Role::Backend)?.get("epoll_ctl");
        not_commit_waits(rec, n, ctl, profile_shares(rec).as_ref())
    }

    fn evaluate(&self, rec: &Evidence) -> Option<Finding> {
        let (n, source, window) = commits(rec)?;
        if n < MIN_COMMITS {
            return None;
        }
        let by_role = rec.syscalls_by_role(None);
        let b = by_role.get(&Role::Backend)?;
        let create = epoll_creates(b);
        let ctl = b.get("epoll_ctl");
        let close = b.get("close");
        let per = |x: u64| round3(x as f64 / n as f64);
        if (create as f64 / n as f64) < MIN_CREATE_PER_COMMIT {
            return None;
        }
        let prof = profile_shares(rec);
        let repl = rec.manifest.postgres.replication.as_ref();
        if not_commit_waits(rec, n, ctl, prof.as_ref()).is_some() {
            return None;
        }
        let level = rec
            .manifest
            .postgres
            .settings
            .get("synchronous_commit")
            .cloned();
        let (a, z) = rec.syscall_span().unwrap_or(window);
        let secs = (z - a).max(1e-9);
        let tps = rec
            .workload
            .as_ref()
            .map(|w| w.tps)
            .filter(|t| *t > 0.0)
            .unwrap_or(n as f64 / secs);
        let version = rec
            .manifest
            .postgres
            .version
            .clone()
            .unwrap_or_else(|| "unknown".into());
        let (fixed, commit) = (FIX.major, FIX.commit);
        let why = match rec.manifest.postgres.major {
            Some(m) if m < fixed => format!(
                "This server is PostgreSQL {version}: before {fixed}, WaitLatch() builds a WaitEventSet (an epoll \
                 instance) for every wait and frees it afterwards (long-lived set since {commit}, {fixed})."
            ),
            Some(_) => format!(
                "This server is PostgreSQL {version}, whose WaitLatch() keeps one epoll set; a per-commit rate \
                 here comes from another per-call WaitEventSet (WaitLatchOrSocket, an extension)."
            ),
            None => "The server's version was not recorded.".into(),
        };
        let prof_text = match &prof {
            Some(p) => format!(
                " On-CPU backend samples: {:.1}% under SyncRepWaitForLSN, {:.1}% in epoll functions, {:.1}% in \
                 kernel mutex code, {:.1}% in the kernel.",
                p.share(p.syncrep) * 100.0,
                p.share(p.epoll) * 100.0,
                p.share(p.mutex) * 100.0,
                p.share(p.kernel) * 100.0
            ),
            None => String::new(),
        };
        let standby_text = match repl {
            Some(r) => format!(
                "synchronous_standby_names '{}'",
                r.synchronous_standby_names
            ),
            None => "standbys seen in the profile".into(),
        };
        // The statements whose commits waited (pgstat's query timeline).
        let sources = crate::evidence::queries::by_wait(rec, "IPC:SyncRep", 3);
        let from = crate::evidence::queries::sentence(&sources, "looks in SyncRep");
        let setup = epoll_setup(rec, n);
        let setup_text = setup.as_ref().map_or(String::new(), |s| {
            format!(
                " The epoll set-up cost the backends {:.1} µs of kernel CPU per commit{}.",
                s.on_cpu_us_per_commit,
                s.off_cpu_us_per_commit.map_or(String::new(), |o| format!(
                    " and {o:.1} µs blocked on its locks"
                ))
            )
        });
        // Severity from the measured cost, never from the counts alone.
        let cost = setup_cost(rec, setup.as_ref(), prof.as_ref());
        let share = cost.as_ref().map(SetupCost::share);
        let severity = super::severity_of_cost(share, WARN_COST, CRITICAL_COST);
        let pct = |x: f64| format!("{:.1} %", x * 100.0);
        let cost_text = match &cost {
            Some(c) => format!(
                " Measured cost: {}{} (a warning from {}, critical from {}){}.",
                c.share_of_backend_cpu.map_or(String::new(), |v| format!(
                    "{} of the backends' CPU",
                    pct(v)
                )),
                c.share_of_commit_latency.map_or(String::new(), |v| format!(
                    "{}{} of the commit latency blocked on its locks",
                    if c.share_of_backend_cpu.is_some() {
                        ", "
                    } else {
                        ""
                    },
                    pct(v)
                )),
                pct(WARN_COST),
                pct(CRITICAL_COST),
                if c.share() < WARN_COST {
                    "; it grows with the cores contending for the kernel's global epmutex (the \
                     seed's 64 CPUs spent 20 % of their cycles in kernel mutex code)"
                } else {
                    ""
                }
            ),
            None => {
                " Its cost was not measured: add the profile collector (the backends' CPU in the \
                  epoll set-up) or offcpu (commits blocked on its lock) for a severity past info."
                    .into()
            }
        };
        let mut f = Finding {
            id: ID.into(),
            severity,
            impact: cost.as_ref().and_then(|c| match c.share_of_backend_cpu {
                Some(cpu) if cpu >= c.share_of_commit_latency.unwrap_or(0.0) => Impact::new(
                    cpu,
                    "the backends' CPU",
                    "profile: backend samples in building and freeing epoll sets",
                ),
                _ => Impact::new(
                    c.share(),
                    "the commit latency",
                    "offcpu: backends blocked in building and freeing epoll sets, per commit",
                ),
            }),
            title: "An epoll set built and freed on every commit wait".into(),
            summary: format!(
                "Backends made {create} epoll_create1, {ctl} epoll_ctl and {close} close calls for {n} commits \
                 ({:.2}, {:.2}, {:.2} per commit) at {tps:.0} tps, while commits waited for standbys \
                 ({standby_text}, synchronous_commit={}). Each wait creates an epoll instance, registers \
                 two fds and closes it; closing takes the kernel's global epmutex, which backends contend \
                 for on many cores.{prof_text}{setup_text}{cost_text}{from} {why}",
                per(create),
                per(ctl),
                per(close),
                level.as_deref().unwrap_or("?"),
            ),
            evidence: json!({
                "commits": n,
                "commits_source": source,
                "tps": round3(tps),
                "epoll_create1": create,
                "epoll_ctl": ctl,
                "close": close,
                "epoll_create1_per_commit": per(create),
                "epoll_ctl_per_commit": per(ctl),
                "close_per_commit": per(close),
                "backend_syscalls_per_commit": per(b.total()),
                "backends": b.pids.len(),
                "window_s": [round3(a), round3(z)],
                "synchronous_commit": level,
                "synchronous_standby_names": repl.map(|r| r.synchronous_standby_names.clone()),
                "profile": prof.as_ref().map(|p| json!({
                    "backend_samples": p.samples,
                    "share_under_SyncRepWaitForLSN": p.share(p.syncrep),
                    "share_in_epoll": p.share(p.epoll),
                    "share_in_kernel_mutex": p.share(p.mutex),
                    "share_in_kernel": p.share(p.kernel),
                })),
                "postgres_version": version,
            }),
            remedy: format!("Upgrade to PostgreSQL {fixed} or later, where WaitLatch() uses a long-lived WaitEventSet \
                     ({commit}) and a commit wait costs no epoll set-up. Until then: commit less often \
                     (batch rows into fewer transactions, multi-row INSERT/COPY), use synchronous_commit=local \
                     or off for sessions that can accept it (per transaction with SET LOCAL), and keep the \
                     contending backends on fewer cores (CPU placement, a connection pooler with fewer server \
                     connections) so the global epmutex is less contended. Prove the change with \
                     `pgbelow lab run --scenario syncrep-commit --sweep` and `pgbelow compare A B`."),
        };
        // Added only when measured: older recordings' evidence is as it was.
        if let Some(s) = setup {
            f.evidence["epoll_setup"] = json!(s);
        }
        if let Some(c) = cost {
            f.evidence["cost"] = json!(c);
        }
        if !sources.is_empty() {
            f.evidence["queries"] = json!(sources);
        }
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyse::{fixture, Severity};
    use crate::evidence::profile::parse_folded;

    #[test]
    fn profile_shares_count_backend_samples() {
        let s = ProfileShares::from_stacks(&parse_folded(
            "backend;main;SyncRepWaitForLSN;WaitLatch;CreateWaitEventSet;epoll_create1;entry_SYSCALL_64_[k] 3\n\
             backend;main;SyncRepWaitForLSN;WaitLatch;FreeWaitEventSet;close;__fput_[k];ep_eventpoll_release_[k];mutex_lock_[k] 1\n\
             backend;main;ExecInsert 6\n\
             walsender;main;WalSndLoop 9\n",
        ));
        assert_eq!(
            s,
            ProfileShares {
                samples: 10,
                syncrep: 4,
                epoll: 4,
                mutex: 1,
                kernel: 4
            }
        );
    }

    // Both fixtures are real lab runs: `pgbelow lab run --scenario
    // syncrep-commit --duration 8 --sweep` (8 clients, FIRST 2 standbys) on
    // PostgreSQL 13.23 and 15.
    #[test]
    fn fires_on_the_pg13_recording() {
        let f = SyncrepWait
            .evaluate(&fixture("pg13-syncrep-commit"))
            .expect("finding");
        assert_eq!(f.id, ID);
        let e = &f.evidence;
        assert_eq!(e["commits"], 16350);
        assert_eq!(e["epoll_create1"], 15969);
        assert_eq!(e["epoll_create1_per_commit"], 0.977);
        assert_eq!(e["epoll_ctl_per_commit"], 1.955);
        assert_eq!(e["close_per_commit"], 0.981);
        assert_eq!(e["synchronous_commit"], "on");
        let p = &e["profile"];
        assert!(p["share_under_SyncRepWaitForLSN"].as_f64().unwrap() > 0.05);
        assert!(p["share_in_epoll"].as_f64().unwrap() > 0.02);
        assert!(f.summary.contains("13.23"), "{}", f.summary);
        assert!(f.remedy.contains("3347c982ba"));
        // The set-up's kernel CPU per commit, from the profile (no offcpu
        // in this recording).
        let setup = &e["epoll_setup"];
        let us = setup["on_cpu_us_per_commit"].as_f64().unwrap();
        assert!(us > 1.0 && us < 1000.0, "{setup}");
        assert!(setup.get("off_cpu_s").is_none(), "{setup}");
        // On 2 CPUs that set-up is a small share of the backends' CPU:
        // counted, stated, and only info (a warning is a measured cost).
        let cpu = e["cost"]["share_of_backend_cpu"].as_f64().unwrap();
        assert!(cpu > 0.0 && cpu < WARN_COST, "{}", e["cost"]);
        assert_eq!(f.severity, Severity::Info);
        assert!(f.summary.contains("of the backends' CPU"), "{}", f.summary);
        assert_eq!(f.impact.as_ref().map(|i| i.share), Some(cpu));
    }

    /// The pg13 recording with its epoll set-up stacks `k` times as many.
    fn with_setup_samples(k: u64) -> Evidence {
        let mut rec = fixture("pg13-syncrep-commit");
        let n = rec
            .stacks()
            .iter()
            .filter(|s| s.role == "backend" && in_epoll_setup(&s.frames))
            .count();
        assert!(n > 0, "no epoll set-up stack in the fixture");
        for s in &mut rec.profile.as_mut().expect("profile").stacks {
            if s.role == "backend" && in_epoll_setup(&s.frames) {
                s.samples *= k;
            }
        }
        rec
    }

    #[test]
    fn severity_follows_the_measured_cost() {
        let sev = |rec: &Evidence| {
            let f = SyncrepWait.evaluate(rec).expect("finding");
            (
                f.severity,
                f.evidence["cost"]["share_of_backend_cpu"].as_f64(),
            )
        };
        // 9 of 358 backend samples in the set-up (2.5 %): info; ×3 ≈ 7 %:
        // warning; ×10 ≈ 21 %: critical.
        let (s1, c1) = sev(&with_setup_samples(1));
        let (s3, c3) = sev(&with_setup_samples(3));
        let (s10, c10) = sev(&with_setup_samples(10));
        assert_eq!(
            (s1, s3, s10),
            (Severity::Info, Severity::Warning, Severity::Critical),
            "costs {c1:?} {c3:?} {c10:?}"
        );
        // Without a profile (nor offcpu) the cost is not measured: info,
        // saying what to add.
        let mut rec = fixture("pg13-syncrep-commit");
        rec.profile = None;
        let f = SyncrepWait.evaluate(&rec).expect("finding");
        assert_eq!(f.severity, Severity::Info);
        assert!(
            f.summary.contains("add the profile collector"),
            "{}",
            f.summary
        );
        assert!(f.evidence.get("cost").is_none(), "{}", f.evidence);
    }

    #[test]
    fn silent_on_the_pg15_recording() {
        assert!(SyncrepWait
            .evaluate(&fixture("pg15-syncrep-commit"))
            .is_none());
    }

    #[test]
    fn decided_by_the_counts_and_the_waits() {
        // Without standbys in the manifest, the profile's SyncRepWaitForLSN still shows the waits.
        let mut rec = fixture("pg13-syncrep-commit");
        rec.manifest.postgres.replication = None;
        assert!(SyncrepWait.evaluate(&rec).is_some());
        // Without either, the check says why it held back.
        let mut quiet = fixture("pg13-syncrep-commit");
        quiet.manifest.postgres.replication = None;
        quiet.profile = None;
        let (c, f) = SyncrepWait.check(&quiet);
        assert!(f.is_none());
        let why = c.held_back.unwrap_or_default();
        assert!(why.contains("synchronous standby"), "{why}");
        // Without the epoll calls in the counts, nothing.
        let mut rec = fixture("pg13-syncrep-commit");
        for s in &mut rec.syscalls {
            for calls in s.counts.values_mut() {
                calls.remove("epoll_create1");
            }
        }
        assert!(SyncrepWait.evaluate(&rec).is_none());
    }

    #[test]
    fn the_sweep_is_read_back() {
        let s = fixture("pg13-syncrep-commit")
            .lab
            .syncrep_sweep
            .clone()
            .expect("sweep");
        let names: Vec<&str> = s
            .levels
            .iter()
            .map(|l| l.synchronous_commit.as_str())
            .collect();
        assert_eq!(
            names,
            ["off", "local", "remote_write", "on", "remote_apply"]
        );
        assert!(s.levels[0].tps > s.levels[4].tps);
    }

    #[test]
    fn silent_without_epoll_calls() {
        // A PG 13 select-only run: many transactions, no commit waits.
        assert!(SyncrepWait
            .evaluate(&fixture("pg13-select-only-timeout"))
            .is_none());
    }
}
