//! /proc/PID/mountinfo: the mounts a process sees, and which one holds a
//! path (the data directory's filesystem; the cgroup hierarchies).
use std::path::{Component, Path};

use crate::recording::schema::system::Mount;

/// Parse /proc/PID/mountinfo (proc(5)): `id parent maj:min root point
/// options [optional…] - fstype source super_options`, with spaces and
/// other bytes in paths escaped as `\040`.
pub fn parse_mountinfo(s: &str) -> Vec<Mount> {
    s.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut a = left.split(' ');
            let _id = a.next()?;
            let _parent = a.next()?;
            let device = a.next()?.to_string();
            let root = unescape(a.next()?);
            let mount_point = unescape(a.next()?);
            let mount_options = a.next()?.to_string();
            let mut b = right.splitn(3, ' ');
            Some(Mount {
                mount_point,
                root,
                device,
                fstype: b.next()?.to_string(),
                source: unescape(b.next()?),
                mount_options,
                super_options: b.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let d = &b[i + 1..i + 4];
            if d.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path`: the longest mount point that is a prefix of
/// it, component by component; among equal ones the last (the one on top).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let comps: Vec<Component> = path.components().collect();
    let mut best: Option<(&Mount, usize)> = None;
    for m in mounts {
        let mc: Vec<Component> = Path::new(&m.mount_point).components().collect();
        let holds = mc.len() <= comps.len() && comps[..mc.len()] == mc[..];
        if holds && best.is_none_or(|(_, n)| mc.len() >= n) {
            best = Some((m, mc.len()));
        }
    }
    best.map(|(m, _)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_and_the_mount_of_a_path() {
        let m = parse_mountinfo(proc_fixture!("mountinfo"));
        let root = m.iter().find(|x| x.mount_point == "/").unwrap();
        assert_eq!(root.fstype, "ext4");
        assert_eq!(root.source, "/dev/vda");
        assert_eq!(root.device, "254:0");
        assert_eq!(root.mount_options, "rw,relatime");
        assert!(root.super_options.starts_with("rw,discard"));
        let shm = mount_of(&m, Path::new("/dev/shm/PostgreSQL.1")).unwrap();
        assert_eq!(
            (shm.fstype.as_str(), shm.mount_point.as_str()),
            ("tmpfs", "/dev/shm")
        );
        // The last of two mounts on /dev/shm is the one on top.
        assert_eq!(shm.device, "0:27");
        let data = mount_of(&m, Path::new("/var/lib/postgresql/15/main")).unwrap();
        assert_eq!(data.mount_point, "/");
        // "/devx" is not under "/dev".
        assert_eq!(mount_of(&m, Path::new("/devx/y")).unwrap().mount_point, "/");
    }

    #[test]
    fn mountinfo_escapes() {
        let line =
            "99 27 8:1 / /mnt/my\\040disk rw,noatime shared:5 - ext4 /dev/sdb1 rw,data=writeback\n";
        let m = parse_mountinfo(line);
        assert_eq!(m[0].mount_point, "/mnt/my disk");
        assert_eq!(m[0].super_options, "rw,data=writeback");
        assert_eq!(
            mount_of(&m, Path::new("/mnt/my disk/pg")).unwrap().device,
            "8:1"
        );
        assert_eq!(unescape("a\\134b\\04"), "a\\b\\04");
    }
}
