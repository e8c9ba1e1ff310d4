//! What `watch` exposes: counters summed over its windows, each window's key
//! ratios and finding states, the collectors' health and its own cost; and
//! their exposition in the Prometheus text format (0.0.4) or OpenMetrics 1.0.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::analyse::Severity;
use crate::evidence::Evidence;
use crate::report::Report;

/// pgbelow's own CPU seconds, resident bytes and open descriptors.
#[derive(Clone, Copy, Debug, Default)]
pub struct Own {
    pub cpu_s: f64,
    pub rss: u64,
    pub fds: u64,
}

/// Every counter and gauge, keyed by their labels (sorted: deterministic output).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    syscalls: BTreeMap<(String, String), u64>,
    state_s: BTreeMap<(String, String), f64>,
    runq_s: BTreeMap<String, f64>,
    cpu_s: BTreeMap<String, f64>,
    commits: u64,
    statements: u64,
    /// Refaults in the cluster's memory cgroup, once its samples came.
    memcg_refaults: Option<u64>,
    /// OTLP pushes by result (ok, error), when --otlp-endpoint is given.
    otlp: BTreeMap<&'static str, u64>,
    /// Process-seconds by (role, wait event type).
    wait_s: BTreeMap<(String, String), f64>,
    checkpoints: BTreeMap<&'static str, u64>,
    checkpoint_buffers: u64,
    windows: u64,
    window_s: f64,
    /// Ratios of the last window; absent when their denominator was 0.
    ratios: BTreeMap<&'static str, f64>,
    /// Each rule's id with the severity it raised in the last window.
    findings: BTreeMap<String, Option<Severity>>,
    /// Each check's status, key figure and bound in the last window.
    checks: BTreeMap<String, crate::analyse::Check>,
    /// The last window's findings' impact: (what it is a share of, share).
    impacts: BTreeMap<String, (String, f64)>,
    /// The last window's account of the backends' busy time: explained,
    /// waiting unexplained, on a CPU unclaimed (shares); None without one.
    explained: Option<[f64; 3]>,
    /// The machine's pressure stall (PSI) over the last window.
    pressure: Option<crate::evidence::system::PressureShares>,
    collector_up: BTreeMap<String, bool>,
    /// The watched server as of the last window: version, and the container
    /// it runs in (id, pod) where it does.
    server_info: Vec<(String, String)>,
    /// Why the server's connection fails, while it does (`watch --all`).
    pub connection_error: Option<String>,
    /// Why the last incident could not be kept, until one is.
    pub keep_error: Option<String>,
    /// Escalated windows and incidents, by trigger id.
    escalations: BTreeMap<String, u64>,
    incidents: BTreeMap<String, u64>,
    escalation_cpu_s: f64,
    /// CPU seconds of pgbelow's own backend on the server, summed over the
    /// windows that measured it; None before the first did.
    observer_cpu_s: Option<f64>,
    /// The history's seconds and bytes, and the hour's escalation budget
    /// left (CPU-s), after the last window.
    history: Option<(f64, u64, f64)>,
    postgres_up: bool,
    last_window_end: f64,
    /// When the agent started (Unix time).
    pub started: f64,
    /// Seconds between the last two windows in which nothing was counted
    /// (the last window's evaluation and the next one's attach).
    pub gap_s: Option<f64>,
}

/// `pgbelow_postgres_info`'s labels: the server's version, and the
/// container's id and pod where the report names them.
fn server_labels(rep: &Report) -> Vec<(String, String)> {
    let pg = &rep.postgres;
    let mut l = Vec::new();
    if let Some(v) = &pg.version {
        l.push(("version".to_string(), v.clone()));
    }
    if let Some(c) = &pg.container {
        l.push(("container_id".to_string(), c.id.clone()));
        if let Some(p) = &c.pod_uid {
            l.push(("pod_uid".to_string(), p.clone()));
        }
    }
    l
}

impl Metrics {
    pub fn new(collectors: &[String]) -> Metrics {
        Metrics {
            findings: crate::analyse::rules()
                .iter()
                .map(|r| (r.id().to_string(), None))
                .collect(),
            collector_up: collectors.iter().map(|c| (c.clone(), false)).collect(),
            started: chrono::Utc::now().timestamp_millis() as f64 / 1000.0,
            ..Default::default()
        }
    }

    /// The server could not be observed: every collector is down.
    pub fn down(&mut self) {
        self.postgres_up = false;
        for up in self.collector_up.values_mut() {
            *up = false;
        }
    }

