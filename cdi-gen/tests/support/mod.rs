//! Helpers of the `tessera-cdi` integration tests; simulated nodes and the
//! prerequisite rule come from `tessera-test-support`.
#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tessera_test_support::node::SimNode;
use tessera_test_support::require;

/// Whether simulated nodes can be built here (root for the device nodes, the
/// stand-ins built); prints and records the skip, or fails under CI, when not.
pub fn can_build_nodes() -> bool {
    require(&SimNode::profile("demo").needs()).is_ok()
}

/// A simulated node of a shipped profile at `<temp dir>/node`; `None` after
/// a skip where nodes cannot be built.
pub fn node(profile: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let root = dir.path().join("node");
    SimNode::profile(profile).at(&root).build().ok()?;
    Some((dir, root))
}

/// Builds a simulated node from a shipped profile at `root`, after
/// [`can_build_nodes`].
pub fn create_node(profile: &str, root: &Path) {
    if let Err(skip) = SimNode::profile(profile).at(root).build() {
        panic!("call can_build_nodes first: {}", skip.reason);
    }
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
