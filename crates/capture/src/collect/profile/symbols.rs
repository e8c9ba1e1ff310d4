//! Names for addresses, once at the end: kernel frames from /proc/kallsyms,
//! user frames with blazesym from each module's file. A frame that no
//! symbol covers keeps its module and offset (`[postgres+0x3a4f0]`), so a
//! stripped binary shows up as such instead of as a silent `[unknown]`.
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::{Arc, Mutex, Weak};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::unwind::{decode, Backing, ModuleInfo};
use crate::recording::schema::profile::KERNEL_SUFFIX;

/// Why /proc/kallsyms shows this process zeros, and the fix, from
/// `kernel.kptr_restrict` and `kernel.perf_event_paranoid` (the kernel's
/// kallsyms_show_value: 0 shows addresses to everyone when perf is allowed
/// (paranoid ≤ 1), else only with CAP_SYSLOG; 1 only with CAP_SYSLOG; 2 to
/// no one).
pub fn kallsyms_hidden_why(kptr_restrict: &str, paranoid: &str) -> (String, String) {
    let root = "run pgbelow as root (or grant it CAP_SYSLOG)";
    match kptr_restrict {
        "2" => (
            "kernel.kptr_restrict = 2 hides them from every process".into(),
            format!("`sysctl kernel.kptr_restrict=1` and {root}"),
        ),
        "0" => (
            format!(
                "kernel.perf_event_paranoid = {paranoid} shows them only to processes with CAP_SYSLOG"
            ),
            format!("{root}, or `sysctl kernel.perf_event_paranoid=1`"),
        ),
        kr => (
            format!("kernel.kptr_restrict = {kr} shows them only to processes with CAP_SYSLOG"),
            root.into(),
        ),
    }
}

/// Does /proc/kallsyms show addresses (not zeros, as with kptr_restrict)?
pub fn kallsyms_visible() -> bool {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open("/proc/kallsyms") else {
        return false;
    };
    std::io::BufReader::new(f)
        .lines()
        .take(16)
        .map_while(Result::ok)
        .any(|l| {
            l.split_whitespace()
                .next()
                .and_then(|a| u64::from_str_radix(a, 16).ok())
                .is_some_and(|a| a != 0)
        })
}

/// Text symbols of the running kernel.
#[derive(Debug, Default)]
pub struct Kallsyms {
    addrs: Vec<u64>,
    /// Each symbol's name in `names`: (start, length).
    spans: Vec<(u32, u32)>,
    names: String,
}

impl Kallsyms {
    /// The running kernel's symbols, shared by whoever in this process holds
    /// them (the profile, off-CPU and sampler collectors each name kernel
    /// frames at a recording's end): read and parsed again only when none
    /// holds them or a module was loaded or unloaded since.
    pub fn read() -> Arc<Kallsyms> {
        static SHARED: Mutex<Option<(String, Weak<Kallsyms>)>> = Mutex::new(None);
        let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((m, weak)) = shared.as_ref() {
            if *m == modules {
                if let Some(k) = weak.upgrade() {
                    return k;
                }
            }
        }
        let k = Arc::new(
            std::fs::read_to_string("/proc/kallsyms")
                .map(|t| Kallsyms::parse(&t))
                .unwrap_or_default(),
        );
        *shared = Some((modules, Arc::downgrade(&k)));
        k
    }

