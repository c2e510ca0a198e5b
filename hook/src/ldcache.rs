//! glibc's `/etc/ld.so.cache`, read and written without running `ldconfig`.
//!
//! Pure: bytes in, bytes out; no I/O, so the parser is fuzzed as is
//! (`fuzz/fuzz_targets/ldcache.rs`). The format is the one glibc's
//! `sysdeps/generic/dl-cache.h` documents, little-endian (x86-64):
//!
//! ```text
//! offset  size  field
//! 0       20    "glibc-ld.so.cache1.1"
//! 20      4     nlibs
//! 24      4     len_strings
//! 28      1     flags (endianness: 2 = little; 0 = unset, before glibc 2.33)
//! 29      3     padding
//! 32      4     extension_offset (0: none)
//! 36      12    unused
//! 48      24*n  entries: flags i32, key u32, value u32, osversion u32, hwcap u64
//! ...           strings (NUL-terminated); key/value are offsets from byte 0
//!               of this header
//! ...           extension (4-aligned): magic 0xEAA42174, count, then count
//!               sections of (tag, flags, offset, size), offsets from byte 0
//! ```
//!
//! An older "compat" file starts with the libc5 table (`"ld.so-1.7.0"`, a
//! count and 12-byte entries) and has the header above after it, 8-aligned;
//! it is read (its new part), and always written back in the new format only,
//! which every glibc since 2.2 reads.
//!
//! Entries are sorted by key in *descending* [`libcmp`] order: `ld.so`
//! binary-searches them. Two extension sections are kept: the generator
//! string and the `glibc-hwcaps` subdirectory list (entries whose `hwcap` has
//! bit 62 set index into it); others are dropped (none exist today).
//!
//! Limits: a file over [`MAX_FILE`] bytes, more than [`MAX_ENTRIES`] entries,
//! an offset or string out of range, or a count that does not fit the file is
//! refused with a [`CacheError`], never a panic or a large allocation.

use std::cmp::Ordering;

/// Magic and version of the new format.
pub const MAGIC_NEW: &[u8; 20] = b"glibc-ld.so.cache1.1";
/// Magic of the libc5/old format (a "compat" file starts with it).
pub const MAGIC_OLD: &[u8; 11] = b"ld.so-1.7.0";
/// `FLAG_ELF_LIBC6`: an ELF library for glibc.
pub const FLAG_ELF_LIBC6: i32 = 0x0003;
/// `FLAG_X8664_LIB64`: an x86-64 library.
pub const FLAG_X8664_LIB64: i32 = 0x0300;
/// What ldconfig writes for an x86-64 glibc library (`libc6,x86-64`).
pub const FLAGS_X86_64: i32 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64;
/// What ldconfig writes for an i386 glibc library (`libc6`).
pub const FLAGS_I386: i32 = FLAG_ELF_LIBC6;
/// `hwcap` bit marking an entry of a `glibc-hwcaps` subdirectory.
pub const HWCAP_EXTENSION: u64 = 1 << 62;
/// The largest cache read (a real one is tens of KiB).
pub const MAX_FILE: usize = 16 << 20;
/// The most entries read or written.
pub const MAX_ENTRIES: usize = 1 << 16;

const HEADER: usize = 48;
const ENTRY: usize = 24;
const OLD_ENTRY: usize = 12;
const ENDIAN_LITTLE: u8 = 2;
const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
const TAG_GENERATOR: u32 = 0;
const TAG_HWCAPS: u32 = 1;
const MAX_SECTIONS: usize = 64;
const MAX_STRING: usize = 4096;

/// Why bytes are not a cache we can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// Neither magic, or too short for the header.
    #[error("not a glibc ld.so.cache (no {what})")]
    NotACache {
        /// What was missing.
        what: &'static str,
    },
    /// Larger than [`MAX_FILE`].
    #[error("{size} bytes, more than the {MAX_FILE} read")]
    TooLarge {
        /// The size.
        size: usize,
    },
    /// Big-endian or invalid endianness flag.
    #[error("endianness flag {0} is not little-endian")]
    Endian(u8),
    /// A count that cannot fit in the file, or over the limits.
    #[error("{what} count {count} does not fit the file")]
    Count {
        /// Which count.
        what: &'static str,
        /// Its value.
        count: usize,
    },
    /// A string offset out of the file, or a string without its NUL.
    #[error("string at offset {0} is out of range or unterminated")]
    String(usize),
    /// A malformed extension.
    #[error("extension: {0}")]
    Extension(&'static str),
}