    /// Add what the window's samples added since the last call, as they
    /// are read (watch/live.rs).
    pub fn add_live(&mut self, d: super::live::LiveDeltas) {
        for (k, n) in d.syscalls {
            *self.syscalls.entry(k).or_default() += n;
        }
        for (k, v) in d.state_s {
            *self.state_s.entry(k).or_default() += v;
        }
        for (k, v) in d.runq_s {
            *self.runq_s.entry(k).or_default() += v;
        }
        for (k, v) in d.cpu_s {
            *self.cpu_s.entry(k).or_default() += v;
        }
        self.commits += d.commits;
        self.statements += d.statements;
        for (k, v) in d.wait_s {
            *self.wait_s.entry(k).or_default() += v;
        }
        if let Some(b) = d.checkpointer {
            self.set_checkpointer(&b);
        }
        if let Some(n) = d.memcg_refaults {
            *self.memcg_refaults.get_or_insert(0) += n;
        }
    }

    /// The server's checkpoint counters as one sample read them.
    fn set_checkpointer(&mut self, b: &crate::collect::pgstat::Checkpointer) {
        self.checkpoints.insert("timed", b.timed);
        self.checkpoints.insert("requested", b.requested);
        self.checkpoint_buffers = b.buffers_written;
    }

    /// One escalated window, for `trigger`, that cost pgbelow `cpu_s`.
    pub fn escalated(&mut self, trigger: &str, cpu_s: f64) {
        *self.escalations.entry(trigger.to_string()).or_default() += 1;
        self.escalation_cpu_s += cpu_s;
    }

    /// One incident, kept or not, for `trigger`.
    pub fn incident(&mut self, trigger: &str) {
        *self.incidents.entry(trigger.to_string()).or_default() += 1;
    }

    /// The flight recorder after a window: history held, budget left.
    pub fn flight(&mut self, held_s: f64, held_bytes: u64, budget_left_s: f64) {
        self.history = Some((held_s, held_bytes, budget_left_s));
    }

    /// Count one OTLP push.
    pub fn otlp_pushed(&mut self, ok: bool) {
        // Both results shown from the first push on, so rate() sees 0s.
        if self.otlp.is_empty() {
            self.otlp = BTreeMap::from([("ok", 0), ("error", 0)]);
        }
        *self
            .otlp
            .entry(if ok { "ok" } else { "error" })
            .or_default() += 1;
    }

    /// Add one window's recording and its report (the syscall, state,
    /// run-queue, CPU, commit and statement counters come live, through
    /// [`Metrics::add_live`]).
    pub fn add_window(&mut self, ev: &Evidence, rep: &Report, server_up: bool) {
        self.windows += 1;
        self.postgres_up = server_up;
        self.server_info = server_labels(rep);
        let secs = ev.rec.manifest.duration_s.unwrap_or(0.0);
        self.window_s += secs;
        if let Some(c) = ev.rec.manifest.observer_backend_cpu_s {
            *self.observer_cpu_s.get_or_insert(0.0) += c;
        }
        self.last_window_end = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
        for c in &ev.rec.manifest.collectors {
            // Degraded is up: it ran, with less (a server in a pid
            // namespace of its own has its pids translated). Those an
            // escalated window added are not the watch's own.
            let ran = matches!(c.status.as_str(), "ok" | "degraded");
            if let Some(up) = self.collector_up.get_mut(&c.name) {
                *up = server_up && ran;
            }
        }
        // Syscall and process counters are added live, each second (add_live).
        let cp = |s: &crate::collect::pgstat::ServerSample| s.checkpointer.clone();
        // The server's own cumulative counters, as its last sample read
        // them: a checkpoint is counted when it starts and its buffers while
        // it writes, so window deltas showed a window's buffers beside 0
        // checkpoints when the checkpoint began in the window before. As
        // read, both count from the same statistics reset.
        if let Some(b) = ev.server.last().and_then(cp) {
            self.set_checkpointer(&b);
        }

        // The rules' gauges, over the window; six decimals: seconds per
        // dropped relation are milliseconds.
        self.ratios.clear();
        for g in crate::analyse::gauges() {
            if let Some(v) = (g.value)(ev) {
                self.ratios.insert(g.name, (v * 1e6).round() / 1e6);
            }
        }
        for sev in self.findings.values_mut() {
            *sev = None;
        }
        for f in &rep.findings {
            self.findings.insert(f.id.clone(), Some(f.severity));
        }
        self.impacts = rep
            .findings
            .iter()
            .filter_map(|f| {
                let i = f.impact.as_ref()?;
                Some((f.id.clone(), (i.of.clone(), i.share)))
            })
            .collect();
        self.checks = rep
            .checks
            .iter()
            .map(|c| (c.id.clone(), c.clone()))
            .collect();
        self.pressure = rep.system.as_ref().and_then(|s| s.pressure.clone());
        self.explained = rep.explained.as_ref().map(|e| {
            [
                e.explained_share,
                e.unexplained_waiting_share,
                e.on_cpu_unclaimed_share,
            ]
        });
    }

