//! `snapshot-scaling` (issue 14, finding `snapshot-scaling-idle-connections`):
//! pgbench select-only on 2 clients while N further connections sit idle.
//! Up to PostgreSQL 13, `GetSnapshotData` walks the PGPROC of every
//! connected backend for each snapshot, idle ones included, so each
//! statement pays for the idle connections. 14 keeps the running xids in
//! dense arrays (941697c3c1, "snapshot scalability: Introduce dense array
//! of in-progress xids"), stops computing the global horizons there
//! (dc7420c2c9) and reuses a snapshot when no transaction with an xid ended
//! since it was built (623a9ba79b, `xactCompletionCount`): select-only
//! snapshots then cost the same at any connection count.
//!
//! The idle connections are opened before recording starts and held until
//! the recording is written; they are plain client backends in state `idle`.
use anyhow::{Context, Result};

use super::spec::{count_in, Flag};
use super::{Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::workload::Plan;

/// Idle connections by default: enough on a 2-vCPU VM to make the walk
/// dominate a select-only statement on 13 (see the rule's thresholds).
pub const DEFAULT_IDLE: u32 = 1000;
/// pgbench clients by default: one per core of the 2-vCPU VM.
pub const DEFAULT_CLIENTS: u32 = 2;
/// Connections above idle + clients for pgbelow's observer, pgbench's own
/// and the superuser reserve.
const HEADROOM: u32 = 20;
/// Threads that open the idle connections (each connection forks a backend).
const OPENERS: usize = 4;

/// `max_connections` for the run unless `--set` gives it.
pub fn with_defaults(opts: &LabOptions) -> LabOptions {
    let mut o = opts.clone();
    if !o
        .set
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("max_connections"))
    {
        let n = idle_count(opts) + opts.clients + HEADROOM;
        o.set.push(("max_connections".into(), n.to_string()));
    }
    o
}

/// The idle connections the run holds.
pub fn idle_count(opts: &LabOptions) -> u32 {
    opts.params.get("idle-connections").unwrap_or(DEFAULT_IDLE)
}

/// Connections held open and idle; closed on drop.
pub struct IdleConnections {
    clients: Vec<postgres::Client>,
}

impl IdleConnections {
    pub fn len(&self) -> usize {
        self.clients.len()
    }
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

/// Open `n` connections to `dsn` (application_name `pgbelow-idle`) and
/// leave them idle.
pub fn open_idle(dsn: &str, n: u32, status: &dyn Fn(&str)) -> Result<IdleConnections> {
    status(&format!("opening {n} idle connections"));
    raise_nofile(u64::from(n) + 256)?;
    let dsn = format!("{dsn} application_name=pgbelow-idle");
    let per = (n as usize).div_ceil(OPENERS);
    let handles: Vec<_> = (0..OPENERS)
        .map(|i| {
            let dsn = dsn.clone();
            let count = per.min((n as usize).saturating_sub(i * per));
            std::thread::spawn(move || -> Result<Vec<postgres::Client>> {
                (0..count)
                    .map(|_| {
                        crate::interrupt::check()?;
                        crate::scenarios::connect(&dsn)
                    })
                    .collect()
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(n as usize);
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(c)) => clients.extend(c),
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow::anyhow!("a connection thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e).with_context(|| {
            format!(
                "opening {n} idle connections (opened {}); lower --idle-connections or raise \
                 max_connections",
                clients.len()
            )
        });
    }
    Ok(IdleConnections { clients })
}

/// Each connection is a socket in this process: the soft open-files limit
/// must hold them (a default 1024 does not hold 1000).
fn raise_nofile(need: u64) -> Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("reading RLIMIT_NOFILE");
    }
    if lim.rlim_cur >= need {
        return Ok(());
    }
    if lim.rlim_max < need {
        return Err(crate::error::fixable(
            format!(
                "the open-files limit ({}) cannot hold {need} connections",
                lim.rlim_max
            ),
            "raise it (ulimit -Hn) or pass a smaller --idle-connections",
        ));
    }
    lim.rlim_cur = need;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("raising RLIMIT_NOFILE");
    }
    Ok(())
}

static IDLE_CONNECTIONS: Flag = Flag::value(
    "idle-connections",
    "N",
    "snapshot-scaling: connections held idle during the run (default 1000; \
     max_connections is set to fit unless --set gives it)",
    |s| count_in(s, 0, 100_000),
);

pub struct SnapshotScaling;

static SPEC: Spec = Spec {
    name: "snapshot-scaling",
    finding: Some("snapshot-scaling-idle-connections"),
    description: "pgbench -S -M prepared on 2 clients while --idle-connections N (default 1000) \
                  further connections sit idle (max_connections set to fit): up to PostgreSQL 13 \
                  every snapshot walks all connected backends, idle ones included, so the backends' \
                  CPU goes to GetSnapshotData and tps falls with N; 14 does not",
    pgbench: Some(Plan {
        name: "snapshot-scaling",
        args: &["-S", "-M", "prepared"],
        script: None,
    }),
    init: true,
    clients: DEFAULT_CLIENTS,
    flags: &[&IDLE_CONNECTIONS],
    checkpoint_at: true,
    ..Spec::BASE
};

impl Scenario for SnapshotScaling {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        Ok(with_defaults(opts))
    }

    /// Held until the recording is written.
    fn prepare(&self, lab: &Lab, _host: &mut Fixtures) -> Result<Prepared> {
        let idle = open_idle(&lab.dsn(), idle_count(lab.opts), lab.status)?;
        Ok(Prepared {
            facts: vec![("idle_connections", serde_json::json!(idle.len()))],
            keep: vec![Box::new(idle)],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::PgChoice;

    #[test]
    fn max_connections_follows_the_idle_count_unless_set() {
        let mut o = LabOptions::new(&SnapshotScaling, PgChoice::System);
        o.clients = 2;
        o.params.set("idle-connections", 300);
        let d = with_defaults(&o);
        assert!(d
            .set
            .iter()
            .any(|(k, v)| k == "max_connections" && v == "322"));
        o.set.push(("MAX_CONNECTIONS".into(), "50".into()));
        let d = with_defaults(&o);
        assert_eq!(d.set.len(), 1, "{:?}", d.set);
    }
}
