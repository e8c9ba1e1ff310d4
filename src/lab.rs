//! `pgbelow lab run`: provision a PostgreSQL, run a scenario under the
//! collectors, analyse the recording, tear everything down.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::collect::session::Session;
use crate::collect::syscalls::Mechanism;
use crate::collect::{Context as CollectContext, Node};
use crate::error::fixable;
use crate::interrupt;
use crate::provision::{Cluster, ClusterOptions, PgInstall, SyncMode, Topology, TopologyOptions};
use crate::recording::manifest::RELEVANT_SETTINGS;
use crate::recording::{
    files, this_host_manifest, NodeInfo, Recorded, ReplicationInfo, ScenarioInfo, Status,
};
use crate::workload::{Pgbench, PgbenchTarget, Scenario, WorkloadSummary};

/// Which PostgreSQL to run.
#[derive(Clone, Debug)]
pub enum PgChoice {
    System,
    Major(u32),
    Dir(PathBuf),
}

#[derive(Clone, Debug)]
pub struct LabOptions {
    pub scenario: Scenario,
    pub pg: PgChoice,
    pub set: Vec<(String, String)>,
    pub duration_s: u32,
    pub clients: u32,
    pub scale: u32,
    pub collectors: Vec<String>,
    pub syscall_mechanism: Option<Mechanism>,
    pub sampling: crate::collect::Sampling,
    pub out: Option<PathBuf>,
    /// Progress bar and status lines on stderr.
    pub show_progress: bool,
    /// Standbys beside the primary (none by default).
    pub replication: Replication,
    /// After the recorded run, the scenario's sweep (syncrep-commit: tps per
    /// synchronous_commit level; drop-many: cost per drop over N × standby
    /// shared_buffers).
    pub sweep: bool,
    /// `drop-many`'s parameters.
    pub drop_many: crate::scenarios::drop_many::Options,
    /// `checkpoint-stall`'s device limits.
    pub stall: crate::scenarios::checkpoint_stall::Options,
    /// `--checkpoint-at S`: issue CHECKPOINT this many seconds into a
    /// pgbench workload, to see what one does under load.
    pub checkpoint_at: Option<u32>,
    /// `snapshot-scaling`: idle connections held during the run (default
    /// [`crate::scenarios::snapshot_scaling::DEFAULT_IDLE`]).
    pub idle_connections: Option<u32>,
    /// `cgroup-cpu-throttling`'s CFS quota in CPUs (None: its default; 0: none).
    pub cpu_quota: Option<f64>,
    /// `memory-cgroup-reclaim`'s limit in MB (None: its default; 0: none).
    pub memory_limit_mb: Option<u64>,
    /// `subtransaction-overflow`: savepoints the long transaction holds
    /// (default [`crate::scenarios::subtransaction_overflow::DEFAULT_SAVEPOINTS`]).
    pub savepoints: Option<u32>,
    /// `no-huge-pages`: run with huge_pages=on and vm.nr_hugepages reserved
    /// (None: off).
    pub huge_pages: Option<bool>,
    /// `noisy-neighbour`: busy loops beside the workload (None: 2 per CPU; 0: none).
    pub hogs: Option<u32>,
}

impl LabOptions {
    /// The scenario on `pg` with the CLI's defaults: 20 s, one client,
    /// scale 1, the default collectors, no standbys, nothing else set.
    pub fn new(scenario: Scenario, pg: PgChoice) -> LabOptions {
        LabOptions {
            scenario,
            pg,
            set: Vec::new(),
            duration_s: 20,
            clients: 1,
            scale: 1,
            collectors: crate::collect::DEFAULT
                .iter()
                .map(|s| s.to_string())
                .collect(),
            syscall_mechanism: None,
            sampling: Default::default(),
            out: None,
            show_progress: false,
            replication: Default::default(),
            sweep: false,
            drop_many: Default::default(),
            stall: Default::default(),
            checkpoint_at: None,
            idle_connections: None,
            cpu_quota: None,
            memory_limit_mb: None,
            savepoints: None,
            huge_pages: None,
            hogs: None,
        }
    }
}

