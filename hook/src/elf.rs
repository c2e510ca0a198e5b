//! Just enough ELF to register a shared library in `ld.so.cache`: its class
//! and machine (which cache flags it gets) and its `DT_SONAME`.
//!
//! Reads through [`ReadAt`] a few bounded pieces — the ELF header, the
//! program headers, the dynamic section and one string — never the whole
//! file (libcuda is tens of MiB). Pure over its reader, so tested and fuzzed
//! on byte slices.

use std::io;

/// Positioned reads (a file, or bytes in tests).
pub trait ReadAt {
    /// Reads up to `buf.len()` bytes at `offset`; fewer only at the end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
}

/// Which libraries the cache can hold for an x86-64 glibc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// ELF64, EM_X86_64.
    X86_64,
    /// ELF32, EM_386.
    I386,
}

/// What the cache needs of a shared object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedObject {
    /// Class and machine.
    pub arch: Arch,
    /// `DT_SONAME`, when it has one.
    pub soname: Option<String>,
}

/// The most program headers read.
const MAX_PHDRS: usize = 256;
/// The most dynamic entries read.
const MAX_DYNAMIC: usize = 4096;
/// The longest SONAME accepted.
const MAX_SONAME: usize = 255;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;

fn read_exact<R: ReadAt + ?Sized>(r: &R, offset: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0; len];
    let mut done = 0;
    while done < len {
        match r.read_at(offset.checked_add(done as u64)?, &mut buf[done..]) {
            Ok(0) | Err(_) => return None,
            Ok(n) => done += n,
        }
    }
    Some(buf)
}

struct Layout {
    wide: bool,
}

impl Layout {
    fn word(&self, b: &[u8], at: usize) -> u64 {
        if self.wide {
            b.get(at..at + 8)
                .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
        } else {
            u64::from(u32_le(b, at))
        }
    }
}

fn u32_le(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
}

fn u16_le(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_le_bytes(s.try_into().unwrap_or([0; 2])))
}

/// Reads `r` as a little-endian shared object (`ET_DYN`) for x86-64 or
/// i386; `None` when it is anything else or malformed (not a library the
/// cache can hold).
pub fn shared_object<R: ReadAt + ?Sized>(r: &R) -> Option<SharedObject> {
    let ehdr = read_exact(r, 0, 64).or_else(|| read_exact(r, 0, 52))?;
    if ehdr.get(..4)? != b"\x7fELF" || ehdr[5] != 1 || u16_le(&ehdr, 16) != 3 {
        return None;
    }
    let (arch, l) = match (ehdr[4], u16_le(&ehdr, 18)) {
        (2, 62) => (Arch::X86_64, Layout { wide: true }),
        (1, 3) => (Arch::I386, Layout { wide: false }),
        _ => return None,
    };
    let (phoff, phentsize, phnum) = if l.wide {
        (l.word(&ehdr, 32), u16_le(&ehdr, 54), u16_le(&ehdr, 56))
    } else {
        (l.word(&ehdr, 28), u16_le(&ehdr, 42), u16_le(&ehdr, 44))
    };
    let entsize = if l.wide { 56 } else { 32 };
    if usize::from(phentsize) != entsize || usize::from(phnum) > MAX_PHDRS {
        return None;
    }
    let phdrs = read_exact(r, phoff, usize::from(phentsize) * usize::from(phnum))?;
    // (offset, vaddr, filesz) of each PT_LOAD, and the dynamic segment.
    let mut loads = Vec::new();
    let mut dynamic = None;
    for p in phdrs.chunks_exact(usize::from(phentsize)) {
        let kind = u32_le(p, 0);
        let (offset, vaddr, filesz) = if l.wide {
            (l.word(p, 8), l.word(p, 16), l.word(p, 32))
        } else {
            (l.word(p, 4), l.word(p, 8), l.word(p, 16))
        };
        match kind {
            PT_LOAD => loads.push((offset, vaddr, filesz)),
            PT_DYNAMIC => dynamic = Some((offset, filesz)),
            _ => {}
        }
    }
    let Some((dyn_off, dyn_size)) = dynamic else {
        return Some(SharedObject { arch, soname: None });
    };
    let dent = if l.wide { 16 } else { 8 };
    let count = usize::try_from(dyn_size).ok()? / dent;
    let dynamic = read_exact(r, dyn_off, count.min(MAX_DYNAMIC) * dent)?;
    let (mut strtab, mut soname) = (None, None);
    for d in dynamic.chunks_exact(dent) {
        let (tag, val) = (l.word(d, 0), l.word(d, dent / 2));
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_SONAME => soname = Some(val),
            _ => {}
        }
    }
    let soname = match (strtab, soname) {
        (Some(strtab), Some(name)) => {
            // DT_STRTAB is an address: find the file offset of its segment.
            let file_off = loads.iter().find_map(|&(off, vaddr, filesz)| {
                let rel = strtab.checked_sub(vaddr)?;
                (rel < filesz).then(|| off.checked_add(rel))?
            })?;
            let at = file_off.checked_add(name)?;
            let mut buf = vec![0; MAX_SONAME + 1];
            let mut n = 0;
            while n < buf.len() {
                let Some(pos) = at.checked_add(n as u64) else {
                    break;
                };
                match r.read_at(pos, &mut buf[n..]) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k,
                }
            }
            let end = buf[..n].iter().position(|b| *b == 0)?;
            let name = std::str::from_utf8(&buf[..end]).ok()?;
            valid_soname(name).then(|| name.to_owned())
        }
        _ => None,
    };
    Some(SharedObject { arch, soname })
}

