//! The proof under containerd's CRI: a container that asks only for
//! the static spec's `tessera.io/gpu=0` (containerd `enable_cdi`, kubelet's
//! CRI `CDI_devices` field; no allocation, no `NVIDIA_VISIBLE_DEVICES`), from
//! a lib64-layout image (glibc in `/usr/lib64`, its own `/etc/ld.so.cache`,
//! built here from the host's glibc, no registry), finds libcuda by name:
//!
//! - `dlopen` of every injected library by SONAME and of `libcuda.so` (the
//!   development link) succeeds, from the node's library directory;
//! - the loader finds `libcuda.so.1` **through the cache** (`LD_DEBUG=libs`
//!   shows `search cache=` and then the file, no `search path=`): the image
//!   was built with glibc from a Debian host, whose built-in search path
//!   happens to hold the mount directory, so only the cache lookup shows that
//!   the image's loader does not depend on it;
//! - `ldconfig -p` (the host's static `ldconfig`, copied into the image) lists
//!   each library, and the image's own `libc.so.6` entry stays.
//!
//! The same holds for a container asking for a transient spec's
//! `tessera.io/alloc=<id>` that carries the driver files (the hook's bind
//! path).
//!
//! The control: the same container with `update_ldcache = false` in
//! `hook.toml`: `ldconfig -p` does not list libcuda, there is no
//! `libcuda.so`, and the loader has to fall back to its search path.
//!
//! The hook runs from the static spec's `createContainer` entry; the
//! container asks it for nothing, so this is its static-spec path
//! (`commands::static_libraries`): only the static spec's mounts that the
//! runtime applied unchanged are registered.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_e2e::hookenv::{self, ALLOC_ID, HookFixture, hook_binary, tagged};
use tessera_e2e::ldimage::{self, LDCONFIG, Layout, Library, PROBE_IN_ROOTFS};
use tessera_model::cdi::Spec;
use tessera_model::contract::cdi::ALLOC_KIND;
use tessera_test_support::containerd::{
    self, ContainerSpec, Containerd, ImageArchive, Options, PidMode,
};
use tessera_test_support::{Need, artefact, require, run};

/// The image's name in the daemon.
const IMAGE: &str = "localhost/tessera-test/ldcache-lib64:latest";
/// Bumped when [`ldimage::build_rootfs`] changes what it puts in the image.
const RECIPE: &str = "ldcache-lib64 v1: ldimage::build_rootfs(Lib64)";
/// The static spec's device the container asks for.
const DEVICE: &str = "tessera.io/gpu=0";
/// Where the node's libraries are mounted (the host's layout).
const DRIVER_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The probe: dlopen each name, the loader's trace for `libcuda.so.1`,
/// `ldconfig -p`, the development link.
fn script(names: &[String]) -> String {
    format!(
        "{PROBE_IN_ROOTFS} {names}; \
         LD_DEBUG=libs {PROBE_IN_ROOTFS} libcuda.so.1 2>&1 | sed 's/^/TRACE /'; \
         /sbin/ldconfig -p | sed 's/^/LDCONFIG /'; \
         ls -l {DRIVER_DIR}/libcuda.so 2>&1 | sed 's/^/LINK /'; \
         echo PROBE-DONE",
        names = names.join(" ")
    )
}

/// The loader's trace lines of its search for `libcuda.so.1`, from `find
/// library=libcuda.so.1` to the first `trying file=`.
fn libcuda_search(output: &str) -> Vec<String> {
    let trace: Vec<&str> = tagged(output, "TRACE");
    let Some(start) = trace
        .iter()
        .position(|l| l.contains("find library=libcuda.so.1"))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in &trace[start..] {
        // `LD_DEBUG` lines start with the pid: `   14:\t search cache=…`.
        let line = line.trim();
        let line = line.split_once(':').map_or(line, |(_, rest)| rest.trim());
        out.push(line.to_owned());
        if line.contains("trying file=") {
            break;
        }
    }
    out
}

