//! A second, independent loader: the Rust `container-device-interface` crate
//! (schema validation, version rules, edit application) must accept every spec
//! Tessera writes — the reviewed golden files and a freshly generated one — and
//! inject the same device nodes Tessera's spec lists.

// Helpers of this test report failures by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use container_device_interface::cache::new_cache;
use container_device_interface::spec::read_spec;
use container_device_interface::spec_dirs::with_spec_dirs;
use tessera_model::cdi::Spec;
use tessera_test_support::node::SimNode;
use tessera_test_support::{Need, artefact, require, run};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../cdi-gen/tests/golden")
}

/// Loads `spec_path` with the reference-style loader and checks every device
/// injects exactly the nodes (path, major, minor) our own types read.
fn cross_check(spec_path: &Path) {
    let ours: Spec = serde_json::from_str(&fs::read_to_string(spec_path).unwrap()).unwrap();
    let theirs = read_spec(&spec_path.to_path_buf(), 0).unwrap_or_else(|e| {
        panic!(
            "{}: rejected by container-device-interface: {e:#}",
            spec_path.display()
        )
    });
    let their_names: BTreeSet<String> = theirs.get_devices().keys().cloned().collect();
    let our_names: BTreeSet<String> = ours.devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(their_names, our_names, "{}", spec_path.display());

    let dir = tempfile::tempdir().unwrap();
    fs::copy(spec_path, dir.path().join("spec.json")).unwrap();
    let cache = new_cache(vec![with_spec_dirs(&[dir.path().to_str().unwrap()])]);
    let mut cache = cache.lock().unwrap();
    cache.refresh().unwrap();
    for device in &ours.devices {
        let mut oci = oci_spec::runtime::Spec::default();
        let qualified = format!("{}={}", ours.kind, device.name);
        cache
            .inject_devices(Some(&mut oci), vec![qualified.clone()])
            .unwrap_or_else(|e| panic!("{qualified}: {e}"));
        let injected: BTreeSet<(String, i64, i64)> = oci
            .linux()
            .as_ref()
            .and_then(|l| l.devices().clone())
            .unwrap_or_default()
            .iter()
            .map(|d| (d.path().display().to_string(), d.major(), d.minor()))
            .collect();
        let expected: BTreeSet<(String, i64, i64)> = device
            .container_edits
            .device_nodes
            .iter()
            .chain(&ours.container_edits.device_nodes)
            .map(|n| (n.path.clone(), n.major.unwrap(), n.minor.unwrap()))
            .collect();
        assert_eq!(injected, expected, "{qualified}");
        let hooks = oci
            .hooks()
            .as_ref()
            .and_then(|h| h.create_container().clone());
        let hooks = hooks.unwrap_or_default();
        assert_eq!(hooks.len(), 1, "{qualified}: one createContainer hook");
        assert!(
            hooks[0].env().as_ref().is_some_and(|e| !e.is_empty()),
            "{qualified}: hook without explicit env"
        );
    }
}

#[test]
fn golden_specs_load_in_the_rust_cdi_crate() {
    let mut checked = 0;
    for entry in fs::read_dir(golden_dir()).expect("golden dir") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            cross_check(&path);
            checked += 1;
        }
    }
    assert!(checked >= 3, "expected golden specs, found {checked}");
}

#[test]
fn freshly_generated_spec_loads_in_the_rust_cdi_crate() {
    let Ok(()) = require(&[Need::Built("tessera-cdi")]) else {
        return;
    };
    let Ok(node) = SimNode::profile("mig-mixed").build() else {
        return;
    };
    let (dir, root) = (node.dir(), node.root());
    let out = dir.join("tessera.io-gpu.json");
    run(Command::new(artefact("tessera-cdi"))
        .args(["generate", "--driver-root"])
        .arg(root)
        .arg("--output")
        .arg(&out))
    .unwrap();
    cross_check(&out);
}
