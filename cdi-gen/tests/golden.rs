//! Golden tests: the spec `tessera-cdi generate` writes for shipped node
//! profiles, compared byte for byte with files in `tests/golden/`. The files
//! were reviewed by hand (device names and nodes against the profile, cap minors
//! against mig-minors, cdiVersion against the rules); the node root, which is a
//! temporary directory, is written as `/ROOT`. `TESSERA_BLESS=1` rewrites the
//! files that differ and then fails, naming them: a blessing run is never a
//! passing run — review the diff and rerun without `TESSERA_BLESS`.

// Helpers of these tests report failures by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod support;

use std::fs;
use std::path::Path;

use support::{create_node, stderr_of, tessera_cdi};
use tessera_test_support::golden::Goldens;

const PROFILES: [&str; 5] = ["demo", "mig-mixed", "a30", "rtx-pro-6000", "h100-80gb"];

fn generate(profile: &str, format: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("node");
    create_node(profile, &root);
    let out = dir.path().join(format!("spec.{format}"));
    let result = tessera_cdi([
        "generate".as_ref(),
        "--driver-root".as_ref(),
        root.as_os_str(),
        "--format".as_ref(),
        format.as_ref(),
        "--output".as_ref(),
        out.as_os_str(),
    ]);
    assert!(result.status.success(), "{profile}: {}", stderr_of(&result));
    fs::read_to_string(&out)
        .unwrap()
        .replace(root.to_str().unwrap(), "/ROOT")
}

#[test]
fn generated_specs_match_the_reviewed_golden_files() {
    if !support::can_build_nodes() {
        return;
    }
    let mut goldens = Goldens::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden"));
    for profile in PROFILES {
        goldens.check(&format!("{profile}.json"), &generate(profile, "json"));
    }
    goldens.finish();
}

#[test]
fn yaml_output_holds_the_same_spec_as_json() {
    if !support::can_build_nodes() {
        return;
    }
    let json: serde_json::Value = serde_json::from_str(&generate("demo", "json")).unwrap();
    let yaml = generate("demo", "yaml");
    let mut goldens = Goldens::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden"));
    goldens.check("demo.yaml", &yaml);
    let from_yaml: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(json, from_yaml);
    goldens.finish();
}

#[test]
fn generating_twice_gives_the_same_bytes() {
    if !support::can_build_nodes() {
        return;
    }
    assert_eq!(generate("mig-mixed", "json"), generate("mig-mixed", "json"));
}