    /// An incident's findings, judged over its history and escalation:
    /// active now at the worse of their severity and the last window's,
    /// until the next window is evaluated.
    pub fn incident_findings(&mut self, rep: &crate::report::Report) {
        for f in &rep.findings {
            let e = self.findings.entry(f.id.clone()).or_insert(None);
            *e = (*e).max(Some(f.severity));
            if let Some(i) = &f.impact {
                self.impacts
                    .entry(f.id.clone())
                    .or_insert_with(|| (i.of.clone(), i.share));
            }
        }
    }

    /// The exposition; `openmetrics` picks OpenMetrics 1.0 over text 0.0.4.
    /// `own` is the process's own figures, read at scrape time.
    pub fn render(&self, openmetrics: bool, own: &Own) -> String {
        let mut e = Exposition::default();
        self.families(&mut e);
        own_families(&mut e, own, self.started);
        e.write(openmetrics)
    }

    /// The server's families (all but the agent's own process), each
    /// sample's labels after `e.prefix`.
    pub fn families(&self, e: &mut Exposition) {
        let lab = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        e.family(
            "pgbelow_syscalls_total",
            Kind::Counter,
            "Syscalls made by the cluster's processes, by role (scaled estimates past --syscalls-budget).",
            self.syscalls
                .iter()
                .map(|((r, s), n)| (lab(&[("role", r), ("syscall", s)]), *n as f64)),
        );
        e.family(
            "pgbelow_process_state_seconds_total",
            Kind::Counter,
            "Process-seconds spent in each /proc state (R, S, D, other), by role.",
            self.state_s
                .iter()
                .map(|((r, s), v)| (lab(&[("role", r), ("state", s)]), crate::round3(*v))),
        );
        e.family(
            "pgbelow_process_runqueue_seconds_total",
            Kind::Counter,
            "Seconds the cluster's processes were runnable but waiting for a CPU (schedstat), by role.",
            self.runq_s
                .iter()
                .map(|(r, v)| (lab(&[("role", r)]), crate::round3(*v))),
        );
        e.family(
            "pgbelow_process_cpu_seconds_total",
            Kind::Counter,
            "Seconds the cluster's processes ran on a CPU (user + system), by role.",
            self.cpu_s
                .iter()
                .map(|(r, v)| (lab(&[("role", r)]), crate::round3(*v))),
        );
        e.family(
            "pgbelow_wait_seconds_total",
            Kind::Counter,
            "Seconds the server's processes spent in each wait event type (pg_stat_activity sampled; CPU: active without a wait event; idle sessions left out), by role.",
            self.wait_s.iter().map(|((r, k), v)| {
                (
                    lab(&[("role", r), ("wait_event_type", k)]),
                    crate::round3(*v),
                )
            }),
        );
        if let Some(n) = self.memcg_refaults {
            e.family(
                "pgbelow_memory_cgroup_refaults_total",
                Kind::Counter,
                "File pages the cluster's memory cgroup evicted and read again (workingset_refault_file), over watched windows (cgroup collector).",
                [(vec![], n as f64)],
            );
        }
        e.family(
            "pgbelow_commits_total",
            Kind::Counter,
            "Committed transactions (pg_stat_database.xact_commit less the start-up commits of connections, 14+, and of parallel workers, 18+), over watched windows, current each second.",
            [(vec![], self.commits as f64)],
        );
        e.family(
            "pgbelow_statements_total",
            Kind::Counter,
            "Statements (pg_stat_statements.calls, else transactions), over watched windows, current each second.",
            [(vec![], self.statements as f64)],
        );
        e.family(
            "pgbelow_checkpoints_total",
            Kind::Counter,
            "Checkpoints started, by kind (timed, requested), since the server's statistics reset (pg_stat_bgwriter; pg_stat_checkpointer from 17).",
            self.checkpoints
                .iter()
                .map(|(k, n)| (lab(&[("kind", k)]), *n as f64)),
        );
        e.family(
            "pgbelow_checkpoint_buffers_written_total",
            Kind::Counter,
            "Buffers written by checkpoints since the server's statistics reset (pg_stat_bgwriter; pg_stat_checkpointer from 17).",
            [(vec![], self.checkpoint_buffers as f64)],
        );
        for g in crate::analyse::gauges() {
            if let Some(v) = self.ratios.get(g.name) {
                e.family(g.name, Kind::Gauge, g.help, [(vec![], *v)]);
            }
        }
        e.family(
            "pgbelow_finding_active",
            Kind::Gauge,
            "1 when the rule raised its finding at this severity over the last window, else 0.",
            self.findings.iter().flat_map(|(id, sev)| {
                [Severity::Info, Severity::Warning, Severity::Critical]
                    .into_iter()
                    .map(move |s| {
                        (
                            vec![
                                ("id".to_string(), id.clone()),
                                ("severity".to_string(), s.as_str().to_string()),
                            ],
                            if *sev == Some(s) { 1.0 } else { 0.0 },
                        )
                    })
            }),
        );
        e.family(
            "pgbelow_finding_impact_ratio",
            Kind::Gauge,
            "The share of `of` (backend busy time, CPU, throughput, …) a finding raised in the last window explains (absent when none).",
            self.impacts.iter().map(|(id, (of, share))| {
                (
                    vec![("id".to_string(), id.clone()), ("of".to_string(), of.clone())],
                    *share,
                )
            }),
        );
        if let Some(p) = &self.pressure {
            let rows = [
                ("cpu", "some", p.cpu_some),
                ("cpu", "full", p.cpu_full),
                ("memory", "some", p.memory_some),
                ("memory", "full", p.memory_full),
                ("io", "some", p.io_some),
                ("io", "full", p.io_full),
            ];
            e.family(
                "pgbelow_pressure_stall_ratio",
                Kind::Gauge,
                "The share of the last window's time in which some (or all, full) runnable tasks of the machine stalled on the resource (/proc/pressure, PSI); a kind the kernel does not report is absent.",
                rows.iter().filter_map(|(r, k, v)| {
                    Some((lab(&[("resource", r), ("kind", k)]), (*v)?))
                }),
            );
        }
        if let Some([explained, waiting, cpu]) = self.explained {
            e.family(
                "pgbelow_backend_busy_explained_ratio",
                Kind::Gauge,
                "The share of the backends' busy time over the last window that is accounted for (by what), from the account of time (procfs and pgstat); absent without it.",
                [
                    (lab(&[("by", "findings")]), explained),
                    (lab(&[("by", "none_waiting")]), waiting),
                    (lab(&[("by", "none_on_cpu")]), cpu),
                ],
            );
        }
        if !self.server_info.is_empty() {
            e.family(
                "pgbelow_postgres_info",
                Kind::Gauge,
                "Always 1; the watched server's version and, in a container, its id and pod as labels (from the postmaster's cgroup path).",
                [(self.server_info.clone(), 1.0)],
            );
        }
        e.family(
            "pgbelow_check_status",
            Kind::Gauge,
            "1 for the check's status over the last window (raised, clear, not_applicable, not_measurable), else 0.",
            self.checks.iter().flat_map(|(id, c)| {
                use crate::analyse::Status;
                [
                    Status::Raised,
                    Status::Clear,
                    Status::NotApplicable,
                    Status::NotMeasurable,
                ]
                    .into_iter()
                    .map(move |s| {
                        let name = serde_json::to_value(s)
                            .ok()
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default();
                        (
                            vec![("id".to_string(), id.clone()), ("status".to_string(), name)],
                            if c.status == s { 1.0 } else { 0.0 },
                        )
                    })
            }),
        );
        type Pick = fn(&crate::analyse::Figure) -> f64;
        let figures: [(&str, &str, Pick); 2] = [
            (
                "pgbelow_check_value",
                "The check's key figure over the last window, in its unit (absent when not measured).",
                |m| m.value,
            ),
            (
                "pgbelow_check_bound",
                "The bound the check's key figure is compared with (absent when not measured).",
                |m| m.limit,
            ),
        ];
        for (name, help, pick) in figures {
            e.family(
                name,
                Kind::Gauge,
                help,
                self.checks.iter().filter_map(|(id, c)| {
                    let m = c.measured.as_ref()?;
                    Some((
                        vec![
                            ("id".to_string(), id.clone()),
                            ("unit".to_string(), m.unit.clone()),
                        ],
                        pick(m),
                    ))
                }),
            );
        }
        e.family(
            "pgbelow_collector_up",
            Kind::Gauge,
            "1 when the collector ran over the last window (degraded included: the report says what it lacked), 0 when it failed or the server was gone.",
            self.collector_up
                .iter()
                .map(|(c, up)| (lab(&[("collector", c)]), if *up { 1.0 } else { 0.0 })),
        );
        e.family(
            "pgbelow_postgres_up",
            Kind::Gauge,
            "1 when the last window observed the server to its end.",
            [(vec![], if self.postgres_up { 1.0 } else { 0.0 })],
        );
        e.family(
            "pgbelow_otlp_exports_total",
            Kind::Counter,
            "Window profiles pushed to --otlp-endpoint, by result (ok, error).",
            self.otlp
                .iter()
                .map(|(r, n)| (lab(&[("result", r)]), *n as f64)),
        );
        e.family(
            "pgbelow_windows_total",
            Kind::Counter,
            "Windows recorded and evaluated.",
            [(vec![], self.windows as f64)],
        );
        e.family(
            "pgbelow_window_seconds_total",
            Kind::Counter,
            "Seconds covered by the windows recorded.",
            [(vec![], crate::round3(self.window_s))],
        );
        if let Some(g) = self.gap_s {
            e.family(
                "pgbelow_window_gap_seconds",
                Kind::Gauge,
                "Seconds between the last two windows in which nothing was counted.",
                [(vec![], crate::round3(g))],
            );
        }
        if self.windows > 0 {
            e.family(
                "pgbelow_last_window_end_timestamp_seconds",
                Kind::Gauge,
                "When the last window was evaluated (Unix time).",
                [(vec![], self.last_window_end)],
            );
        }
        let by_trigger = |m: &BTreeMap<String, u64>| -> Vec<Sample> {
            // Every trigger from the start, so rate() sees its 0s.
            let mut v: BTreeMap<&str, u64> =
                super::trigger::IDS.iter().map(|id| (*id, 0)).collect();
            for (k, n) in m {
                v.insert(k.as_str(), *n);
            }
            v.into_iter()
                .map(|(k, n)| (vec![("trigger".to_string(), k.to_string())], n as f64))
                .collect()
        };
        e.family(
            "pgbelow_escalations_total",
            Kind::Counter,
            "Windows recorded with the deep collectors (offcpu, profile, system, fsync, clock; every syscall counted) after a trigger tripped, by trigger.",
            by_trigger(&self.escalations),
        );
        e.family(
            "pgbelow_escalation_cpu_seconds_total",
            Kind::Counter,
            "pgbelow's own CPU seconds over its escalated windows.",
            [(vec![], crate::round3(self.escalation_cpu_s))],
        );
        if let Some(c) = self.observer_cpu_s {
            e.family(
                "pgbelow_observer_backend_cpu_seconds_total",
                Kind::Counter,
                "CPU seconds of pgbelow's own backends on the server (the pgstat collector's connection) over the windows: the server's side of pgbelow's cost, which process_cpu_seconds_total does not include.",
                [(vec![], crate::round3(c))],
            );
        }
        e.family(
            "pgbelow_incidents_total",
            Kind::Counter,
            "Incidents (history before the onset, the window the trigger ended, the escalated one), kept in --keep or not, by trigger.",
            by_trigger(&self.incidents),
        );
        if let Some((held_s, held_bytes, left)) = self.history {
            e.family(
                "pgbelow_history_seconds",
                Kind::Gauge,
                "Seconds of recent windows held for the next incident (--history).",
                [(vec![], crate::round3(held_s))],
            );
            e.family(
                "pgbelow_history_bytes",
                Kind::Gauge,
                "Bytes of recent windows held for the next incident, on disk in the scratch directory (--history-max-mb).",
                [(vec![], held_bytes as f64)],
            );
            e.family(
                "pgbelow_escalation_budget_left_seconds",
                Kind::Gauge,
                "pgbelow CPU seconds escalations may still use in the hour ending now (--budget).",
                [(vec![], crate::round3(left))],
            );
        }
        if let Some(why) = &self.keep_error {
            e.family(
                "pgbelow_keep_error",
                Kind::Gauge,
                "1 while the last incident could not be written to --keep (full, read-only); the reason as a label. Watching goes on.",
                [(vec![("reason".to_string(), why.clone())], 1.0)],
            );
        }
        if let Some(why) = &self.connection_error {
            e.family(
                "pgbelow_postgres_connection_error",
                Kind::Gauge,
                "1 while pgbelow cannot connect to the server (watch --all: the connection postmaster.pid names, as the account the server runs as); the reason as a label. Its kernel-side collectors go on.",
                [(vec![("reason".to_string(), why.clone())], 1.0)],
            );
        }
    }
}