/// What is wrong with the output of a container whose libraries must all
/// be found.
fn problems(output: &str, names: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if !output.contains("PROBE-DONE") {
        problems.push("the probe did not finish".to_owned());
    }
    for name in names {
        let line = tagged(output, "DLOPEN")
            .into_iter()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()));
        match line.map(|l| l.split_whitespace().collect::<Vec<_>>()) {
            Some(words) if words.get(1) == Some(&"ok") => {
                let path = words.get(2).copied().unwrap_or_default();
                if !path.starts_with(&format!("{DRIVER_DIR}/")) {
                    problems.push(format!("{name} loaded from {path}, not from {DRIVER_DIR}"));
                }
            }
            other => problems.push(format!("dlopen {name}: {other:?}")),
        }
        if name == "libcuda.so" {
            continue;
        }
        let listed = tagged(output, "LDCONFIG").into_iter().any(|l| {
            let l = l.trim();
            l.starts_with(&format!("{name} (libc6,x86-64)"))
                && l.ends_with(&format!("=> {DRIVER_DIR}/{name}"))
        });
        if !listed {
            problems.push(format!(
                "ldconfig -p does not list {name} => {DRIVER_DIR}/{name}"
            ));
        }
    }
    if !tagged(output, "LDCONFIG").iter().any(|l| {
        l.trim()
            .starts_with("libc.so.6 (libc6,x86-64) => /usr/lib64/libc.so.6")
    }) {
        problems.push("the image's own libc.so.6 entry was lost".into());
    }
    let search = libcuda_search(output);
    let from_cache = search.iter().any(|l| l.starts_with("search cache="))
        && !search.iter().any(|l| l.starts_with("search path="))
        && search
            .last()
            .is_some_and(|l| l.ends_with(&format!("trying file={DRIVER_DIR}/libcuda.so.1")));
    if !from_cache {
        problems.push(format!(
            "the loader did not find libcuda.so.1 through the cache: {search:?}"
        ));
    }
    if !tagged(output, "LINK")
        .iter()
        .any(|l| l.ends_with(&format!("{DRIVER_DIR}/libcuda.so -> libcuda.so.1")))
    {
        problems.push(format!("no {DRIVER_DIR}/libcuda.so -> libcuda.so.1 link"));
    }
    problems
}

/// The lib64 image as an OCI archive, cached per machine under
/// `SCRATCH_BASE/images` (keyed by the probe, `ldconfig`, and every library
/// copied in).
fn lib64_image(program: &Path, libraries: &[Library]) -> ImageArchive {
    let mut files: Vec<PathBuf> = libraries.iter().map(|l| l.host.clone()).collect();
    files.push(program.to_owned());
    let deps = ldimage::dependencies(&files).expect("dependencies");
    let mut parts: Vec<Vec<u8>> = vec![
        RECIPE.as_bytes().to_vec(),
        fs::read(program).expect("probe"),
        fs::read(LDCONFIG).expect("ldconfig"),
        fs::read("/lib64/ld-linux-x86-64.so.2").expect("loader"),
    ];
    for dep in &deps {
        parts.push(dep.display().to_string().into_bytes());
        parts.push(fs::read(dep).expect("dependency"));
    }
    let key: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    containerd::busybox_image_archive_with("ldcache-lib64", &key, |rootfs| {
        ldimage::build_rootfs(rootfs, Layout::Lib64, program, libraries)
            .map_err(|e| std::io::Error::other(format!("{e:#}")))
    })
    .expect("the lib64 image")
}

/// Rewrites the static spec with the hook reading the fixture's config.
fn write_static_spec(fx: &HookFixture) {
    run(Command::new(artefact("tessera-cdi"))
        .args(["generate", "--driver-root"])
        .arg(&fx.node_root)
        .arg("--hook-path")
        .arg(hook_binary())
        .arg("--hook-config")
        .arg(&fx.config)
        .arg("--output")
        .arg(fx.cdi_dir.join("tessera.io-gpu.json")))
    .expect("tessera-cdi generate");
}

/// The host paths the static spec mounts.
fn static_mount_sources(fx: &HookFixture) -> Vec<String> {
    let spec: serde_json::Value = serde_json::from_slice(
        &fs::read(fx.cdi_dir.join("tessera.io-gpu.json")).expect("static spec"),
    )
    .expect("static spec JSON");
    spec["containerEdits"]["mounts"]
        .as_array()
        .expect("the static spec's mounts")
        .iter()
        .filter_map(|m| m["hostPath"].as_str().map(str::to_owned))
        .collect()
}

/// Adds the static spec's mounts (the driver files) to the fixture's
/// transient spec of [`ALLOC_ID`], as the device plugin's transient specs
/// carry them.
fn write_transient_spec_with_libraries(fx: &HookFixture) {
    let static_spec: Spec = serde_json::from_slice(
        &fs::read(fx.cdi_dir.join("tessera.io-gpu.json")).expect("static spec"),
    )
    .expect("static spec JSON");
    let mut spec = fx.transient_spec(ALLOC_ID).expect("transient spec");
    spec.container_edits
        .mounts
        .extend(static_spec.container_edits.mounts.iter().cloned());
    fs::write(
        fx.transient_spec_path(ALLOC_ID),
        serde_json::to_vec_pretty(&spec).expect("JSON"),
    )
    .expect("write the transient spec");
}

