//! What the lab writes into the recording's manifest about the servers it
//! started, and the collectors' context for them.
use std::collections::BTreeMap;

use anyhow::Result;

use crate::collect::{Context as CollectContext, Node};
use crate::recording::manifest::RELEVANT_SETTINGS;
use crate::recording::{this_host_manifest, Manifest, NodeInfo, ReplicationInfo};
use crate::scenarios::{Fixtures, Lab};

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

/// The manifest: the server (version, settings, nodes and replication),
/// the fixtures' and the preparation's facts.
pub(super) fn build(
    lab: &Lab,
    host: &Fixtures,
    facts: &[(&'static str, serde_json::Value)],
) -> Result<Manifest> {
    let (cluster, topo, install) = (lab.primary(), lab.topo, lab.install);
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
    for (k, v) in host.facts().into_iter().chain(facts.iter().cloned()) {
        manifest.facts.insert(k.into(), v);
    }
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
            standby_set: lab
                .opts
                .replication
                .standby_set
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            method: topo.method.clone().unwrap_or_default(),
            setup_s: crate::round3(topo.setup_s),
        });
    }
    Ok(manifest)
}

/// The collectors' view: every node, and the server the workload runs on.
pub(super) fn collect_context(lab: &Lab) -> CollectContext {
    let observed = lab.observed();
    let nodes = lab
        .topo
        .nodes()
        .into_iter()
        .map(|(name, pid)| Node { name, pid })
        .collect();
    let mut ctx = CollectContext::new(lab.primary().postmaster_pid()).with_nodes(nodes);
    ctx.dsn = Some(observed.conninfo("bench"));
    ctx.data_dir = Some(observed.data_dir().to_path_buf());
    ctx.server_log = Some(observed.log_path().to_path_buf());
    ctx.bin_dir = Some(lab.install.bin_dir.clone());
    ctx.major = Some(lab.install.major);
    ctx.syscall_mechanism = lab.opts.syscall_mechanism;
    ctx.sampling = lab.opts.sampling;
    if ctx.sampling.syscalls_budget_pct.is_none() {
        ctx.sampling.syscalls_budget_pct = lab.opts.scenario.spec().syscalls_budget_pct;
    }
    ctx
}
