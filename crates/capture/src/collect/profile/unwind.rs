//! User stacks: every executable file a sampled process maps, loaded once
//! (its `.eh_frame` unwind tables for framehop, its name for symbolization
//! at the end), and one unwinder per distinct address-space layout, which
//! all backends forked from one postmaster share.
//!
//! User frames are kept as (module, file offset) from the moment they are
//! sampled, so they can be symbolized after the process has exited and so
//! identical stacks of different backends compare equal.
use std::collections::HashMap;
use std::ops::{Deref, Range};
use std::path::PathBuf;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment};

use super::maps::{self, Mapping};

/// Bytes of a loaded file (or the vDSO image), shared by every module made from it.
pub enum Backing {
    Map(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Backing {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A section's bytes, for framehop.
#[derive(Clone)]
pub struct Bytes {
    backing: Arc<Backing>,
    range: Range<usize>,
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.backing[self.range.clone()]
    }
}

/// What pgbelow needs from one ELF file.
pub struct ElfData {
    pub backing: Arc<Backing>,
    text: Option<(Range<u64>, Range<usize>)>,
    eh_frame: Option<(Range<u64>, Range<usize>)>,
    eh_frame_hdr: Option<(Range<u64>, Range<usize>)>,
    got: Option<Range<u64>>,
    /// PT_LOAD segments: (vaddr, file offset, file size).
    loads: Vec<(u64, u64, u64)>,
    /// Has a `.symtab` (static functions resolvable) or DWARF.
    pub symtab: bool,
    /// The GNU build id in hex (where debuginfod and /usr/lib/debug/.build-id
    /// find its symbols).
    pub build_id: Option<String>,
}

impl ElfData {
    pub fn parse(backing: Arc<Backing>) -> Option<ElfData> {
        let file = object::File::parse(&*backing as &[u8]).ok()?;
        let sec = |name: &str| {
            let s = file.section_by_name(name)?;
            let (off, size) = s.file_range()?;
            Some((
                s.address()..s.address() + s.size(),
                usize::try_from(off).ok()?..usize::try_from(off + size).ok()?,
            ))
        };
        let loads = file
            .segments()
            .filter_map(|s| {
                let (off, size) = s.file_range();
                Some((s.address(), off, size)).filter(|_| size > 0)
            })
            .collect();
        let got = file
            .section_by_name(".got")
            .map(|s| s.address()..s.address() + s.size());
        let symtab = file.section_by_name(".symtab").is_some()
            || file.section_by_name(".debug_info").is_some();
        let build_id = file
            .build_id()
            .ok()
            .flatten()
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect());
        Some(ElfData {
            build_id,
            text: sec(".text"),
            eh_frame: sec(".eh_frame"),
            eh_frame_hdr: sec(".eh_frame_hdr"),
            got,
            loads,
            symtab,
            backing: backing.clone(),
        })
    }

    /// The load bias of a mapping: actual address minus the address the
    /// file states. The mapping starts at a page boundary, which may lie in
    /// the previous segment's bytes, so take the segment it overlaps most.
    fn bias(&self, m: &Mapping) -> u64 {
        let (lo, hi) = (m.offset, m.offset + (m.end - m.start));
        let best = self
            .loads
            .iter()
            .map(|&(vaddr, off, size)| (hi.min(off + size).saturating_sub(lo.max(off)), vaddr, off))
            .filter(|(overlap, _, _)| *overlap > 0)
            .max_by_key(|(overlap, _, _)| *overlap);
        match best {
            // avma(X) = start + X - m.offset; svma(X) = vaddr + X - off
            Some((_, vaddr, off)) => m
                .start
                .wrapping_sub(m.offset)
                .wrapping_add(off)
                .wrapping_sub(vaddr),
            None => m.start.wrapping_sub(m.offset),
        }
    }

    fn bytes(&self, r: &Option<(Range<u64>, Range<usize>)>) -> Option<Bytes> {
        let (_, file) = r.as_ref()?;
        (file.end <= self.backing.len()).then(|| Bytes {
            backing: self.backing.clone(),
            range: file.clone(),
        })
    }

    fn section_info(&self) -> framehop::ExplicitModuleSectionInfo<Bytes> {
        framehop::ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.as_ref().map(|t| t.0.clone()),
            text: self.bytes(&self.text),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|t| t.0.clone()),
            eh_frame: self.bytes(&self.eh_frame),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|t| t.0.clone()),
            eh_frame_hdr: self.bytes(&self.eh_frame_hdr),
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            debug_frame: None,
            text_segment_svma: None,
            text_segment: None,
        }
    }
}