/// A SONAME the hook will create a link of that name for: a plain file name
/// of printable ASCII, not `.` or `..`.
pub fn valid_soname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SONAME
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

/// Shared-object fixtures for the unit tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::{DT_NULL, DT_SONAME, DT_STRTAB, PT_DYNAMIC, PT_LOAD};

    /// A minimal ELF64 x86-64 shared object: one PT_LOAD mapping the file
    /// at `vaddr`, a PT_DYNAMIC with DT_STRTAB and (optionally) DT_SONAME.
    pub fn tiny_so(soname: Option<&str>, vaddr: u64) -> Vec<u8> {
        let mut f = vec![0u8; 64 + 2 * 56];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        f[6] = 1;
        f[16..18].copy_from_slice(&3u16.to_le_bytes());
        f[18..20].copy_from_slice(&62u16.to_le_bytes());
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&2u16.to_le_bytes());
        let strtab = f.len() as u64;
        let mut strings = vec![0u8];
        let name_off = strings.len() as u64;
        strings.extend_from_slice(soname.unwrap_or("").as_bytes());
        strings.push(0);
        f.extend_from_slice(&strings);
        while !f.len().is_multiple_of(8) {
            f.push(0);
        }
        let dyn_off = f.len() as u64;
        let mut dynamic = vec![(DT_STRTAB, vaddr + strtab)];
        if soname.is_some() {
            dynamic.push((DT_SONAME, name_off));
        }
        dynamic.push((DT_NULL, 0));
        for (t, v) in &dynamic {
            f.extend_from_slice(&t.to_le_bytes());
            f.extend_from_slice(&v.to_le_bytes());
        }
        let total = f.len() as u64;
        let ph = |f: &mut Vec<u8>, i: usize, kind: u32, off: u64, va: u64, size: u64| {
            let p = 64 + i * 56;
            f[p..p + 4].copy_from_slice(&kind.to_le_bytes());
            f[p + 8..p + 16].copy_from_slice(&off.to_le_bytes());
            f[p + 16..p + 24].copy_from_slice(&va.to_le_bytes());
            f[p + 32..p + 40].copy_from_slice(&size.to_le_bytes());
        };
        ph(&mut f, 0, PT_LOAD, 0, vaddr, total);
        ph(
            &mut f,
            1,
            PT_DYNAMIC,
            dyn_off,
            vaddr + dyn_off,
            dynamic.len() as u64 * 16,
        );
        f
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::tiny_so;
    use super::*;

    #[test]
    fn the_soname_is_read_through_the_load_segment() {
        for vaddr in [0, 0x40_0000] {
            let so = tiny_so(Some("libcuda.so.1"), vaddr);
            assert_eq!(
                shared_object(so.as_slice()),
                Some(SharedObject {
                    arch: Arch::X86_64,
                    soname: Some("libcuda.so.1".into())
                })
            );
        }
        let none = tiny_so(None, 0);
        assert_eq!(shared_object(none.as_slice()).and_then(|s| s.soname), None);
    }

    #[test]
    fn a_real_library_of_the_host_has_its_soname() {
        for path in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ] {
            if let Ok(file) = std::fs::File::open(path) {
                let so = shared_object(&file).expect("libc is a shared object");
                assert_eq!(so.arch, Arch::X86_64);
                assert_eq!(so.soname.as_deref(), Some("libc.so.6"));
                return;
            }
        }
        eprintln!("no x86-64 libc.so.6 on this host; the synthetic tests cover the reader");
    }

    #[test]
    fn other_files_are_not_shared_objects_and_bad_sonames_are_dropped() {
        assert_eq!(shared_object(&b"not elf"[..]), None);
        assert_eq!(shared_object(&b""[..]), None);
        let mut exec = tiny_so(Some("libx.so.1"), 0);
        exec[16] = 2; // ET_EXEC
        assert_eq!(shared_object(exec.as_slice()), None);
        let mut arm = tiny_so(Some("libx.so.1"), 0);
        arm[18] = 183; // EM_AARCH64
        assert_eq!(shared_object(arm.as_slice()), None);
        for bad in ["../../etc/passwd", "a/b", "..", "lib x.so"] {
            let so = tiny_so(Some(bad), 0);
            assert_eq!(
                shared_object(so.as_slice()).and_then(|s| s.soname),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn truncations_and_flips_never_panic() {
        let so = tiny_so(Some("libnvidia-ml.so.1"), 0x1000);
        for n in 0..so.len() {
            let _ = shared_object(&so[..n]);
        }
        for i in 0..so.len() {
            let mut b = so.clone();
            b[i] ^= 0xff;
            let _ = shared_object(b.as_slice());
        }
    }
}