/// The agent's own families: its build and its process, by the names every
/// Prometheus client library's process collector uses; once per exposition.
pub fn own_families(e: &mut Exposition, own: &Own, started: f64) {
    e.family(
        "pgbelow_build_info",
        Kind::Gauge,
        "Always 1; the running pgbelow's version as a label.",
        [(
            vec![("version".to_string(), env!("CARGO_PKG_VERSION").to_string())],
            1.0,
        )],
    );
    e.family(
        "process_cpu_seconds_total",
        Kind::Counter,
        "Total user and system CPU time spent in seconds (pgbelow itself, all threads).",
        [(vec![], crate::round3(own.cpu_s))],
    );
    e.family(
        "process_resident_memory_bytes",
        Kind::Gauge,
        "Resident memory size in bytes (pgbelow itself).",
        [(vec![], own.rss as f64)],
    );
    e.family(
        "process_open_fds",
        Kind::Gauge,
        "Number of open file descriptors (pgbelow itself).",
        [(vec![], own.fds as f64)],
    );
    e.family(
        "process_start_time_seconds",
        Kind::Gauge,
        "Start time of the process since the Unix epoch in seconds.",
        [(vec![], started)],
    );
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// Labels and value of one sample.
type Sample = (Vec<(String, String)>, f64);

/// Metric families being gathered, in the order first given; a family
/// given again (another server's, under `watch --all`) adds its samples to
/// the first, so that each family's HELP and TYPE are written once.
#[derive(Default)]
pub struct Exposition {
    families: Vec<(String, Kind, String, Vec<Sample>)>,
    index: BTreeMap<String, usize>,
    /// Labels put before each sample's own (`watch --all`: the server's).
    pub prefix: Vec<(String, String)>,
}

impl Exposition {
    /// One metric family. `name` is the sample name; OpenMetrics names a
    /// counter's family without its `_total` suffix.
    fn family(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = Sample>,
    ) {
        let i = *self.index.entry(name.to_string()).or_insert_with(|| {
            self.families
                .push((name.to_string(), kind, help.to_string(), Vec::new()));
            self.families.len() - 1
        });
        let prefix = &self.prefix;
        self.families[i].3.extend(samples.into_iter().map(|(l, v)| {
            let mut all = prefix.clone();
            all.extend(l);
            (all, v)
        }));
    }

    /// A gauge of one sample without labels of its own.
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, Kind::Gauge, help, [(vec![], value)]);
    }

    /// The text: Prometheus 0.0.4, or OpenMetrics 1.0 (with its `# EOF`).
    pub fn write(&self, openmetrics: bool) -> String {
        let mut out = String::new();
        for (name, kind, help, samples) in &self.families {
            let family = match kind {
                Kind::Counter if openmetrics => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            let t = match kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# HELP {family} {}", escape(help, false));
            let _ = writeln!(out, "# TYPE {family} {t}");
            for (labels, v) in samples {
                out.push_str(name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (k, val)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape(val, true));
                    }
                    out.push('}');
                }
                let _ = writeln!(out, " {}", number(*v));
            }
        }
        if openmetrics {
            out.push_str("# EOF\n");
        }
        out
    }
}

