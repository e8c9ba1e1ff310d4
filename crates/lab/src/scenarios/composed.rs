//! Two causes at once (issue 39): `lab run --scenario A --also B` runs A's
//! workload on a server that also has B's set-up — B's device, cgroup or
//! busy loops — as real incidents often have more than one cause. B brings
//! its set-up, never its workload: a scenario whose cause is its own
//! workload, or that needs standbys, is refused as an `--also`.
//!
//! A's set-up runs first, then each `--also` in order: a set-up that
//! restarts the server (wal-fsync-latency moves pg_wal) must come before
//! one that moves the server's processes into a cgroup, or the restarted
//! server would be outside it. A set-up that restarts the server after
//! another one ran is refused with the order that works.
use anyhow::Result;

use super::{Beside, Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::collect::session::Session;
use crate::error::fixable;
use crate::provision::Topology;

/// A scenario with others' set-ups beside it.
pub struct Composed {
    main: &'static dyn Scenario,
    also: Vec<&'static dyn Scenario>,
}

/// `main` with the set-ups of `also`, or why they cannot compose. Leaked:
/// a run composes once, and [`LabOptions::scenario`] is `'static`.
pub fn compose(
    main: &'static dyn Scenario,
    also: &[&'static dyn Scenario],
) -> Result<&'static dyn Scenario> {
    if also.is_empty() {
        return Ok(main);
    }
    let name = main.spec().name;
    for (i, a) in also.iter().enumerate() {
        let s = a.spec();
        if s.name == name || also[..i].iter().any(|b| b.spec().name == s.name) {
            return Err(fixable(
                format!("--also {} names a scenario twice", s.name),
                "give each scenario once",
            ));
        }
        if s.pgbench.is_none() || s.on_standby || s.standbys > 0 {
            return Err(fixable(
                format!(
                    "--also {}: its cause is its own workload or topology, not a set-up beside another's",
                    s.name
                ),
                format!(
                    "run it as --scenario {} (with the other as --also, if that one is a set-up)",
                    s.name
                ),
            ));
        }
        if s.init && !main.spec().init {
            return Err(fixable(
                format!(
                    "--also {} needs pgbench's tables, which --scenario {name} does not make",
                    s.name
                ),
                format!("run {} as --scenario with {name} as --also", s.name),
            ));
        }
    }
    Ok(Box::leak(Box::new(Composed {
        main,
        also: also.to_vec(),
    })))
}

impl Composed {
    /// The set-ups in the order they run: the main, then the `--also` ones.
    fn setups(&self) -> impl Iterator<Item = &'static dyn Scenario> + '_ {
        std::iter::once(self.main).chain(self.also.iter().copied())
    }
}

impl Scenario for Composed {
    fn spec(&self) -> &'static Spec {
        self.main.spec()
    }

    fn also(&self) -> &[&'static dyn Scenario] {
        &self.also
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        // The main scenario's settings first: `with_settings` keeps a value
        // already set.
        let mut o = self.main.options(opts)?;
        for s in &self.also {
            o = s.options(&o)?;
        }
        Ok(o)
    }

    fn before_start(
        &self,
        opts: &LabOptions,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        for s in self.setups() {
            s.before_start(opts, host, status)?;
        }
        Ok(())
    }

    fn templated_data(&self) -> bool {
        self.setups().all(|s| s.templated_data())
    }

    fn after_start(
        &self,
        opts: &LabOptions,
        topo: &mut Topology,
        host: &mut Fixtures,
        status: &dyn Fn(&str),
    ) -> Result<()> {
        let mut before: Option<&'static str> = None;
        for s in self.setups() {
            let pid = topo.primary().postmaster_pid();
            s.after_start(opts, topo, host, status)?;
            if let Some(earlier) = before.filter(|_| topo.primary().postmaster_pid() != pid) {
                let name = s.spec().name;
                return Err(fixable(
                    format!("{name} restarts the server, which leaves {earlier}'s set-up behind"),
                    format!("run it first: --scenario {name} --also {earlier}"),
                ));
            }
            before = Some(s.spec().name);
        }
        Ok(())
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        let mut all = Prepared::default();
        for s in self.setups() {
            let p = s.prepare(lab, host)?;
            all.facts.extend(p.facts);
            all.keep.extend(p.keep);
        }
        Ok(all)
    }

    fn beside(&self, lab: &Lab) -> Result<Option<Box<dyn Beside>>> {
        let mut all = Vec::new();
        for s in self.setups() {
            all.extend(s.beside(lab)?);
        }
        Ok(match all.len() {
            0 => None,
            1 => all.pop(),
            _ => Some(Box::new(Besides(all))),
        })
    }

    fn drive(&self, lab: &Lab, session: &mut Session) -> Result<()> {
        self.main.drive(lab, session)
    }

    fn after(&self, lab: &Lab, dir: &std::path::Path) -> Result<()> {
        self.main.after(lab, dir)
    }
}

/// Several scenarios' [`Beside`]s as one.
struct Besides(Vec<Box<dyn Beside>>);

impl Beside for Besides {
    fn facts(&self) -> Vec<(&'static str, serde_json::Value)> {
        self.0.iter().flat_map(|b| b.facts()).collect()
    }

    fn workload_done(&mut self) -> Result<()> {
        let mut first = Ok(());
        for b in &mut self.0 {
            let r = b.workload_done();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    fn stop(&mut self) {
        for b in &mut self.0 {
            b.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::find;

    fn s(name: &str) -> &'static dyn Scenario {
        find(name).unwrap()
    }

    #[test]
    fn a_set_up_composes_and_keeps_the_main_workload() {
        let c = compose(s("disk-read-latency"), &[s("noisy-neighbour")]).unwrap();
        assert_eq!(c.spec().name, "disk-read-latency");
        let names: Vec<&str> = c.also().iter().map(|s| s.spec().name).collect();
        assert_eq!(names, ["noisy-neighbour"]);
        let one = compose(s("tpcb"), &[]).unwrap();
        assert!(one.also().is_empty());
    }

    #[test]
    fn a_workload_of_its_own_or_a_repeat_is_refused_with_the_fix() {
        let e = compose(s("tpcb"), &[s("drop-many")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--also drop-many") && e.contains("--scenario drop-many"),
            "{e}"
        );
        let e = compose(s("tpcb"), &[s("tpcb")]).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        let e = compose(s("tpcb"), &[s("replay-without-prefetch")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("topology"), "{e}");
    }
}