/// `--standbys N --sync MODE --standby-set GUC=VALUE…`
#[derive(Clone, Debug, Default)]
pub struct Replication {
    pub standbys: usize,
    pub sync: SyncMode,
    pub standby_set: Vec<(String, String)>,
}

/// SQL listing the relevant settings, for psql -A -t (name|value lines).
pub fn settings_sql() -> String {
    let names: Vec<String> = RELEVANT_SETTINGS.iter().map(|n| format!("'{n}'")).collect();
    format!(
        "select name, current_setting(name) from pg_settings where name in ({}) order by name",
        names.join(",")
    )
}

/// Parse `name|value` lines from psql -A -t.
pub fn parse_settings(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

pub fn resolve_install(pg: &PgChoice, show: bool) -> Result<PgInstall> {
    let say = move |m: &str| {
        if show {
            eprintln!("pgbelow: {m}");
        }
    };
    match pg {
        PgChoice::System => PgInstall::system(),
        PgChoice::Major(m) => PgInstall::for_major(*m, &say),
        PgChoice::Dir(d) => PgInstall::from_dir(d),
    }
}

fn default_out(scenario: &str, major: u32) -> PathBuf {
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    PathBuf::from("pgbelow-runs").join(format!("{scenario}-pg{major}-{stamp}"))
}

pub(crate) fn check_interrupt() -> Result<()> {
    if interrupt::requested() {
        bail!("interrupted");
    }
    Ok(())
}

pub fn run(opts: &LabOptions) -> Result<Recorded> {
    let with_defaults;
    let opts = match opts.scenario {
        Scenario::DropMany => {
            with_defaults = crate::scenarios::drop_many::with_defaults(opts);
            &with_defaults
        }
        Scenario::CheckpointStall => {
            crate::scenarios::checkpoint_stall::require_root()?;
            with_defaults = crate::scenarios::checkpoint_stall::with_defaults(opts);
            &with_defaults
        }
        Scenario::SnapshotScaling => {
            with_defaults = crate::scenarios::snapshot_scaling::with_defaults(opts);
            &with_defaults
        }
        Scenario::RelationExtension => {
            with_defaults = crate::scenarios::relation_extension::with_defaults(opts);
            &with_defaults
        }
        Scenario::WalFsyncLatency => {
            crate::scenarios::checkpoint_stall::require_root()?;
            opts
        }
        Scenario::SubtransactionOverflow => {
            if opts.replication.standbys == 0 {
                return Err(fixable(
                    "the subtransaction-overflow scenario reads on a standby",
                    "run it with --standbys 1 (its default)",
                ));
            }
            with_defaults = crate::scenarios::subtransaction_overflow::with_defaults(opts);
            &with_defaults
        }
        Scenario::ReplayWithoutPrefetch => {
            with_defaults = crate::scenarios::replay_prefetch::with_defaults(opts);
            &with_defaults
        }
        Scenario::CgroupCpuThrottling => {
            if cpu_quota(opts).is_some() {
                crate::scenarios::cgroup_cpu_throttling::require_root()?;
            }
            opts
        }
        Scenario::MemoryCgroupReclaim => {
            if memory_limit(opts).is_some() {
                crate::scenarios::memory_cgroup::require_root()?;
            }
            with_defaults = crate::scenarios::memory_cgroup::with_defaults(opts);
            &with_defaults
        }
        Scenario::NoHugePages => {
            with_defaults = crate::scenarios::no_huge_pages::with_defaults(opts);
            &with_defaults
        }
        _ => opts,
    };
    crate::collect::preflight(&opts.collectors)?;
    let pgbench = Pgbench::locate()?;
    let install = resolve_install(&opts.pg, opts.show_progress)?;
    check_interrupt()?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| default_out(opts.scenario.name(), install.major));
    if out.join(files::MANIFEST).exists() {
        return Err(fixable(
            format!("{} already holds a recording", out.display()),
            "pass another --out DIR, or remove that one",
        ));
    }
    crate::recording::writer::probe_writable(&out)?;
    let status = |m: &str| {
        if opts.show_progress {
            eprintln!("pgbelow: {m}");
        }
    };
    status(&format!(
        "starting PostgreSQL {} from {}",
        install.version,
        install.bin_dir.display()
    ));
    let rep = &opts.replication;
    // Declared before the topology so that it is dropped after it: the
    // device can only be unmounted once the server is gone.
    let mut stall: Option<crate::scenarios::checkpoint_stall::StallDevice> = None;
    let mut cpu_cgroup: Option<crate::scenarios::cgroup_cpu_throttling::CpuCgroup> = None;
    let mut mem_cgroup: Option<crate::scenarios::memory_cgroup::MemCgroup> = None;
    // Reserved before the server starts, restored after it stopped.
    let mut huge = if opts.scenario == Scenario::NoHugePages
        && crate::scenarios::no_huge_pages::huge_pages_on(opts)
    {
        Some(crate::scenarios::no_huge_pages::HugePages::reserve(
            opts, &status,
        )?)
    } else {
        None
    };
    let facts: Vec<(String, serde_json::Value)> = huge
        .iter()
        .map(|h| ("huge_pages_reserved".to_string(), h.fact()))
        .collect();
    let topo = Topology::start(
        &install,
        &TopologyOptions {
            primary: ClusterOptions {
                settings: opts.set.clone(),
                log_checkpoints: true,
            },
            standbys: rep.standbys,
            sync: rep.sync,
            standby_settings: rep.standby_set.clone(),
        },
        &status,
    );
    let mut topo = match topo {
        Ok(t) => t,
        Err(e) if interrupt::requested() => return interrupted_early(&out, opts, &install, &e),
        Err(e) => return Err(e),
    };
    if let Some(m) = &topo.method {
        status(&format!(
            "{} standby(s) streaming ({m}, {:.1} s)",
            rep.standbys, topo.setup_s
        ));
    }
    let result = if opts.scenario == Scenario::CheckpointStall {
        start_stall_device(&topo, &status).map(|d| {
            stall = Some(d);
        })
    } else if opts.scenario == Scenario::WalFsyncLatency {
        start_stall_device(&topo, &status).and_then(|d| {
            let wal = d.mount.join("pg_wal");
            stall = Some(d);
            status(&format!("moving pg_wal to {}", wal.display()));
            topo.primary_mut().move_wal_to(&wal)?;
            let pids = cluster_pids(&topo);
            stall.as_mut().map_or(Ok(()), |d| d.adopt(&pids))
        })
    } else if let Some(q) = cpu_quota(opts) {
        crate::scenarios::cgroup_cpu_throttling::CpuCgroup::create(q).and_then(|cg| {
            status(&format!(
                "the cluster runs in {} with a quota of {q} CPU",
                cg.cg.path.display()
            ));
            let r = cg.cg.adopt(&cluster_pids(&topo));
            cpu_cgroup = Some(cg);
            r
        })
    } else if let Some(mb) = memory_limit(opts) {
        // Moved in before the load, limited after it (run_on).
        let pm = topo.primary().postmaster_pid();
        crate::scenarios::memory_cgroup::MemCgroup::create(pm, mb).and_then(|cg| {
            let r = cg.cg.adopt(&cluster_pids(&topo));
            mem_cgroup = Some(cg);
            r
        })
    } else {
        Ok(())
    }
    .and_then(|()| {
        run_on(
            topo.primary(),
            &topo,
            &install,
            &pgbench,
            &out,
            opts,
            stall.as_mut(),
            mem_cgroup.as_ref(),
            &facts,
            &status,
        )
    });
    let unlimited = stall.as_mut().map_or(Ok(()), |d| d.unlimit());
    let stopped = topo.stop();
    let mut torn = stall.take().map_or(Ok(()), |mut d| d.teardown());
    for cg in [
        cpu_cgroup.take().map(|mut c| c.cg.teardown()),
        mem_cgroup.take().map(|mut c| c.cg.teardown()),
    ]
    .into_iter()
    .flatten()
    {
        if let Err(e) = cg {
            torn = torn.and(Err(e));
        }
    }
    if let Err(e) = huge.take().map_or(Ok(()), |mut h| h.teardown()) {
        torn = torn.and(Err(e));
    }
    let removed = match (unlimited, torn) {
        (Ok(()), r) | (r, Ok(())) => r,
        (Err(a), Err(b)) => Err(a.context(format!("{b:#}"))),
    };
    let res = match result {
        // Stopped before the workload began: the recording says so.
        Err(e) if interrupt::requested() && !out.join(files::MANIFEST).exists() => {
            interrupted_early(&out, opts, &install, &e)?
        }
        r => r?,
    };
    stopped.context("stopping the lab cluster(s)")?;
    removed?;
    Ok(res)
}

