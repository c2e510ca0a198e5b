//! `tessera-cdi` on bad input: one clear line on stderr, exit status 1, no
//! panic, and the output file left exactly as it was.

// Helpers of these tests report failures by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod support;

use std::fs;
use std::path::Path;

use support::{stderr_of, tessera_cdi};

/// Runs `generate` against `root` into `out`, with extra arguments.
fn generate(root: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "generate".as_ref(),
        "--driver-root".as_ref(),
        root.as_os_str(),
        "--output".as_ref(),
        out.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    tessera_cdi(args)
}

/// Runs `generate` against `root` into `out` and returns the single error line.
fn generate_fails(root: &Path, out: &Path) -> String {
    let result = generate(root, out, &[]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "want one error line, got: {stderr}");
    assert!(lines[0].starts_with("tessera-cdi: "), "{stderr}");
    lines[0].to_owned()
}

/// A node and an existing spec file whose bytes must survive a failed run;
/// `None` after a skip where nodes cannot be built.
fn node_with_previous_spec(
    profile: &str,
) -> Option<(tempfile::TempDir, std::path::PathBuf, std::path::PathBuf)> {
    let (dir, root) = support::node(profile)?;
    let out = dir.path().join("tessera.io-gpu.json");
    fs::write(&out, b"previous spec").unwrap();
    Some((dir, root, out))
}

/// Rewrites the text file at `path` through `change`.
fn edit(path: &Path, change: impl FnOnce(&str) -> String) {
    let text = fs::read_to_string(path).unwrap();
    fs::write(path, change(&text)).unwrap();
}

fn assert_untouched(out: &Path) {
    assert_eq!(
        fs::read(out).unwrap(),
        b"previous spec",
        "output file changed"
    );
    let dir = out.parent().unwrap();
    let leftovers: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn missing_driver_root_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("spec.json");
    fs::write(&out, b"previous spec").unwrap();
    let line = generate_fails(&dir.path().join("absent"), &out);
    assert!(
        line.contains("driver root") && line.contains("absent"),
        "{line}"
    );
    assert!(line.contains("No such file or directory"), "{line}");
    assert_untouched(&out);
}

/// Damages a fresh node with `damage`, runs `generate` on it, and checks
/// its one error line names each of `named`; the previous spec stays.
fn damaged_node_fails_in_one_line(damage: impl FnOnce(&Path), named: &[&str]) {
    let Some((_dir, root, out)) = node_with_previous_spec("demo") else {
        return;
    };
    damage(&root);
    let line = generate_fails(&root, &out);
    for name in named {
        assert!(line.contains(name), "want {name:?} in: {line}");
    }
    assert_untouched(&out);
}

const NVML: &str = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

#[test]
fn driver_root_without_nvml_is_one_line() {
    damaged_node_fails_in_one_line(
        |root| {
            // The SONAME link and the versioned file it points to (the
            // driver falls back to a lone versioned file).
            let real = fs::canonicalize(root.join(NVML)).unwrap();
            fs::remove_file(root.join(NVML)).unwrap();
            fs::remove_file(real).unwrap();
        },
        &["libnvidia-ml.so.1"],
    );
}

#[test]
fn nvml_that_fails_to_load_is_one_line() {
    damaged_node_fails_in_one_line(
        |root| fs::write(root.join(NVML), b"not an ELF file").unwrap(),
        &["NVML"],
    );
}

#[test]
fn corrupt_mig_minors_names_file_and_line() {
    damaged_node_fails_in_one_line(
        |root| {
            edit(&root.join("proc/driver/nvidia-caps/mig-minors"), |text| {
                let mut lines: Vec<&str> = text.lines().collect();
                lines[6] = "gpu0/gi1/access";
                lines.join("\n")
            });
        },
        &["mig-minors line 7", "gpu0/gi1/access"],
    );
}

#[test]
fn unknown_gpu_model_in_the_node_fails_at_nvml_init() {
    let Some((_dir, root, out)) = node_with_previous_spec("demo") else {
        return;
    };
    edit(&root.join("run/tessera-sim/state.json"), |state| {
        state.replacen("\"H100-80GB\"", "\"H300-1TB\"", 1)
    });
    let result = generate(&root, &out, &[]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    // The simulated driver says why it did not load (as a real driver logs to
    // the kernel log); tessera-cdi adds its own single line.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tessera-cdi: "))
        .collect();
    assert_eq!(ours.len(), 1, "{stderr}");
    assert!(
        ours[0].contains("NVML") && ours[0].contains("driver is not loaded"),
        "{stderr}"
    );
    assert!(
        stderr.contains("unknown GPU model \"H300-1TB\""),
        "{stderr}"
    );
    assert_untouched(&out);
}

#[test]
fn relative_hook_path_is_refused() {
    let Some((_dir, root, out)) = node_with_previous_spec("demo") else {
        return;
    };
    let result = generate(&root, &out, &["--hook-path", "tessera-hook"]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1));
    assert!(
        stderr.contains("--hook-path") && stderr.contains("absolute"),
        "{stderr}"
    );
    assert_untouched(&out);
}

