//! The hook registration files under `packaging/` say what the contract says:
//! `/usr/bin/tessera-hook` with argv `tessera-hook prestart|poststop`, an
//! explicit `env` on every entry (CVE-2025-23266), hooks.d schema 1.0.0 with a
//! stage podman 4.3 and CRI-O accept, and a containerd base spec that is a whole
//! OCI spec (containerd starts every container from it). Needs no root.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

const HOOK_PATH: &str = "/usr/bin/tessera-hook";
const HOOK_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

fn read_json(rel: &str) -> Value {
    let path = packaging().join(rel);
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn assert_entry(entry: &Value, verb: &str, what: &str) {
    assert_eq!(entry["path"], HOOK_PATH, "{what}: path");
    assert_eq!(
        entry["args"],
        serde_json::json!(["tessera-hook", verb]),
        "{what}: args"
    );
    assert_eq!(
        entry["env"],
        serde_json::json!([HOOK_ENV]),
        "{what}: every entry carries an explicit env"
    );
}

/// hooks.d 1.0.0 fields (containers/common `pkg/hooks/1.0.0`): anything else
/// makes podman and CRI-O refuse the file.
fn assert_hooks_d(rel: &str, verb: &str, stage: &str) -> Value {
    let file = read_json(rel);
    let keys: Vec<&str> = file
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["hook", "stages", "version", "when"], "{rel}: keys");
    assert_eq!(file["version"], "1.0.0", "{rel}");
    assert_entry(&file["hook"], verb, rel);
    assert_eq!(file["stages"], serde_json::json!([stage]), "{rel}: stages");
    file
}

#[test]
fn hooks_d_files_gate_on_the_alloc_annotation_with_explicit_env() {
    for (rel, verb, stage) in [
        ("oci-hooks.d/tessera-hook.json", "prestart", "prestart"),
        (
            "oci-hooks.d/tessera-hook-poststop.json",
            "poststop",
            "poststop",
        ),
    ] {
        let file = assert_hooks_d(rel, verb, stage);
        let annotations = file["when"]["annotations"]
            .as_object()
            .unwrap_or_else(|| panic!("{rel}: when.annotations"));
        assert_eq!(annotations.len(), 1, "{rel}");
        let (key, value) = annotations.iter().next().expect("one");
        assert_eq!(
            key, r"^tessera\.io/alloc-id$",
            "{rel}: anchored, dot escaped"
        );
        assert_eq!(value, ".*", "{rel}");
        assert!(file["when"].get("always").is_none(), "{rel}: not always");
    }
}

#[test]
fn nvidia_visible_devices_variant_runs_always_and_replaces_the_default_by_name() {
    for (name, verb, stage) in [
        ("tessera-hook.json", "prestart", "prestart"),
        ("tessera-hook-poststop.json", "poststop", "poststop"),
    ] {
        let rel = format!("oci-hooks.d/nvidia-visible-devices/{name}");
        let file = assert_hooks_d(&rel, verb, stage);
        assert_eq!(
            file["when"],
            serde_json::json!({"always": true}),
            "{rel}: hooks.d cannot match env, so the variant runs for every container"
        );
        assert!(
            packaging().join("oci-hooks.d").join(name).exists(),
            "{name}: same file name as the default, so installing one replaces the other"
        );
    }
}

#[test]
fn containerd_base_spec_is_a_whole_spec_with_both_hooks() {
    let spec = read_json("containerd/base-runtime-spec.json");
    for key in ["ociVersion", "process", "root", "mounts", "linux"] {
        assert!(
            spec.get(key).is_some(),
            "base_runtime_spec replaces containerd's default spec: {key} missing"
        );
    }
    let hooks = spec["hooks"].as_object().expect("hooks");
    let mut stages: Vec<&str> = hooks.keys().map(String::as_str).collect();
    stages.sort_unstable();
    assert_eq!(stages, ["createContainer", "poststop"]);
    assert_entry(&hooks["createContainer"][0], "prestart", "createContainer");
    assert_entry(&hooks["poststop"][0], "poststop", "poststop");
    assert_eq!(hooks["createContainer"].as_array().map(Vec::len), Some(1));
    assert_eq!(hooks["poststop"].as_array().map(Vec::len), Some(1));

    let fragment = fs::read_to_string(packaging().join("containerd/config-fragment.toml"))
        .expect("config fragment");
    assert!(
        fragment.contains("base_runtime_spec = \"/etc/containerd/tessera-base-runtime-spec.json\""),
        "{fragment}"
    );
    assert!(
        fragment.contains("container_annotations = [\"tessera.io/alloc-id\"]"),
        "{fragment}"
    );
}
