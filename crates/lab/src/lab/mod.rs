//! `pgbelow lab run`: provision a PostgreSQL, run a scenario under the
//! collectors, tear everything down. The runner is generic: what a
//! scenario needs happens in its hooks ([`crate::scenarios::Scenario`]),
//! called in order; the host fixtures they make are lifted before the
//! servers stop and torn down after, newest first.
mod manifest;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::collect::session::Session;
use crate::error::fixable;
use crate::interrupt;
use crate::provision::{template, ClusterOptions, PgInstall, Topology, TopologyOptions};
use crate::recording::{files, this_host_manifest, Recorded, ScenarioInfo, Status};
use crate::scenarios::{Beside, Fixtures, Lab};
use crate::workload::{Pgbench, PgbenchTarget};

pub use crate::scenarios::{LabOptions, PgChoice, Replication};
pub use manifest::{parse_settings, settings_sql};

pub fn resolve_install(pg: &PgChoice, show: bool) -> Result<PgInstall> {
    let say = move |m: &str| {
        if show {
            eprintln!("pgbelow: {m}");
        }
    };
    pg.install(&say)
}

fn default_out(scenario: &str, major: u32) -> PathBuf {
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    PathBuf::from("pgbelow-runs").join(format!("{scenario}-pg{major}-{stamp}"))
}

/// The scenario's name, with `+` and each `--also`.
fn run_name(s: &dyn crate::scenarios::Scenario) -> String {
    std::iter::once(s.spec().name)
        .chain(s.also().iter().map(|a| a.spec().name))
        .collect::<Vec<_>>()
        .join("+")
}