/// The recording of a run stopped (Ctrl-C, SIGTERM, SIGHUP) while it was
/// provisioning or loading data: a manifest with status `interrupted`,
/// what was asked for and where it stopped, and no samples.
fn interrupted_early(
    out: &Path,
    opts: &LabOptions,
    install: &PgInstall,
    e: &anyhow::Error,
) -> Result<Recorded> {
    let mut manifest = this_host_manifest("lab");
    manifest.postgres.version = Some(install.version.clone());
    manifest.postgres.major = Some(install.major);
    manifest.postgres.bin_dir = Some(install.bin_dir.display().to_string());
    manifest.scenario = Some(scenario_info(opts));
    let mut w = crate::recording::Writer::create(out, manifest)?;
    w.manifest.status = Status::Interrupted;
    w.manifest.error = Some(format!(
        "stopped before the workload started: {}",
        format!("{e:#}").replace('\n', " ")
    ));
    w.manifest.duration_s = Some(0.0);
    w.write_manifest()?;
    w.flush()?;
    Ok(Recorded {
        dir: out.to_path_buf(),
        follow_up: Ok(()),
    })
}

fn scenario_info(opts: &LabOptions) -> ScenarioInfo {
    ScenarioInfo {
        name: opts.scenario.name().into(),
        clients: opts.clients,
        duration_s: opts.duration_s,
        scale: opts.scale,
        set: opts.set.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        pg: Some(match &opts.pg {
            PgChoice::System => "system".into(),
            PgChoice::Major(m) => m.to_string(),
            PgChoice::Dir(d) => d.display().to_string(),
        }),
    }
}