/// One library: its name (`key`, the SONAME) and path (`value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `FLAGS_X86_64` and the like.
    pub flags: i32,
    /// The name looked up (`libcuda.so.1`), without NUL.
    pub key: Vec<u8>,
    /// The file (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`), without NUL.
    pub value: Vec<u8>,
    /// Unused by glibc; kept.
    pub osversion: u32,
    /// Hardware capabilities; with [`HWCAP_EXTENSION`], the low 32 bits
    /// index [`Cache::hwcaps`].
    pub hwcap: u64,
}

impl Entry {
    /// An x86-64 glibc library entry.
    pub fn x86_64(key: &str, value: &str) -> Entry {
        Entry {
            flags: FLAGS_X86_64,
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            osversion: 0,
            hwcap: 0,
        }
    }
}

/// A whole cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cache {
    /// Entries, in file order (descending by key once [`Cache::sort`]ed).
    pub entries: Vec<Entry>,
    /// The `glibc-hwcaps` subdirectory names.
    pub hwcaps: Vec<Vec<u8>>,
    /// The generator string (`ldconfig (GNU libc) …`).
    pub generator: Option<Vec<u8>>,
}

/// glibc's `_dl_cache_libcmp`, as an ordering: runs of digits compare as
/// numbers, a digit sorts after a non-digit, other bytes compare as bytes,
/// and a prefix sorts first.
pub fn libcmp(a: &[u8], b: &[u8]) -> Ordering {
    let (mut i, mut j) = (0, 0);
    loop {
        match (a.get(i), b.get(j)) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => match (x.is_ascii_digit(), y.is_ascii_digit()) {
                (true, true) => {
                    let (si, sj) = (i, j);
                    while a.get(i).is_some_and(u8::is_ascii_digit) {
                        i += 1;
                    }
                    while b.get(j).is_some_and(u8::is_ascii_digit) {
                        j += 1;
                    }
                    let ord = cmp_number(&a[si..i], &b[sj..j]);
                    if ord != Ordering::Equal {
                        return ord;
                    }
                }
                (true, false) => return Ordering::Greater,
                (false, true) => return Ordering::Less,
                (false, false) => {
                    if x != y {
                        return x.cmp(y);
                    }
                    i += 1;
                    j += 1;
                }
            },
        }
    }
}