    /// Parse `/proc/kallsyms` text (`ffffffff81000000 T _stext\t[module]`,
    /// the kernel's `%px %c %s\t[%s]` columns). Cut with memchr at the known
    /// separators rather than split on whitespace: in a debug build (the
    /// tests') splitting 120,000 lines was a quarter of a 5 s recording's CPU.
    pub fn parse(text: &str) -> Kallsyms {
        let mut syms: Vec<(u64, u32, u32)> = Vec::new();
        let mut names = String::new();
        let b = text.as_bytes();
        let mut at = 0;
        while at < b.len() {
            let end = memchr::memchr(b'\n', &b[at..]).map_or(b.len(), |e| at + e);
            let line = &b[at..end];
            at = end + 1;
            let Some(sp) = memchr::memchr(b' ', line) else {
                continue;
            };
            let rest = &line[sp + 1..];
            if rest.len() < 3 || rest[1] != b' ' || !matches!(rest[0], b't' | b'T' | b'w' | b'W') {
                continue;
            }
            let name = &rest[2..];
            let name = &name[..memchr::memchr2(b'\t', b' ', name).unwrap_or(name.len())];
            let addr = std::str::from_utf8(&line[..sp])
                .ok()
                .and_then(|a| u64::from_str_radix(a, 16).ok());
            let (Some(addr), Ok(name)) = (addr, std::str::from_utf8(name)) else {
                continue;
            };
            if addr == 0 || name.is_empty() {
                continue;
            }
            syms.push((addr, names.len() as u32, name.len() as u32));
            names.push_str(name);
        }
        // Stable: of the names at one address, the first listed stays.
        syms.sort_by_key(|s| s.0);
        syms.dedup_by_key(|s| s.0);
        Kallsyms {
            addrs: syms.iter().map(|s| s.0).collect(),
            spans: syms.iter().map(|s| (s.1, s.2)).collect(),
            names,
        }
    }

    /// False when addresses are hidden (kptr_restrict, not root): all zero.
    pub fn usable(&self) -> bool {
        !self.addrs.is_empty()
    }

    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.addrs.partition_point(|a| *a <= addr).checked_sub(1)?;
        // Past the last symbol there is no telling where the text ends.
        if i + 1 == self.addrs.len() && addr - self.addrs[i] > 1 << 20 {
            return None;
        }
        let (start, len) = self.spans[i];
        self.names.get(start as usize..(start + len) as usize)
    }
}

/// A frame name safe for the folded format (`;` separates frames).
pub fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' | '\t' => ' ',
            c => c,
        })
        .collect()
}

pub fn kernel_label(k: &Kallsyms, addr: u64) -> (String, bool) {
    match k.lookup(addr) {
        Some(n) => (format!("{}{KERNEL_SUFFIX}", clean(n)), true),
        None => (format!("[kernel]{KERNEL_SUFFIX}"), false),
    }
}

/// Names of user frames, by encoded frame; `None` where no symbol covers it.
pub fn symbolize_user(
    modules: &[ModuleInfo],
    frames: impl IntoIterator<Item = u64>,
) -> HashMap<u64, Option<String>> {
    let mut by_module: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for f in frames {
        if let Some((m, off)) = decode(f) {
            by_module.entry(m).or_default().push(off);
        }
    }
    let symbolizer = Symbolizer::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .build();
    let mut out = HashMap::new();
    for (m, mut offs) in by_module {
        offs.sort_unstable();
        offs.dedup();
        let names = symbolize_module(&symbolizer, &modules[m as usize], &offs);
        for (off, name) in offs.into_iter().zip(names) {
            out.insert(super::unwind::encode(m, off), name);
        }
    }
    out
}

fn symbolize_module(s: &Symbolizer, m: &ModuleInfo, offs: &[u64]) -> Vec<Option<String>> {
    let none = || vec![None; offs.len()];
    // The vDSO has no file: symbolize our own copy of its image.
    let _tmp;
    let path = match (&m.open_path, m.elf.as_deref()) {
        (Some(p), _) => p.clone(),
        (None, Some(elf)) => {
            let Backing::Owned(bytes) = &*elf.backing else {
                return none();
            };
            let Ok(mut f) = tempfile::NamedTempFile::new() else {
                return none();
            };
            if f.write_all(bytes).is_err() {
                return none();
            }
            let p = f.path().to_path_buf();
            _tmp = f;
            p
        }
        (None, None) => return none(),
    };
    let src = Source::Elf(Elf::new(path));
    match s.symbolize(&src, Input::FileOffset(offs)) {
        Ok(syms) => syms
            .into_iter()
            .map(|r| match r {
                Symbolized::Sym(sym) => Some(clean(&sym.name)),
                Symbolized::Unknown(_) => None,
            })
            .collect(),
        Err(_) => none(),
    }
}

