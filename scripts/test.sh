#!/usr/bin/env bash
# Runs every Tessera check on a fresh Debian machine, as root: installs what it
# needs, then format, lints, unit, integration and end-to-end tests (real
# podman, runc and crun on a simulated GPU node), and a short benchmark smoke run.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$tessera_root"

tessera_install_packages
tessera_install_containerd
tessera_install_rust
tessera_fix_hybrid_cgroups

echo "== format"
cargo fmt --all --check
echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== build"
# One build serves every stage: the binaries and the simulated NVML and CUDA
# libraries that the integration and end-to-end tests run are built once, in
# target/debug, and the test build below reuses them.
cargo build --workspace --locked
# The hook ships statically linked; its tests and the end-to-end tests run that build.
bash scripts/build-hook.sh debug >/dev/null
echo "== tests (unit, integration, end-to-end)"
export TESSERA_REQUIRE_SIM=1
cargo test --workspace --locked --no-fail-fast
echo "== benchmark smoke run"
TESSERA_BENCH_QUICK=1 bash scripts/bench-cdi.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-hook.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-vgpu.sh
