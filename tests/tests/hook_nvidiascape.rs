//! The NVIDIAScape case (CVE-2025-23266): a `createContainer` hook entry
//! without `env` runs, under runc, with the container's environment and the
//! rootfs as its working directory, so `LD_PRELOAD=/proc/self/cwd/evil.so` from
//! an image loads the image's library into a root process on the host.
//!
//! Positive control: a dynamically linked no-op hook (`/bin/true`) in that
//! configuration loads the library — its constructor writes a marker file on
//! the host — which proves the test can fail. Then `tessera-hook`, statically
//! linked, in the same configuration (and doing its full work for an
//! allocation) must not load it, nor anything it runs.

use std::fs;
use std::path::Path;

use tessera_e2e::hookenv::{HookFixture, evil_library, hook_binary, is_static_elf};
use tessera_e2e::oci::{HookEntry, Runtime, run_bundle};
use tessera_e2e::prerequisites;

const DYNAMIC_NOOP: &str = "/bin/true";

#[test]
fn the_hook_binary_is_statically_linked() {
    let hook = hook_binary();
    assert!(
        is_static_elf(&hook).expect("ELF"),
        "{} has a program interpreter: an LD_PRELOAD from the container could load into it \
         (build it with scripts/build-hook.sh)",
        hook.display()
    );
    assert!(
        !is_static_elf(Path::new(DYNAMIC_NOOP)).expect("ELF"),
        "{DYNAMIC_NOOP} should be dynamically linked for the positive control"
    );
}

/// Runs the bundle with `hook` as the only createContainer hook (no `env`) and
/// the evil library preloaded from the container's env; says whether it loaded.
fn library_loaded(
    fx: &HookFixture,
    runtime: Runtime,
    hook: HookEntry,
    annotate: bool,
    tag: &str,
) -> (bool, Option<String>) {
    let marker = fx.dir().join(format!("loaded-{runtime}-{tag}"));
    let _ = fs::remove_file(&marker);
    let mut bundle = fx.bundle("true").expect("bundle");
    fs::copy(
        evil_library().expect("evil.so"),
        bundle.rootfs().join("evil.so"),
    )
    .expect("copy evil.so");
    bundle
        .env("LD_PRELOAD=/proc/self/cwd/evil.so")
        .env(&format!("TESSERA_E2E_MARKER={}", marker.display()))
        .hook("createContainer", &hook);
    if annotate {
        bundle
            .annotate(
                tessera_e2e::hookenv::ALLOC_ANNOTATION,
                tessera_e2e::hookenv::ALLOC_ID,
            )
            .hook("poststop", &fx.hook_entry("poststop"));
    }
    let out = run_bundle(runtime, &bundle, "scape").expect("run");
    (marker.exists(), out.create_error)
}

#[test]
fn a_container_ld_preload_reaches_a_dynamic_hook_but_not_tessera_hook() {
    if let Some(why) = prerequisites(&["runc", "crun", "cc"]) {
        eprintln!("SKIPPED: NVIDIAScape test: {why}");
        return;
    }
    let fx = HookFixture::new("scape").expect("fixture");
    for runtime in Runtime::ALL {
        let control = HookEntry {
            path: DYNAMIC_NOOP.into(),
            args: vec!["true".into()],
            env: None,
        };
        let (control_fired, control_err) = library_loaded(&fx, runtime, control, false, "control");
        assert_eq!(control_err, None, "{runtime}: control container");
        match runtime {
            // runc hands a createContainer hook without env the container's env.
            Runtime::Runc => assert!(
                control_fired,
                "positive control did not fire under runc: the test could not see the attack"
            ),
            // crun 1.8.1 runs hooks with its own env, not the container's: the
            // control does not fire there, and the check below is a bonus.
            Runtime::Crun => {}
        }
        eprintln!("{runtime}: positive control fired: {control_fired}");

        let args = fx.hook_args("prestart");
        for annotate in [true, false] {
            let hook = HookEntry {
                path: hook_binary(),
                args: args.clone(),
                env: None,
            };
            let (fired, err) = library_loaded(&fx, runtime, hook, annotate, "hook");
            assert!(
                !fired,
                "{runtime}: tessera-hook (allocation: {annotate}) loaded the container's LD_PRELOAD library ({err:?})"
            );
        }
    }
}