pub fn run(opts: &LabOptions) -> Result<Recorded> {
    let opts = &opts.scenario.options(opts)?;
    crate::collect::preflight(&opts.collectors, false)?;
    let pgbench = Pgbench::locate()?;
    let install = resolve_install(&opts.pg, opts.show_progress)?;
    interrupt::check()?;
    let out = opts
        .out
        .clone()
        .unwrap_or_else(|| default_out(&run_name(opts.scenario), install.major));
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
    // Declared before the topology so that they are dropped after it: a
    // device can only be unmounted once the server is gone.
    let mut host = Fixtures::default();
    opts.scenario.before_start(opts, &mut host, &status)?;
    let template = template_for(opts, &install, &pgbench, &status);
    let mut topo = match start_topology(opts, &install, template.as_deref(), &status) {
        Ok(t) => t,
        Err(e) if interrupt::requested() => return interrupted_early(&out, opts, &install, &e),
        Err(e) => return Err(e),
    };
    let result = opts
        .scenario
        .after_start(opts, &mut topo, &mut host, &status)
        .and_then(|()| {
            let lab = Lab {
                opts,
                install: &install,
                pgbench: &pgbench,
                topo: &topo,
                status: &status,
            };
            run_on(&lab, &mut host, &out, template.is_some())
        });
    let released = host.release();
    let stopped = topo.stop();
    let torn = host.teardown();
    let removed = match (released, torn) {
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

/// The template for this run's primary ([`template`]): the `bench`
/// database, filled by `pgbench -i` when the scenario asks for it. A
/// template that cannot be made is said and the run goes on with initdb.
fn template_for(
    opts: &LabOptions,
    install: &PgInstall,
    pgbench: &Pgbench,
    status: &dyn Fn(&str),
) -> Option<PathBuf> {
    if !template::enabled() || !opts.scenario.templated_data() {
        return None;
    }
    // The template's data was made under the default settings: a run that
    // sets what shapes the data itself makes its own.
    if opts.set.iter().any(|(k, _)| template::shapes_data(k)) {
        return None;
    }
    let init = opts.scenario.spec().init;
    let filler = match init {
        true => format!("pgbench -i -s {} ({})", opts.scale, pgbench.version().ok()?),
        false => "create database bench".to_string(),
    };
    let key = template::Key::new(install, filler);
    let made = template::ensure(install, &key, status, |c| {
        c.psql("postgres", "CREATE DATABASE bench")?;
        if init {
            let target = PgbenchTarget {
                host: c.socket_dir().display().to_string(),
                port: c.port(),
                user: c.user().to_string(),
                dbname: "bench".into(),
            };
            status(&format!("pgbench -i -s {} for the template", opts.scale));
            pgbench.init(&target, opts.scale)?;
        }
        Ok(())
    });
    match made {
        Ok(data) => Some(data),
        Err(_) if interrupt::requested() => None,
        Err(e) => {
            eprintln!(
                "pgbelow: no template cluster ({e:#}); running initdb and pgbench -i instead"
            );
            None
        }
    }
}

fn start_topology(
    opts: &LabOptions,
    install: &PgInstall,
    template: Option<&Path>,
    status: &dyn Fn(&str),
) -> Result<Topology> {
    let rep = &opts.replication;
    let topo = Topology::start(
        install,
        &TopologyOptions {
            primary: ClusterOptions {
                settings: opts.set.clone(),
                log_checkpoints: true,
            },
            standbys: rep.standbys,
            sync: rep.sync,
            standby_settings: rep.standby_set.clone(),
            primary_template: template.map(Path::to_path_buf),
        },
        status,
    )?;
    if let Some(m) = &topo.method {
        status(&format!(
            "{} standby(s) streaming ({m}, {:.1} s)",
            rep.standbys, topo.setup_s
        ));
    }
    Ok(topo)
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
        name: opts.scenario.spec().name.into(),
        also: opts
            .scenario
            .also()
            .iter()
            .map(|s| s.spec().name.to_string())
            .collect(),
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

/// The database, the scenario's preparation, the recorded workload and
/// what follows it, on running servers.
/// `templated`: the primary's data came from a template that holds the
/// `bench` database and, for scenarios that ask, pgbench's tables.
fn run_on(lab: &Lab, host: &mut Fixtures, out: &Path, templated: bool) -> Result<Recorded> {
    let (opts, status) = (lab.opts, lab.status);
    if !templated {
        lab.psql("postgres", "CREATE DATABASE bench")?;
        if opts.scenario.spec().init {
            status(&format!("pgbench -i -s {}", opts.scale));
            // A stop that came before a command started does not end it: check.
            interrupt::check()?;
            lab.pgbench.init(&lab.target(lab.primary()), opts.scale)?;
        }
    }
    // Held until this function returns: after the recording is written.
    let prepared = opts.scenario.prepare(lab, host)?;
    interrupt::check()?;
    // The standbys replay the set-up before the workload starts.
    lab.topo.wait_caught_up()?;
    let mut manifest = manifest::build(lab, host, &prepared.facts)?;
    manifest.scenario = Some(scenario_info(opts));
    let mut beside = opts.scenario.beside(lab)?;
    for (k, v) in beside.as_ref().map(|b| b.facts()).unwrap_or_default() {
        manifest.facts.insert(k.into(), v);
    }
    let ctx = manifest::collect_context(lab);
    let mut session = Session::start(
        out.to_path_buf(),
        manifest,
        ctx,
        &opts.collectors,
        Vec::new(),
    )?;
    let outcome = opts.scenario.drive(lab, &mut session);
    // What ran beside fails the run only when the workload ran.
    let outcome = match (outcome, beside.as_mut().map(|b| b.workload_done())) {
        (Ok(()), Some(Err(e))) => Err(e),
        (o, _) => o,
    };
    let (st, err) = match &outcome {
        Ok(_) if interrupt::requested() => (Status::Interrupted, None),
        Ok(_) => (Status::Complete, None),
        Err(e) => (Status::Failed, Some(format!("{e:#}"))),
    };
    let dir = session.finish(st, err)?;
    if let Some(b) = beside.as_mut() {
        Beside::stop(b.as_mut());
    }
    if let Err(e) = outcome {
        return Ok(Recorded {
            dir,
            follow_up: Err(e),
        });
    }
    let follow_up = opts.scenario.after(lab, &dir);
    status(&format!("recording written to {}", dir.display()));
    drop(prepared);
    Ok(Recorded { dir, follow_up })
}
