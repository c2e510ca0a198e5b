//! A writer of minimal ELF64 shared objects: what the node builder installs
//! for the driver libraries it has no stand-in for.
//!
//! The object is real enough for every tool that looks at driver libraries:
//! the dynamic loader maps it (`dlopen` succeeds), `ldconfig` reads its
//! `DT_SONAME` and lists it, `readelf -d` shows the SONAME. It defines no
//! symbols and runs no code.
//!
//! Layout (file offsets equal virtual addresses; one read-write `PT_LOAD`
//! covers the whole file, because older loaders relocate the dynamic section
//! in place):
//!
//! ```text
//! 0x000  ELF header
//! 0x040  program headers: PT_LOAD, PT_DYNAMIC, PT_GNU_STACK (non-executable stack)
//! 0x0e8  .dynamic: DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_SONAME, DT_NULL
//! 0x158  .hash: one empty bucket, one chain (the null symbol)
//! 0x168  .dynsym: the null symbol
//! 0x180  .dynstr: "\0" SONAME "\0" NOTE "\0"
//! ```

/// `EM_*` of the machine this crate is built for.
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = 183; // EM_AARCH64
#[cfg(not(target_arch = "aarch64"))]
const MACHINE: u16 = 62; // EM_X86_64

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const PHDRS: usize = 3;
const DYN_ENTRIES: usize = 7;
const DYN_OFFSET: usize = EHDR_SIZE + PHDRS * PHDR_SIZE;
const HASH_OFFSET: usize = DYN_OFFSET + DYN_ENTRIES * 16;
const SYMTAB_OFFSET: usize = HASH_OFFSET + 16;
const STRTAB_OFFSET: usize = SYMTAB_OFFSET + 24;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_STACK: u32 = 0x6474_e551;
const PF_W: u32 = 2;
const PF_R: u32 = 4;

const DT_NULL: u64 = 0;
const DT_HASH: u64 = 4;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_STRSZ: u64 = 10;
const DT_SYMENT: u64 = 11;
const DT_SONAME: u64 = 14;

/// The bytes of a shared object whose `DT_SONAME` is `soname`; `note` is
/// stored in the string table too (a line saying what the file stands for).
///
/// # Panics
/// If `soname` or `note` contains a NUL byte.
pub fn shared_object(soname: &str, note: &str) -> Vec<u8> {
    assert!(
        !soname.contains('\0') && !note.contains('\0'),
        "ELF strings cannot hold NUL"
    );
    let mut strtab = vec![0u8];
    let soname_at = strtab.len() as u64;
    strtab.extend_from_slice(soname.as_bytes());
    strtab.push(0);
    strtab.extend_from_slice(note.as_bytes());
    strtab.push(0);
    let size = STRTAB_OFFSET + strtab.len();
    let size64 = size as u64;

    let mut out = Vec::with_capacity(size);
    // ELF header.
    out.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]); // 64-bit, LE, version 1, SysV
    out.extend_from_slice(&[0; 8]);
    put16(&mut out, 3); // e_type: ET_DYN
    put16(&mut out, MACHINE);
    put32(&mut out, 1); // e_version
    put64(&mut out, 0); // e_entry
    put64(&mut out, EHDR_SIZE as u64); // e_phoff
    put64(&mut out, 0); // e_shoff: no section headers
    put32(&mut out, 0); // e_flags
    put16(&mut out, EHDR_SIZE as u16);
    put16(&mut out, PHDR_SIZE as u16);
    put16(&mut out, PHDRS as u16);
    put16(&mut out, 64); // e_shentsize
    put16(&mut out, 0); // e_shnum
    put16(&mut out, 0); // e_shstrndx
    debug_assert_eq!(out.len(), EHDR_SIZE);

    // Program headers.
    phdr(&mut out, PT_LOAD, PF_R | PF_W, 0, size64, 0x1000);
    phdr(
        &mut out,
        PT_DYNAMIC,
        PF_R | PF_W,
        DYN_OFFSET as u64,
        (DYN_ENTRIES * 16) as u64,
        8,
    );
    phdr(&mut out, PT_GNU_STACK, PF_R | PF_W, 0, 0, 16);
    debug_assert_eq!(out.len(), DYN_OFFSET);

    // Dynamic section.
    for (tag, value) in [
        (DT_HASH, HASH_OFFSET as u64),
        (DT_STRTAB, STRTAB_OFFSET as u64),
        (DT_SYMTAB, SYMTAB_OFFSET as u64),
        (DT_STRSZ, strtab.len() as u64),
        (DT_SYMENT, 24),
        (DT_SONAME, soname_at),
        (DT_NULL, 0),
    ] {
        put64(&mut out, tag);
        put64(&mut out, value);
    }
    debug_assert_eq!(out.len(), HASH_OFFSET);

    // SysV hash: nbucket = 1, nchain = 1, bucket[0] = 0 (empty), chain[0] = 0.
    for word in [1, 1, 0, 0] {
        put32(&mut out, word);
    }
    // Symbol 0, the null symbol.
    out.extend_from_slice(&[0; 24]);
    debug_assert_eq!(out.len(), STRTAB_OFFSET);
    out.extend_from_slice(&strtab);
    out
}

