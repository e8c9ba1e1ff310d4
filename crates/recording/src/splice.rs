//! One recording from several back to back: `watch`'s incident is the
//! windows of its history before the onset, the window the trigger cut
//! short and the escalated one after it, as one ordinary recording that
//! `pgbelow report` and `compare` read like any other.
//!
//! Each part's times are shifted by its start's distance from the first
//! part's (the manifests' `started_at`); streams are concatenated in order,
//! folded stacks summed, `cpu_outside.json` added up, and a whole-file part
//! that more than one window wrote (a summary of the profile or off-CPU
//! collector when the user runs them all the time) is the last window's,
//! which the manifest's `incident.parts` says.
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::manifest::{Manifest, Status};
use super::schema::system::{OutsideCpu, OUTSIDE_FILE, TOP_OUTSIDE};

// The incident's types are the manifest's (`incident`); splicing fills them.
pub use super::manifest::{Incident, Part};

/// Fields holding a time relative to the recording's start.
const TIME_FIELDS: [&str; 3] = ["t", "t_start", "t_end"];

/// Files of a recording that are its report, not its data.
fn is_report(name: &str) -> bool {
    name.starts_with("report.") || name.ends_with(".svg") || name.ends_with(".html")
}

pub fn manifest_of(dir: &Path) -> Result<Manifest> {
    let p = dir.join(super::files::MANIFEST);
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}

fn started(m: &Manifest) -> Result<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(&m.started_at)
        .with_context(|| format!("started_at {:?} is not RFC 3339", m.started_at))
}

/// Shift a JSON object's time fields by `by` seconds (three decimals).
fn shift(v: &mut serde_json::Value, by: f64) {
    if let Some(o) = v.as_object_mut() {
        for k in TIME_FIELDS {
            if let Some(t) = o.get(k).and_then(|t| t.as_f64()) {
                o.insert(
                    k.into(),
                    serde_json::json!(((t + by) * 1000.0).round() / 1000.0),
                );
            }
        }
    }
}

/// A wall-clock offset further than this from the monotonic one is a
/// clock that jumped between the windows: the monotonic one is used.
const CLOCK_JUMP_S: f64 = 2.0;

