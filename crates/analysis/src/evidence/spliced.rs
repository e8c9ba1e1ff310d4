//! The evidence of a spliced recording (watch's incident): read as one run,
//! judged from the onset.
use super::Evidence;
use crate::recording::fixtures::copy_at;
use crate::recording::splice::{splice, Incident};

// Two real recordings 16.5 s apart (a quiet one, then one beside 4 busy
// loops), joined as an incident whose onset is at 16 s: the evidence holds
// every sample of both, and the rules judge the second window's.
#[test]
fn an_incident_is_one_run_judged_from_its_onset() {
    let tmp = std::env::temp_dir().join(format!("pgbelow-test-spliced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let a = copy_at(
        "pg15-noisy-neighbour-none-quiet",
        &tmp,
        "2026-11-25T23:05:00.000Z",
    );
    let b = copy_at(
        "pg15-noisy-neighbour-hogs-4",
        &tmp,
        "2026-11-25T23:05:16.500Z",
    );
    let out = tmp.join("incident");
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
    let (ea, eb) = (Evidence::load(&a).unwrap(), Evidence::load(&b).unwrap());
    let ev = Evidence::load(&out).unwrap();
    assert_eq!(ev.procfs.len(), ea.procfs.len() + eb.procfs.len());
    let judged = ev.judged().unwrap();
    assert_eq!(judged.procfs.len(), eb.procfs.len());
    assert!(judged.system.iter().all(|s| s.t >= 16.0));
    // Not an incident: judged as a whole.
    let whole = tmp.join("whole");
    splice(&[a, b], &[false, false], None, &whole, None).unwrap();
    let ev = Evidence::load(&whole).unwrap();
    assert!(ev.manifest.incident.is_none() && ev.judged().is_none());
    std::fs::remove_dir_all(&tmp).unwrap();
}
