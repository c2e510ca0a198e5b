//! Reads a shared object's `DT_SONAME` from its ELF dynamic section.
//!
//! A driver install ships each library as `lib<name>.so.<driver version>` and
//! names it, in the file itself, by its SONAME (`libcuda.so.1`): the name the
//! loader looks for and the name `ldconfig` makes a link of. Discovery reads the
//! SONAME rather than guessing it, so a host where the SONAME link is missing or
//! stale still gets the right name in the container.
//!
//! Only 64-bit little-endian ELF (x86-64, aarch64) is understood; anything else,
//! a truncated file or a file without a SONAME reads as `None`. The file is read
//! in small pieces at the offsets the headers give, never whole (the ray-tracing
//! core library is over 100 MB).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;
const DT_STRSZ: u64 = 10;
/// At most this many program headers or dynamic entries are read.
const MAX_ENTRIES: u64 = 4096;
/// The longest SONAME read.
const MAX_NAME: usize = 256;

/// The SONAME of the ELF shared object at `path`, if it is one that has one.
pub fn read(path: &Path) -> Option<String> {
    let file = File::open(path).ok()?;
    soname(&file)
}

fn bytes<const N: usize>(file: &File, offset: u64) -> Option<[u8; N]> {
    let mut buf = [0u8; N];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}

fn u16_at(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// A program header's fields that matter here.
struct Segment {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

fn soname(file: &File) -> Option<String> {
    let header: [u8; 64] = bytes(file, 0)?;
    if header[..4] != ELF_MAGIC || header[4] != ELFCLASS64 || header[5] != ELFDATA2LSB {
        return None;
    }
    let phoff = u64_at(&header, 0x20);
    let phentsize = u64::from(u16_at(&header, 0x36));
    let phnum = u64::from(u16_at(&header, 0x38));
    if phentsize < 56 || phnum > MAX_ENTRIES {
        return None;
    }
    let mut segments = Vec::new();
    for i in 0..phnum {
        let ph: [u8; 56] = bytes(file, phoff.checked_add(i.checked_mul(phentsize)?)?)?;
        segments.push(Segment {
            kind: u32_at(&ph, 0),
            offset: u64_at(&ph, 8),
            vaddr: u64_at(&ph, 16),
            filesz: u64_at(&ph, 32),
        });
    }
    let dynamic = segments.iter().find(|s| s.kind == PT_DYNAMIC)?;
    let (mut strtab, mut name) = (None, None);
    for i in 0..(dynamic.filesz / 16).min(MAX_ENTRIES) {
        let entry: [u8; 16] = bytes(file, dynamic.offset.checked_add(i * 16)?)?;
        match u64_at(&entry, 0) {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(u64_at(&entry, 8)),
            DT_SONAME => name = Some(u64_at(&entry, 8)),
            _ => {}
        }
    }
    // DT_STRTAB is an address; the loadable segment holding it maps it to the file.
    let strtab = strtab?;
    let load = segments.iter().find(|s| {
        s.kind == PT_LOAD && s.vaddr <= strtab && strtab < s.vaddr.saturating_add(s.filesz)
    })?;
    let at = (strtab - load.vaddr)
        .checked_add(load.offset)?
        .checked_add(name?)?;
    let mut buf = [0u8; MAX_NAME];
    let n = file.read_at(&mut buf, at).ok()?;
    let end = buf[..n].iter().position(|&b| b == 0)?;
    let text = std::str::from_utf8(&buf[..end]).ok()?;
    (!text.is_empty() && !text.contains('/')).then(|| text.to_owned())
}

/// The smallest 64-bit little-endian ELF shared object whose `DT_SONAME` is
/// `soname`: no code, one loadable segment, a dynamic section and a string
/// table. For tests and fixture trees that need a library's name to be real
/// (what [`read`] and a loader's cache writer look at) but not its code.
pub fn minimal_shared_object(soname: &str) -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const EHDR: u64 = 64;
    const PHDR: u64 = 56;
    let dynamic_at = EHDR + 2 * PHDR;
    let strtab_at = dynamic_at + 4 * 16;
    let strtab: Vec<u8> = [&[0u8][..], soname.as_bytes(), &[0u8]].concat();
    let total = strtab_at + strtab.len() as u64;

    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&ELF_MAGIC);
    out.extend_from_slice(&[ELFCLASS64, ELFDATA2LSB, 1, 0]);
    out.extend_from_slice(&[0u8; 8]);
    out.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    out.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // entry
    out.extend_from_slice(&EHDR.to_le_bytes()); // phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // flags
    for half in [EHDR as u16, PHDR as u16, 2, 64, 0, 0] {
        out.extend_from_slice(&half.to_le_bytes());
    }
    let mut phdr = |kind: u32, offset: u64, size: u64| {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&4u32.to_le_bytes()); // PF_R
        for word in [offset, BASE + offset, BASE + offset, size, size, 8] {
            out.extend_from_slice(&word.to_le_bytes());
        }
    };
    phdr(PT_LOAD, 0, total);
    phdr(PT_DYNAMIC, dynamic_at, 4 * 16);
    for (tag, value) in [
        (DT_STRTAB, BASE + strtab_at),
        (DT_STRSZ, strtab.len() as u64),
        (DT_SONAME, 1),
        (DT_NULL, 0),
    ] {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&strtab);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_soname_of_a_real_shared_object() {
        // The C library every Linux test machine runs on names itself libc.so.6.
        let libc = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib64/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("libc.so.6 in a known directory");
        assert_eq!(read(libc).as_deref(), Some("libc.so.6"));
    }

    #[test]
    fn reads_the_soname_of_a_minimal_shared_object() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libcuda.so.550.54.14");
        std::fs::write(&path, minimal_shared_object("libcuda.so.1")).unwrap();
        assert_eq!(read(&path).as_deref(), Some("libcuda.so.1"));
        // Through a link, as a SONAME link is.
        let link = dir.path().join("libcuda.so.1");
        std::os::unix::fs::symlink("libcuda.so.550.54.14", &link).unwrap();
        assert_eq!(read(&link).as_deref(), Some("libcuda.so.1"));
        // A name with a slash is no SONAME.
        std::fs::write(&path, minimal_shared_object("../x.so")).unwrap();
        assert_eq!(read(&path), None);
    }

    #[test]
    fn non_elf_and_truncated_files_have_none() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("libnvidia-cfg.so.1");
        std::fs::write(&text, "# placeholder\n").unwrap();
        assert_eq!(read(&text), None);
        let short = dir.path().join("short.so");
        std::fs::write(&short, [0x7f, b'E', b'L', b'F', 2, 1, 1]).unwrap();
        assert_eq!(read(&short), None);
        assert_eq!(read(&dir.path().join("absent.so")), None);
        // An executable has a dynamic section but no SONAME.
        assert_eq!(read(Path::new("/bin/sh")), None);
    }
}