#[test]
fn list_shows_every_device_of_the_node() {
    let Some((_dir, root)) = support::node("demo") else {
        return;
    };
    let result = tessera_cdi(["list".as_ref(), "--driver-root".as_ref(), root.as_os_str()]);
    assert!(result.status.success(), "{}", stderr_of(&result));
    let table = String::from_utf8_lossy(&result.stdout);
    assert!(table.contains("tessera.io/gpu=0 "), "{table}");
    assert!(table.contains("tessera.io/gpu=1:0"), "{table}");
    assert!(table.contains("/dev/nvidia-caps/nvidia-cap"), "{table}");
    assert!(
        !table.contains("tessera.io/gpu=1 "),
        "MIG GPU offered whole: {table}"
    );
}

#[test]
fn validate_accepts_a_generated_spec_and_reports_every_problem_of_a_bad_one() {
    let Some((dir, root, out)) = node_with_previous_spec("demo") else {
        return;
    };
    let ok = generate(&root, &out, &[]);
    assert!(ok.status.success(), "{}", stderr_of(&ok));
    let valid = tessera_cdi(["validate".as_ref(), out.as_os_str()]);
    assert!(valid.status.success(), "{}", stderr_of(&valid));
    assert!(String::from_utf8_lossy(&valid.stdout).contains("valid"));

    // Two problems at once: a bad node type and a relative mount target.
    let mut spec: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["deviceNodes"][0]["type"] = "x".into();
    spec["containerEdits"]["mounts"][0]["containerPath"] = "relative/lib.so".into();
    let bad = dir.path().join("bad.json");
    fs::write(&bad, serde_json::to_vec(&spec).unwrap()).unwrap();
    let result = tessera_cdi(["validate".as_ref(), bad.as_os_str()]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1));
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "one line per problem: {stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("devices[0].containerEdits.deviceNodes[0].type")),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("containerEdits.mounts[0].containerPath")),
        "{stderr}"
    );

    // An unknown field fails the whole spec, as in the reference loader.
    spec = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    spec["devices"][0]["surprise"] = true.into();
    fs::write(&bad, serde_json::to_vec(&spec).unwrap()).unwrap();
    let result = tessera_cdi(["validate".as_ref(), bad.as_os_str()]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("surprise"), "{stderr}");

    // Not JSON at all.
    fs::write(&bad, b"{ not json").unwrap();
    let result = tessera_cdi(["validate".as_ref(), bad.as_os_str()]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("bad.json"), "{stderr}");
}

/// A transient spec as the device plugin writes it: one device named by the
/// allocation id, `TESSERA_ALLOC_ID`, and the hook at both stages.
fn transient_spec(id: &str) -> serde_json::Value {
    let hook = |stage: &str, verb: &str| {
        serde_json::json!({"hookName": stage, "path": "/usr/bin/tessera-hook",
                           "args": ["tessera-hook", verb], "env": ["PATH=/usr/bin"]})
    };
    serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "tessera.io/alloc",
        "devices": [{"name": id, "containerEdits": {
            "env": [format!("TESSERA_ALLOC_ID={id}")],
            "deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
            "hooks": [hook("createContainer", "prestart"), hook("poststop", "poststop")]
        }}]
    })
}

