//! `record` as a non-root user with the least capability set
//! (docs/privileges.md), given as ambient capabilities by `setpriv`, against
//! a cluster started with initdb and pg_ctl under another account
//! (`postgres`), as on a user's host; then with one capability taken away:
//! the collector that needs it degrades with the capability and the fix
//! named, and a missing CAP_SYS_PTRACE is reported as a privilege, never
//! as "not the database host".
use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::userdb::UserCluster;
use serde_json::Value;

const LEAST: &str = "+bpf,+perfmon,+sys_ptrace,+dac_read_search,+syslog";
/// `nobody`: not root, owns nothing of the cluster.
const UID: &str = "65534";

/// `pgbelow record` as `nobody` with the capabilities `caps` (ambient),
/// `bin` a copy of pgbelow that nobody can execute.
fn record_as_nobody(
    bin: &common::AnyUserBinary,
    c: &UserCluster,
    dir: &Path,
    caps: &str,
    name: &str,
) -> (Output, PathBuf) {
    let out = dir.join(name);
    let o = Command::new("setpriv")
        .args(["--reuid", UID, "--regid", UID, "--clear-groups"])
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg(&bin.path)
        .args(["record", "--dsn", &c.dsn("postgres"), "--duration", "3"])
        .args([
            "--collectors",
            "syscalls,procfs,pgstat,fsync,offcpu",
            "--format",
            "json",
            "--out",
        ])
        .arg(&out)
        .env("HOME", dir)
        .env_remove("PGHOST")
        .output()
        .unwrap();
    (o, out)
}

fn collector<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["collectors"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no collector {name}: {}", r["collectors"]))
}

#[test]
fn least_capabilities_record_without_root() {
    if common::skipped_unless_root("setpriv to another user needs root") {
        return;
    }
    let c = UserCluster::start(&[], &[]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let bin = common::any_user_binary();

    // The least set: every collector runs.
    let (o, _) = record_as_nobody(&bin, &c, tmp.path(), LEAST, "least");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "record failed: {err}");
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    for name in ["syscalls", "pgstat", "fsync", "offcpu"] {
        assert_eq!(
            collector(&r, name)["status"],
            "ok",
            "{name}: {}",
            r["collectors"]
        );
    }
    // /proc/PID/stack needs CAP_SYS_ADMIN: the kernel stacks of blocked
    // processes come from the eBPF task iterator instead, not degraded.
    let procfs = collector(&r, "procfs");
    assert_eq!(procfs["status"], "ok", "{procfs}");
    assert!(
        procfs["mechanism"]
            .as_str()
            .unwrap_or("")
            .contains("task iterator"),
        "{procfs}"
    );
    assert!(!err.contains("missing, needed for"), "{err}");
    assert!(!err.contains("libbpf:"), "{err}");

    // Without CAP_BPF: the eBPF collectors degrade, naming it and the fix;
    // the run goes on, and libbpf prints nothing.
    let no_bpf = LEAST.replace("+bpf,", "");
    let (o, _) = record_as_nobody(&bin, &c, tmp.path(), &no_bpf, "nobpf");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "record failed: {err}");
    assert!(err.contains("CAP_BPF missing"), "{err}");
    assert!(!err.contains("libbpf:"), "{err}");
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    for name in ["syscalls", "fsync", "offcpu"] {
        let col = collector(&r, name);
        let reason = col["reason"].as_str().unwrap_or("");
        // The syscall counter falls back to perf tracepoints when tracefs
        // is mounted (another test of the harness may have mounted it).
        let fell_back = name == "syscalls"
            && col["status"] == "degraded"
            && col["mechanism"] == "perf-tracepoint";
        assert!(col["status"] == "failed" || fell_back, "{col}");
        assert!(
            reason.contains("CAP_BPF") && reason.contains("setcap cap_bpf"),
            "{col}"
        );
    }
    assert_eq!(collector(&r, "pgstat")["status"], "ok");

    // Without CAP_SYS_PTRACE the postmaster cannot be seen: a privilege
    // error (exit 2), not "run it on the database host".
    let no_ptrace = LEAST.replace("+sys_ptrace,", "");
    let (o, out) = record_as_nobody(&bin, &c, tmp.path(), &no_ptrace, "noptrace");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("cap_sys_ptrace"), "{err}");
    assert!(!err.contains("must run on the database host"), "{err}");
    assert!(!out.exists(), "a half-written recording was left: {out:?}");
}