fn number(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Backslash and newline always; double quotes in label values.
fn escape(s: &str, quotes: bool) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '"' if quotes => o.push_str("\\\""),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server in a container: its id and pod are labels of
    /// `pgbelow_postgres_info` (the fact as the system collector writes it,
    /// from a real pod's /proc/PID/cgroup).
    #[test]
    fn a_containerised_server_is_labelled_with_its_container() {
        let mut ev = crate::evidence::fixture("pg13-select-only-timeout-all");
        let cgroup = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/proc/container/kubepods-systemd-containerd"),
        )
        .unwrap();
        let c = crate::collect::container::container_of(
            &crate::collect::cgroup::parse_proc_cgroup(&cgroup),
        )
        .unwrap();
        ev.rec.manifest.facts.insert(
            crate::recording::schema::system::CONTAINER.into(),
            serde_json::to_value(&c).unwrap(),
        );
        let rep = crate::report::build(&ev);
        assert!(crate::report::text::render(&rep)
            .contains("container: containerd f45298cd514d in pod dd1bf9d1-"));
        let mut m = Metrics::new(&[]);
        m.add_window(&ev, &rep, true);
        let text = m.render(
            false,
            &Own {
                cpu_s: 0.0,
                rss: 0,
                fds: 0,
            },
        );
        assert!(
            text.contains(&format!(
                "container_id=\"{}\",pod_uid=\"dd1bf9d1-241d-47f5-8e25-12de83135812\"}} 1",
                c.id
            )),
            "{text}"
        );
    }

    /// An incident's findings are active at once, until the next window
    /// says otherwise (real lab runs: slow reads, and the same cold start
    /// without the limit).
    #[test]
    fn an_incident_raises_its_findings_until_the_next_window() {
        let healthy = crate::evidence::fixture("pg15-disk-read-latency-unlimited");
        let slow = crate::evidence::fixture("pg15-disk-read-latency-150");
        let (hr, sr) = (crate::report::build(&healthy), crate::report::build(&slow));
        let own = Own {
            cpu_s: 0.0,
            rss: 0,
            fds: 0,
        };
        let line = "pgbelow_finding_active{id=\"disk-read-latency\",severity=\"critical\"}";
        let value = |m: &Metrics| {
            m.render(false, &own)
                .lines()
                .find(|l| l.starts_with(line))
                .map(|l| l[line.len()..].trim().to_string())
        };
        let mut m = Metrics::new(&["pgstat".into()]);
        m.add_window(&healthy, &hr, true);
        assert_eq!(value(&m).as_deref(), Some("0"));
        m.incident_findings(&sr);
        assert_eq!(value(&m).as_deref(), Some("1"));
        m.add_window(&healthy, &hr, true);
        assert_eq!(value(&m).as_deref(), Some("0"));
    }

    /// PSI as the window's report has it: each kind the kernel reported,
    /// none it did not (this fixture predates PSI in recordings: the
    /// shares are set on its report).
    #[test]
    fn pressure_is_exported_as_the_kernel_reported_it() {
        let ev = crate::evidence::fixture("pg13-select-only-timeout-all");
        let mut rep = crate::report::build(&ev);
        let mut m = Metrics::new(&["system".into()]);
        m.add_window(&ev, &rep, true);
        let own = Own {
            cpu_s: 0.0,
            rss: 0,
            fds: 0,
        };
        assert!(!m
            .render(false, &own)
            .contains("pgbelow_pressure_stall_ratio"));
        rep.system.as_mut().unwrap().pressure = Some(crate::evidence::system::PressureShares {
            covered_s: 10.0,
            cpu_some: Some(0.25),
            io_some: Some(0.5),
            io_full: Some(0.125),
            ..Default::default()
        });
        m.add_window(&ev, &rep, true);
        let text = m.render(false, &own);
        for l in [
            "pgbelow_pressure_stall_ratio{resource=\"cpu\",kind=\"some\"} 0.25",
            "pgbelow_pressure_stall_ratio{resource=\"io\",kind=\"full\"} 0.125",
        ] {
            assert!(text.lines().any(|t| t == l), "no {l:?} in\n{text}");
        }
        assert!(!text.contains("resource=\"memory\""), "{text}");
    }

    #[test]
    fn a_recorded_window_gives_counters_ratios_and_findings() {
        let ev = crate::evidence::fixture("pg13-select-only-timeout-all");
        let rep = crate::report::build(&ev);
        let own = Own {
            cpu_s: 1.5,
            rss: 1 << 20,
            fds: 12,
        };
        let mut m = Metrics::new(&["syscalls".into(), "procfs".into()]);
        let mut live = super::super::live::LiveSyscalls::default();
        live.learn(ev.rec.processes.keys().map(|p| (*p, ev.rec.role_of(*p))));
        m.add_live(live.read_new(&ev.rec.dir));
        m.add_window(&ev, &rep, true);
        let text = m.render(false, &own);
        assert!(text.contains("# TYPE pgbelow_syscalls_total counter"));
        assert!(
            text.contains("pgbelow_syscalls_total{role=\"backend\",syscall=\"setitimer\"}"),
            "{text}"
        );
        assert!(text.contains(
            "pgbelow_finding_active{id=\"timer-syscalls-per-statement\",severity=\"info\"} 1"
        ));
        assert!(text.contains("pgbelow_collector_up{collector=\"syscalls\"} 1"));
        assert!(
            text.contains(
                "pgbelow_finding_impact_ratio{id=\"timer-syscalls-per-statement\",of=\"the backends' CPU\"} 0.022"
            ),
            "{text}"
        );
        // The account: the timer finding claims its share of the CPU; the
        // rest of the backends' busy time is on a CPU or waiting unclaimed.
        let e = rep.explained.as_ref().unwrap();
        for (by, v) in [
            ("findings", e.explained_share),
            ("none_waiting", e.unexplained_waiting_share),
            ("none_on_cpu", e.on_cpu_unclaimed_share),
        ] {
            let line = format!("pgbelow_backend_busy_explained_ratio{{by=\"{by}\"}} {v}");
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(
            e.explained_share > 0.0 && e.on_cpu_unclaimed_share > 0.5,
            "{e:#?}"
        );
        assert!(text.contains("pgbelow_build_info{version=\""), "{text}");
        assert!(
            text.contains("pgbelow_postgres_info{version=\"13."),
            "{text}"
        );
        assert!(!text.contains("container_id="), "{text}");
        // The exporter's own process, by the client libraries' names.
        for l in [
            "process_cpu_seconds_total 1.5",
            "process_resident_memory_bytes 1048576",
            "process_open_fds 12",
        ] {
            assert!(text.lines().any(|t| t == l), "no {l:?} in\n{text}");
        }
        assert!(text.contains("process_start_time_seconds 1"), "{text}");
        assert!(!text.contains("pgbelow_self_"), "{text}");
        // The live counters, from the same recording's samples.
        for key in [
            "pgbelow_process_state_seconds_total{role=\"backend\",state=\"R\"}",
            "pgbelow_process_cpu_seconds_total{role=\"backend\"}",
            "pgbelow_process_runqueue_seconds_total{role=\"backend\"}",
        ] {
            let v = text
                .lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {key} in\n{text}"));
            assert!(v > 0.0, "{key} {v}");
        }
        assert!(
            text.contains(
                "pgbelow_check_status{id=\"timer-syscalls-per-statement\",status=\"raised\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("pgbelow_check_value{id=\"timer-syscalls-per-statement\",unit=\"\"}"));
        let per = text
            .lines()
            .find_map(|l| l.strip_prefix("pgbelow_timer_syscalls_per_statement "))
            .expect("ratio gauge");
        let per: f64 = per.parse().unwrap();
        assert!((0.8..=2.2).contains(&per), "{per}");

        let om = m.render(true, &own);
        assert!(om.contains("# TYPE pgbelow_syscalls counter"));
        assert!(om.ends_with("# EOF\n"));
        m.down();
        assert!(m
            .render(false, &Own::default())
            .contains("pgbelow_collector_up{collector=\"syscalls\"} 0"));
    }

    // The rules' key figures as gauges: present where the window holds what
    // they divide by, absent (not 0) where it does not.
    // The checkpoint counters are the server's own, read together: buffers
    // written by checkpoints never stand beside 0 checkpoints.
    #[test]
    fn checkpoint_counters_agree_with_each_other() {
        // An attached recording whose window held a checkpoint.
        let ev = crate::evidence::fixture("pg15-attach-counters-checkpoint");
        let rep = crate::report::build(&ev);
        let mut m = Metrics::new(&[]);
        m.add_window(&ev, &rep, true);
        let text = m.render(false, &Own::default());
        let get = |k: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {k} in\n{text}"))
        };
        let buffers = get("pgbelow_checkpoint_buffers_written_total");
        let started = get("pgbelow_checkpoints_total{kind=\"timed\"}")
            + get("pgbelow_checkpoints_total{kind=\"requested\"}");
        let last = ev
            .server
            .last()
            .and_then(|s| s.checkpointer.clone())
            .unwrap();
        assert_eq!(buffers, last.buffers_written as f64);
        assert_eq!(started, (last.timed + last.requested) as f64);
        assert!(
            buffers > 0.0 && started >= 1.0,
            "{buffers} buffers, {started} checkpoints"
        );
    }

    #[test]
    fn replay_and_checkpoint_gauges() {
        let gauge = |fixture: &str, name: &str| -> Option<f64> {
            let ev = crate::evidence::fixture(fixture);
            let rep = crate::report::build(&ev);
            let mut m = Metrics::new(&[]);
            m.add_window(&ev, &rep, true);
            m.render(false, &Own::default())
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse().ok())
        };
        let replay = "pgbelow_replay_cpu_seconds_per_dropped_relation";
        let ckpt = "pgbelow_checkpoint_throughput_ratio";
        let drop13 = gauge("pg13-drop-many-1row-1g", replay).expect("replay gauge");
        assert!(drop13 > 0.001, "{drop13}");
        let stall = gauge("pg15-checkpoint-stall", ckpt).expect("checkpoint gauge");
        assert!(stall < 0.5, "{stall}");
        assert_eq!(gauge("pg13-select-only-timeout-all", ckpt), None);
        assert_eq!(gauge("pg13-select-only-timeout-all", replay), None);
        // The memory cgroup's refaults: a live counter.
        let refaults = |fixture: &str| -> Option<f64> {
            let ev = crate::evidence::fixture(fixture);
            let mut m = Metrics::new(&[]);
            let mut live = super::super::live::LiveSyscalls::default();
            m.add_live(live.read_new(&ev.rec.dir));
            m.render(false, &Own::default()).lines().find_map(|l| {
                l.strip_prefix("pgbelow_memory_cgroup_refaults_total ")?
                    .parse()
                    .ok()
            })
        };
        let tight = refaults("pg15-memcg-limit-160").expect("refault counter");
        assert!(tight > 1000.0, "{tight}");
        assert_eq!(refaults("pg15-memcg-no-limit"), Some(0.0));
        // Recorded before the memory cgroup was read: absent.
        assert_eq!(refaults("pg15-checkpoint-stall"), None);
        let prefetch = "pgbelow_replay_fadvise_per_pread";
        assert_eq!(gauge("pg14-replay-without-prefetch", prefetch), Some(0.0));
        let p15 = gauge("pg15-replay-prefetch", prefetch).expect("prefetch gauge");
        assert!(p15 > 0.5, "{p15}");
        assert_eq!(gauge("pg13-select-only-timeout-all", prefetch), None);
        let pte = "pgbelow_shared_memory_page_tables_ratio";
        let off = gauge("pg15-no-huge-pages-off", pte).expect("page tables gauge");
        let on = gauge("pg15-no-huge-pages-on", pte).expect("page tables gauge");
        assert!(off > 0.05 && on < 0.01, "{off} {on}");
        assert_eq!(gauge("pg13-select-only-timeout-all", pte), None);
    }

    // Two servers' windows in one exposition (watch --all): every family
    // declared once, each sample after its server's labels.
    #[test]
    fn servers_merge_into_one_declaration_per_family() {
        let ev = crate::evidence::fixture("pg13-select-only-timeout-all");
        let rep = crate::report::build(&ev);
        let mut e = Exposition::default();
        for port in ["5432", "5433"] {
            let mut m = Metrics::new(&["syscalls".into()]);
            m.add_window(&ev, &rep, true);
            e.prefix = vec![("port".to_string(), port.to_string())];
            m.families(&mut e);
        }
        e.prefix.clear();
        own_families(&mut e, &Own::default(), 0.0);
        let text = e.write(false);
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let mut unique = types.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(types.len(), unique.len(), "{text}");
        for port in ["5432", "5433"] {
            let want = format!("pgbelow_windows_total{{port=\"{port}\"}} 1");
            assert!(text.lines().any(|l| l == want), "no {want} in\n{text}");
        }
        assert!(text.lines().any(|l| l == "process_open_fds 0"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd", true), "a\\\"b\\\\c\\nd");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.25), "0.25");
    }
}
