//! The NVIDIAScape case (CVE-2025-23266): a `createContainer` hook entry
//! without `env` runs, under runc, with the container's environment and the
//! rootfs as its working directory, so `LD_PRELOAD=/proc/self/cwd/evil.so` from
//! an image loads the image's library into a root process on the host.
//!
//! The malicious container reaches a hook's loader by one of two routes:
//! - **inherited**: the hook entry has no `env`; runc hands the hook the
//!   container's environment (crun 1.8.1 does not: its hooks get its own);
//! - **passed**: the hook entry's `env` carries the container's `LD_PRELOAD`,
//!   as a registration that copies the container's environment would do.
//!
//! For each runtime and route a positive control — a dynamically linked no-op
//! that drains the OCI state from its stdin ([`hookenv::dynamic_noop`]), in
//! the hook's place in the very same bundle — must load the library (its
//! constructor writes a marker file on the host); a route whose
//! control does not fire proves nothing and is not counted, and the test
//! fails if no runtime counts. Then the hook, statically linked, in that
//! configuration — doing its full work for an allocation, by legacy
//! injection and by binding a container whose CDI edits the runtime applied —
//! must leave its binding record (so it ran) and must not have loaded the
//! library. The test of the tests puts a naive (dynamically linked) hook in
//! its place: the check must report it.

use std::fs;

use tessera_e2e::hookenv::{
    self, ALLOC_ANNOTATION, ALLOC_ID, HOOK_ENV, HookFixture, dynamic_noop, evil_library,
    hook_binary,
};
use tessera_e2e::hooktrace::{HookUnderTest, Probe, Trace};
use tessera_model::contract::env::ALLOC_ID as ALLOC_ID_ENV;
use tessera_test_support::elf::linking;
use tessera_test_support::oci::{HookEntry, Runtime, run_bundle_as};
use tessera_test_support::require;

/// The image's preload: `/proc/self/cwd` is the rootfs for runc's
/// `createContainer` hooks and the bundle for crun's, whose rootfs is
/// `rootfs/` in it. The loader skips the entry that does not exist.
const PRELOAD: &str = "LD_PRELOAD=/proc/self/cwd/evil.so:/proc/self/cwd/rootfs/evil.so";

#[test]
fn the_hook_binary_is_statically_linked() {
    let hook = hook_binary();
    assert!(
        !linking(&hook).expect("ELF").interp,
        "{} has a program interpreter: an LD_PRELOAD from the container could load into it \
         (build it with scripts/build-hook.sh)",
        hook.display()
    );
    let control = dynamic_noop().expect("dynamic no-op");
    assert!(
        linking(&control).expect("ELF").interp,
        "{} should be dynamically linked for the positive control",
        control.display()
    );
}

/// How the container's `LD_PRELOAD` reaches the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The hook entry has no `env`: whatever the runtime gives.
    Inherited,
    /// The hook entry's `env` carries the container's preload.
    Passed,
}

/// How the container asks for its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The annotation; the hook injects the devices.
    Legacy,
    /// The runtime applied the edits; `TESSERA_ALLOC_ID` in the env; the hook binds.
    Cdi,
}

/// What runs at `createContainer`.
#[derive(Debug, Clone, Copy)]
enum InHookPlace {
    /// The positive control.
    Control,
    /// The hook under test.
    Hook(HookUnderTest),
}

/// One run of the malicious container.
struct ScapeRun {
    /// The evil library's constructor ran (in a hook: nothing else loads it).
    loaded: bool,
    trace: Option<Trace>,
    create_error: Option<String>,
}

fn run_scape(
    fx: &HookFixture,
    runtime: Runtime,
    route: Route,
    mode: Mode,
    what: InHookPlace,
    tag: &str,
) -> ScapeRun {
    let marker = fx.dir().join(format!("loaded-{tag}"));
    let _ = fs::remove_file(&marker);
    let marker_env = format!("TESSERA_E2E_MARKER={}", marker.display());
    let mut bundle = fx.bundle("true").expect("bundle");
    fs::copy(
        evil_library().expect("evil.so"),
        bundle.rootfs().join("evil.so"),
    )
    .expect("copy evil.so");
    bundle.env(PRELOAD).env(&marker_env);
    match mode {
        Mode::Legacy => {
            bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
        }
        Mode::Cdi => {
            fx.apply_edits_like_a_runtime(&mut bundle);
            bundle.env(&format!("{ALLOC_ID_ENV}={ALLOC_ID}"));
        }
    }
    let probe = Probe::new(fx, fx.dir(), tag);
    probe.clear();
    probe.annotate(&mut bundle);
    let mut entry = match what {
        InHookPlace::Control => HookEntry {
            path: dynamic_noop().expect("dynamic no-op"),
            args: vec!["noop".into()],
            env: None,
        },
        InHookPlace::Hook(hook) => {
            let poststop = hook.entry(fx, "poststop").expect("poststop entry");
            bundle.hook("poststop", &poststop);
            hook.entry(fx, "prestart").expect("hook entry")
        }
    };
    entry.env = match route {
        Route::Inherited => None,
        Route::Passed => Some(vec![
            HOOK_ENV.to_owned(),
            PRELOAD.to_owned(),
            marker_env.clone(),
        ]),
    };
    bundle
        .hook("createContainer", &entry)
        .hook("createContainer", &probe.witness_entry().expect("witness"));
    let out = run_bundle_as(runtime, &bundle, probe.container_id()).expect("run");
    ScapeRun {
        loaded: marker.exists(),
        trace: probe.trace(runtime, &out),
        create_error: out.create_error,
    }
}