/// Join `parts` (oldest first) into the new recording `out`, which must not
/// exist; written in a temporary directory beside it and renamed, so a
/// failure leaves nothing half-written. `incident.parts` is filled here.
/// `monotonic`: each part's start in seconds on a monotonic clock (any
/// origin), when the caller knows it: the manifests' wall-clock starts are
/// used unless the clock jumped between them.
pub fn splice(
    parts: &[PathBuf],
    escalated: &[bool],
    monotonic: Option<&[f64]>,
    out: &Path,
    incident: Option<Incident>,
) -> Result<()> {
    anyhow::ensure!(!parts.is_empty(), "nothing to splice");
    let manifests: Vec<Manifest> = parts
        .iter()
        .map(|p| manifest_of(p))
        .collect::<Result<_>>()?;
    let t0 = started(&manifests[0])?;
    let mut incident = incident;
    let mut offsets: Vec<f64> = manifests
        .iter()
        .map(|m| Ok((started(m)? - t0).num_milliseconds() as f64 / 1000.0))
        .collect::<Result<_>>()?;
    if let Some(mono) = monotonic.filter(|m| m.len() == parts.len()) {
        let jumped = offsets
            .iter()
            .zip(mono)
            .any(|(wall, m)| (wall - (m - mono[0])).abs() > CLOCK_JUMP_S);
        if jumped {
            offsets = mono.iter().map(|m| round3(m - mono[0])).collect();
        }
    }
    let parent = out.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".pgbelow-splice-")
        .tempdir_in(parent)?;
    // Every file name any part has, and which parts have it.
    let mut names: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, p) in parts.iter().enumerate() {
        for e in std::fs::read_dir(p)? {
            let e = e?;
            if !e.file_type()?.is_file() {
                continue;
            }
            let name = e.file_name().to_string_lossy().to_string();
            if name != super::files::MANIFEST && !is_report(&name) {
                names.entry(name).or_default().push(i);
            }
        }
    }
    for (name, have) in &names {
        let dest = tmp.path().join(name);
        if name.ends_with(".jsonl") {
            let mut w = std::io::BufWriter::new(std::fs::File::create(&dest)?);
            let from_log = [
                super::schema::pgstat::LOG_HISTORY,
                super::schema::pgstat::CHECKPOINTS,
            ]
            .contains(&name.as_str());
            for &i in have {
                // A window reads the server log back to a second before the
                // last one ended, and names a checkpoint still running at its
                // start: a line from before then, the earlier windows saw as
                // it was written (or read themselves).
                let seen_until = (0..i)
                    .map(|j| offsets[j] + manifests[j].duration_s.unwrap_or(0.0))
                    .fold(f64::NEG_INFINITY, f64::max);
                let f = std::fs::File::open(parts[i].join(name))?;
                for line in std::io::BufReader::new(f).lines() {
                    let line = line?;
                    // A damaged line stays as it was: the reader names it.
                    match serde_json::from_str::<serde_json::Value>(&line) {
                        Ok(mut v) => {
                            shift(&mut v, offsets[i]);
                            if from_log && seen_before(&v, offsets[i], seen_until) {
                                continue;
                            }
                            serde_json::to_writer(&mut w, &v)?;
                        }
                        Err(_) => w.write_all(line.as_bytes())?,
                    }
                    w.write_all(b"\n")?;
                }
            }
            w.flush()?;
        } else if name.ends_with(".folded") {
            let mut sum: BTreeMap<String, u64> = BTreeMap::new();
            for &i in have {
                let f = std::fs::File::open(parts[i].join(name))?;
                for line in std::io::BufReader::new(f).lines() {
                    let line = line?;
                    if let Some((stack, n)) = line.rsplit_once(' ') {
                        if let Ok(n) = n.parse::<u64>() {
                            *sum.entry(stack.to_string()).or_default() += n;
                        }
                    }
                }
            }
            let mut w = std::io::BufWriter::new(std::fs::File::create(&dest)?);
            for (stack, n) in sum {
                writeln!(w, "{stack} {n}")?;
            }
            w.flush()?;
        } else if name == OUTSIDE_FILE {
            // An incident's: the walks of the windows from its onset on
            // (what its rules judge), unless none reaches it.
            let onset = incident.as_ref().map_or(f64::NEG_INFINITY, |i| i.onset_t);
            let ends = |i: usize| offsets[i] + manifests[i].duration_s.unwrap_or(0.0);
            let after: Vec<usize> = have.iter().copied().filter(|i| ends(*i) > onset).collect();
            let have = if after.is_empty() {
                have.clone()
            } else {
                after
            };
            let mut all: Vec<(usize, OutsideCpu)> = Vec::new();
            for &i in &have {
                let text = std::fs::read_to_string(parts[i].join(name))?;
                if let Ok(o) = serde_json::from_str::<OutsideCpu>(&text) {
                    all.push((i, o));
                }
            }
            if let Some(merged) = merge_outside(&all, &offsets) {
                std::fs::write(&dest, serde_json::to_vec(&merged)?)?;
            }
        } else {
            // A whole-file part: the last window's that has it, times shifted.
            let i = *have.last().unwrap_or(&0);
            let text = std::fs::read(parts[i].join(name))?;
            match serde_json::from_slice::<serde_json::Value>(&text) {
                Ok(mut v) if name.ends_with(".json") => {
                    shift(&mut v, offsets[i]);
                    std::fs::write(&dest, serde_json::to_vec(&v)?)?;
                }
                _ => std::fs::write(&dest, text)?,
            }
        }
    }
    // The manifest: the first window's, over the whole span.
    let mut m = manifests[0].clone();
    let mut collectors: Vec<super::CollectorInfo> = Vec::new();
    let mut end = 0.0f64;
    let mut parts_info = Vec::new();
    for (i, pm) in manifests.iter().enumerate() {
        let t_start = offsets[i];
        let t_end = t_start + pm.duration_s.unwrap_or(0.0);
        end = end.max(t_end);
        parts_info.push(Part {
            t_start: round3(t_start),
            t_end: round3(t_end),
            collectors: pm
                .collectors
                .iter()
                .filter(|c| c.status != "off")
                .map(|c| c.name.clone())
                .collect(),
            escalated: escalated.get(i).copied().unwrap_or(false),
        });
        for c in &pm.collectors {
            match collectors.iter_mut().find(|x| x.name == c.name) {
                Some(x) => {
                    x.cpu_s += c.cpu_s;
                    // The worst a window saw is the recording's.
                    if x.status == "ok" && c.status != "ok" {
                        x.status = c.status.clone();
                        x.reason = c.reason.clone();
                    }
                }
                None => collectors.push(c.clone()),
            }
        }
        for (k, v) in &pm.facts {
            m.facts.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    m.collectors = collectors;
    m.duration_s = Some(round3(end));
    m.status = match manifests.last().map(|l| &l.status) {
        Some(Status::Recording) | None => Status::Complete,
        Some(s) => s.clone(),
    };
    m.pgbelow_cpu_s = Some(round3(
        manifests.iter().filter_map(|x| x.pgbelow_cpu_s).sum(),
    ));
    // Measured for the incident only when measured in every window.
    m.observer_backend_cpu_s = manifests
        .iter()
        .map(|x| x.observer_backend_cpu_s)
        .sum::<Option<f64>>()
        .map(round3);
    m.pgbelow_peak_rss_kb = manifests.iter().filter_map(|x| x.pgbelow_peak_rss_kb).max();
    m.postgres = manifests
        .last()
        .map(|l| l.postgres.clone())
        .unwrap_or_default();
    m.incident = incident.take().map(|mut i| {
        i.parts = parts_info;
        i
    });
    std::fs::write(
        tmp.path().join(super::files::MANIFEST),
        serde_json::to_vec_pretty(&m)?,
    )?;
    let tmp = tmp.keep();
    std::fs::rename(&tmp, out).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&tmp);
    })?;
    Ok(())
}