/// The checkpoint-stall device, its tablespace dir owned by the server
/// account (the owner of the primary's data dir), the cluster's processes
/// under the write limit.
fn start_stall_device(
    topo: &Topology,
    status: &dyn Fn(&str),
) -> Result<crate::scenarios::checkpoint_stall::StallDevice> {
    use std::os::unix::fs::MetadataExt;
    let primary = topo.primary();
    let meta = std::fs::metadata(primary.data_dir())
        .with_context(|| format!("reading {}", primary.data_dir().display()))?;
    let mut dev =
        crate::scenarios::checkpoint_stall::StallDevice::create(meta.uid(), meta.gid(), status)?;
    dev.adopt(&cluster_pids(topo))?;
    Ok(dev)
}

/// Every process of every node (postmasters and their children).
fn cluster_pids(topo: &Topology) -> Vec<u32> {
    let roots: Vec<u32> = topo.nodes().into_iter().map(|(_, p)| p).collect();
    crate::procinfo::subtree(&roots).into_keys().collect()
}

/// The memory limit (MB) the run puts the cluster under, if any.
fn memory_limit(opts: &LabOptions) -> Option<u64> {
    (opts.scenario == Scenario::MemoryCgroupReclaim)
        .then(|| {
            opts.memory_limit_mb
                .unwrap_or(crate::scenarios::memory_cgroup::DEFAULT_LIMIT_MB)
        })
        .filter(|mb| *mb > 0)
}

/// The CFS quota the run puts the cluster under, if any.
fn cpu_quota(opts: &LabOptions) -> Option<f64> {
    (opts.scenario == Scenario::CgroupCpuThrottling)
        .then(|| {
            opts.cpu_quota
                .unwrap_or(crate::scenarios::cgroup_cpu_throttling::DEFAULT_QUOTA_CPUS)
        })
        .filter(|q| *q > 0.0)
}

