//! Shared test fixtures: a simulated node in a temporary root with the built
//! library installed in it, as the node builder would lay it out.
#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvml_wrapper_sys::bindings::NvmlLib;
use tempfile::TempDir;
use tessera_model::mig::catalogue::{self, GiProfileSpec};
use tessera_sim::state::{NodeState, SimGpu, StateStore};

/// Where the installed library lives inside a node root.
pub const LIB_IN_ROOT: &str = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

/// Env var telling a re-run of this test binary which child role to play.
pub const CHILD_ROLE: &str = "TESSERA_NVML_TEST_CHILD";
/// Env var handing the child the node root.
pub const CHILD_ROOT: &str = "TESSERA_NVML_TEST_ROOT";

/// The cdylib cargo built for this test run.
///
/// `cargo test` compiles the library as `cdylib` + `rlib` before the
/// integration tests but leaves the `.so` in `target/<profile>/deps/` (it
/// copies it up to `target/<profile>/` only for `cargo build`), so the copy
/// next to this test binary is the fresh one; `target/<profile>/` is the
/// fallback for a test binary run on its own.
pub fn built_library() -> PathBuf {
    const NAME: &str = "libtessera_sim_nvml.so";
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe
        .parent()
        .expect("test binary lives in target/<profile>/deps");
    let candidates = [deps.join(NAME), deps.parent().unwrap_or(deps).join(NAME)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{NAME} not found at {} or {}: build it with `cargo build -p tessera-sim-nvml` \
                 (`cargo test -p tessera-sim-nvml` builds it too)",
                candidates[0].display(),
                candidates[1].display()
            )
        })
        .clone()
}

/// The catalogue's GI profile `id` of model `key`: expected values come
/// from the catalogue, so tuning its numbers does not break these tests.
pub fn profile(key: &str, id: u32) -> &'static GiProfileSpec {
    let model = catalogue::find(key).unwrap_or_else(|| panic!("model {key}"));
    let mig = model
        .mig
        .as_ref()
        .unwrap_or_else(|| panic!("{key} has MIG"));
    mig.profile_by_id(id)
        .unwrap_or_else(|| panic!("{key} has profile {id}"))
}

/// The catalogue's whole-GPU memory of model `key`, in bytes.
pub fn gpu_bytes(key: &str) -> u64 {
    catalogue::find(key)
        .unwrap_or_else(|| panic!("model {key}"))
        .memory_mib
        * MIB
}

/// Bytes in a MiB.
pub const MIB: u64 = 1024 * 1024;

/// A GPU of catalogue model `model` with NVML index `index`, device minor
/// `minor` and MIG mode `mig`.
pub fn gpu(index: u32, minor: u32, model: &str, mig: bool) -> SimGpu {
    SimGpu {
        index,
        minor,
        uuid: tessera_sim::ids::gpu_uuid("nvml-test", index, model),
        model: model.to_string(),
        mig_enabled: mig,
        mig_pending: mig,
        gpu_instances: Vec::new(),
    }
}

/// A node root in a temporary directory, holding a state file and a copy of
/// the built library at [`LIB_IN_ROOT`]. Each copy is its own file, so each
/// test loads its own instance of the library, with its own globals.
pub struct SimNode {
    dir: TempDir,
}

impl SimNode {
    /// A node with these GPUs.
    pub fn new(gpus: Vec<SimGpu>) -> SimNode {
        let node = SimNode::without_state();
        let mut state = NodeState::new("570.133.20");
        state.cuda_driver_version = 12080;
        state.gpus = gpus;
        StateStore::write_new(node.root(), &state).expect("write state");
        node
    }

    /// A root with the library installed but no state file.
    pub fn without_state() -> SimNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = dir.path().join(LIB_IN_ROOT);
        std::fs::create_dir_all(lib.parent().expect("lib dir")).expect("mkdir lib dir");
        std::fs::copy(built_library(), &lib).expect("install library");
        SimNode { dir }
    }

    /// The node root.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The installed library.
    pub fn lib_path(&self) -> PathBuf {
        self.root().join(LIB_IN_ROOT)
    }

    /// The node's state store, for checking what the library wrote.
    pub fn store(&self) -> StateStore {
        StateStore::open(self.root()).expect("state store")
    }

    /// Loads the installed library through `nvml-wrapper-sys`'s declarations.
    pub fn load(&self) -> NvmlLib {
        load(&self.lib_path())
    }

    /// Runs this test binary's `child_process_role` test with `role`, the
    /// node root and `envs`; returns its output.
    pub fn run_child(&self, role: &str, envs: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args([
            "--exact",
            "child_process_role",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE, role)
        .env(CHILD_ROOT, self.root());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.output().expect("spawn child test process")
    }
}

/// Loads the library at `path` the way nvml-wrapper does (libloading, every
/// symbol looked up at once).
pub fn load(path: &Path) -> NvmlLib {
    // SAFETY: loading runs no code of ours beyond the Rust runtime's own
    // initialisers; the library is this crate's cdylib.
    let lib = unsafe { libloading::Library::new(path) }
        .unwrap_or_else(|e| panic!("dlopen {}: {e}", path.display()));
    // SAFETY: only looks symbols up; each is called later with nvml.h's signature.
    unsafe { NvmlLib::from_library(lib) }.expect("symbol table")
}

/// Asserts a child process ran the child role and succeeded, showing its
/// output otherwise.
pub fn assert_child_ok(what: &str, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("test child_process_role ... ok"),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        stdout,
        String::from_utf8_lossy(&output.stderr)
    );
}