/// Whether a server-log event of a later window (shifted) is from before
/// that window began and within what an earlier one covered; a time
/// stamped when read (no time in log_line_prefix) is a second or so late.
fn seen_before(v: &serde_json::Value, start: f64, seen_until: f64) -> bool {
    let Some(t) = v["t"].as_f64() else {
        return false;
    };
    let slack = if v["t_from"] == "read" { 2.0 } else { 0.0 };
    t <= start + 0.001 && t < seen_until + slack
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The windows' walks of the processes outside the cluster, added up: each
/// process's CPU over the windows, the most first.
fn merge_outside(all: &[(usize, OutsideCpu)], offsets: &[f64]) -> Option<OutsideCpu> {
    let (first, last) = (all.first()?, all.last()?);
    let mut by_pid: BTreeMap<u32, super::schema::system::OutsideProcess> = BTreeMap::new();
    for (_, o) in all {
        for p in &o.top {
            by_pid
                .entry(p.pid)
                .and_modify(|x| x.cpu_s += p.cpu_s)
                .or_insert_with(|| p.clone());
        }
    }
    let mut top: Vec<_> = by_pid.into_values().collect();
    top.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s).then(a.pid.cmp(&b.pid)));
    top.truncate(TOP_OUTSIDE);
    let mut merged = last.1.clone();
    merged.t_start = round3(first.1.t_start + offsets[first.0]);
    merged.t_end = round3(last.1.t_end + offsets[last.0]);
    merged.cpu_s = round3(all.iter().map(|(_, o)| o.cpu_s).sum());
    merged.processes_seen = all.iter().map(|(_, o)| o.processes_seen).max().unwrap_or(0);
    merged.top = top;
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixtures::{copy_at, fixture};

    /// Two real recordings as windows: a quiet one started at 23:05:00,
    /// one beside 4 busy loops started at `second`.
    fn quiet_then_hogs(into: &Path, second: &str) -> (PathBuf, PathBuf) {
        (
            copy_at(
                "pg15-noisy-neighbour-none-quiet",
                into,
                "2026-11-25T23:05:00.000Z",
            ),
            copy_at("pg15-noisy-neighbour-hogs-4", into, second),
        )
    }

    fn lines(p: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    // Two real recordings 16.5 s apart (a quiet one, then one beside 4 busy
    // loops): every sample of both, the second's 16.5 s later, one
    // manifest over both (the evidence's reading of it is tested in the
    // analysis crate: evidence/spliced.rs).
    #[test]
    fn two_windows_are_one_recording() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = quiet_then_hogs(tmp.path(), "2026-11-25T23:05:16.500Z");
        let out = tmp.path().join("incident");
        let incident = Incident {
            trigger: "test".into(),
            trigger_id: "runq-jump".into(),
            onset_t: 16.0,
            parts: Vec::new(),
        };
        splice(
            &[a.clone(), b.clone()],
            &[false, true],
            None,
            &out,
            Some(incident),
        )
        .unwrap();
        let (pa, pb, po) = (
            lines(&a.join("procfs.jsonl")),
            lines(&b.join("procfs.jsonl")),
            lines(&out.join("procfs.jsonl")),
        );
        assert_eq!(po.len(), pa.len() + pb.len());
        let t = |v: &serde_json::Value| v["t"].as_f64().unwrap();
        assert_eq!(
            t(&po[pa.len()]),
            ((t(&pb[0]) + 16.5) * 1000.0).round() / 1000.0
        );
        assert!(po.windows(2).all(|w| t(&w[0]) < t(&w[1])), "times in order");
        let m = manifest_of(&out).unwrap();
        let (ma, mb) = (manifest_of(&a).unwrap(), manifest_of(&b).unwrap());
        assert_eq!(m.started_at, ma.started_at);
        assert_eq!(m.duration_s, Some(round3(16.5 + mb.duration_s.unwrap())));
        let inc = m.incident.unwrap();
        assert_eq!(inc.parts.len(), 2);
        assert_eq!((inc.parts[1].t_start, inc.parts[1].escalated), (16.5, true));
        // The outside processes' CPU from the onset (16 s): the second
        // window's walk, the busy loops on top.
        let outside = |d: &Path| {
            serde_json::from_slice::<OutsideCpu>(&std::fs::read(d.join(OUTSIDE_FILE)).unwrap())
                .unwrap()
        };
        let o = outside(&out);
        assert!((o.cpu_s - outside(&b).cpu_s).abs() < 0.01, "{o:?}");
        assert!(
            o.top.iter().filter(|p| p.comm == "pgbelow-hog").count() == 4,
            "{o:?}"
        );
        // Not an incident: both walks added up, judged as a whole.
        let whole = tmp.path().join("whole");
        splice(&[a.clone(), b.clone()], &[false, false], None, &whole, None).unwrap();
        let o = outside(&whole);
        assert!(
            (o.cpu_s - (outside(&a).cpu_s + outside(&b).cpu_s)).abs() < 0.01,
            "{o:?}"
        );
        // Nothing of the work left beside it.
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(".pgbelow-splice"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    // The observer backend's CPU is the incident's only when every window
    // measured it: one that did not (no pgstat connection) leaves it
    // unmeasured, never a sum that reads as the whole.
    #[test]
    fn the_observer_backends_cpu_is_summed_only_when_every_window_measured_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = quiet_then_hogs(tmp.path(), "2026-11-25T23:05:16.500Z");
        let set = |d: &Path, v: Option<f64>| {
            let mut m = manifest_of(d).unwrap();
            m.observer_backend_cpu_s = v;
            std::fs::write(
                d.join(super::super::files::MANIFEST),
                serde_json::to_vec(&m).unwrap(),
            )
            .unwrap();
        };
        let joined = |name: &str| {
            let out = tmp.path().join(name);
            splice(&[a.clone(), b.clone()], &[false, false], None, &out, None).unwrap();
            manifest_of(&out).unwrap().observer_backend_cpu_s
        };
        set(&a, Some(0.125));
        set(&b, None);
        assert_eq!(joined("one-unmeasured"), None);
        set(&b, Some(0.25));
        assert_eq!(joined("both"), Some(0.375));
    }

    // A checkpoint the first window saw start (the real stall run's) is
    // still running when the second begins 46 s later: the second names it
    // again, from the log (as the collector does for an unfinished one, and
    // in its history back to before the first ended). It is one start in
    // the joined recording; a line logged in the gap between the windows,
    // which only the second read, stays.
    #[test]
    fn a_log_line_two_windows_read_is_one_event() {
        let tmp = tempfile::tempdir().unwrap();
        let (ta, tb) = (tmp.path().join("a"), tmp.path().join("b"));
        let a = copy_at("pg15-checkpoint-stall", &ta, "2026-11-22T05:03:19.000Z");
        let b = copy_at("pg15-checkpoint-stall", &tb, "2026-11-22T05:04:05.000Z");
        let start = lines(&a.join("checkpoints.jsonl"))
            .into_iter()
            .find(|v| v["phase"] == "start")
            .unwrap();
        let at = |t: f64| {
            let mut v = start.clone();
            v["t"] = serde_json::json!(t);
            serde_json::to_string(&v).unwrap()
        };
        let t0 = start["t"].as_f64().unwrap();
        std::fs::write(b.join("checkpoints.jsonl"), at(t0 - 46.0) + "\n").unwrap();
        let gap = -0.4; // 45.6 s into the first: after it ended (45.319 s)
        std::fs::write(
            b.join("log_history.jsonl"),
            format!("{}\n{}\n", at(t0 - 46.0), at(gap)),
        )
        .unwrap();
        let whole = tmp.path().join("whole");
        splice(&[a, b], &[false, false], None, &whole, None).unwrap();
        let starts: Vec<f64> = lines(&whole.join("checkpoints.jsonl"))
            .iter()
            .filter(|v| v["phase"] == "start")
            .map(|v| v["t"].as_f64().unwrap())
            .collect();
        assert_eq!(starts, [t0], "{starts:?}");
        let history: Vec<f64> = lines(&whole.join("log_history.jsonl"))
            .iter()
            .map(|v| v["t"].as_f64().unwrap())
            .collect();
        assert_eq!(history, [round3(46.0 + gap)], "{history:?}");
    }

    // The wall clock jumped an hour between two windows 16.5 s apart on
    // the monotonic clock: the monotonic offset holds; a second's
    // disagreement (NTP slewing, the attach's own time) does not override.
    #[test]
    fn a_clock_jump_between_windows_is_not_an_hour_of_gap() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = quiet_then_hogs(tmp.path(), "2026-11-26T00:05:16.500Z");
        // The second window's start in the joined recording, the monotonic
        // starts 16.5 s apart.
        let second_start = |parts: &[PathBuf], out: &Path| {
            let mono = [100.0, 116.5];
            splice(
                parts,
                &[false, false],
                Some(&mono),
                out,
                Some(Incident::default()),
            )
            .unwrap();
            manifest_of(out).unwrap().incident.unwrap().parts[1].t_start
        };
        assert_eq!(second_start(&[a.clone(), b], &tmp.path().join("o")), 16.5);
        let b2 = copy_at(
            "pg15-noisy-neighbour-hogs-4",
            &tmp.path().join("b2"),
            "2026-11-25T23:05:17.400Z",
        );
        assert_eq!(second_start(&[a, b2], &tmp.path().join("o2")), 17.4);
    }

    // A folded file two windows wrote is one set of stacks, counts summed.
    #[test]
    fn folded_stacks_are_summed() {
        let tmp = tempfile::tempdir().unwrap();
        let a = copy_at(
            "pg15-noisy-neighbour-none-quiet",
            tmp.path(),
            "2026-11-25T23:05:00Z",
        );
        let b = copy_at(
            "pg15-noisy-neighbour-hogs-4",
            tmp.path(),
            "2026-11-25T23:05:20Z",
        );
        let real =
            std::fs::read_to_string(fixture("pg13-select-only-timeout-all").join("profile.folded"))
                .unwrap();
        std::fs::write(a.join("profile.folded"), &real).unwrap();
        std::fs::write(b.join("profile.folded"), &real).unwrap();
        let out = tmp.path().join("o");
        splice(
            &[a, b],
            &[false, false],
            None,
            &out,
            Some(Incident::default()),
        )
        .unwrap();
        let total = |s: &str| -> u64 {
            s.lines()
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
                .sum()
        };
        let got = std::fs::read_to_string(out.join("profile.folded")).unwrap();
        assert_eq!(total(&got), 2 * total(&real));
        assert!(got.lines().count() <= real.lines().count());
    }

    // A part that is not a recording: an error, and no output directory.
    #[test]
    fn a_part_without_manifest_writes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("o");
        assert!(splice(
            &[tmp.path().to_path_buf()],
            &[false],
            None,
            &out,
            Some(Incident::default())
        )
        .is_err());
        assert!(!out.exists());
    }
}