fn phdr(out: &mut Vec<u8>, kind: u32, flags: u32, offset: u64, size: u64, align: u64) {
    put32(out, kind);
    put32(out, flags);
    put64(out, offset); // p_offset
    put64(out, offset); // p_vaddr
    put64(out, offset); // p_paddr
    put64(out, size); // p_filesz
    put64(out, size); // p_memsz
    put64(out, align);
}

fn put16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// The `DT_SONAME` of an ELF64 little-endian shared object, read through its
/// program headers (as `ldconfig` does); `None` when `bytes` is not one or
/// has no SONAME.
pub fn soname(bytes: &[u8]) -> Option<String> {
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let u64_at = |at: usize| {
        bytes
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    if bytes.get(..6)? != [0x7f, b'E', b'L', b'F', 2, 1] {
        return None;
    }
    let phoff = usize::try_from(u64_at(32)?).ok()?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    let phdrs: Vec<usize> = (0..phnum).map(|i| phoff + i * phentsize).collect();
    // Virtual address → file offset, through the PT_LOAD segments.
    let to_offset = |vaddr: u64| -> Option<usize> {
        phdrs.iter().find_map(|&ph| {
            (u32_at(ph)? == PT_LOAD).then_some(())?;
            let (off, va, filesz) = (u64_at(ph + 8)?, u64_at(ph + 16)?, u64_at(ph + 32)?);
            (va..va + filesz)
                .contains(&vaddr)
                .then(|| usize::try_from(vaddr - va + off).ok())?
        })
    };
    let dynamic = phdrs
        .iter()
        .find(|&&ph| u32_at(ph) == Some(PT_DYNAMIC))
        .and_then(|&ph| usize::try_from(u64_at(ph + 8)?).ok())?;
    let (mut strtab, mut soname) = (None, None);
    let mut at = dynamic;
    loop {
        let tag = u64_at(at)?;
        let value = u64_at(at + 8)?;
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(value),
            DT_SONAME => soname = Some(value),
            _ => {}
        }
        at += 16;
    }
    let start = to_offset(strtab?)? + usize::try_from(soname?).ok()?;
    let tail = bytes.get(start..)?;
    let end = tail.iter().position(|&b| b == 0)?;
    String::from_utf8(tail[..end].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soname_reads_back() {
        let bytes = shared_object("libnvidia-encode.so.1", "tessera-sim placeholder");
        assert_eq!(soname(&bytes).as_deref(), Some("libnvidia-encode.so.1"));
        assert_eq!(&bytes[..4], b"\x7fELF");
    }

    #[test]
    fn not_elf_has_no_soname() {
        assert_eq!(soname(b"#!/bin/sh\n"), None);
        assert_eq!(soname(b""), None);
    }
}
