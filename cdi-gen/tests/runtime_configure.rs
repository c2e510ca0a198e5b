//! `tessera-cdi runtime configure` on fixtures: containerd 1.7's real default
//! config (`fixtures/containerd-1.7-default.toml`, the output of
//! `/opt/tessera-e2e/containerd-1.7/usr/bin/containerd config default`,
//! containerd 1.7.24 from Debian 13) and the config file Debian 13's
//! containerd package installs (`fixtures/containerd-1.7-debian-13-package.toml`,
//! its /etc/containerd/config.toml), a hand-edited config, a version 3
//! config, Docker's daemon.json, a CRI-O drop-in, refusals.

#![allow(clippy::unwrap_used)]

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use support::{stderr_of, tessera_cdi};
use tessera_cdi::runtime::{DEFAULT_CDI_SPEC_DIRS, Version, containerd, crio, diff, docker};

const DEFAULT_17: &str = include_str!("fixtures/containerd-1.7-default.toml");
const DEBIAN_17: &str = include_str!("fixtures/containerd-1.7-debian-13-package.toml");
const V17: Version = Version::new(1, 7, 24);
const V20: Version = Version::new(2, 0, 0);

fn dirs() -> Vec<String> {
    DEFAULT_CDI_SPEC_DIRS
        .iter()
        .map(|d| (*d).to_owned())
        .collect()
}

fn edit17(text: &str) -> Option<String> {
    containerd::enable_cdi(text, Path::new("config.toml"), V17, 2, &dirs()).unwrap()
}

/// Every leaf value of a TOML document by dotted path.
fn leaves(text: &str) -> Vec<(String, toml::Value)> {
    fn walk(prefix: &str, v: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    walk(&format!("{prefix}.{k}"), v, out);
                }
            }
            other => out.push((prefix.to_owned(), other.clone())),
        }
    }
    let table: toml::Table = toml::from_str(text).unwrap();
    let mut out = Vec::new();
    walk("", &toml::Value::Table(table), &mut out);
    out
}

/// Asserts that `after` differs from `before` only in the CRI table's
/// `enable_cdi` (now true) and `cdi_spec_dirs` (now holding both defaults).
fn assert_only_cdi_changed(before: &str, after: &str, cri: &str) {
    let cdi_keys = [
        format!(".plugins.{cri}.enable_cdi"),
        format!(".plugins.{cri}.cdi_spec_dirs"),
    ];
    let strip = |text: &str| -> Vec<(String, toml::Value)> {
        leaves(text)
            .into_iter()
            .filter(|(k, _)| !cdi_keys.contains(k))
            .collect()
    };
    assert_eq!(
        strip(before),
        strip(after),
        "a value other than the CDI keys changed"
    );
    let after: toml::Table = toml::from_str(after).unwrap();
    let table = &after["plugins"][cri];
    assert_eq!(table["enable_cdi"].as_bool(), Some(true));
    let listed: Vec<&str> = table["cdi_spec_dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for d in DEFAULT_CDI_SPEC_DIRS {
        assert!(listed.contains(&d), "{d} missing from {listed:?}");
    }
}

/// Every comment of a document (whole-line and trailing), for documents
/// with no `#` inside strings.
fn comment_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.find('#').map(|i| &l[i..]))
        .collect()
}

#[test]
fn containerd_17_default_config_changes_only_enable_cdi() {
    let after = edit17(DEFAULT_17).expect("the default has enable_cdi = false");
    assert_only_cdi_changed(DEFAULT_17, &after, "io.containerd.grpc.v1.cri");
    // One line changed, nothing else moved.
    let d = diff::unified(DEFAULT_17, &after, "a", "b");
    assert_eq!(
        d.lines()
            .filter(|l| l.starts_with(['-', '+']))
            .collect::<Vec<_>>(),
        [
            "--- a",
            "+++ b",
            "-    enable_cdi = false",
            "+    enable_cdi = true"
        ],
        "{d}"
    );
    assert_eq!(edit17(&after), None, "second run must find nothing to do");
}

