//! Helpers of the node builder's own tests: stand-in library files the
//! builder only copies. (The prerequisite rule is `tessera-test-support`'s.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tessera_sim::builder::{BuildOptions, BuiltNode, build_node};
use tessera_sim::profile::NodeProfile;

/// A stand-in "NVML library" file: the builder only copies it.
pub fn fake_nvml(dir: &Path) -> PathBuf {
    let path = dir.join("libtessera_sim_nvml.so");
    std::fs::write(&path, "fake NVML stand-in for tests\n").expect("write the fake NVML library");
    path
}

/// A stand-in "CUDA driver library" file: the builder only copies it.
pub fn fake_cuda(dir: &Path) -> PathBuf {
    let path = dir.join("libtessera_sim_cuda.so");
    std::fs::write(&path, "fake CUDA stand-in for tests\n").expect("write the fake CUDA library");
    path
}

/// Build options with fake stand-in libraries in `dir`.
pub fn fake_libs(dir: &Path) -> BuildOptions {
    BuildOptions {
        nvml_library: Some(fake_nvml(dir)),
        cuda_library: Some(fake_cuda(dir)),
        ..BuildOptions::default()
    }
}

/// Builds `profile` into a fresh temporary root.
pub fn build(profile: &NodeProfile) -> (tempfile::TempDir, BuiltNode) {
    let tmp = tempfile::tempdir().expect("make a temporary directory");
    let root = tmp.path().join("root");
    let opts = fake_libs(tmp.path());
    let built = build_node(profile, &root, &opts)
        .unwrap_or_else(|e| panic!("building profile {} failed: {e}", profile.name));
    (tmp, built)
}