// The lab's context, passed through as is.
#[allow(clippy::too_many_arguments)]
fn run_on(
    cluster: &Cluster,
    topo: &Topology,
    install: &PgInstall,
    pgbench: &Pgbench,
    out: &Path,
    opts: &LabOptions,
    mut stall: Option<&mut crate::scenarios::checkpoint_stall::StallDevice>,
    mem_cgroup: Option<&crate::scenarios::memory_cgroup::MemCgroup>,
    facts: &[(String, serde_json::Value)],
    status: &dyn Fn(&str),
) -> Result<Recorded> {
    check_interrupt()?;
    cluster.psql("postgres", "CREATE DATABASE bench")?;
    let mut limits = None;
    let mut idle = None;
    let target = PgbenchTarget {
        host: cluster.socket_dir().display().to_string(),
        port: cluster.port(),
        user: cluster.user().to_string(),
        dbname: "bench".into(),
    };
    if opts.scenario.pgbench_init() {
        status(&format!("pgbench -i -s {}", opts.scale));
        // A stop that came before a command started does not end it: check.
        check_interrupt()?;
        pgbench.init(&target, opts.scale)?;
        if opts.scenario == Scenario::SnapshotScaling {
            use crate::scenarios::snapshot_scaling as snap;
            // Held until this function returns: after the recording is written.
            idle = Some(snap::open_idle(
                &cluster.conninfo("bench"),
                snap::idle_count(opts),
                status,
            )?);
        }
        if let Some(cg) = mem_cgroup {
            // The load's pages written back first, so the limit only has
            // clean cache to reclaim.
            check_interrupt()?;
            cluster.psql("bench", "CHECKPOINT")?;
            cg.limit(status)?;
        }
        if let (Scenario::WalFsyncLatency, Some(dev)) = (opts.scenario, stall.as_deref_mut()) {
            let l = crate::scenarios::wal_fsync::limits(&opts.stall);
            // The copied segments and the load's WAL are written back before
            // the limit, so only the workload's own flushes are slowed.
            // SAFETY: sync has no preconditions.
            unsafe { libc::sync() };
            check_interrupt()?;
            dev.limit(&l, status)?;
            limits = Some(l);
        }
    } else if let Some(dev) = stall.as_deref_mut() {
        status("creating the hot table on the limited device");
        crate::scenarios::checkpoint_stall::prepare(
            &|db: &str, sql: &str| {
                check_interrupt()?;
                cluster.psql(db, sql)
            },
            &dev.tablespace_dir(),
        )?;
        let cal = if opts.stall.needs_calibration() {
            calibrate_stall(cluster, pgbench, &target, opts, status)?
        } else {
            None
        };
        limits = Some(opts.stall.limits(cal));
        check_interrupt()?;
        dev.limit(limits.as_ref().expect("set above"), status)?;
    } else {
        crate::scenarios::prepare(opts, &cluster.conninfo("bench"), status)?;
    }
    // subtransaction-overflow: the long transaction, then the xids after it.
    let hold = if opts.scenario == Scenario::SubtransactionOverflow {
        use crate::scenarios::subtransaction_overflow as subtx;
        let dsn = cluster.conninfo("bench");
        let h = subtx::hold(&dsn, subtx::savepoints(opts), status)?;
        subtx::burn(&dsn, status)?;
        Some(h)
    } else {
        None
    };
    check_interrupt()?;
    // The standbys replay the set-up before the workload starts.
    topo.wait_caught_up()?;
    let settings = parse_settings(&cluster.psql("bench", &settings_sql())?);
    let version = cluster
        .psql("bench", "show server_version")?
        .trim()
        .to_string();

    let mut manifest = this_host_manifest("lab");
    manifest.postgres.version = Some(version);
    manifest.postgres.major = Some(install.major);
    manifest.postgres.bin_dir = Some(install.bin_dir.display().to_string());
    manifest.postgres.symtab = Some(install.has_symtab());
    manifest.postgres.postmaster_pid = cluster.postmaster_pid();
    manifest.postgres.data_dir = Some(cluster.data_dir().display().to_string());
    manifest.postgres.settings = settings;
    if let Some(cg) = mem_cgroup {
        manifest.facts.insert("memory_cgroup".into(), cg.fact());
    }
    if let (Some(dev), Some(l)) = (stall.as_deref(), &limits) {
        manifest.facts.insert("stall_device".into(), dev.fact(l));
    }
    manifest.facts.extend(facts.iter().cloned());
    if !topo.standbys().is_empty() {
        let nodes = std::iter::once(("primary", cluster)).chain(
            topo.standbys()
                .iter()
                .map(|s| (s.name.as_str(), &s.cluster)),
        );
        manifest.postgres.nodes = nodes
            .map(|(name, c)| NodeInfo {
                name: name.into(),
                postmaster_pid: c.postmaster_pid(),
                port: Some(c.port()),
                data_dir: Some(c.data_dir().display().to_string()),
            })
            .collect();
        let names: Vec<String> = topo.standbys().iter().map(|s| s.name.clone()).collect();
        manifest.postgres.replication = Some(ReplicationInfo {
            sync: topo.sync().to_string(),
            synchronous_standby_names: cluster
                .psql("bench", "show synchronous_standby_names")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| topo.sync().standby_names(&names)),
            standby_set: opts
                .replication
                .standby_set
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            method: topo.method.clone().unwrap_or_default(),
            setup_s: crate::collect::session::round_ms(topo.setup_s),
        });
    }
    manifest.scenario = Some(scenario_info(opts));
    if let Some(i) = &idle {
        manifest
            .facts
            .insert("idle_connections".into(), serde_json::json!(i.len()));
    }
    if let Some(h) = &hold {
        manifest.facts.insert(
            "held_transaction".into(),
            serde_json::json!({"savepoints": h.savepoints, "xid": h.xid}),
        );
    }
    // Where the workload and the server's view are: the standby for
    // subtransaction-overflow (its readers are the ones that suffer).
    let observed = match (&hold, topo.standbys().first()) {
        (Some(_), Some(s)) => &s.cluster,
        _ => cluster,
    };
    let nodes = topo
        .nodes()
        .into_iter()
        .map(|(name, pid)| Node { name, pid })
        .collect();
    let mut ctx = CollectContext::new(cluster.postmaster_pid()).with_nodes(nodes);
    ctx.dsn = Some(observed.conninfo("bench"));
    ctx.data_dir = Some(observed.data_dir().to_path_buf());
    ctx.server_log = Some(observed.log_path().to_path_buf());
    ctx.bin_dir = Some(install.bin_dir.clone());
    ctx.major = Some(install.major);
    ctx.syscall_mechanism = opts.syscall_mechanism;
    ctx.sampling = opts.sampling;
    // noisy-neighbour: the busy loops start before the recording (its
    // first walk of /proc sees them) and stop after it (its last one too).
    let mut hogs = match opts.scenario {
        Scenario::NoisyNeighbour => {
            use crate::scenarios::noisy_neighbour as nn;
            let n = nn::hogs(opts);
            check_interrupt()?;
            let h = nn::Hogs::start(n, u64::from(opts.duration_s) + 60)?;
            if n > 0 {
                status(&format!(
                    "{n} busy loops ({}) beside the workload",
                    nn::HOG_NAME
                ));
            }
            manifest.facts.insert("noisy_neighbour".into(), h.fact());
            Some(h)
        }
        _ => None,
    };
    let mut session = Session::start(
        out.to_path_buf(),
        manifest,
        ctx,
        &opts.collectors,
        Vec::new(),
    )?;
    let dsn = cluster.conninfo("bench");
    let target = PgbenchTarget {
        host: observed.socket_dir().display().to_string(),
        port: observed.port(),
        ..target
    };
    let writer = match &hold {
        Some(_) => Some(crate::scenarios::subtransaction_overflow::Writer::start(
            &dsn,
        )?),
        None => None,
    };
    // replay-without-prefetch: the standbys' relation files leave the page
    // cache every EVICT_EVERY_S, so that replay reads them from the disk.
    let standby_dirs: Vec<PathBuf> = topo
        .standbys()
        .iter()
        .map(|s| s.cluster.data_dir().to_path_buf())
        .filter(|_| opts.scenario == Scenario::ReplayWithoutPrefetch)
        .collect();
    let mut evict = || -> Result<()> {
        for d in &standby_dirs {
            crate::scenarios::replay_prefetch::evict(d)?;
        }
        Ok(())
    };
    let outcome = if opts.scenario.uses_pgbench() {
        let period = crate::scenarios::replay_prefetch::EVICT_EVERY_S;
        evict().and_then(|()| {
            drive(
                &mut session,
                pgbench,
                &target,
                &dsn,
                opts,
                (period, &mut evict),
            )
        })
    } else {
        crate::scenarios::drive(&mut session, &dsn, opts)
    };
    // The writer's error (if any) is the run's only when the workload ran.
    let outcome = match (outcome, writer.map(|w| w.stop())) {
        (Ok(()), Some(Err(e))) => Err(e),
        (o, _) => o,
    };
    let (st, err) = match &outcome {
        Ok(_) if interrupt::requested() => (Status::Interrupted, None),
        Ok(_) => (Status::Complete, None),
        Err(e) => (Status::Failed, Some(format!("{e:#}"))),
    };
    let dir = session.finish(st, err)?;
    if let Some(h) = hogs.as_mut() {
        h.stop();
    }
    if opts.scenario == Scenario::NoHugePages {
        if let Err(e) = crate::scenarios::no_huge_pages::finish(&dsn) {
            eprintln!("pgbelow: warning: {e:#}");
        }
    }
    if let Err(e) = outcome {
        return Ok(Recorded {
            dir,
            follow_up: Err(e),
        });
    }
    let mut follow_up: Result<()> = Ok(());
    if opts.sweep && opts.scenario == Scenario::SyncrepCommit && !interrupt::requested() {
        let sync = cluster
            .psql("bench", "show synchronous_standby_names")
            .ok()
            .map(|s| s.trim().to_string());
        follow_up =
            crate::scenarios::syncrep_commit::sweep(opts, pgbench, &target, &dir, sync, status)
                .map(|_| ())
                .context("syncrep-commit --sweep");
    }
    if opts.sweep && opts.scenario == Scenario::DropMany && !interrupt::requested() {
        follow_up = crate::scenarios::drop_sweep::sweep(opts, install, &dir, status)
            .map(|_| ())
            .context("drop-many --sweep");
    }
    status(&format!("recording written to {}", dir.display()));
    Ok(Recorded { dir, follow_up })
}

