//! The hook binary is statically linked: no program interpreter (`PT_INTERP`)
//! and no `DT_NEEDED` entries, so the dynamic loader never runs and
//! `LD_PRELOAD` from a container's environment cannot load code into it
//! (CVE-2025-23266). The ELF is parsed by `tessera_test_support::elf`, not by
//! readelf, and the parser is checked against a dynamic binary so the test
//! can fail.

mod common;

use std::fs;
use std::process::Command;

use common::{Need, require};
use tessera_test_support::elf::{Linking, linking};

#[test]
fn hook_has_no_interpreter_and_no_needed_libraries() {
    let hook = common::hook_binary();
    assert_eq!(
        linking(&hook).expect("reading the hook's ELF headers"),
        Linking::default(),
        "{} must be statically linked (build it with hook/scripts/build-static.sh)",
        hook.display()
    );
}

#[test]
fn the_parser_sees_a_dynamic_binary() {
    // The test binary itself is dynamically linked: the positive control.
    let me = std::env::current_exe().expect("current exe");
    let l = linking(&me).expect("reading the test binary's ELF headers");
    assert!(l.interp && l.needed > 0, "{l:?}");
}

#[test]
fn ld_preload_is_inert() {
    require!(Need::Program("cc"));
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
    assert!(
        cc.is_ok_and(|s| s.success()),
        "cc could not build the preload library"
    );
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