/// Compares two runs of ASCII digits by value, whatever their length.
fn cmp_number(a: &[u8], b: &[u8]) -> Ordering {
    let strip = |s: &[u8]| -> usize { s.iter().take_while(|c| **c == b'0').count() };
    let (a, b) = (&a[strip(a)..], &b[strip(b)..]);
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    let bytes = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    let bytes = data.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// The NUL-terminated string at `offset` of `data`.
fn string_at(data: &[u8], offset: usize) -> Result<Vec<u8>, CacheError> {
    let rest = data.get(offset..).ok_or(CacheError::String(offset))?;
    let len = rest
        .iter()
        .take(MAX_STRING)
        .position(|b| *b == 0)
        .ok_or(CacheError::String(offset))?;
    Ok(rest[..len].to_vec())
}

/// Parses a cache file (new or compat format).
pub fn parse(file: &[u8]) -> Result<Cache, CacheError> {
    if file.len() > MAX_FILE {
        return Err(CacheError::TooLarge { size: file.len() });
    }
    let start = if file.starts_with(MAGIC_NEW) {
        0
    } else if file.starts_with(MAGIC_OLD) {
        // Magic padded to 12 bytes, then nlibs, then the old entries.
        let count = u32_at(file, 12).ok_or(CacheError::NotACache {
            what: "old-format count",
        })? as usize;
        let end = count
            .checked_mul(OLD_ENTRY)
            .and_then(|n| n.checked_add(16))
            .filter(|end| *end <= file.len())
            .ok_or(CacheError::Count {
                what: "old-format entry",
                count,
            })?;
        let aligned = end.div_ceil(8) * 8;
        if !file
            .get(aligned..)
            .is_some_and(|r| r.starts_with(MAGIC_NEW))
        {
            return Err(CacheError::NotACache {
                what: "new-format part after the old table",
            });
        }
        aligned
    } else {
        return Err(CacheError::NotACache {
            what: "glibc-ld.so.cache1.1 magic",
        });
    };
    let data = &file[start..];
    if data.len() < HEADER {
        return Err(CacheError::NotACache {
            what: "complete header",
        });
    }
    let nlibs = u32_at(data, 20).unwrap_or(0) as usize;
    let endian = data[28] & 3;
    if endian != 0 && endian != ENDIAN_LITTLE {
        return Err(CacheError::Endian(data[28]));
    }
    let entries_end = nlibs
        .checked_mul(ENTRY)
        .and_then(|n| n.checked_add(HEADER))
        .filter(|end| nlibs <= MAX_ENTRIES && *end <= data.len())
        .ok_or(CacheError::Count {
            what: "entry",
            count: nlibs,
        })?;
    let mut cache = Cache::default();
    for at in (HEADER..entries_end).step_by(ENTRY) {
        let field = |o| u32_at(data, at + o).unwrap_or(0);
        cache.entries.push(Entry {
            flags: field(0) as i32,
            key: string_at(data, field(4) as usize)?,
            value: string_at(data, field(8) as usize)?,
            osversion: field(12),
            hwcap: u64_at(data, at + 16).unwrap_or(0),
        });
    }
    let extension = u32_at(data, 32).unwrap_or(0) as usize;
    if extension != 0 {
        parse_extension(data, extension, &mut cache)?;
    }
    Ok(cache)
}

fn parse_extension(data: &[u8], at: usize, cache: &mut Cache) -> Result<(), CacheError> {
    let bad = CacheError::Extension;
    if u32_at(data, at) != Some(EXTENSION_MAGIC) {
        return Err(bad("no magic at its offset"));
    }
    let count = u32_at(data, at + 4).ok_or(bad("truncated"))? as usize;
    if count > MAX_SECTIONS {
        return Err(CacheError::Count {
            what: "extension section",
            count,
        });
    }
    for i in 0..count {
        let s = at + 8 + i * 16;
        let (Some(tag), Some(offset), Some(size)) =
            (u32_at(data, s), u32_at(data, s + 8), u32_at(data, s + 12))
        else {
            return Err(bad("truncated section table"));
        };
        let (offset, size) = (offset as usize, size as usize);
        let body = offset
            .checked_add(size)
            .and_then(|end| data.get(offset..end))
            .ok_or(bad("section out of range"))?;
        match tag {
            TAG_GENERATOR => cache.generator = Some(body.to_vec()),
            TAG_HWCAPS => {
                if !size.is_multiple_of(4) || size / 4 > MAX_ENTRIES {
                    return Err(bad("hwcaps section size"));
                }
                for k in (0..size).step_by(4) {
                    let str_offset = u32_at(body, k).unwrap_or(0) as usize;
                    cache.hwcaps.push(string_at(data, str_offset)?);
                }
            }
            _ => {}
        }
    }
    for e in &cache.entries {
        if e.hwcap & HWCAP_EXTENSION != 0 && (e.hwcap & 0xffff_ffff) as usize >= cache.hwcaps.len()
        {
            return Err(bad("an entry names a missing glibc-hwcaps subdirectory"));
        }
    }
    Ok(())
}

impl Cache {
    /// Sorts the entries as `ld.so` needs them: descending by key, then by
    /// flags and hwcap (descending), stable otherwise.
    pub fn sort(&mut self) {
        self.entries.sort_by(|a, b| {
            libcmp(&b.key, &a.key)
                .then(b.flags.cmp(&a.flags))
                .then(b.hwcap.cmp(&a.hwcap))
        });
    }

    /// Adds `entry`, replacing every entry with the same key, flags and hwcap
    /// (ours win over the image's), and keeps the order sorted.
    pub fn insert(&mut self, entry: Entry) {
        self.entries
            .retain(|e| !(e.key == entry.key && e.flags == entry.flags && e.hwcap == entry.hwcap));
        self.entries.push(entry);
        self.sort();
    }

    /// The paths `key` resolves to, in lookup order, with their flags.
    pub fn lookup(&self, key: &str) -> Vec<(&[u8], i32)> {
        self.entries
            .iter()
            .filter(|e| e.key == key.as_bytes())
            .map(|e| (e.value.as_slice(), e.flags))
            .collect()
    }

    /// The file's bytes, in the new format (sorted first). Strings are
    /// shared: each distinct string is written once.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut sorted = self.clone();
        sorted.sort();
        sorted.entries.truncate(MAX_ENTRIES);
        let strings_start = HEADER + sorted.entries.len() * ENTRY;
        let mut strings: Vec<u8> = Vec::new();
        let mut offsets: std::collections::HashMap<Vec<u8>, u32> = Default::default();
        let mut intern = |s: &[u8]| -> u32 {
            if let Some(o) = offsets.get(s) {
                return *o;
            }
            let o = (strings_start + strings.len()) as u32;
            strings.extend_from_slice(s);
            strings.push(0);
            offsets.insert(s.to_vec(), o);
            o
        };
        let mut table = Vec::with_capacity(sorted.entries.len() * ENTRY);
        for e in &sorted.entries {
            let (k, v) = (intern(&e.key), intern(&e.value));
            table.extend_from_slice(&e.flags.to_le_bytes());
            table.extend_from_slice(&k.to_le_bytes());
            table.extend_from_slice(&v.to_le_bytes());
            table.extend_from_slice(&e.osversion.to_le_bytes());
            table.extend_from_slice(&e.hwcap.to_le_bytes());
        }
        let hwcap_offsets: Vec<u32> = sorted.hwcaps.iter().map(|h| intern(h)).collect();

        let mut out = Vec::with_capacity(strings_start + strings.len() + 64);
        out.extend_from_slice(MAGIC_NEW);
        out.extend_from_slice(&(sorted.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.push(ENDIAN_LITTLE);
        out.extend_from_slice(&[0; 3]);
        out.extend_from_slice(&[0; 4]); // extension_offset, set below
        out.extend_from_slice(&[0; 12]);
        out.extend_from_slice(&table);
        out.extend_from_slice(&strings);

        let mut sections: Vec<(u32, Vec<u8>)> = Vec::new();
        if let Some(g) = &sorted.generator {
            sections.push((TAG_GENERATOR, g.clone()));
        }
        if !hwcap_offsets.is_empty() {
            sections.push((
                TAG_HWCAPS,
                hwcap_offsets.iter().flat_map(|o| o.to_le_bytes()).collect(),
            ));
        }
        if !sections.is_empty() {
            while !out.len().is_multiple_of(4) {
                out.push(0);
            }
            let ext = out.len();
            out[32..36].copy_from_slice(&(ext as u32).to_le_bytes());
            out.extend_from_slice(&EXTENSION_MAGIC.to_le_bytes());
            out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
            let mut body_at = ext + 8 + sections.len() * 16;
            for (tag, body) in &sections {
                body_at = body_at.div_ceil(4) * 4;
                out.extend_from_slice(&tag.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
                out.extend_from_slice(&(body_at as u32).to_le_bytes());
                out.extend_from_slice(&(body.len() as u32).to_le_bytes());
                body_at += body.len();
            }
            for (_, body) in &sections {
                while !out.len().is_multiple_of(4) {
                    out.push(0);
                }
                out.extend_from_slice(body);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Cache {
        let mut c = Cache::default();
        for (k, v) in [
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            ("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1"),
            ("libm.so.6", "/lib/x86_64-linux-gnu/libm.so.6"),
            ("libcrypt.so.1", "/lib/x86_64-linux-gnu/libcrypt.so.1"),
        ] {
            c.insert(Entry::x86_64(k, v));
        }
        c
    }

    #[test]
    fn libcmp_compares_numbers_by_value_and_digits_after_letters() {
        assert_eq!(libcmp(b"libfoo.so.10", b"libfoo.so.9"), Ordering::Greater);
        assert_eq!(libcmp(b"libfoo.so.1", b"libfoo.so.01"), Ordering::Equal);
        assert_eq!(libcmp(b"libfoo.so", b"libfoo.so.1"), Ordering::Less);
        assert_eq!(libcmp(b"lib1", b"liba"), Ordering::Greater);
        assert_eq!(libcmp(b"libcuda.so.1", b"libc.so.6"), Ordering::Greater);
        assert_eq!(libcmp(b"", b""), Ordering::Equal);
        // Long digit runs never overflow.
        assert_eq!(
            libcmp(b"x99999999999999999999999", b"x100000000000000000000000"),
            Ordering::Less
        );
    }

    #[test]
    fn a_cache_round_trips_sorted_descending() {
        let c = sample();
        let bytes = c.to_bytes();
        assert!(bytes.starts_with(MAGIC_NEW));
        assert_eq!(bytes[28], ENDIAN_LITTLE);
        let back = parse(&bytes).expect("parse");
        assert_eq!(back, c);
        let keys: Vec<_> = back
            .entries
            .iter()
            .map(|e| String::from_utf8_lossy(&e.key).into_owned())
            .collect();
        assert_eq!(
            keys,
            ["libz.so.1", "libm.so.6", "libcrypt.so.1", "libc.so.6"]
        );
        for w in back.entries.windows(2) {
            assert_ne!(libcmp(&w[0].key, &w[1].key), Ordering::Less);
        }
    }

    #[test]
    fn strings_are_offsets_from_the_header_and_shared() {
        let mut c = Cache::default();
        c.insert(Entry::x86_64("libx.so.1", "/l/libx.so.1"));
        c.insert(Entry::x86_64("libx.so.1", "/l/libx.so.1"));
        let bytes = c.to_bytes();
        assert_eq!(u32_at(&bytes, 20), Some(1));
        let key = u32_at(&bytes, HEADER + 4).expect("key") as usize;
        assert_eq!(key, HEADER + ENTRY, "strings follow the single entry");
        assert_eq!(&bytes[key..key + 10], b"libx.so.1\0");
        assert_eq!(
            u32_at(&bytes, 24).expect("len") as usize,
            "libx.so.1\0/l/libx.so.1\0".len()
        );
    }

    #[test]
    fn merging_replaces_the_images_entry_of_the_same_name_and_keeps_the_rest() {
        let mut image = sample();
        image.insert(Entry::x86_64(
            "libcuda.so.1",
            "/usr/local/cuda/compat/libcuda.so.1",
        ));
        image.insert(Entry {
            flags: FLAGS_I386,
            ..Entry::x86_64("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1")
        });
        image.generator = Some(b"ldconfig (GNU libc) stable release version 2.36".to_vec());
        let mut merged = parse(&image.to_bytes()).expect("image cache");
        merged.insert(Entry::x86_64("libcuda.so.1", "/usr/lib64/libcuda.so.1"));
        merged.insert(Entry::x86_64("libcuda.so", "/usr/lib64/libcuda.so"));
        let back = parse(&merged.to_bytes()).expect("merged");
        assert_eq!(
            back.lookup("libcuda.so.1"),
            [
                (&b"/usr/lib64/libcuda.so.1"[..], FLAGS_X86_64),
                (&b"/usr/lib/i386-linux-gnu/libcuda.so.1"[..], FLAGS_I386)
            ]
        );
        assert_eq!(back.lookup("libcuda.so").len(), 1);
        assert_eq!(back.lookup("libz.so.1").len(), 1);
        assert_eq!(back.entries.len(), 7);
        assert_eq!(back.generator, image.generator);
    }

    #[test]
    fn hwcaps_subdirectories_survive_a_rewrite() {
        let mut c = sample();
        c.hwcaps = vec![b"x86-64-v3".to_vec(), b"x86-64-v2".to_vec()];
        c.insert(Entry {
            hwcap: HWCAP_EXTENSION | 1,
            ..Entry::x86_64(
                "libz.so.1",
                "/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2/libz.so.1",
            )
        });
        let back = parse(&c.to_bytes()).expect("parse");
        assert_eq!(back.hwcaps, c.hwcaps);
        assert_eq!(back, c);
        assert_eq!(back.lookup("libz.so.1").len(), 2);
    }

    #[test]
    fn the_compat_format_is_read_from_its_new_part() {
        let new = sample().to_bytes();
        let mut file = Vec::new();
        file.extend_from_slice(MAGIC_OLD);
        file.push(0);
        file.extend_from_slice(&1u32.to_le_bytes());
        file.extend_from_slice(&[0; OLD_ENTRY]); // one old entry, never read
        while !file.len().is_multiple_of(8) {
            file.push(0);
        }
        let start = file.len();
        file.extend_from_slice(&new);
        assert_eq!(start, 32);
        assert_eq!(parse(&file).expect("compat"), sample());
    }

    #[test]
    fn the_hosts_cache_parses_and_round_trips() {
        // Written by the host's ldconfig: the real thing, when present.
        let Ok(bytes) = std::fs::read("/etc/ld.so.cache") else {
            eprintln!("no /etc/ld.so.cache on this host; the synthetic tests cover the format");
            return;
        };
        let cache = parse(&bytes).expect("the host's cache parses");
        assert!(!cache.lookup("libc.so.6").is_empty(), "libc.so.6 listed");
        assert_eq!(parse(&cache.to_bytes()).expect("rewritten"), cache);
        if bytes.starts_with(MAGIC_NEW) {
            // Same entries, same order as ldconfig wrote them.
            let mut resorted = cache.clone();
            resorted.sort();
            assert_eq!(resorted.entries, cache.entries, "ldconfig's order is ours");
        }
    }

    #[test]
    fn glibcs_own_ldconfig_reads_what_we_write() {
        // The host's ldconfig (a test-only check: the hook never runs it).
        let ldconfig = std::path::Path::new("/sbin/ldconfig");
        if !ldconfig.is_file() {
            eprintln!("no /sbin/ldconfig here; the round-trip tests cover the format");
            return;
        }
        let mut c = sample();
        c.insert(Entry::x86_64(
            "libcuda.so.1",
            "/usr/local/nvidia/lib64/libcuda.so.1",
        ));
        c.insert(Entry::x86_64(
            "libcuda.so",
            "/usr/local/nvidia/lib64/libcuda.so",
        ));
        c.generator = Some(b"tessera-hook".to_vec());
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("ld.so.cache");
        std::fs::write(&file, c.to_bytes()).expect("write");
        let out = std::process::Command::new(ldconfig)
            .arg("-C")
            .arg(&file)
            .arg("-p")
            .output()
            .expect("ldconfig -p");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.starts_with("6 libs found in cache"), "{text}");
        let listed: Vec<&str> = text.lines().skip(1).map(str::trim).collect();
        assert_eq!(
            listed.first().copied(),
            Some("libz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1")
        );
        assert!(
            listed.contains(&"libcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1")
        );
    }

    #[test]
    fn hostile_caches_are_refused_cleanly() {
        let good = sample().to_bytes();
        let with = |at: usize, value: u32| {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&value.to_le_bytes());
            b
        };
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("header only half", good[..30].to_vec()),
            ("huge count", with(20, u32::MAX)),
            ("count past the end", with(20, 1000)),
            ("key out of range", with(HEADER + 4, u32::MAX)),
            ("value at the end", with(HEADER + 8, good.len() as u32)),
            ("extension out of range", with(32, u32::MAX - 2)),
            ("extension without magic", with(32, HEADER as u32)),
            ("old count huge", {
                let mut b = b"ld.so-1.7.0\0".to_vec();
                b.extend_from_slice(&u32::MAX.to_le_bytes());
                b
            }),
            ("old part without a new part", {
                let mut b = b"ld.so-1.7.0\0".to_vec();
                b.extend_from_slice(&0u32.to_le_bytes());
                b.extend_from_slice(&[0; 64]);
                b
            }),
            ("big-endian", {
                let mut b = good.clone();
                b[28] = 3;
                b
            }),
            (
                "garbage",
                b"\x7fELF not a cache at all, just bytes".to_vec(),
            ),
        ];
        for (what, bytes) in cases {
            assert!(parse(&bytes).is_err(), "{what}: accepted");
        }
        // An unterminated last string.
        let mut cut = good.clone();
        cut.pop();
        assert!(matches!(parse(&cut), Err(CacheError::String(_))));
        // A hostile extension: a section pointing past the end.
        let mut c = sample();
        c.generator = Some(b"g".to_vec());
        let mut b = c.to_bytes();
        let ext = u32_at(&b, 32).expect("ext") as usize;
        b[ext + 8 + 12..ext + 8 + 16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&b), Err(CacheError::Extension(_))));
    }

    #[test]
    fn every_prefix_and_every_byte_flip_of_a_cache_parses_or_errs() {
        let mut c = sample();
        c.generator = Some(b"gen".to_vec());
        c.hwcaps = vec![b"x86-64-v2".to_vec()];
        let bytes = c.to_bytes();
        for n in 0..bytes.len() {
            let _ = parse(&bytes[..n]);
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            if let Ok(back) = parse(&b) {
                let _ = back.to_bytes();
            }
        }
    }
}
