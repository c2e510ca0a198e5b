//! Shared fixtures: the built artefacts, simulated nodes in temporary
//! roots, and running the probes against them.
#![allow(dead_code, reason = "each test file uses a different part")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;
use tessera_sim::profile::NodeProfile;
use tessera_sim::state::{NodeState, StateStore};

/// Library directory inside a node root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;

/// Environment that would change what the probe sees; cleared for every run.
const CLEARED_ENV: &[&str] = &[
    "TESSERA_SIM_ROOT",
    "TESSERA_SIM_DEBUG",
    "CUDA_VISIBLE_DEVICES",
    "TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB",
    "TESSERA_SIM_CUDA_NS_PER_BLOCK",
    "LD_PRELOAD",
];

/// A test needs something absent: under CI (`CI` or `TESSERA_REQUIRE_SIM`
/// set) that is a failure; elsewhere the test says so loudly and passes.
pub fn missing(test: &str, reason: &str) {
    if std::env::var_os("CI").is_some() || std::env::var_os("TESSERA_REQUIRE_SIM").is_some() {
        panic!("{test}: {reason}");
    }
    eprintln!("SKIPPED: {test}: {reason}");
}

/// A cdylib cargo built for this test run: next to the test binary in
/// `target/<profile>/deps/` (where `cargo test` leaves it), or one level up.
pub fn built_library(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("test binary path: {e}"))?;
    let deps = exe.parent().ok_or("test binary has no directory")?;
    let candidates = [deps.join(name), deps.parent().unwrap_or(deps).join(name)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "{name} not found at {} or {}: build it with `cargo build -p tessera-sim-cuda -p tessera-sim-nvml`",
                candidates[0].display(),
                candidates[1].display()
            )
        })
}

/// The CUDA stand-in cdylib.
pub fn cuda_library() -> Result<PathBuf, String> {
    built_library("libtessera_sim_cuda.so")
}

/// The NVML stand-in cdylib.
pub fn nvml_library() -> Result<PathBuf, String> {
    built_library("libtessera_sim_nvml.so")
}

/// The probe binary.
pub fn probe_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera-cuda-probe"))
}

/// The load-time-linked probe binary.
pub fn linked_probe_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera-cuda-probe-linked"))
}

/// A directory the probe loads `libcuda.so.1` from.
pub struct Fixture {
    dir: TempDir,
    /// The directory holding `libcuda.so.1`.
    pub lib_dir: PathBuf,
    /// The node root, when there is a node.
    pub root: Option<PathBuf>,
    /// The node state, when there is a node.
    pub state: Option<NodeState>,
}

impl Fixture {
    /// The stand-in alone in a directory that is no node root: the default configuration.
    pub fn plain(test: &str) -> Option<Fixture> {
        let cuda = match cuda_library() {
            Ok(p) => p,
            Err(e) => {
                missing(test, &e);
                return None;
            }
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let lib_dir = dir.path().join("plain");
        std::fs::create_dir_all(&lib_dir).expect("mkdir");
        std::fs::copy(&cuda, lib_dir.join("libcuda.so.1")).expect("install libcuda.so.1");
        Some(Fixture {
            dir,
            lib_dir,
            root: None,
            state: None,
        })
    }

    /// A node built from a shipped profile, with both stand-ins installed
    /// as the node builder installs them (no device nodes: not needed here).
    pub fn node(test: &str, profile: &str) -> Option<Fixture> {
        let (cuda, nvml) = match (cuda_library(), nvml_library()) {
            (Ok(c), Ok(n)) => (c, n),
            (Err(e), _) | (_, Err(e)) => {
                missing(test, &e);
                return None;
            }
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        let lib_dir = root.join(LIB_DIR);
        std::fs::create_dir_all(&lib_dir).expect("mkdir lib dir");
        std::fs::copy(&cuda, lib_dir.join("libcuda.so.1")).expect("install libcuda.so.1");
        std::fs::copy(&nvml, lib_dir.join("libnvidia-ml.so.1")).expect("install libnvidia-ml.so.1");
        let state = NodeProfile::load(profile)
            .and_then(|p| p.node_state(profile))
            .expect("profile state");
        StateStore::write_new(&root, &state).expect("write state");
        Some(Fixture {
            dir,
            lib_dir,
            root: Some(root),
            state: Some(state),
        })
    }

    /// The temporary directory holding everything.
    pub fn path(&self) -> &Path {
        self.dir.path()
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
        let output = self
            .command(&probe_exe(), args, envs)
            .output()
            .expect("spawn tessera-cuda-probe");
        Run::new(args, output)
    }

    /// Runs the load-time-linked probe to completion.
    pub fn linked_probe(&self, args: &[&str], envs: &[(&str, &str)]) -> Run {
        let output = self
            .command(&linked_probe_exe(), args, envs)
            .output()
            .expect("spawn tessera-cuda-probe-linked");
        Run::new(args, output)
    }
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
