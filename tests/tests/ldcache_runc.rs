//! The container finds every injected driver library by name, with any
//! image's loader: `tessera-hook` makes the SONAME and `libcuda.so` links and
//! registers the libraries in the container's `/etc/ld.so.cache`, under real
//! runc and crun, whether the runtime applied the spec (bind mode) or the hook
//! did (legacy injection).
//!
//! Two root filesystems, built here from the host's glibc (no registry):
//!
//! - **Debian layout**: glibc in `/lib/x86_64-linux-gnu`, the libraries
//!   mounted at the host's `/usr/lib/x86_64-linux-gnu` paths.
//! - **lib64 layout** (a RHEL/UBI-like image): glibc in `/usr/lib64`, found
//!   through the image's own `/etc/ld.so.cache` (made with `ldconfig -r`),
//!   the libraries mounted at `/usr/local/nvidia/lib64`, which the loader
//!   does not search. Without the hook `dlopen("libcuda.so.1")` fails there
//!   (shown); with it, it succeeds, and the image's own entries (libc) stay.
//!
//! In each, a small program `dlopen`s every injected library by SONAME and
//! by `libcuda.so`, printing where it was loaded from, and the host's static
//! `ldconfig` (copied in) runs `-p` on the container's cache.

use std::fs;
use std::path::Path;
use std::time::Duration;

use tessera_e2e::hookenv::{self, ALLOC_ANNOTATION, ALLOC_ID, HookFixture, tagged};
use tessera_e2e::ldimage::{self, LDCONFIG, Layout, Library, build_rootfs, node_libraries};
use tessera_model::cdi::Mount;
use tessera_test_support::oci::{Bundle, Container, Runtime, unique_id};
use tessera_test_support::{Need, require};

/// Where the driver libraries are mounted in `layout`: the host's directory
/// in the Debian image, one its loader does not search in the lib64 image.
fn driver_dir(layout: Layout) -> &'static str {
    match layout {
        Layout::Debian => "/usr/lib/x86_64-linux-gnu",
        Layout::Lib64 => "/usr/local/nvidia/lib64",
    }
}

/// The transient spec of [`ALLOC_ID`] with the libraries mounted in
/// `layout`'s directory, written over the fixture's.
fn write_spec(fx: &HookFixture, layout: Layout, libraries: &[Library]) -> Vec<Mount> {
    let mut spec = fx.transient_spec(ALLOC_ID).expect("spec");
    let mounts: Vec<Mount> = libraries
        .iter()
        .map(|l| Mount {
            host_path: l.host.display().to_string(),
            container_path: format!(
                "{}/{}",
                driver_dir(layout),
                l.host.file_name().expect("name").to_string_lossy()
            ),
            options: ["ro", "nosuid", "nodev", "bind"]
                .map(str::to_owned)
                .to_vec(),
            mount_type: None,
        })
        .collect();
    spec.devices[0]
        .container_edits
        .mounts
        .extend(mounts.iter().cloned());
    fs::write(
        fx.transient_spec_path(ALLOC_ID),
        serde_json::to_vec_pretty(&spec).expect("json"),
    )
    .expect("write spec");
    mounts
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The runtime applies the spec; no Tessera hook at all.
    NoHook,
    /// The runtime applies the spec; the hook binds at createContainer.
    Bind,
    /// The hook applies the spec (legacy injection) at createContainer.
    Inject,
}

fn script(names: &[String]) -> String {
    format!(
        "/usr/bin/dlopen-probe {names}; /sbin/ldconfig -p | sed 's/^/LDCONFIG /'; \
         ls -l /usr/lib/x86_64-linux-gnu/libcuda.so /usr/local/nvidia/lib64/libcuda.so 2>/dev/null | sed 's/^/LINK /'; \
         echo PROBE-DONE",
        names = names.join(" ")
    )
}

/// What every run of one layout shares.
struct Setup<'a> {
    fx: &'a HookFixture,
    program: &'a Path,
    libraries: &'a [Library],
    mounts: Vec<Mount>,
    names: &'a [String],
}

