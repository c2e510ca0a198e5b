//! How an ELF64 little-endian executable links: whether it has a program
//! interpreter (`PT_INTERP`) and how many `DT_NEEDED` libraries it names.
//! Parsed here, not by readelf, so the tests that pin "the hook is static"
//! depend on no tool (and check the parser against a dynamic binary).

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, ensure};

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;

/// What the dynamic-linking parts of an ELF file say.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Linking {
    /// Has a program interpreter: the dynamic loader runs it.
    pub interp: bool,
    /// `DT_NEEDED` entries.
    pub needed: usize,
}

impl Linking {
    /// Static or static-pie: no interpreter, no needed library, so an
    /// `LD_PRELOAD` cannot reach it.
    pub fn is_static(self) -> bool {
        !self.interp && self.needed == 0
    }
}

/// Reads how the ELF64 little-endian file at `path` links.
pub fn linking(path: &Path) -> Result<Linking> {
    let b = fs::read(path).with_context(|| path.display().to_string())?;
    ensure!(
        b.len() > 64 && b[..4] == *b"\x7fELF" && (b[4], b[5]) == (2, 1),
        "{} is not a 64-bit little-endian ELF file",
        path.display()
    );
    let at = |o: usize, n: usize| -> Result<&[u8]> {
        b.get(o..o + n)
            .with_context(|| format!("{}: truncated at byte {o}", path.display()))
    };
    let u16_at = |o| -> Result<u16> { Ok(u16::from_le_bytes(at(o, 2)?.try_into()?)) };
    let u32_at = |o| -> Result<u32> { Ok(u32::from_le_bytes(at(o, 4)?.try_into()?)) };
    let u64_at =
        |o| -> Result<usize> { Ok(usize::try_from(u64::from_le_bytes(at(o, 8)?.try_into()?))?) };
    let phoff = u64_at(0x20)?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    let mut out = Linking::default();
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        match u32_at(ph)? {
            PT_INTERP => out.interp = true,
            PT_DYNAMIC => {
                let offset = u64_at(ph + 8)?;
                let size = u64_at(ph + 32)?;
                for entry in (offset..offset + size).step_by(16) {
                    match u64_at(entry)? as u64 {
                        DT_NULL => break,
                        DT_NEEDED => out.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}
