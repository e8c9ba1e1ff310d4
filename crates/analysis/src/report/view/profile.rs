//! The profile of a recording as one model both profile exports encode
//! (pprof, OTLP): stacks root first with their on-CPU sample counts and,
//! where the offcpu collector ran, their off-CPU time in D, S and the run
//! queue; labels `role`, `pid` where the recording has per-process stacks,
//! `node`, `application_name` (as the query timeline saw it), `query_id`
//! and `traceparent` (a sqlcommenter comment's); the sampling period and
//! when the recording ran.
//!
//! `query_id`: a process's stacks are not split by time, so a backend's
//! stacks are divided between the queries it ran in proportion to what the
//! per-query join ([`crate::evidence::queries::pid_shares`]) gave each of
//! its on-CPU samples (or off-CPU seconds in that state) — exact for a
//! backend that ran one query. What the join gave to no query (idle, or
//! intervals it could not place) keeps no `query_id`: not attributed,
//! never spread over the queries.
use anyhow::Result;

use crate::evidence::queries::{Request, Shares};
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
    pub kind: SampleKind,
    /// On-CPU samples, or off-CPU microseconds.
    pub count: u64,
    pub labels: Vec<(&'static str, String)>,
}

/// What a sample's count measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SampleKind {
    OnCpu,
    /// Off the CPU in this state ([`OFF_CPU_STATES`]).
    OffCpu(&'static str),
}

/// The offcpu collector's states, and each one's sample type in the
/// exports (nanoseconds): uninterruptible sleep (I/O, page faults),
/// interruptible sleep (locks, latches, the client), runnable but waiting
/// for a CPU.
pub const OFF_CPU_STATES: [(&str, &str); 3] =
    [("D", "off_cpu_d"), ("S", "off_cpu_s"), ("runq", "runq")];

impl ProfileModel {
    /// The off-CPU states the model has samples of, in [`OFF_CPU_STATES`]'
    /// order (none when the offcpu collector did not run: not measured,
    /// not 0).
    pub fn off_cpu_states(&self) -> Vec<(&'static str, &'static str)> {
        OFF_CPU_STATES
            .into_iter()
            .filter(|(st, _)| {
                self.samples
                    .iter()
                    .any(|s| s.kind == SampleKind::OffCpu(st))
            })
            .collect()
    }
}

/// Frames known by name only (folded stacks: no binary).
fn named(names: &[String]) -> Vec<Frame> {
    names
        .iter()
        .map(|n| Frame {
            name: n.clone(),
            module: None,
        })
        .collect()
}