/// The label of a user frame no symbol covered.
pub fn unresolved_label(modules: &[ModuleInfo], frame: u64) -> String {
    match decode(frame) {
        Some((m, off)) => format!("[{}+{off:#x}]", clean(modules[m as usize].name())),
        None => "[anon]".to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hidden_kernel_addresses_name_the_setting_that_hides_them() {
        use super::kallsyms_hidden_why as why;
        // The fix never asks for the value just reported.
        let (cause, fix) = why("0", "2");
        assert!(cause.contains("perf_event_paranoid = 2"), "{cause}");
        assert!(
            fix.contains("CAP_SYSLOG") && fix.contains("perf_event_paranoid=1"),
            "{fix}"
        );
        assert!(!fix.contains("kptr_restrict=0"), "{fix}");
        let (cause, fix) = why("1", "2");
        assert!(cause.contains("kptr_restrict = 1"), "{cause}");
        assert!(fix.starts_with("run pgbelow as root"), "{fix}");
        let (cause, fix) = why("2", "1");
        assert!(cause.contains("kptr_restrict = 2"), "{cause}");
        assert!(fix.contains("kptr_restrict=1"), "{fix}");
    }

    use super::*;

    #[test]
    fn kallsyms_lookup() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_one\n\
             ffffffff81000200 D some_data\n\
             ffffffff81000300 T mutex_spin_on_owner\n\
             ffffffffc0001000 t ext4_foo\t[ext4]\n",
        );
        assert!(k.usable());
        assert_eq!(k.lookup(0xffffffff81000150), Some("do_one"));
        assert_eq!(k.lookup(0xffffffff81000250), Some("do_one")); // data is skipped
        assert_eq!(k.lookup(0xffffffff81000300), Some("mutex_spin_on_owner"));
        assert_eq!(k.lookup(0xffffffffc0001010), Some("ext4_foo"));
        assert_eq!(k.lookup(0x1000), None);
        // kptr_restrict: every address reads as zero.
        let hidden = Kallsyms::parse("0000000000000000 T _stext\n0000000000000000 t do_one\n");
        assert!(!hidden.usable());
    }

    /// The running kernel's own /proc/kallsyms, cut at its columns, names
    /// what a plain whitespace split of the same text names (the parser
    /// this one replaced), and the collectors share one copy while any of
    /// them holds it.
    #[test]
    fn the_live_kallsyms_parse_as_a_whitespace_split_does() {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let k = Kallsyms::parse(&text);
        if !k.usable() {
            eprintln!("skipped: /proc/kallsyms shows this process no addresses");
            return;
        }
        let mut reference: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then_some((addr, name))
            })
            .collect();
        reference.sort_by_key(|s| s.0);
        reference.dedup_by_key(|s| s.0);
        assert_eq!(k.addrs.len(), reference.len());
        for (addr, name) in reference.iter().step_by(97) {
            assert_eq!(k.lookup(*addr), Some(*name), "{addr:#x}");
            assert_eq!(k.lookup(addr + 1), Some(*name), "{addr:#x}+1");
        }
        assert!(
            reference.iter().any(|(_, n)| *n == "schedule"),
            "no `schedule` among {} text symbols",
            reference.len()
        );
        let a = Kallsyms::read();
        let b = Kallsyms::read();
        assert!(Arc::ptr_eq(&a, &b), "a second reader parsed its own copy");
        assert_eq!(a.addrs.len(), k.addrs.len());
    }

    #[test]
    fn names_are_folded_safe() {
        assert_eq!(clean("a;b\nc"), "a:b c");
    }
}