#[test]
fn debian_package_config_gets_the_keys_indented_in_its_cri_table() {
    let after = edit17(DEBIAN_17).unwrap();
    assert_only_cdi_changed(DEBIAN_17, &after, "io.containerd.grpc.v1.cri");
    assert!(
        after.contains(
            "  [plugins.\"io.containerd.grpc.v1.cri\"]\n    enable_cdi = true\n    cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"]\n"
        ),
        "{after}"
    );
    assert_eq!(edit17(&after), None);
}

const HAND_EDITED: &str = r#"# containerd for the GPU nodes -- edited by hand, keep these notes!
version=2
root =   "/srv/containerd"   # big disk

[plugins."io.containerd.grpc.v1.cri"]
	# tabs, and an odd spacing on purpose
	sandbox_image="registry.example/pause:3.9"
	enable_cdi    =   false   # was off: containerd 1.6 days
	cdi_spec_dirs = [
	  "/etc/cdi",   # static specs
	]

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"   # never changed by Tessera

# trailing note
"#;

#[test]
fn hand_edited_config_keeps_comments_spacing_and_other_values() {
    let after = edit17(HAND_EDITED).unwrap();
    assert_only_cdi_changed(HAND_EDITED, &after, "io.containerd.grpc.v1.cri");
    assert_eq!(comment_lines(HAND_EDITED).len(), 7);
    for line in comment_lines(HAND_EDITED) {
        assert!(after.contains(line), "comment line lost: {line:?}\n{after}");
    }
    assert!(
        after.contains("\tenable_cdi    =   true   # was off: containerd 1.6 days\n"),
        "{after}"
    );
    assert!(
        after.contains("root =   \"/srv/containerd\"   # big disk"),
        "{after}"
    );
    assert!(after.contains("default_runtime_name = \"runc\""), "{after}");
    assert_eq!(edit17(&after), None);
}

