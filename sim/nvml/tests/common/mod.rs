//! Shared test fixtures: a simulated node in a temporary root with the built
//! library installed in it, as the node builder would lay it out.
#![allow(dead_code, reason = "each test file uses a different part")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvml_wrapper_sys::bindings::NvmlLib;
use tessera_sim::state::{NodeState, SimGpu, StateStore};
use tessera_test_support::node::StandIn;

/// Where the installed library lives inside a node root.
pub const LIB_IN_ROOT: &str = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";

/// The cdylib cargo built for this test run (`target/<profile>/deps/`, where
/// `cargo test` leaves it, or `target/<profile>/` for a test binary run on its own).
pub fn built_library() -> PathBuf {
    tessera_test_support::built_library(StandIn::Nvml.built_name())
}

/// Env var telling a re-run of this test binary which child role to play.
pub const CHILD_ROLE: &str = "TESSERA_NVML_TEST_CHILD";
/// Env var handing the child the node root.
pub const CHILD_ROOT: &str = "TESSERA_NVML_TEST_ROOT";

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
        pci_bus: None,
        mig_enabled: mig,
        mig_pending: mig,
        gpu_instances: Vec::new(),
    }
}

/// A node root in a temporary directory (a `tessera-test-support` node,
/// files only), holding a state file and a copy of the built library at
/// [`LIB_IN_ROOT`]. Each copy is its own file, so each test loads its own
/// instance of the library, with its own globals.
pub struct SimNode {
    node: tessera_test_support::node::SimNode,
}

impl SimNode {
    /// A node with these GPUs.
    pub fn new(gpus: Vec<SimGpu>) -> SimNode {
        let mut state = NodeState::new("570.133.20");
        state.cuda_driver_version = 12080;
        state.gpus = gpus;
        SimNode::build(tessera_test_support::node::SimNode::state(state))
    }

    /// A root with the library installed but no state file.
    pub fn without_state() -> SimNode {
        SimNode::build(
            tessera_test_support::node::SimNode::state(NodeState::new("570.133.20"))
                .without_state_file(),
        )
    }

    fn build(builder: tessera_test_support::node::SimNodeBuilder) -> SimNode {
        // The crate's own cdylib: `cargo test` builds it, so missing is a broken setup.
        let node = builder
            .stand_ins(&[StandIn::Nvml])
            .build()
            .unwrap_or_else(|skip| panic!("{}", skip.reason));
        SimNode { node }
    }

    /// The node root.
    pub fn root(&self) -> &Path {
        self.node.root()
    }

    /// The installed library.
    pub fn lib_path(&self) -> PathBuf {
        self.node.library(StandIn::Nvml)
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
            "--ignored",
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
