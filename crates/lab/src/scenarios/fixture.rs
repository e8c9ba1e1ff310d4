//! Host fixtures a scenario sets up around the cluster (a limited device,
//! cpu and memory cgroups, reserved huge pages). Each is written to the
//! cleanup ledger before it is made; the lab lifts them all before the
//! servers stop and tears them down after, in reverse order.
use std::any::Any;

use anyhow::Result;

pub trait Fixture: Any {
    /// What the manifest records about it (`facts.<key>`), if anything.
    fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }

    /// Before the servers stop: lift what would slow their shutdown.
    fn release(&mut self) -> Result<()> {
        Ok(())
    }

    /// After the servers stopped: undo it all.
    fn teardown(&mut self) -> Result<()>;

    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The run's fixtures in the order they were made.
#[derive(Default)]
pub struct Fixtures(Vec<Box<dyn Fixture>>);

impl Fixtures {
    pub fn push(&mut self, f: impl Fixture) {
        self.0.push(Box::new(f));
    }

    /// The fixture of type `T`, if the scenario made one.
    pub fn get_mut<T: Fixture>(&mut self) -> Option<&mut T> {
        self.0
            .iter_mut()
            .find_map(|f| f.as_any_mut().downcast_mut::<T>())
    }

    pub fn facts(&self) -> Vec<(&'static str, serde_json::Value)> {
        self.0.iter().filter_map(|f| f.fact()).collect()
    }

    /// Every fixture's [`Fixture::release`]; the first error is returned
    /// after all were tried.
    pub fn release(&mut self) -> Result<()> {
        first_error(self.0.iter_mut().rev().map(|f| f.release()))
    }

    /// Every fixture's [`Fixture::teardown`], newest first.
    pub fn teardown(&mut self) -> Result<()> {
        let r = first_error(self.0.iter_mut().rev().map(|f| f.teardown()));
        self.0.clear();
        r
    }
}

fn first_error(results: impl Iterator<Item = Result<()>>) -> Result<()> {
    let mut out = Ok(());
    for r in results {
        if let Err(e) = r {
            out = match out {
                Ok(()) => Err(e),
                Err(a) => Err(a.context(format!("{e:#}"))),
            };
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    struct Probe(&'static str, Arc<Mutex<Vec<String>>>, bool);

    impl Fixture for Probe {
        fn fact(&self) -> Option<(&'static str, serde_json::Value)> {
            Some((self.0, serde_json::json!(true)))
        }
        fn release(&mut self) -> Result<()> {
            self.1.lock().unwrap().push(format!("release {}", self.0));
            Ok(())
        }
        fn teardown(&mut self) -> Result<()> {
            self.1.lock().unwrap().push(format!("teardown {}", self.0));
            if self.2 {
                anyhow::bail!("{} failed", self.0)
            }
            Ok(())
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    #[test]
    fn torn_down_newest_first_and_every_one_tried() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut f = Fixtures::default();
        f.push(Probe("device", log.clone(), true));
        f.push(Probe("cgroup", log.clone(), false));
        assert_eq!(f.facts().len(), 2);
        assert!(f.get_mut::<Probe>().is_some());
        f.release().unwrap();
        let e = f.teardown().unwrap_err();
        assert!(format!("{e:#}").contains("device failed"), "{e:#}");
        assert_eq!(
            *log.lock().unwrap(),
            [
                "release cgroup",
                "release device",
                "teardown cgroup",
                "teardown device"
            ]
        );
    }
}
