//! The prerequisite rule itself, seen from outside: a child test process
//! with a missing prerequisite fails in required mode and skips loudly,
//! into the ledger, otherwise.

use std::path::Path;
use std::process::{Command, Output};

use tessera_test_support::{Need, require};

/// The child: a test whose prerequisite never holds. Run only by the tests
/// below, each time in a process of its own with the mode they choose.
#[test]
#[ignore = "run as a child process by the rule's tests"]
fn child_with_a_missing_prerequisite() {
    require!(Need::condition(
        false,
        "a unicorn",
        "apt-get install unicorn"
    ));
    panic!("the test went on past a missing prerequisite");
}

fn run_child(ledger: &Path, require_all: Option<&str>) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        "child_with_a_missing_prerequisite",
        "--test-threads=1",
    ])
    .env_remove("CI")
    .env_remove("TESSERA_REQUIRE_ALL")
    .env("TESSERA_SKIP_LOG", ledger);
    if let Some(value) = require_all {
        cmd.env("TESSERA_REQUIRE_ALL", value);
    }
    cmd.output().expect("run the child test")
}

#[test]
fn required_mode_fails_with_one_line_naming_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = dir.path().join("skips.log");
    let out = run_child(&ledger, Some("1"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "required mode passed:\n{stdout}");
    assert!(
        stdout.contains("missing prerequisite: a unicorn (apt-get install unicorn)"),
        "{stdout}"
    );
    assert!(!ledger.exists(), "a failure is not a skip");
}

#[test]
fn local_mode_skips_visibly_and_records_the_skip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = dir.path().join("skips.log");
    for value in [None, Some("0"), Some("false")] {
        let _ = std::fs::remove_file(&ledger);
        let out = run_child(&ledger, value);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{value:?}: local mode failed:\n{stderr}"
        );
        let line = "child_with_a_missing_prerequisite: missing a unicorn (apt-get install unicorn)";
        assert!(
            stderr.contains("SKIPPED ") && stderr.contains(line),
            "{value:?}: the skip is not on stderr:\n{stderr}"
        );
        let recorded = std::fs::read_to_string(&ledger).expect("ledger written");
        assert_eq!(recorded.lines().count(), 1, "{recorded}");
        assert!(recorded.contains(line), "{recorded}");
    }
}
