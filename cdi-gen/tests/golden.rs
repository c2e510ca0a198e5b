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

/// Golden comparisons of one test: mismatches fail it; under
/// `TESSERA_BLESS` the differing files are rewritten and [`Goldens::finish`]
/// fails listing them.
struct Goldens {
    bless: bool,
    rewritten: Vec<String>,
    checked: usize,
}

impl Goldens {
    fn new() -> Self {
        Goldens {
            bless: std::env::var("TESSERA_BLESS")
                .is_ok_and(|v| !v.is_empty() && v != "0" && v != "false"),
            rewritten: Vec::new(),
            checked: 0,
        }
    }

    fn check(&mut self, name: &str, actual: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        self.checked += 1;
        let expected = fs::read_to_string(&path);
        if self.bless {
            if expected.as_deref().ok() != Some(actual) {
                fs::write(&path, actual).unwrap();
                self.rewritten.push(path.display().to_string());
            }
            return;
        }
        let expected = expected
            .unwrap_or_else(|e| panic!("{}: {e} (TESSERA_BLESS=1 writes it)", path.display()));
        if expected != actual {
            let first = expected
                .lines()
                .zip(actual.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(expected.lines().count().min(actual.lines().count()));
            panic!(
                "{name} differs from the golden file at line {}:\n  golden: {:?}\n  actual: {:?}",
                first + 1,
                expected.lines().nth(first),
                actual.lines().nth(first)
            );
        }
    }

    /// Under `TESSERA_BLESS`, fails: the run wrote files instead of testing.
    fn finish(self) {
        let list = if self.rewritten.is_empty() {
            String::new()
        } else {
            format!(": {}", self.rewritten.join(", "))
        };
        assert!(
            !self.bless,
            "TESSERA_BLESS is set, so this run wrote golden files instead of testing: \
             rewrote {} of {}{list}. Review the diff and rerun without TESSERA_BLESS.",
            self.rewritten.len(),
            self.checked,
        );
    }
}

#[test]
fn generated_specs_match_the_reviewed_golden_files() {
    if !support::can_build_nodes() {
        return;
    }
    let mut goldens = Goldens::new();
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
    let mut goldens = Goldens::new();
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
