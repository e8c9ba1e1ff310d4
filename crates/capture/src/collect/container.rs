//! The container a server runs in, from its cgroup path: Docker (cgroupfs
//! `/docker/ID`, systemd `docker-ID.scope`), containerd and CRI-O
//! (`cri-containerd-ID.scope`, `crio-ID.scope`), Podman (`libpod-ID.scope`)
//! and Kubernetes pods (`/kubepods…/pod<uid>/…`), whichever cgroup version.
//! The id is the 64-hex-digit one the runtime names the container by
//! (`docker ps` shows its first 12).
use super::cgroup::Membership;
pub use crate::recording::schema::system::Container;

/// The id in one path component, with the runtime its form names.
fn id_in(component: &str) -> Option<(String, &'static str)> {
    let bare = component.strip_suffix(".scope").unwrap_or(component);
    let (runtime, id) = [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
    ]
    .iter()
    .find_map(|(prefix, rt)| bare.strip_prefix(prefix).map(|id| (*rt, id)))
    .unwrap_or(("", bare));
    let hex = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| (id.to_ascii_lowercase(), runtime))
}

/// The container of a process whose /proc/PID/cgroup is `members`: the
/// innermost container id on any line (the v2 line first), None on a host.
pub fn container_of(members: &[Membership]) -> Option<Container> {
    let mut lines: Vec<&Membership> = members.iter().collect();
    lines.sort_by_key(|m| m.hierarchy != 0);
    lines.iter().find_map(|m| {
        let parts: Vec<&str> = m.path.split('/').filter(|p| !p.is_empty()).collect();
        let (i, (id, runtime)) = parts
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, p)| id_in(p).map(|x| (i, x)))?;
        let pod = parts[..i].iter().find_map(|p| pod_uid(p));
        let runtime = match (runtime, parts.first()) {
            ("", Some(&"docker")) => "docker",
            (rt, _) => rt,
        };
        Some(Container {
            id,
            runtime: (!runtime.is_empty()).then(|| runtime.to_string()),
            pod_uid: pod,
            cgroup: m.path.clone(),
        })
    })
}

/// The container the process `pid` runs in, from its /proc/PID/cgroup as
/// this host sees it (None on a host, or when the file is gone).
pub fn of_process(pid: u32) -> Option<Container> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    container_of(&super::cgroup::parse_proc_cgroup(&text))
}

/// A Kubernetes pod's uid from `pod<uid>` (cgroupfs) or
/// `kubepods-<class>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(component: &str) -> Option<String> {
    let bare = component.strip_suffix(".slice").unwrap_or(component);
    let uid = bare.rsplit_once("pod").map(|(_, u)| u)?;
    let uid = uid.replace('_', "-");
    (uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(name: &str) -> Option<Container> {
        let p = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .join("tests/fixtures/proc/container")
            .join(name);
        container_of(&super::super::cgroup::parse_proc_cgroup(
            &std::fs::read_to_string(p).unwrap(),
        ))
    }

    // Real /proc/PID/cgroup files (tests/fixtures/proc/container/README.md).
    #[test]
    fn container_ids_from_real_cgroup_files() {
        let c = of("docker-cgroupfs").unwrap();
        assert_eq!(
            c.id,
            "31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30"
        );
        assert_eq!(c.runtime.as_deref(), Some("docker"));
        assert_eq!(c.pod_uid, None);
        let c = of("docker-systemd").unwrap();
        assert!(c.id.starts_with("9ec39b91f3d7"), "{c:?}");
        assert_eq!(c.runtime.as_deref(), Some("docker"));
        let c = of("kubepods-cgroupfs").unwrap();
        assert!(c.id.starts_with("da31e536c8d6"), "{c:?}");
        assert_eq!(
            c.pod_uid.as_deref(),
            Some("1fe19bf5-e8ef-11e8-900c-52daee5a874d")
        );
        // The runtime is not in a cgroupfs pod's path.
        assert_eq!(c.runtime, None);
        let c = of("kubepods-systemd-containerd").unwrap();
        assert!(c.id.starts_with("f45298cd514d"), "{c:?}");
        assert_eq!(c.runtime.as_deref(), Some("containerd"));
        assert_eq!(
            c.pod_uid.as_deref(),
            Some("dd1bf9d1-241d-47f5-8e25-12de83135812")
        );
        // This machine's own shell: a 32-digit id in a memory cgroup's
        // path is no container's.
        assert_eq!(of("host"), None);
    }
}