#[test]
fn version_3_config_uses_the_cri_runtime_table() {
    let v3 = "version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_unprivileged_ports = true\n";
    let after = containerd::enable_cdi(v3, Path::new("c.toml"), V20, 3, &dirs())
        .unwrap()
        .unwrap();
    assert_only_cdi_changed(v3, &after, "io.containerd.cri.v1.runtime");
    let err = containerd::enable_cdi(v3, Path::new("c.toml"), V17, 2, &dirs()).unwrap_err();
    assert!(
        err.to_string()
            .contains("config version 3 needs containerd 2.0"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn a_missing_config_gets_a_minimal_one_for_the_runtimes_version() {
    let new = containerd::enable_cdi("", Path::new("c.toml"), V17, 2, &dirs())
        .unwrap()
        .unwrap();
    let table: toml::Table = toml::from_str(&new).unwrap();
    assert_eq!(table["version"].as_integer(), Some(2));
    assert_eq!(
        table["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"].as_bool(),
        Some(true)
    );
    assert_eq!(table.len(), 2, "{new}");
}

#[test]
fn containerd_1x_imports_put_the_keys_where_the_cri_table_lives() {
    let main = Path::new("/etc/containerd/config.toml");
    let drop_in = containerd::drop_in_for(Path::new("/etc/containerd/conf.d/*.toml")).unwrap();
    assert_eq!(
        drop_in,
        Path::new("/etc/containerd/conf.d/99-tessera-cdi.toml")
    );
    assert_eq!(containerd::drop_in_for(Path::new("/etc/c/*/x.toml")), None);
    assert_eq!(containerd::drop_in_for(Path::new("/etc/c/one.toml")), None);
    let other = PathBuf::from("/etc/containerd/conf.d/10-registry.toml");
    // 1.x replaces whole plugin tables: never a drop-in next to a CRI table.
    assert_eq!(
        containerd::choose_target(V17, main, true, &[(other.clone(), false)], Some(&drop_in)),
        main
    );
    assert_eq!(
        containerd::choose_target(V17, main, true, &[(other.clone(), true)], Some(&drop_in)),
        other
    );
    assert_eq!(
        containerd::choose_target(V17, main, false, &[(other.clone(), false)], Some(&drop_in)),
        drop_in
    );
    assert_eq!(containerd::choose_target(V17, main, false, &[], None), main);
    // 2.x merges key by key: the drop-in.
    assert_eq!(
        containerd::choose_target(V20, main, true, &[(other, true)], Some(&drop_in)),
        drop_in
    );
    assert!(containerd::name_matches("*.toml", "99-tessera-cdi.toml"));
    assert!(!containerd::name_matches("*.toml", ".hidden.toml"));
    assert!(!containerd::name_matches("*.toml", "x.conf"));
}

#[test]
fn docker_daemon_json_keeps_other_keys_order_and_indent() {
    let before = "{\n    \"log-level\": \"warn\",\n    \"data-root\": \"/srv/docker\",\n    \"default-runtime\": \"runc\",\n    \"features\": {\"buildkit\": true}\n}\n";
    let after = docker::enable_cdi(before, Path::new("daemon.json"), &dirs())
        .unwrap()
        .unwrap();
    let b: serde_json::Value = serde_json::from_str(before).unwrap();
    let a: serde_json::Value = serde_json::from_str(&after).unwrap();
    assert_eq!(a["features"]["cdi"], true);
    assert_eq!(a["features"]["buildkit"], true);
    for key in ["log-level", "data-root", "default-runtime"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(a.as_object().unwrap().len(), 4, "{after}");
    assert!(after.find("log-level").unwrap() < after.find("data-root").unwrap());
    assert!(
        after.contains("\n    \"log-level\""),
        "indent kept: {after}"
    );
    assert_eq!(
        docker::enable_cdi(&after, Path::new("daemon.json"), &dirs()).unwrap(),
        None
    );
    let custom = vec!["/opt/cdi".to_owned()];
    let with_dirs = docker::enable_cdi(&after, Path::new("daemon.json"), &custom)
        .unwrap()
        .unwrap();
    let w: serde_json::Value = serde_json::from_str(&with_dirs).unwrap();
    assert_eq!(
        w["cdi-spec-dirs"],
        serde_json::json!(["/etc/cdi", "/var/run/cdi", "/opt/cdi"])
    );
}

#[test]
fn crio_drop_in_is_created_then_left_alone() {
    let new = crio::enable_cdi("", Path::new("99.conf"), &dirs())
        .unwrap()
        .unwrap();
    let table: toml::Table = toml::from_str(&new).unwrap();
    assert_eq!(
        table["crio"]["runtime"]["cdi_spec_dirs"],
        toml::Value::Array(vec!["/etc/cdi".into(), "/var/run/cdi".into()])
    );
    assert!(new.starts_with("# Written by `tessera-cdi"), "{new}");
    assert_eq!(
        crio::enable_cdi(&new, Path::new("99.conf"), &dirs()).unwrap(),
        None
    );
    let partial = "[crio.runtime]\n# ours\ncdi_spec_dirs = [\"/run/cdi\"]\n";
    let after = crio::enable_cdi(partial, Path::new("99.conf"), &dirs())
        .unwrap()
        .unwrap();
    assert!(after.contains("# ours"), "{after}");
    assert!(
        after.contains(r#"["/run/cdi", "/etc/cdi"]"#),
        "/run is /var/run: {after}"
    );
}

#[test]
fn wrong_types_are_refused_naming_the_key() {
    for (text, want) in [
        (
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = \"yes\"\n",
            "enable_cdi: expected a boolean",
        ),
        (
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncdi_spec_dirs = \"/etc/cdi\"\n",
            "cdi_spec_dirs: expected an array",
        ),
        ("version = 2\nplugins = 3\n", "plugins: expected a table"),
        ("version = \"2\"\n", "version: expected an integer"),
        ("version = 9\n", "config versions 1 to 3"),
        ("version = 2\n[plugins\n", "invalid TOML at line 2"),
    ] {
        let err = containerd::enable_cdi(text, Path::new("/x/config.toml"), V17, 2, &dirs())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/x/config.toml: "), "{err}");
        assert!(err.contains(want), "{text:?}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    for (text, want) in [
        ("[1]", "expected a JSON object"),
        ("{\"features\": []}", "features: expected an object"),
        (
            "{\"features\": {\"cdi\": \"on\"}}",
            "features.cdi: expected a boolean",
        ),
        ("{\"a\": 1, \"a\": 2}", "duplicate key"),
        ("{\"a\": ", "invalid JSON"),
    ] {
        let err = docker::enable_cdi(text, Path::new("/d.json"), &dirs())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
}

// The CLI: files, exit codes, dry runs.

fn configure(args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["runtime", "configure"];
    all.extend_from_slice(args);
    let out = tessera_cdi(&all);
    let stderr = stderr_of(&out);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

#[test]
fn cli_dry_run_prints_the_diff_and_writes_nothing_then_the_write_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, DEFAULT_17).unwrap();
    fs::set_permissions(&config, fs::Permissions::from_mode(0o640)).unwrap();
    let path = config.to_str().unwrap();
    let args = [
        "--runtime",
        "containerd",
        "--config",
        path,
        "--runtime-version",
        "1.7.24",
    ];
    let (code, stdout, stderr) = configure(&[&args[..], &["--dry-run"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("-    enable_cdi = false\n+    enable_cdi = true\n"),
        "{stdout}"
    );
    assert!(
        stdout.starts_with(&format!("--- {path}\n+++ {path}\n")),
        "{stdout}"
    );
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        DEFAULT_17,
        "dry run wrote"
    );

    let (code, stdout, stderr) = configure(&args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("CDI enabled in"), "{stdout}");
    assert!(stdout.contains("restart containerd to apply (systemctl restart containerd)"));
    let written = fs::read_to_string(&config).unwrap();
    assert_only_cdi_changed(DEFAULT_17, &written, "io.containerd.grpc.v1.cri");
    assert_eq!(
        fs::metadata(&config).unwrap().permissions().mode() & 0o7777,
        0o640
    );
    let modified = fs::metadata(&config).unwrap().modified().unwrap();

    let (code, stdout, _) = configure(&args);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("already configured"), "{stdout}");
    assert_eq!(fs::metadata(&config).unwrap().modified().unwrap(), modified);
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "temporary file left"
    );
}

#[test]
fn cli_refuses_containerd_16_with_exit_3_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, DEFAULT_17).unwrap();
    // A stand-in `containerd --version` of 1.6, through --runtime-binary.
    let fake = dir.path().join("containerd");
    fs::write(&fake, "#!/bin/sh\necho 'containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1'\n").unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let (code, _, stderr) = configure(&[
        "--runtime",
        "containerd",
        "--config",
        config.to_str().unwrap(),
        "--runtime-binary",
        fake.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("containerd 1.6.20 has no CDI support"),
        "{stderr}"
    );
    assert!(
        stderr.contains("tessera-device-plugin --cdi-mode native"),
        "{stderr}"
    );
    assert_eq!(fs::read_to_string(&config).unwrap(), DEFAULT_17);
}

#[test]
fn cli_malformed_files_are_named_exit_2_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    for (runtime, name, text, version) in [
        (
            "containerd",
            "config.toml",
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\nenable_cdi = false\n",
            "1.7.24",
        ),
        (
            "docker",
            "daemon.json",
            "{\"features\": {\"cdi\": false},}\n",
            "25.0.3",
        ),
        ("crio", "99-tessera-cdi.conf", "[crio.runtime\n", "1.30.0"),
    ] {
        let file = dir.path().join(name);
        fs::write(&file, text).unwrap();
        let path = file.to_str().unwrap();
        let (code, stdout, stderr) = configure(&[
            "--runtime",
            runtime,
            "--config",
            path,
            "--runtime-version",
            version,
        ]);
        assert_eq!(code, Some(2), "{runtime}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!("tessera-cdi: {path}: ")),
            "{stderr}"
        );
        assert!(stderr.trim_end().ends_with("nothing written"), "{stderr}");
        assert!(stdout.is_empty());
        assert_eq!(fs::read_to_string(&file).unwrap(), text);
        assert_eq!(
            fs::read_dir(dir.path())
                .unwrap()
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
                .count(),
            0
        );
    }
}

#[test]
fn cli_containerd_17_with_conf_d_imports_writes_a_drop_in_only_when_safe() {
    let dir = tempfile::tempdir().unwrap();
    let conf_d = dir.path().join("conf.d");
    fs::create_dir(&conf_d).unwrap();
    let config = dir.path().join("config.toml");
    // No CRI table anywhere: a drop-in is safe under 1.7's merge.
    let main =
        "version = 2\nimports = [\"conf.d/*.toml\"]\n\n[grpc]\n  address = \"/run/x.sock\"\n";
    fs::write(&config, main).unwrap();
    let path = config.to_str().unwrap();
    let args = [
        "--runtime",
        "containerd",
        "--config",
        path,
        "--runtime-version",
        "1.7.24",
    ];
    let (code, stdout, stderr) = configure(&args);
    assert_eq!(code, Some(0), "{stderr}");
    let drop_in = conf_d.join("99-tessera-cdi.toml");
    assert!(stdout.contains(drop_in.to_str().unwrap()), "{stdout}");
    assert_eq!(
        fs::read_to_string(&config).unwrap(),
        main,
        "config.toml changed"
    );
    let written: toml::Table = toml::from_str(&fs::read_to_string(&drop_in).unwrap()).unwrap();
    assert_eq!(written["version"].as_integer(), Some(2));
    assert_eq!(
        written["plugins"]["io.containerd.grpc.v1.cri"]["enable_cdi"].as_bool(),
        Some(true)
    );
    let (code, stdout, _) = configure(&args);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("already configured"), "{stdout}");

    // A CRI table in config.toml: a drop-in would replace it; edit in place.
    fs::remove_file(&drop_in).unwrap();
    let with_cri =
        format!("{main}\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"p:1\"\n");
    fs::write(&config, &with_cri).unwrap();
    let (code, stdout, stderr) = configure(&args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("CDI enabled in {path}")),
        "{stdout}"
    );
    assert!(!drop_in.exists());
    assert_only_cdi_changed(
        &with_cri,
        &fs::read_to_string(&config).unwrap(),
        "io.containerd.grpc.v1.cri",
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random text, and the fixture with random bytes spliced in, never
    /// make the editors panic; what they produce parses and is stable.
    #[test]
    fn random_documents_never_panic(
        noise in "[ -~\n\t\"'\\[\\]=#{}.,:]{0,200}",
        at in 0usize..DEFAULT_17.len(),
    ) {
        let mut spliced = DEFAULT_17.to_owned();
        let at = (0..=at).rev().find(|i| spliced.is_char_boundary(*i)).unwrap_or(0);
        spliced.insert_str(at, &noise);
        for text in [noise.as_str(), spliced.as_str()] {
            for version in [V17, V20] {
                if let Ok(Some(out)) = containerd::enable_cdi(text, Path::new("f"), version, 2, &dirs()) {
                    prop_assert!(out.parse::<toml_edit::DocumentMut>().is_ok());
                    prop_assert_eq!(containerd::enable_cdi(&out, Path::new("f"), version, 2, &dirs()).unwrap(), None);
                }
            }
            if let Ok(Some(out)) = crio::enable_cdi(text, Path::new("f"), &dirs()) {
                prop_assert_eq!(crio::enable_cdi(&out, Path::new("f"), &dirs()).unwrap(), None);
            }
            if let Ok(Some(out)) = docker::enable_cdi(text, Path::new("f"), &dirs()) {
                prop_assert_eq!(docker::enable_cdi(&out, Path::new("f"), &dirs()).unwrap(), None);
            }
        }
    }
}
