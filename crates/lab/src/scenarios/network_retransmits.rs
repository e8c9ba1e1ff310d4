//! `network-retransmits`: the `syncrep-network-latency` set-up (one INSERT
//! per transaction, 4 clients, one synchronous standby streaming over TCP
//! on 127.0.0.1) with a lossy link instead of a far one: the NFQUEUE
//! thread drops one packet in `--drop-every` (20 by default: 5 %) each way
//! and delays none. A lost WAL segment on a link that waits for the
//! standby's reply gets no duplicate ACK, so TCP sends it again only when
//! its retransmission timeout fires (200 ms at least on Linux): the
//! commits behind it wait that long in SyncRep. `--drop-every 0` runs the
//! same TCP standby without loss (the healthy baseline). Root only (an
//! iptables NFQUEUE rule, removed afterwards).
use anyhow::Result;

use super::spec::{count_in, Flag};
use super::syncrep_network_latency as net;
use super::{Fixtures, Lab, LabOptions, Prepared, Scenario, Spec};
use crate::provision::SyncMode;

/// One packet in this many dropped by default (5 %).
pub const DEFAULT_DROP_EVERY: u64 = 20;

pub(crate) static DROP_EVERY: Flag = Flag::value(
    "drop-every",
    "N",
    "network-retransmits: drop one packet in N each way between primary and standby (default \
     20, 5 %; 0: none, the healthy baseline)",
    |s| match s.trim() {
        "0" => Ok("0".into()),
        _ => count_in(s, 2, 1_000_000),
    },
);

fn drop_every(opts: &LabOptions) -> u64 {
    opts.params.get("drop-every").unwrap_or(DEFAULT_DROP_EVERY)
}

pub struct NetworkRetransmits;

static SPEC: Spec = Spec {
    name: "network-retransmits",
    finding: Some("network-retransmits"),
    description: "pgbench -f: one INSERT per transaction, 4 clients, on a primary with 1 \
                  synchronous standby streaming over TCP whose packets are dropped one in 20 \
                  each way (an iptables NFQUEUE rule on lo that pgbelow reads; root only; \
                  removed afterwards): TCP resends each lost segment after its retransmission \
                  timeout and the commits behind it wait. --drop-every 0 runs the same TCP \
                  standby without loss (the healthy baseline)",
    pgbench: Some(net::PLAN),
    clients: net::DEFAULT_CLIENTS,
    standbys: 1,
    sync: SyncMode::First,
    flags: &[&DROP_EVERY],
    ..Spec::BASE
};

impl Scenario for NetworkRetransmits {
    fn spec(&self) -> &'static Spec {
        &SPEC
    }

    fn options(&self, opts: &LabOptions) -> Result<LabOptions> {
        if drop_every(opts) > 0 {
            net::require_root()?;
            net::iptables()?;
        }
        Ok(net::tcp_standby_options(opts))
    }

    fn prepare(&self, lab: &Lab, host: &mut Fixtures) -> Result<Prepared> {
        net::prepare_tcp_standby(lab, host, 0, drop_every(lab.opts))
    }
}