#[test]
fn validate_takes_several_files_and_holds_transient_specs_to_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, spec: &serde_json::Value| {
        let path = dir.path().join(name);
        fs::write(&path, serde_json::to_vec(spec).unwrap()).unwrap();
        path
    };
    let good = write("good.json", &transient_spec("pod-1-0"));
    let mut no_env = transient_spec("pod-2-0");
    no_env["devices"][0]["containerEdits"]["env"] = serde_json::json!([]);
    let no_env = write("no-env.json", &no_env);
    let mut no_poststop = transient_spec("pod-3-0");
    no_poststop["devices"][0]["containerEdits"]["hooks"]
        .as_array_mut()
        .unwrap()
        .pop();
    let no_poststop = write("no-poststop.json", &no_poststop);

    let result = tessera_cdi([
        "validate".as_ref(),
        good.as_os_str(),
        no_env.as_os_str(),
        no_poststop.as_os_str(),
    ]);
    let stderr = stderr_of(&result);
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    // Every file is checked: the good one is reported valid, each bad one
    // gets one line naming the file, the field and what is missing.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains("good.json: valid"), "{stdout}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].contains("no-env.json")
            && lines[0].contains("devices[0].containerEdits.env")
            && lines[0].contains("TESSERA_ALLOC_ID=pod-2-0"),
        "{stderr}"
    );
    assert!(
        lines[1].contains("no-poststop.json") && lines[1].contains("no poststop hook"),
        "{stderr}"
    );

    // All good: exit 0, one line each.
    let other = write("other.json", &transient_spec("pod-4-0"));
    let result = tessera_cdi(["validate".as_ref(), good.as_os_str(), other.as_os_str()]);
    assert!(result.status.success(), "{}", stderr_of(&result));
    assert_eq!(String::from_utf8_lossy(&result.stdout).lines().count(), 2);

    // No file at all is a usage error.
    let result = tessera_cdi(["validate"]);
    assert_eq!(result.status.code(), Some(2), "{}", stderr_of(&result));
}

#[test]
fn generate_writes_the_hook_config_into_the_hook_args() {
    let Some((dir, root, out)) = node_with_previous_spec("demo") else {
        return;
    };
    let result = generate(&root, &out, &["--hook-config", "/etc/tessera/node-a.toml"]);
    assert!(result.status.success(), "{}", stderr_of(&result));
    let spec: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    let hooks = spec["containerEdits"]["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(
        hooks[0]["args"],
        serde_json::json!([
            "tessera-hook",
            "--config",
            "/etc/tessera/node-a.toml",
            "prestart"
        ])
    );
    assert!(!hooks[0]["env"].as_array().unwrap().is_empty());

    // A relative config path is refused before anything is written.
    let out2 = dir.path().join("second.json");
    fs::write(&out2, b"previous spec").unwrap();
    let result = generate(&root, &out2, &["--hook-config", "hook.toml"]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--hook-config"), "{stderr}");
    assert_untouched(&out2);
}

/// A GKE-style split node: the driver files in an install directory
/// (`lib64/`, `bin/`), device nodes and `/proc` in a simulated node given by
/// `--dev-root` and `--proc-root`, NVML the node's stand-in. The spec takes
/// each from its own root, and `--library-groups` chooses the mounts.
#[test]
fn generate_takes_dev_proc_and_driver_files_from_their_own_roots() {
    let Some((dir, node, out)) = node_with_previous_spec("demo") else {
        return;
    };
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(node.join("run/tessera-sim/state.json")).unwrap())
            .unwrap();
    let version = state["driver_version"].as_str().unwrap();
    let install = dir.path().join("home/kubernetes/bin/nvidia");
    fs::create_dir_all(install.join("lib64")).unwrap();
    fs::create_dir_all(install.join("bin")).unwrap();
    let write_lib = |stem: &str, soname: &str| {
        fs::write(
            install.join(format!("lib64/{stem}.{version}")),
            tessera_driver::soname::minimal_shared_object(soname),
        )
        .unwrap();
    };
    write_lib("libcuda.so", "libcuda.so.1");
    write_lib("libnvidia-encode.so", "libnvidia-encode.so.1");
    write_lib("libnvoptix.so", "libnvoptix.so.1");
    fs::write(install.join("bin/nvidia-smi"), b"#!/bin/sh\n").unwrap();

    let nvml = node.join(NVML);
    let run = |groups: &str| {
        let result = tessera_cdi([
            "generate".as_ref(),
            "--driver-root".as_ref(),
            install.as_os_str(),
            "--dev-root".as_ref(),
            node.as_os_str(),
            "--proc-root".as_ref(),
            node.as_os_str(),
            "--nvml-lib".as_ref(),
            nvml.as_os_str(),
            "--library-groups".as_ref(),
            groups.as_ref(),
            "--output".as_ref(),
            out.as_os_str(),
        ]);
        assert!(result.status.success(), "{}", stderr_of(&result));
        let spec: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
        spec
    };
    let spec = run("compute,video,utilities");
    let edits = &spec["containerEdits"];
    let mounts: Vec<(&str, &str)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["containerPath"].as_str().unwrap(),
                m["hostPath"].as_str().unwrap(),
            )
        })
        .collect();
    let host = |rel: &str| install.join(rel).display().to_string();
    let cuda = host(&format!("lib64/libcuda.so.{version}"));
    let encode = host(&format!("lib64/libnvidia-encode.so.{version}"));
    let smi = host("bin/nvidia-smi");
    assert_eq!(
        mounts,
        [
            (
                format!("/lib64/libcuda.so.{version}").as_str(),
                cuda.as_str()
            ),
            ("/lib64/libcuda.so.1", cuda.as_str()),
            (
                &format!("/lib64/libnvidia-encode.so.{version}"),
                encode.as_str()
            ),
            ("/lib64/libnvidia-encode.so.1", encode.as_str()),
            ("/bin/nvidia-smi", smi.as_str()),
        ]
    );
    let ctl = &edits["deviceNodes"][0];
    assert_eq!(ctl["path"], "/dev/nvidiactl");
    assert_eq!(
        ctl["hostPath"].as_str().unwrap(),
        node.join("dev/nvidiactl").display().to_string()
    );

    let graphics = run("graphics");
    let paths: Vec<&str> = graphics["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            format!("/lib64/libnvoptix.so.{version}").as_str(),
            "/lib64/libnvoptix.so.1"
        ]
    );

    // Without --proc-root the install directory, which has no
    // proc/driver/nvidia, is not where /proc is looked for.
    let result = generate(
        &install,
        &out,
        &[
            "--dev-root",
            "/nonexistent-dev",
            "--nvml-lib",
            nvml.to_str().unwrap(),
        ],
    );
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("dev root /nonexistent-dev"), "{stderr}");
}