/// `count` divided in proportion to `shares` (summing to at most 1; what
/// is left over goes to no query), whole units by the largest remainder,
/// so the parts add up to `count`.
fn divide(count: u64, shares: &[(Option<Request>, f64)]) -> Vec<(Option<Request>, u64)> {
    let given: f64 = shares.iter().map(|(_, s)| s.max(0.0)).sum();
    let mut parts: Vec<(Option<Request>, f64)> = shares
        .iter()
        .map(|(q, s)| (q.clone(), s.max(0.0)))
        .collect();
    if given < 1.0 {
        parts.push((None, 1.0 - given));
    }
    let total: f64 = parts.iter().map(|(_, s)| s).sum();
    if total <= 0.0 {
        return vec![(None, count)];
    }
    let exact: Vec<f64> = parts
        .iter()
        .map(|(_, s)| count as f64 * s / total)
        .collect();
    let mut whole: Vec<u64> = exact.iter().map(|x| x.floor() as u64).collect();
    let mut left = count - whole.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..exact.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for i in order {
        if left == 0 {
            break;
        }
        whole[i] += 1;
        left -= 1;
    }
    // Two parts for no query (the join's and the leftover) become one.
    let mut out: std::collections::BTreeMap<Option<Request>, u64> = Default::default();
    for ((q, _), n) in parts.into_iter().zip(whole) {
        *out.entry(q).or_default() += n;
    }
    out.into_iter().filter(|(_, n)| *n > 0).collect()
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
    let shares = crate::evidence::queries::pid_shares(ev).unwrap_or_default();
    let pid_labels = |pid: u32| {
        let mut labels = vec![
            ("role", ev.rec.role_of(pid).as_str().to_string()),
            ("pid", pid.to_string()),
        ];
        labels.extend(node_of(Some(pid)).map(|n| ("node", n)));
        let app = ev.activity.as_ref().and_then(|a| a.apps.get(&pid));
        labels.extend(app.map(|a| ("application_name", a.clone())));
        labels
    };
    // Each stack once per query its process gave it to.
    let mut out: Vec<ModelSample> = Vec::new();
    let mut push = |frames: &[Frame],
                    kind: SampleKind,
                    count: u64,
                    labels: Vec<(&'static str, String)>,
                    sh: Option<&Shares>| {
        let parts = match sh {
            Some(sh) => divide(count, sh),
            None => vec![(None, count)],
        };
        for (q, n) in parts {
            let mut labels = labels.clone();
            if let Some(q) = q {
                labels.push(("query_id", q.query));
                labels.extend(q.traceparent.map(|t| ("traceparent", t)));
            }
            out.push(ModelSample {
                frames: frames.to_vec(),
                kind,
                count: n,
                labels,
            });
        }
    };
    if !prof.pid_stacks.is_empty() {
        for ps in &prof.pid_stacks {
            push(
                &ps.frames,
                SampleKind::OnCpu,
                ps.samples,
                pid_labels(ps.pid),
                shares.on_cpu.get(&ps.pid),
            );
        }
    } else {
        // Older recordings: role-level folded stacks, no binaries.
        for st in &prof.stacks {
            let frames = named(&st.frames);
            let mut labels = vec![("role", st.role.as_str().to_string())];
            labels.extend(node_of(None).map(|n| ("node", n)));
            push(&frames, SampleKind::OnCpu, st.samples, labels, None);
        }
    }
    // Off-CPU stacks are per process in every recording that has them.
    for os in ev.offcpu.iter().flat_map(|o| &o.pid_stacks) {
        let Some((state, _)) = OFF_CPU_STATES.into_iter().find(|(st, _)| *st == os.state) else {
            continue;
        };
        let frames = named(&os.frames);
        push(
            &frames,
            SampleKind::OffCpu(state),
            os.us,
            pid_labels(os.pid),
            shares.off_cpu.get(&(os.pid, os.state.clone())),
        );
    }
    m.samples = out;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Option<Request> {
        Some(Request {
            query: s.to_string(),
            traceparent: None,
        })
    }

    #[test]
    fn a_count_divides_by_its_shares_and_adds_up() {
        // One query the whole time: all of it.
        assert_eq!(divide(7, &[(q("1"), 1.0)]), vec![(q("1"), 7)]);
        // Two queries and time in none; the parts add up to the count.
        let d = divide(10, &[(q("1"), 0.55), (q("2"), 0.25), (None, 0.2)]);
        assert_eq!(d.iter().map(|(_, n)| n).sum::<u64>(), 10);
        assert_eq!(d, vec![(None, 2), (q("1"), 6), (q("2"), 2)]);
        // What the join placed nowhere is not attributed, not spread.
        let d = divide(100, &[(q("1"), 0.5)]);
        assert_eq!(d, vec![(None, 50), (q("1"), 50)]);
        // Without shares: all of it to no query.
        assert_eq!(divide(3, &[]), vec![(None, 3)]);
    }

    /// A real recording with the offcpu collector and the query timeline
    /// (PostgreSQL 13, select-only, role-level on-CPU stacks): every
    /// stack's time is kept, the off-CPU time in D, S and runq samples
    /// divided between the queries their backends ran.
    #[test]
    fn a_recording_with_queries_labels_stacks_by_query() {
        let ev = crate::evidence::fixture("pg13-select-only-on-off-cpu");
        let m = model(&ev).expect("the fixture has a profile");
        let on: u64 = m
            .samples
            .iter()
            .filter(|s| s.kind == SampleKind::OnCpu)
            .map(|s| s.count)
            .sum();
        let want: u64 = ev
            .profile
            .as_ref()
            .unwrap()
            .stacks
            .iter()
            .map(|s| s.samples)
            .sum();
        assert_eq!(on, want, "on-CPU samples kept");
        let o = ev.offcpu.as_ref().expect("the fixture has offcpu");
        let off: u64 = m
            .samples
            .iter()
            .filter(|s| matches!(s.kind, SampleKind::OffCpu(_)))
            .map(|s| s.count)
            .sum();
        let want: u64 = o.pid_stacks.iter().map(|p| p.us).sum();
        assert_eq!(off, want, "off-CPU time kept");
        assert!(!m.off_cpu_states().is_empty());
        let ids: std::collections::BTreeSet<&str> = m
            .samples
            .iter()
            .flat_map(|s| &s.labels)
            .filter(|(k, _)| *k == "query_id")
            .map(|(_, v)| v.as_str())
            .collect();
        let known = &ev.activity.as_ref().unwrap().names;
        assert!(!ids.is_empty(), "no stack labelled with a query");
        for id in ids {
            assert!(known.contains_key(id), "{id} is not a recorded query");
        }
    }
}