/// What the check found with one hook.
#[derive(Default)]
struct ScapeReport {
    /// Where the positive control fired: where the check counts.
    counted: Vec<(Runtime, Route, Mode)>,
    /// The library loaded into the hook under test, where the control fired.
    breaches: Vec<String>,
    /// Runs that prove nothing (no trace, a control that failed to run) or
    /// a load where the control did not fire.
    failures: Vec<String>,
    notes: Vec<String>,
}

fn check_scape(fx: &HookFixture, hook: HookUnderTest) -> ScapeReport {
    let mut report = ScapeReport::default();
    for runtime in Runtime::ALL {
        for route in [Route::Inherited, Route::Passed] {
            for mode in [Mode::Legacy, Mode::Cdi] {
                let setup = format!("{runtime}, {route:?} preload, {mode:?}");
                let tag = format!("{runtime}-{route:?}-{mode:?}-{hook:?}").to_lowercase();
                let control = run_scape(
                    fx,
                    runtime,
                    route,
                    mode,
                    InHookPlace::Control,
                    &format!("{tag}-control"),
                );
                if let Some(e) = &control.create_error {
                    report
                        .failures
                        .push(format!("{setup}: the control container failed: {e}"));
                }
                let counted = control.loaded;
                if counted {
                    report.counted.push((runtime, route, mode));
                }
                let run = run_scape(fx, runtime, route, mode, InHookPlace::Hook(hook), &tag);
                let what = format!("{setup}: {hook}");
                match &run.trace {
                    Some(Trace::Bound { .. }) => {}
                    other => report.failures.push(format!(
                        "{what} did not bind the container ({other:?}, {:?})",
                        run.create_error
                    )),
                }
                let trace = run
                    .trace
                    .as_ref()
                    .map_or("no trace".to_owned(), ToString::to_string);
                match (run.loaded, counted) {
                    (true, true) => report.breaches.push(format!(
                        "{what} loaded the container's LD_PRELOAD library ({trace})"
                    )),
                    (true, false) => report.failures.push(format!(
                        "{what} loaded the library where the control did not fire"
                    )),
                    (false, true) => report.notes.push(format!(
                        "{what}: {trace}, library not loaded; control fired: counted"
                    )),
                    (false, false) => report.notes.push(format!(
                        "{what}: {trace}, library not loaded; control did not fire: NOT COUNTED \
                         (the runtime does not hand this route's env to hooks)"
                    )),
                }
            }
        }
    }
    eprintln!(
        "{}\n{}\n{}",
        report.notes.join("\n"),
        report.breaches.join("\n"),
        report.failures.join("\n")
    );
    report
}

fn scape_fixture(tag: &str) -> Option<HookFixture> {
    if require(&hookenv::needs(&["runc", "crun", "cc"])).is_err() {
        return None;
    }
    Some(HookFixture::new(tag).expect("fixture"))
}

#[test]
fn a_container_ld_preload_reaches_a_dynamic_hook_but_not_tessera_hook() {
    let Some(fx) = scape_fixture("scape") else {
        return;
    };
    let report = check_scape(&fx, HookUnderTest::Tessera);
    assert!(
        report.breaches.is_empty() && report.failures.is_empty(),
        "\n{}\n{}",
        report.breaches.join("\n"),
        report.failures.join("\n")
    );
    assert!(
        !report.counted.is_empty(),
        "no positive control fired under any runtime: the check proves nothing"
    );
    assert!(
        report
            .counted
            .iter()
            .any(|c| (c.0, c.1) == (Runtime::Runc, Route::Inherited)),
        "the NVIDIAScape route itself (runc, no env) is not covered: {:?}",
        report.counted
    );
}

#[test]
fn naive_hook_is_caught_by_the_nvidiascape_check() {
    let Some(fx) = scape_fixture("scape-naive") else {
        return;
    };
    let report = check_scape(&fx, HookUnderTest::Naive);
    assert!(
        report.failures.is_empty(),
        "runs that prove nothing:\n{}",
        report.failures.join("\n")
    );
    assert!(!report.counted.is_empty(), "no positive control fired");
    for (runtime, route, mode) in &report.counted {
        let what = format!("{runtime}, {route:?} preload, {mode:?}: naive hook");
        assert!(
            report.breaches.iter().any(|b| b.starts_with(&what)),
            "{what}: the check did not catch the naive hook loading the library: {:?}",
            report.breaches
        );
    }
}
