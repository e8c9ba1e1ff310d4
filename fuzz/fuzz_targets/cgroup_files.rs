#![no_main]
use libfuzzer_sys::fuzz_target;

use pgbelow::collect::{cgroup, memcg, system};

// A real /proc/self/mountinfo (cgroup v1 hierarchies and cgroup2), so that
// fuzzed /proc/PID/cgroup paths are joined to real hierarchies.
const MOUNTINFO: &str = include_str!("../../tests/fixtures/proc/mountinfo");

fuzz_target!(|data: &[u8]| {
    if let Some(s) = pgbelow_fuzz::text(data) {
        // /proc/PID/cgroup, then where each controller's directory is.
        let members = cgroup::parse_proc_cgroup(s);
        let mounts = system::parse_mountinfo(MOUNTINFO);
        for c in ["cpu", "memory"] {
            if let Some((dir, root, _)) = cgroup::controller_dir(&members, &mounts, c) {
                let _ = cgroup::up_to(&dir, &root);
            }
        }
        // cpu.stat, cfs_quota_us/cfs_period_us, cpu.max.
        let _ = cgroup::parse_cpu_stat(s);
        let (q, p) = s.split_once('\n').unwrap_or((s, "100000"));
        let _ = cgroup::quota_v1(q, p);
        let _ = cgroup::quota_v2(s);
        // memory.stat, memory.events, memory.oom_control; limit files.
        let _ = memcg::parse_keyed(s);
        let _ = memcg::parse_limit(s);
    }
});
