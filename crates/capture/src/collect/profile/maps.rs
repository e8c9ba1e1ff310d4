//! `/proc/PID/maps`: where each file is mapped, read when a process is first
//! sampled so its frames can be symbolized after it has exited.

/// One executable mapping.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    /// The file path, `[vdso]`, or empty for anonymous memory.
    pub path: String,
}

/// Executable mappings of a maps file, in address order.
pub fn parse_exec_maps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
    out.sort_by_key(|m| m.start);
    out
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut field = || {
        let s = rest.trim_start();
        let end = s.find(' ').unwrap_or(s.len());
        rest = &s[end..];
        Some(&s[..end]).filter(|f| !f.is_empty())
    };
    let range = field()?;
    let perms = field()?;
    let offset = field()?;
    let _dev = field()?;
    let _inode = field()?;
    let path = rest.trim();
    if perms.as_bytes().get(2) != Some(&b'x') {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    Some(Mapping {
        start: u64::from_str_radix(a, 16).ok()?,
        end: u64::from_str_radix(b, 16).ok()?,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: path.to_string(),
    })
}

/// The mapping holding `addr`, by binary search over sorted mappings.
pub fn find(maps: &[Mapping], addr: u64) -> Option<&Mapping> {
    let i = maps.partition_point(|m| m.start <= addr);
    let m = maps.get(i.checked_sub(1)?)?;
    (addr < m.end).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines from a PostgreSQL 13 backend's /proc/PID/maps on this machine.
    const MAPS: &str = "\
55a1c5a00000-55a1c5a9b000 r--p 00000000 fd:01 4456 /var/cache/pgbelow/pg/13.23.0-beta.16/bin/postgres
55a1c5a9b000-55a1c5e2c000 r-xp 0009b000 fd:01 4456 /var/cache/pgbelow/pg/13.23.0-beta.16/bin/postgres
55a1c7a3e000-55a1c7a9f000 rw-p 00000000 00:00 0                          [heap]
7f3b1e028000-7f3b1e1bd000 r-xp 00028000 fd:01 2883  /usr/lib/x86_64-linux-gnu/libc.so.6
7f3b1e400000-7f3b1e401000 r-xp 00000000 00:00 0 
7f3b1e500000-7f3b1e501000 r-xp 00001000 fd:01 99 /tmp/my lib.so (deleted)
7ffd2b5d2000-7ffd2b5d4000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn executable_mappings_only() {
        let m = parse_exec_maps(MAPS);
        let paths: Vec<&str> = m.iter().map(|m| m.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "/var/cache/pgbelow/pg/13.23.0-beta.16/bin/postgres",
                "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "",
                "/tmp/my lib.so",
                "[vdso]",
                "[vsyscall]",
            ]
        );
        assert_eq!(m[0].offset, 0x9b000);
        let hit = find(&m, 0x55a1c5a9b123).unwrap();
        assert_eq!(hit.start, 0x55a1c5a9b000);
        assert!(find(&m, 0x55a1c5a00000).is_none()); // r--p, not executable
        assert!(find(&m, 0x10).is_none());
        assert_eq!(find(&m, 0x7ffd2b5d2001).unwrap().path, "[vdso]");
    }
}
