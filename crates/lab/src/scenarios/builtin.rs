//! pgbench's own workloads, run as they are: `select-only` and `tpcb`.
use super::{Scenario, Spec};
use crate::workload::Plan;

pub struct SelectOnly;

static SELECT_ONLY: Spec = Spec {
    name: "select-only",
    finding: Some("timer-syscalls-per-statement"),
    // Without a statement_timeout there is no timer to re-arm.
    matrix_set: &[("statement_timeout", "10s")],
    description: "pgbench -S -M prepared: one indexed SELECT per transaction; shows per-statement \
                  syscall costs such as setitimer with statement_timeout (seed 000)",
    pgbench: Some(Plan {
        name: "select-only",
        args: &["-S", "-M", "prepared"],
        script: None,
    }),
    init: true,
    checkpoint_at: true,
    ..Spec::BASE
};

impl Scenario for SelectOnly {
    fn spec(&self) -> &'static Spec {
        &SELECT_ONLY
    }
}

pub struct Tpcb;

static TPCB: Spec = Spec {
    name: "tpcb",
    description: "pgbench's built-in TPC-B-like transaction (7 statements, simple protocol)",
    pgbench: Some(Plan {
        name: "tpcb",
        args: &[],
        script: None,
    }),
    init: true,
    // BEGIN, 3 UPDATE, SELECT, INSERT, END
    statements_per_transaction: 7,
    checkpoint_at: true,
    ..Spec::BASE
};

impl Scenario for Tpcb {
    fn spec(&self) -> &'static Spec {
        &TPCB
    }
}
