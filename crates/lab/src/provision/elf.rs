//! Just enough ELF to tell whether a binary still has its `.symtab`.
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

const SHT_SYMTAB: u32 = 2;

/// True if the ELF file at `path` has a section of type `SHT_SYMTAB`.
/// Any read or format problem answers `false`.
pub fn has_symtab(path: &Path) -> bool {
    symtab_present(path).unwrap_or(false)
}

fn symtab_present(path: &Path) -> Option<bool> {
    let mut f = File::open(path).ok()?;
    let mut hdr = [0u8; 64];
    f.read_exact(&mut hdr[..52]).ok()?;
    if &hdr[..4] != b"\x7fELF" {
        return None;
    }
    let is64 = match hdr[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let le = match hdr[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    if is64 {
        f.read_exact(&mut hdr[52..64]).ok()?;
    }
    let u16_at = |b: &[u8], o: usize| {
        let a = [b[o], b[o + 1]];
        if le {
            u16::from_le_bytes(a)
        } else {
            u16::from_be_bytes(a)
        }
    };
    let u32_at = |b: &[u8], o: usize| {
        let a = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let u64_at = |b: &[u8], o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        if le {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let (shoff, shentsize, mut shnum) = if is64 {
        (
            u64_at(&hdr, 0x28),
            u16_at(&hdr, 0x3A),
            u16_at(&hdr, 0x3C) as u64,
        )
    } else {
        (
            u32_at(&hdr, 0x20) as u64,
            u16_at(&hdr, 0x2E),
            u16_at(&hdr, 0x30) as u64,
        )
    };
    let shentsize = shentsize as usize;
    if shoff == 0 || shentsize < 8 {
        return Some(false);
    }
    let mut ent = vec![0u8; shentsize];
    f.seek(SeekFrom::Start(shoff)).ok()?;
    if shnum == 0 {
        // More than 0xff00 sections: the real count is section 0's sh_size.
        f.read_exact(&mut ent).ok()?;
        shnum = if is64 {
            u64_at(&ent, 0x20)
        } else {
            u32_at(&ent, 0x14) as u64
        };
        f.seek(SeekFrom::Start(shoff)).ok()?;
    }
    for _ in 0..shnum.min(1 << 20) {
        f.read_exact(&mut ent).ok()?;
        if u32_at(&ent, 4) == SHT_SYMTAB {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_elf_and_missing_files_have_no_symtab() {
        assert!(!has_symtab(Path::new("/nonexistent/postgres")));
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), b"#!/bin/sh\necho hi\n").unwrap();
        assert!(!has_symtab(f.path()));
    }

    #[test]
    fn test_binary_has_symtab() {
        // Test binaries are built unstripped.
        let exe = std::env::current_exe().unwrap();
        assert!(has_symtab(&exe));
    }
}