fn run(setup: &Setup<'_>, runtime: Runtime, layout: Layout, mode: Mode) -> String {
    let Setup {
        fx,
        program,
        libraries,
        names,
        ..
    } = *setup;
    let mounts = &setup.mounts;
    let mut bundle = fx.bundle(&script(names)).expect("bundle");
    build_rootfs(&bundle.rootfs(), layout, program, libraries).expect("rootfs");
    match mode {
        Mode::NoHook | Mode::Bind => {
            fx.apply_edits_like_a_runtime(&mut bundle);
            add_mounts(&mut bundle, mounts);
            bundle.env(&format!("TESSERA_ALLOC_ID={ALLOC_ID}"));
        }
        Mode::Inject => {
            bundle.annotate(ALLOC_ANNOTATION, ALLOC_ID);
        }
    }
    if mode != Mode::NoHook {
        bundle
            .hook("createContainer", &fx.hook_entry("prestart"))
            .hook("poststop", &fx.hook_entry("poststop"));
    }
    let id = unique_id("ldcache");
    let container = Container::create(runtime, &bundle, &id)
        .unwrap_or_else(|e| panic!("{runtime} {layout:?} {mode:?}: create: {}", e.stderr));
    container
        .start_and_wait(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{runtime} {layout:?} {mode:?}: {e:#}"));
    let output = container.output();
    container.delete().expect("delete");
    assert!(
        output.contains("PROBE-DONE"),
        "{runtime} {layout:?} {mode:?}: {output}"
    );
    output
}

fn add_mounts(bundle: &mut Bundle, mounts: &[Mount]) {
    let config = bundle.config_mut();
    if let Some(list) = config["mounts"].as_array_mut() {
        for m in mounts {
            list.push(serde_json::json!({
                "destination": m.container_path,
                "type": "bind",
                "source": m.host_path,
                "options": m.options,
            }));
        }
    }
}

/// What is wrong with a probe's output where every library must be found.
fn problems(output: &str, layout: Layout, names: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = driver_dir(layout);
    for name in names {
        let line = tagged(output, "DLOPEN")
            .into_iter()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()));
        match line {
            Some(l) if l.split_whitespace().nth(1) == Some("ok") => {
                let path = l.split_whitespace().nth(2).unwrap_or_default();
                if !path.starts_with(&format!("{dir}/")) {
                    problems.push(format!("{name} loaded from {path}, not from {dir}"));
                }
            }
            other => problems.push(format!("dlopen {name}: {other:?}")),
        }
        let listed = tagged(output, "LDCONFIG").into_iter().any(|l| {
            let l = l.trim();
            l.starts_with(&format!("{name} (libc6,x86-64)"))
                && l.ends_with(&format!("=> {dir}/{name}"))
        });
        if !listed {
            problems.push(format!("ldconfig -p does not list {name} => {dir}/{name}"));
        }
    }
    if !tagged(output, "LDCONFIG")
        .iter()
        .any(|l| l.trim().starts_with("libc.so.6 (libc6,x86-64)"))
    {
        problems.push("the image's own libc.so.6 entry was lost".into());
    }
    if !tagged(output, "LINK")
        .iter()
        .any(|l| l.ends_with(&format!("{dir}/libcuda.so -> libcuda.so.1")))
    {
        problems.push(format!("no {dir}/libcuda.so -> libcuda.so.1 link"));
    }
    problems
}

#[test]
fn every_injected_library_is_found_by_name_in_debian_and_lib64_images() {
    let mut needs = hookenv::needs(&["runc", "crun", "readelf", "ldd", "cc"]);
    needs.push(Need::File {
        path: LDCONFIG.into(),
        fix: "apt-get install libc-bin".into(),
    });
    if require(&needs).is_err() {
        return;
    }
    let fx = HookFixture::new("ldcache").expect("fixture");
    let program = ldimage::dlopen_probe().expect("dlopen helper");
    let libraries = node_libraries(&fx.node_root).expect("node libraries");
    let mut names: Vec<String> = libraries.iter().map(|l| l.soname.clone()).collect();
    names.push("libcuda.so".into());
    let mut failures = Vec::new();
    for layout in [Layout::Lib64, Layout::Debian] {
        let setup = Setup {
            fx: &fx,
            program: &program,
            libraries: &libraries,
            mounts: write_spec(&fx, layout, &libraries),
            names: &names,
        };
        if layout == Layout::Lib64 {
            // The control: this image's loader cannot find the libraries
            // without the hook.
            let output = run(&setup, Runtime::Runc, layout, Mode::NoHook);
            let line = tagged(&output, "DLOPEN")
                .into_iter()
                .find(|l| l.starts_with("libcuda.so.1 "))
                .unwrap_or_default()
                .to_owned();
            assert!(
                line.starts_with("libcuda.so.1 FAIL"),
                "without the hook, libcuda.so.1 should not be found in the lib64 image: {line:?}\n{output}"
            );
            assert!(
                tagged(&output, "LDCONFIG")
                    .iter()
                    .any(|l| l.trim().starts_with("libc.so.6 ")),
                "the lib64 image's own cache lists libc: {output}"
            );
        }
        for runtime in Runtime::ALL {
            for mode in [Mode::Bind, Mode::Inject] {
                let output = run(&setup, runtime, layout, mode);
                for p in problems(&output, layout, &names) {
                    failures.push(format!("{runtime} {layout:?} {mode:?}: {p}"));
                }
                if std::env::var_os("TESSERA_E2E_VERBOSE").is_some() {
                    eprintln!("{output}");
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