/// Runs the probe in a fresh container of `pod_name` asking for `device`.
fn probe(daemon: &Containerd, pod_name: &str, device: &str, names: &[String]) -> String {
    let pod = daemon.run_pod(pod_name, PidMode::Container).expect("pod");
    let spec = ContainerSpec::new("probe", &["/bin/sleep", "3600"])
        .image(IMAGE)
        .cdi_device(device);
    let id = pod
        .run_container(&spec)
        .unwrap_or_else(|e| panic!("{pod_name}: {e:#}\n{}", daemon.log_tail(30)));
    let out = daemon
        .exec_sync(&id, &["/bin/sh", "-c", &script(names)], 60)
        .expect("exec");
    pod.remove().expect("remove the pod");
    format!("{}{}", out.stdout, out.stderr)
}

#[test]
fn a_static_spec_container_from_a_lib64_image_finds_libcuda_by_name() {
    let mut needs = hookenv::needs(&["readelf", "ldd", "cc"]);
    needs.extend(containerd::needs());
    needs.push(Need::File {
        path: LDCONFIG.into(),
        fix: "apt-get install libc-bin".into(),
    });
    if require(&needs).is_err() {
        return;
    }
    let fx = HookFixture::new("ldcache-cri").expect("fixture");
    write_static_spec(&fx);
    let program = ldimage::dlopen_probe().expect("dlopen helper");
    let libraries = ldimage::node_libraries(&fx.node_root).expect("node libraries");
    // The libraries of the spec's groups (the default: compute, video, utilities).
    let mounted = static_mount_sources(&fx);
    let mut names: Vec<String> = libraries
        .iter()
        .filter(|l| mounted.iter().any(|m| Path::new(m) == l.host))
        .map(|l| l.soname.clone())
        .collect();
    assert!(
        names.iter().any(|n| n == "libcuda.so.1") && names.len() > 5,
        "the static spec mounts too few of the node's libraries: {names:?}"
    );
    names.push("libcuda.so".into());
    let archive = lib64_image(&program, &libraries);

    let daemon = Containerd::start(Options {
        enable_cdi: true,
        cdi_spec_dirs: vec![fx.cdi_dir.clone()],
        ..Options::default()
    })
    .expect("containerd");
    daemon.import_image_as(&archive, IMAGE).expect("import");

    // The control: the hook does not touch the libraries.
    let config = fs::read_to_string(&fx.config).expect("hook.toml");
    fs::write(&fx.config, format!("{config}update_ldcache = false\n")).expect("hook.toml");
    let output = probe(&daemon, "ldcache-off", DEVICE, &names);
    assert!(output.contains("PROBE-DONE"), "{output}");
    assert!(
        !tagged(&output, "LDCONFIG")
            .iter()
            .any(|l| l.trim().starts_with("libcuda.so.1 ")),
        "without the hook's cache update ldconfig -p must not list libcuda:\n{output}"
    );
    assert!(
        libcuda_search(&output)
            .iter()
            .any(|l| l.starts_with("search path=")),
        "without the cache the loader must search its path for libcuda.so.1:\n{output}"
    );
    assert!(
        tagged(&output, "DLOPEN")
            .iter()
            .any(|l| l.starts_with("libcuda.so FAIL")),
        "without the hook there is no libcuda.so development link:\n{output}"
    );

    fs::write(&fx.config, config).expect("hook.toml");
    let output = probe(&daemon, "ldcache-static", DEVICE, &names);
    if std::env::var_os("TESSERA_E2E_VERBOSE").is_some() {
        eprintln!("{output}");
    }
    let found = problems(&output, &names);
    assert!(
        found.is_empty(),
        "static spec:\n{}\n--- output ---\n{output}",
        found.join("\n")
    );

    // A transient spec carrying the same driver files: the hook's bind path.
    write_transient_spec_with_libraries(&fx);
    let device = format!("{ALLOC_KIND}={ALLOC_ID}");
    let output = probe(&daemon, "ldcache-transient", &device, &names);
    let found = problems(&output, &names);
    assert!(
        found.is_empty(),
        "transient spec:\n{}\n--- output ---\n{output}",
        found.join("\n")
    );
}
