//! Shared helpers of the `tessera-cdi` integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A workspace build output next to this package's binary (`target/<profile>/`).
pub fn artefact(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_tessera-cdi"))
        .parent()
        .expect("target dir")
        .to_owned();
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// Builds a simulated node from a shipped profile.
pub fn create_node(profile: &str, root: &Path) {
    let out = Command::new(artefact("tessera-sim"))
        .args(["create", "--profile", profile, "--root"])
        .arg(root)
        .output()
        .expect("spawn tessera-sim");
    assert!(
        out.status.success(),
        "tessera-sim create {profile}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `tessera-cdi` with arguments.
pub fn tessera_cdi<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_tessera-cdi"))
        .args(args)
        .env_remove("TESSERA_LOG")
        .output()
        .expect("spawn tessera-cdi")
}

/// Stderr as text, asserting it holds no panic.
pub fn stderr_of(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!text.contains("panicked"), "tessera-cdi panicked: {text}");
    text
}
