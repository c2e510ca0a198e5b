//! The hook binary is statically linked: no program interpreter (`PT_INTERP`)
//! and no `DT_NEEDED` entries, so the dynamic loader never runs and
//! `LD_PRELOAD` from a container's environment cannot load code into it
//! (CVE-2025-23266). The ELF is parsed here, not by readelf, and the parser is
//! checked against a dynamic binary so the test can fail.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;

/// What the dynamic-linking parts of an ELF64 little-endian file say.
#[derive(Debug, Default, PartialEq, Eq)]
struct Linking {
    interp: bool,
    needed: usize,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes(b[o..o + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

fn linking(path: &Path) -> Linking {
    let b = fs::read(path).expect("reading the ELF file");
    assert_eq!(&b[..4], b"\x7fELF", "{} is not ELF", path.display());
    assert_eq!((b[4], b[5]), (2, 1), "expected ELF64 little-endian");
    let phoff = usize::try_from(u64_at(&b, 0x20)).expect("phoff");
    let phentsize = usize::from(u16_at(&b, 0x36));
    let phnum = usize::from(u16_at(&b, 0x38));
    let mut out = Linking::default();
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        match u32_at(&b, ph) {
            PT_INTERP => out.interp = true,
            PT_DYNAMIC => {
                let offset = usize::try_from(u64_at(&b, ph + 8)).expect("offset");
                let size = usize::try_from(u64_at(&b, ph + 32)).expect("filesz");
                for entry in (offset..offset + size).step_by(16) {
                    match u64_at(&b, entry) {
                        DT_NULL => break,
                        DT_NEEDED => out.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn hook_has_no_interpreter_and_no_needed_libraries() {
    let hook = common::hook_binary();
    assert_eq!(
        linking(hook),
        Linking::default(),
        "{} must be statically linked (build it with hook/scripts/build-static.sh)",
        hook.display()
    );
}

#[test]
fn the_parser_sees_a_dynamic_binary() {
    // The test binary itself is dynamically linked: the positive control.
    let me = std::env::current_exe().expect("current exe");
    let l = linking(&me);
    assert!(l.interp && l.needed > 0, "{l:?}");
}

#[test]
fn ld_preload_is_inert() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("evil.c");
    let lib = dir.path().join("evil.so");
    let marker = dir.path().join("loaded");
    fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void f(void) {{ FILE *m = fopen(\"{}\", \"w\"); if (m) fclose(m); }}\n",
            marker.display()
        ),
    )
    .expect("write evil.c");
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status();
    if !cc.is_ok_and(|s| s.success()) {
        eprintln!(
            "SKIP ld_preload_is_inert: no working C compiler (cc) to build the preload library"
        );
        return;
    }
    // Positive control: a dynamic program loads it.
    let status = Command::new("/bin/true")
        .env("LD_PRELOAD", &lib)
        .status()
        .expect("/bin/true");
    assert!(status.success());
    assert!(
        marker.exists(),
        "control: the preload library did not run in /bin/true"
    );
    fs::remove_file(&marker).expect("rm marker");
    // The hook does not, whatever it is asked to do.
    let out = Command::new(common::hook_binary())
        .arg("--help")
        .env_clear()
        .env("LD_PRELOAD", &lib)
        .output()
        .expect("running the hook");
    assert!(out.status.success());
    assert!(!marker.exists(), "LD_PRELOAD code ran inside tessera-hook");
}
