//! Fixtures of the CUDA stand-in's tests: the probes, a directory holding
//! `libcuda.so.1` (alone, or in a simulated node from `tessera-test-support`),
//! and running the probes against it.
#![allow(dead_code, reason = "each test file uses a different part")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;
use tessera_sim::state::NodeState;
#[allow(unused_imports, reason = "each test file uses a different part")]
pub use tessera_test_support::node::LIB_DIR;
use tessera_test_support::node::{SimNode, StandIn};
#[allow(unused_imports, reason = "each test file uses a different part")]
pub use tessera_test_support::{Need, built_library, require};
/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;

/// Environment that would change what the probe sees; cleared for every run.
const CLEARED_ENV: &[&str] = &[
    "TESSERA_SIM_ROOT",
    "TESSERA_SIM_DEBUG",
    "CUDA_VISIBLE_DEVICES",
    "TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB",
    "TESSERA_SIM_CUDA_NS_PER_BLOCK",
    "TESSERA_SIM_CUDA_LAUNCH_NS",
    "TESSERA_SIM_CUDA_BLOCKS_PER_SM",
    "TESSERA_SIM_CUDA_NOISE_PCT",
    "TESSERA_SIM_CUDA_NOISE_SEED",
    "TESSERA_SIM_CUDA_UTIL_BIAS_PCT",
    "LD_PRELOAD",
];

/// The CUDA stand-in cdylib cargo built for this run, once [`require`]d.
pub fn cuda_library() -> PathBuf {
    built_library(StandIn::Cuda.built_name())
}

/// The probe binary.
pub fn probe_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera-cuda-probe"))
}

/// The load-time-linked probe binary.
pub fn linked_probe_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera-cuda-probe-linked"))
}

/// What holds a fixture's files (removed on drop).
enum FixtureDir {
    Temp(TempDir),
    Node(SimNode),
}

/// A directory the probe loads `libcuda.so.1` from.
pub struct Fixture {
    dir: FixtureDir,
    /// The directory holding `libcuda.so.1`.
    pub lib_dir: PathBuf,
    /// The node root, when there is a node.
    pub root: Option<PathBuf>,
    /// The node state, when there is a node.
    pub state: Option<NodeState>,
}

impl Fixture {
    /// The stand-in alone in a directory that is no node root: the default
    /// configuration. `None` after a skip when the stand-in is not built.
    pub fn plain() -> Option<Fixture> {
        require(&[Need::Built(StandIn::Cuda.built_name())]).ok()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let lib_dir = dir.path().join("plain");
        std::fs::create_dir_all(&lib_dir).expect("mkdir");
        std::fs::copy(cuda_library(), lib_dir.join("libcuda.so.1")).expect("install libcuda.so.1");
        Some(Fixture {
            dir: FixtureDir::Temp(dir),
            lib_dir,
            root: None,
            state: None,
        })
    }

    /// A node built from a shipped profile with both stand-ins installed as
    /// the node builder installs them (no device nodes: not needed here).
    /// `None` after a skip when a stand-in is not built.
    pub fn node(profile: &str) -> Option<Fixture> {
        let node = SimNode::profile(profile).files_only().build().ok()?;
        Some(Fixture {
            lib_dir: node.lib_dir(),
            root: Some(node.root().to_owned()),
            state: Some(node.state_at_build().clone()),
            dir: FixtureDir::Node(node),
        })
    }

    /// The temporary directory holding everything.
    pub fn path(&self) -> &Path {
        match &self.dir {
            FixtureDir::Temp(dir) => dir.path(),
            FixtureDir::Node(node) => node.dir(),
        }
    }

    /// The installed NVML stand-in.
    pub fn nvml_path(&self) -> PathBuf {
        self.lib_dir.join("libnvidia-ml.so.1")
    }

    /// A command running `exe` with this fixture's `libcuda.so.1` first on
    /// the loader path and a clean environment plus `envs`.
    pub fn command(&self, exe: &Path, args: &[&str], envs: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args(args);
        for name in CLEARED_ENV {
            cmd.env_remove(name);
        }
        cmd.env("LD_LIBRARY_PATH", &self.lib_dir);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the probe to completion.
    pub fn probe(&self, args: &[&str], envs: &[(&str, &str)]) -> Run {
        self.run(&probe_exe(), args, envs)
    }

    /// Runs the load-time-linked probe to completion.
    pub fn linked_probe(&self, args: &[&str], envs: &[(&str, &str)]) -> Run {
        self.run(&linked_probe_exe(), args, envs)
    }

    fn run(&self, exe: &Path, args: &[&str], envs: &[(&str, &str)]) -> Run {
        let output = self
            .command(exe, args, envs)
            .output()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
        Run::new(args, output)
    }
}

/// A probe command line's arguments, written as one string (no argument
/// holds white space).
pub fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// A finished probe run.
pub struct Run {
    /// The arguments, for messages.
    pub args: String,
    /// Exit code.
    pub code: Option<i32>,
    /// `key=value` lines of stdout.
    pub values: BTreeMap<String, String>,
    /// stdout as text.
    pub stdout: String,
    /// stderr as text.
    pub stderr: String,
}

/// `key=value` lines as a map (later keys win).
pub fn parse_lines(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Run {
    fn new(args: &[&str], output: Output) -> Run {
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        Run {
            args: args.join(" "),
            code: output.status.code(),
            values: parse_lines(&stdout),
            stdout,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The value of `key`, failing the test with the whole output if absent.
    pub fn get(&self, key: &str) -> &str {
        self.values.get(key).map(String::as_str).unwrap_or_else(|| {
            panic!(
                "`{}`: no {key}= line\n--- stdout\n{}--- stderr\n{}",
                self.args, self.stdout, self.stderr
            )
        })
    }

    /// The value of `key` as a number.
    pub fn num(&self, key: &str) -> f64 {
        let v = self.get(key);
        v.parse()
            .unwrap_or_else(|_| panic!("`{}`: {key}={v} is not a number", self.args))
    }

    /// Asserts the run exited 0.
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code,
            Some(0),
            "`{}` failed\n--- stdout\n{}--- stderr\n{}",
            self.args,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Asserts stderr names each of `needles`.
    pub fn naming(self, needles: &[&str]) -> Run {
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "`{}`: stderr should name {needle}\n--- stderr\n{}",
                self.args,
                self.stderr
            );
        }
        self
    }

    /// Asserts the run failed with exit 1 and one stderr line.
    pub fn failed(self) -> Run {
        assert_eq!(
            self.code,
            Some(1),
            "`{}` should fail\n--- stdout\n{}--- stderr\n{}",
            self.args,
            self.stdout,
            self.stderr
        );
        assert_eq!(self.stderr.lines().count(), 1, "{}", self.stderr);
        self
    }
}