/// A file (or pseudo-file such as `[vdso]`) that code was mapped from.
pub struct ModuleInfo {
    /// As /proc/PID/maps names it; empty for anonymous memory.
    pub path: String,
    /// Where pgbelow could read it (the path, or through /proc/PID/root).
    pub open_path: Option<PathBuf>,
    pub elf: Option<Arc<ElfData>>,
}

impl ModuleInfo {
    pub fn name(&self) -> &str {
        match self.path.rsplit('/').next() {
            Some(n) if !n.is_empty() => n,
            _ if self.path.is_empty() => "anon",
            _ => &self.path,
        }
    }
}

/// A user frame as kept in memory: `(module id + 1) << 48 | file offset`,
/// or an address that no file mapping covered (top 16 bits zero).
pub fn encode(module: u32, file_offset: u64) -> u64 {
    ((u64::from(module) + 1) << 48) | (file_offset & ((1 << 48) - 1))
}

/// `(module id, file offset)`, or `None` for an unmapped address.
pub fn decode(frame: u64) -> Option<(u32, u64)> {
    let m = frame >> 48;
    (m != 0).then(|| ((m - 1) as u32, frame & ((1 << 48) - 1)))
}

/// The executable mappings of one process, with the unwinder built from them.
pub struct Layout {
    pub maps: Vec<Mapping>,
    /// Module id of each mapping.
    ids: Vec<u32>,
    #[cfg(target_arch = "x86_64")]
    unwinder: framehop::x86_64::UnwinderX86_64<Bytes>,
}

impl Layout {
    pub fn covers(&self, addr: u64) -> bool {
        maps::find(&self.maps, addr).is_some()
    }

    /// The encoded frame for a user address.
    pub fn encode(&self, addr: u64) -> u64 {
        let i = self.maps.partition_point(|m| m.start <= addr);
        match i.checked_sub(1) {
            Some(i) if addr < self.maps[i].end && !self.maps[i].path.is_empty() => {
                let m = &self.maps[i];
                encode(self.ids[i], addr - m.start + m.offset)
            }
            _ => addr & ((1 << 48) - 1),
        }
    }
}

/// A layout's identity: (start, end, file offset, module id) of each mapping.
type LayoutKey = Vec<(u64, u64, u64, u32)>;

/// Every module and layout seen so far.
#[derive(Default)]
pub struct Layouts {
    pub modules: Vec<ModuleInfo>,
    by_path: HashMap<String, u32>,
    by_key: HashMap<LayoutKey, Arc<Layout>>,
    #[cfg(target_arch = "x86_64")]
    fh_modules: HashMap<(u32, u64, u64, u64), framehop::Module<Bytes>>,
    #[cfg(target_arch = "x86_64")]
    cache: Option<Box<framehop::x86_64::CacheX86_64>>,
}