/// checkpoint-stall: the calibration run (pgbench, unthrottled) on the
/// lab cluster.
fn calibrate_stall(
    cluster: &Cluster,
    pgbench: &Pgbench,
    target: &PgbenchTarget,
    opts: &LabOptions,
    status: &dyn Fn(&str),
) -> Result<Option<crate::scenarios::checkpoint_stall::Calibration>> {
    crate::scenarios::checkpoint_stall::calibrate(
        &|sql: &str| {
            check_interrupt()?;
            cluster.psql("bench", sql)
        },
        &|secs: u32| {
            let (summary, _) = pgbench
                .start(target, opts.scenario, opts.clients, secs)?
                .wait()?;
            check_interrupt()?;
            Ok(summary.tps.unwrap_or(0.0))
        },
        status,
    )
}

/// Call `poll` every 20 ms while it returns true, ticking the collectors
/// once a second from `next_tick` (recording time, s). Every workload
/// driver runs under this loop.
pub(crate) fn tick_while(
    session: &mut Session,
    mut next_tick: f64,
    mut poll: impl FnMut(&mut Session) -> Result<bool>,
) -> Result<()> {
    while poll(session)? {
        if session.t() >= next_tick {
            session.tick()?;
            next_tick += 1.0;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Run pgbench, ticking the collectors each second and streaming progress;
/// `dsn` is the same database, for `--checkpoint-at`; `periodic` runs
/// every `period.0` seconds beside the tick.
fn drive(
    session: &mut Session,
    pgbench: &Pgbench,
    target: &PgbenchTarget,
    dsn: &str,
    opts: &LabOptions,
    periodic: (f64, &mut dyn FnMut() -> Result<()>),
) -> Result<()> {
    let (period_s, each) = periodic;
    let bar = if opts.show_progress {
        let b = ProgressBar::new(u64::from(opts.duration_s));
        b.set_style(
            ProgressStyle::with_template("{spinner} {elapsed:>3} [{bar:30}] {pos}/{len}s {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let t_start = session.t();
    let mut run = pgbench.start(target, opts.scenario, opts.clients, opts.duration_s)?;
    let mut interrupted = false;
    let mut seen = Vec::new();
    let mut checkpoint: Option<std::thread::JoinHandle<Result<()>>> = None;
    let mut next_call = t_start + period_s;
    tick_while(session, t_start + 1.0, |session| {
        if session.t() >= next_call {
            each()?;
            next_call += period_s;
        }
        if let Some(at) = opts.checkpoint_at {
            if checkpoint.is_none() && session.t() - t_start >= f64::from(at) {
                // CHECKPOINT returns when it is done: off the tick loop.
                let dsn = dsn.to_string();
                checkpoint = Some(std::thread::spawn(move || {
                    crate::scenarios::connect(&dsn)?
                        .batch_execute("CHECKPOINT")
                        .context("CHECKPOINT (--checkpoint-at)")
                }));
            }
        }
        for p in run.progress() {
            bar.set_position(p.t as u64);
            bar.set_message(format!("{:.0} tps, lat {:.3} ms", p.tps, p.lat_ms));
            let mut p = p;
            p.t = crate::collect::session::round_ms(t_start + p.t);
            session.writer().append(files::PROGRESS, &p)?;
            seen.push(p);
        }
        if run.finished() {
            return Ok(false);
        }
        if !interrupted && interrupt::requested() {
            interrupted = true;
            run.interrupt();
        }
        Ok(true)
    })?;
    let t_end = session.t();
    let (mut summary, rest) = match run.wait() {
        Ok(r) => r,
        // pgbench prints no summary when interrupted; its progress lines stand in.
        Err(_) if interrupted => (Default::default(), Vec::new()),
        Err(e) => return Err(e),
    };
    for mut p in rest {
        p.t = crate::collect::session::round_ms(t_start + p.t);
        seen.push(p.clone());
        session.writer().append(files::PROGRESS, &p)?;
    }
    bar.finish_and_clear();
    // A CHECKPOINT still running when the workload ends is not waited for
    // (behind a write limit it can take minutes); stopping the server ends
    // it and its connection. One that failed is said, not fatal: the
    // workload's recording stands.
    if let Some(h) = checkpoint.filter(|h| h.is_finished()) {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("pgbelow: warning: {e:#}"),
            Err(_) => eprintln!("pgbelow: warning: the --checkpoint-at thread panicked"),
        }
    }
    let mut source = format!(
        "pgbench transactions × {} statement(s) per {} transaction",
        opts.scenario.statements_per_transaction(),
        opts.scenario.name()
    );
    if summary.transactions.is_none() && !seen.is_empty() {
        // Each progress line covers one second: Σ tps ≈ transactions.
        let total: f64 = seen.iter().map(|p| p.tps).sum();
        summary.transactions = Some(total.round() as u64);
        summary.tps = Some(total / seen.len() as f64);
        source = format!("{source}, estimated from per-second progress (pgbench was interrupted)");
    }
    let transactions = summary.transactions.unwrap_or(0);
    let w = WorkloadSummary {
        tool: "pgbench".into(),
        scenario: opts.scenario.name().into(),
        clients: summary.clients.unwrap_or(opts.clients),
        scale: opts.scale,
        transactions,
        statements: transactions * opts.scenario.statements_per_transaction(),
        statements_source: source,
        failed: summary.failed.unwrap_or(0),
        tps: summary.tps.unwrap_or(0.0),
        duration_s: crate::collect::session::round_ms(t_end - t_start),
        latency_avg_ms: summary.latency_avg_ms,
        t_start,
        t_end,
    };
    session.writer().put(files::WORKLOAD_SUMMARY, &w)?;
    Ok(())
}
