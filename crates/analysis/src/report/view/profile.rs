//! The on-CPU profile of a recording as one model both profile exports
//! encode (pprof, OTLP): stacks root first with their sample counts and
//! labels (`role`, `pid` where the recording has per-process stacks, and
//! `node`), the sampling period and when the recording ran.
use anyhow::Result;

use crate::evidence::Evidence;
/// The model's frame, and inferno's options pgbelow's flame graphs share
/// with the recording's own SVG.
pub use crate::recording::schema::profile::{flame_options, Frame};
use crate::recording::schema::profile::{KERNEL_MODULE, KERNEL_SUFFIX};

pub struct ProfileModel {
    /// Where the profile comes from, as far as the recording knows
    /// (OpenTelemetry resource attributes).
    pub resource: Vec<(&'static str, String)>,
    /// The recording's directory: with `start_unix_ns`, what makes a
    /// profile id stable.
    pub source: std::path::PathBuf,
    pub period_ns: i64,
    pub duration_ns: i64,
    /// When the recording started (Unix ns; 0 when unknown).
    pub start_unix_ns: i64,
    pub comment: String,
    pub samples: Vec<ModelSample>,
}

pub struct ModelSample {
    /// Root first.
    pub frames: Vec<Frame>,
    pub count: u64,
    pub labels: Vec<(&'static str, String)>,
}

/// Kernel frames are named `func_[k]` in folded stacks: the exports get the
/// bare name in the kernel's mapping.
pub fn split_kernel(f: &Frame) -> (&str, Option<String>) {
    match f.name.strip_suffix(KERNEL_SUFFIX) {
        Some(bare) => (bare, Some(KERNEL_MODULE.to_string())),
        None => (&f.name, f.module.clone()),
    }
}

/// Where the profile comes from, as far as the recording knows.
fn resource_attributes(ev: &Evidence) -> Vec<(&'static str, String)> {
    let m = &ev.rec.manifest;
    let mut out = vec![("service.name", "postgresql".to_string())];
    if let Some(h) = &m.host.hostname {
        out.push(("host.name", h.clone()));
    }
    if let Some(d) = &m.postgres.data_dir {
        out.push(("postgresql.data_directory", d.clone()));
    }
    if let Some(c) = m
        .postgres
        .settings
        .get("cluster_name")
        .filter(|c| !c.is_empty())
    {
        out.push(("postgresql.cluster_name", c.clone()));
    }
    if let Some(v) = &m.postgres.version {
        out.push(("postgresql.version", v.clone()));
    }
    // OpenTelemetry's semantic conventions for a container and its pod.
    let container: Option<crate::recording::schema::system::Container> = m
        .facts
        .get(crate::recording::schema::system::CONTAINER)
        .and_then(|v| serde_json::from_value(v.clone()).ok());
    if let Some(c) = container {
        out.push(("container.id", c.id));
        if let Some(rt) = c.runtime {
            out.push(("container.runtime", rt));
        }
        if let Some(p) = c.pod_uid {
            out.push(("k8s.pod.uid", p));
        }
    }
    out
}

/// The model, or an error naming why the recording has no profile.
pub fn model(ev: &Evidence) -> Result<ProfileModel> {
    let prof = ev.profile.as_ref().ok_or_else(|| {
        crate::error::fixable(
            format!(
                "{} has no on-CPU profile (profile.json)",
                ev.rec.dir.display()
            ),
            "record with the profile collector (--collectors all, or a list with profile)",
        )
    })?;
    let hz = prof.summary.hz.max(1);
    let mut m = ProfileModel {
        resource: resource_attributes(ev),
        source: ev.rec.dir.clone(),
        period_ns: (1_000_000_000 / hz) as i64,
        duration_ns: (prof.summary.duration_s * 1e9) as i64,
        start_unix_ns: chrono::DateTime::parse_from_rfc3339(&ev.rec.manifest.started_at)
            .ok()
            .and_then(|t| t.timestamp_nanos_opt())
            .unwrap_or(0),
        comment: format!(
            "pgbelow on-CPU profile of {} ({})",
            ev.rec.dir.display(),
            prof.summary.mechanism
        ),
        samples: Vec::new(),
    };
    // One server: its processes are the "primary" node, as in a recording's Context.
    let single = ev.rec.manifest.postgres.nodes.len() <= 1;
    let node_of = |pid: Option<u32>| match pid.and_then(|p| ev.rec.node_of(p)) {
        Some(n) => Some(n.to_string()),
        None => single.then(|| "primary".to_string()),
    };
    if !prof.pid_stacks.is_empty() {
        for ps in &prof.pid_stacks {
            let mut labels = vec![
                ("role", ev.rec.role_of(ps.pid).as_str().to_string()),
                ("pid", ps.pid.to_string()),
            ];
            labels.extend(node_of(Some(ps.pid)).map(|n| ("node", n)));
            m.samples.push(ModelSample {
                frames: ps.frames.clone(),
                count: ps.samples,
                labels,
            });
        }
    } else {
        // Older recordings: role-level folded stacks, no binaries.
        for st in &prof.stacks {
            let frames = st
                .frames
                .iter()
                .map(|n| Frame {
                    name: n.clone(),
                    module: None,
                })
                .collect();
            let mut labels = vec![("role", st.role.as_str().to_string())];
            labels.extend(node_of(None).map(|n| ("node", n)));
            m.samples.push(ModelSample {
                frames,
                count: st.samples,
                labels,
            });
        }
    }
    Ok(m)
}