#[test]
fn an_unknown_library_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let result = tessera_cdi([
        "generate",
        "--driver-root",
        dir.path().to_str().unwrap(),
        "--library-groups",
        "compute,utility",
    ]);
    let stderr = stderr_of(&result);
    assert_eq!(result.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("compute, video, graphics, utilities"),
        "{stderr}"
    );
}

/// Dynamic MIG's starting point: every GPU in MIG mode, no instance. Plain
/// `generate` refuses it and keeps the old file; `--allow-empty` succeeds and
/// removes the spec (it could only name devices that are gone), then writes
/// one again once an instance exists.
#[test]
fn allow_empty_removes_the_spec_of_a_node_with_nothing_to_describe() {
    let Some((_dir, root, out)) = node_with_previous_spec("a100-40gb-dynamic") else {
        return;
    };
    let line = generate_fails(&root, &out);
    assert!(line.contains("nothing to describe"), "{line}");
    assert_untouched(&out);

    let one_line_ok = |extra: &[&str], output: &Path| {
        let mut args = vec!["--allow-empty"];
        args.extend_from_slice(extra);
        let result = generate(&root, output, &args);
        let stderr = stderr_of(&result);
        assert!(result.status.success(), "{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "want one line, got: {stderr}");
        (lines[0].to_owned(), result.stdout)
    };
    let (line, _) = one_line_ok(&[], &out);
    assert!(
        line.starts_with("tessera-cdi: nothing to describe")
            && line.ends_with(&format!("removed {}", out.display())),
        "{line}"
    );
    assert!(!out.exists(), "the stale spec is still there");
    let (line, _) = one_line_ok(&[], &out);
    assert!(line.ends_with("no spec written"), "{line}");
    assert!(!out.exists(), "a spec appeared");
    let (_, stdout) = one_line_ok(&[], Path::new("-"));
    assert!(stdout.is_empty(), "{}", String::from_utf8_lossy(&stdout));

    // A 1g.5gb (profile 19) made by hand: the node has a device to describe.
    use tessera_driver::GpuDriver as _;
    let driver = tessera_driver::nvml::NvmlDriver::load(
        &tessera_driver::devices::find_nvml_library(&root).unwrap(),
    )
    .unwrap();
    let gi = driver
        .create_gpu_instance(
            0,
            19,
            tessera_model::mig::placement::Placement { start: 0, size: 1 },
        )
        .unwrap();
    driver.create_compute_instance(0, gi.id).unwrap();
    let (line, _) = one_line_ok(&[], &out);
    assert!(line.contains("wrote"), "{line}");
    let spec: serde_json::Value = serde_json::from_slice(&fs::read(&out).unwrap()).unwrap();
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(names.contains(&"0:0"), "the MIG device by index: {names:?}");
    assert!(
        !names.contains(&"0"),
        "the MIG GPU offered whole: {names:?}"
    );
}