impl Layouts {
    /// Read `/proc/PID/maps` and return the (shared) layout it describes.
    pub fn read(&mut self, pid: u32) -> Option<Arc<Layout>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        Some(self.layout(pid, maps::parse_exec_maps(&text)))
    }

    pub fn layout(&mut self, pid: u32, maps: Vec<Mapping>) -> Arc<Layout> {
        let ids: Vec<u32> = maps.iter().map(|m| self.module_id(&m.path, pid)).collect();
        let key: LayoutKey = maps
            .iter()
            .zip(&ids)
            .map(|(m, id)| (m.start, m.end, m.offset, *id))
            .collect();
        if let Some(l) = self.by_key.get(&key) {
            return l.clone();
        }
        #[cfg(target_arch = "x86_64")]
        let unwinder = self.unwinder_for(&maps, &ids);
        let l = Arc::new(Layout {
            maps,
            ids,
            #[cfg(target_arch = "x86_64")]
            unwinder,
        });
        self.by_key.insert(key, l.clone());
        l
    }

    fn module_id(&mut self, path: &str, pid: u32) -> u32 {
        if let Some(id) = self.by_path.get(path) {
            return *id;
        }
        let (open_path, elf) = load_module(path, pid);
        let id = self.modules.len() as u32;
        self.modules.push(ModuleInfo {
            path: path.to_string(),
            open_path,
            elf,
        });
        self.by_path.insert(path.to_string(), id);
        id
    }

    #[cfg(target_arch = "x86_64")]
    fn unwinder_for(
        &mut self,
        maps: &[Mapping],
        ids: &[u32],
    ) -> framehop::x86_64::UnwinderX86_64<Bytes> {
        use framehop::Unwinder;
        let mut u = framehop::x86_64::UnwinderX86_64::new();
        let mut done: Vec<u32> = Vec::new();
        for (m, &id) in maps.iter().zip(ids) {
            if done.contains(&id) {
                continue;
            }
            done.push(id);
            let Some(elf) = self.modules[id as usize].elf.clone() else {
                continue;
            };
            let (lo, hi) = maps
                .iter()
                .zip(ids)
                .filter(|(_, i)| **i == id)
                .fold((u64::MAX, 0), |(lo, hi), (m, _)| {
                    (lo.min(m.start), hi.max(m.end))
                });
            let bias = elf.bias(m);
            let name = self.modules[id as usize].path.clone();
            let module = self
                .fh_modules
                .entry((id, bias, lo, hi))
                .or_insert_with(|| framehop::Module::new(name, lo..hi, bias, elf.section_info()))
                .clone();
            u.add_module(module);
        }
        u
    }

    /// Unwind a user stack from its registers (BP, SP, IP) and the copied
    /// stack bytes; pushes lookup addresses (return address − 1 for callers),
    /// leaf first. True if the unwinder reached the root of the stack.
    #[cfg(target_arch = "x86_64")]
    pub fn unwind(
        &mut self,
        layout: &Layout,
        regs: [u64; 3],
        stack: &[u8],
        out: &mut Vec<u64>,
    ) -> bool {
        use framehop::Unwinder;
        const MAX_FRAMES: usize = 128;
        let [bp, sp, ip] = regs;
        let cache = self
            .cache
            .get_or_insert_with(|| Box::new(framehop::x86_64::CacheX86_64::new()));
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = usize::try_from(addr.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
            let b = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(b.try_into().map_err(|_| ())?))
        };
        let regs = framehop::x86_64::UnwindRegsX86_64::new(ip, sp, bp);
        let mut it = layout.unwinder.iter_frames(ip, regs, cache, &mut read);
        let start = out.len();
        loop {
            match it.next() {
                Ok(Some(f)) => {
                    out.push(f.address_for_lookup());
                    if out.len() - start >= MAX_FRAMES {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    }
}

/// Open an executable mapping's file (or our own copy of the vDSO) and
/// parse what unwinding and symbolization need.
fn load_module(path: &str, pid: u32) -> (Option<PathBuf>, Option<Arc<ElfData>>) {
    if path == "[vdso]" {
        return (
            None,
            own_vdso()
                .and_then(|b| ElfData::parse(Arc::new(Backing::Owned(b))))
                .map(Arc::new),
        );
    }
    if !path.starts_with('/') {
        return (None, None);
    }
    // The process may live in another mount namespace (a container).
    let candidates = [
        PathBuf::from(path),
        PathBuf::from(format!("/proc/{pid}/root{path}")),
    ];
    for p in candidates {
        let Ok(f) = std::fs::File::open(&p) else {
            continue;
        };
        // SAFETY: a read-only private mapping of a file we only read; a
        // binary replaced on disk meanwhile would give wrong symbols, not UB
        // in safe code reading bytes.
        let Ok(map) = (unsafe { memmap2::Mmap::map(&f) }) else {
            continue;
        };
        let elf = ElfData::parse(Arc::new(Backing::Map(map))).map(Arc::new);
        return (Some(p), elf);
    }
    (None, None)
}

/// The vDSO is one image per kernel: copy ours, which every process shares.
fn own_vdso() -> Option<Vec<u8>> {
    let text = std::fs::read_to_string("/proc/self/maps").ok()?;
    let m = maps::parse_exec_maps(&text)
        .into_iter()
        .find(|m| m.path == "[vdso]")?;
    let len = usize::try_from(m.end - m.start).ok()?;
    // SAFETY: [vdso] is mapped readable in this process for its lifetime.
    let bytes = unsafe { std::slice::from_raw_parts(m.start as *const u8, len) };
    Some(bytes.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let f = encode(3, 0x9b123);
        assert_eq!(decode(f), Some((3, 0x9b123)));
        assert_eq!(decode(0x7f00_1234_5678), None);
    }

    #[test]
    fn own_executable_and_vdso_load() {
        let me = std::fs::read_link("/proc/self/exe").unwrap();
        let mut l = Layouts::default();
        let layout = l.read(std::process::id()).expect("own maps");
        let id = *l.by_path.get(me.to_str().unwrap()).expect("own exe mapped");
        let elf = l.modules[id as usize].elf.as_ref().expect("own exe parsed");
        assert!(elf.eh_frame.is_some() && !elf.loads.is_empty());
        // Our own code address encodes to our executable.
        let addr = frames_round_trip as *const () as usize as u64;
        assert!(layout.covers(addr));
        assert_eq!(decode(layout.encode(addr)).map(|(m, _)| m), Some(id));
        if let Some(v) = l.by_path.get("[vdso]") {
            assert!(l.modules[*v as usize].elf.is_some(), "vDSO image parsed");
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod self_unwind {
    use super::*;

    /// Registers (BP, SP, IP) and 16 KiB of stack, as a perf sample has them.
    #[inline(never)]
    fn capture() -> ([u64; 3], Vec<u8>) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads registers only.
        unsafe {
            std::arch::asm!("lea {}, [rip]", out(reg) ip);
            std::arch::asm!("mov {}, rsp", out(reg) sp);
            std::arch::asm!("mov {}, rbp", out(reg) bp);
        }
        let top = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let (a, b) = l.split_whitespace().next()?.split_once('-')?;
                let (a, b) = (
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                );
                (a <= sp && sp < b).then_some(b)
            })
            .next()
            .unwrap();
        let len = (top - sp).min(16384) as usize;
        // SAFETY: [sp, sp + len) lies in this thread's mapped stack.
        let stack = unsafe { std::slice::from_raw_parts(sp as *const u8, len) }.to_vec();
        ([bp, sp, ip], stack)
    }

    #[test]
    fn unwinds_own_stack_to_the_thread_start() {
        let (regs, stack) = capture();
        let mut l = Layouts::default();
        let layout = l.read(std::process::id()).unwrap();
        let mut out = Vec::new();
        let complete = l.unwind(&layout, regs, &stack, &mut out);
        let enc: Vec<u64> = out.iter().map(|a| layout.encode(*a)).collect();
        let names = crate::collect::profile::symbols::symbolize_user(&l.modules, enc.clone());
        let names: Vec<String> = enc
            .iter()
            .map(|e| names.get(e).cloned().flatten().unwrap_or_default())
            .collect();
        // The innermost frame is `capture`; line-tables-only DWARF (the dev
        // profile's) names it without its module path.
        assert!(
            names[0] == "capture" || names[0].ends_with("self_unwind::capture"),
            "{names:#?}"
        );
        assert!(
            names[1].ends_with("unwinds_own_stack_to_the_thread_start"),
            "{names:#?}"
        );
        assert!(complete, "{names:#?}");
        assert!(
            names.iter().any(|n| n == "start_thread" || n == "clone3"),
            "{names:#?}"
        );
    }
}
