#!/usr/bin/env bash
# Runs every Tessera check on a fresh Debian machine, as root: installs what it
# needs, then format, lints, unit, integration and end-to-end tests (real
# podman, runc, crun and containerd on a simulated GPU node), and a short
# benchmark smoke run. Every test runs: none may skip.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$tessera_root"

if [[ $(id -u) != 0 ]]; then
  echo "scripts/test.sh: run as root (sudo bash scripts/test.sh): it installs packages, and the tests make device nodes, mounts and containers; as another user they would fail or skip" >&2
  exit 1
fi

tessera_install_packages
tessera_install_containerd
tessera_install_kubectl
tessera_install_rust
tessera_install_packaging_tools
tessera_fix_hybrid_cgroups

# A one-off build gains nothing from incremental state, and it took 4.5 GB.
export CARGO_INCREMENTAL=0

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
# Every test's prerequisites (root, runc, crun, podman, containerd, the built
# stand-ins, …) are required here: a missing one fails its test with one line
# naming what to install (tests/support, the prerequisite rule). Any skip that
# still happens is recorded in the ledger and fails this script.
export TESSERA_REQUIRE_ALL=1
export TESSERA_SKIP_LOG="$tessera_root/target/tessera-skips.log"
rm -f "$TESSERA_SKIP_LOG"
cargo test --workspace --locked --no-fail-fast
if [[ -s "$TESSERA_SKIP_LOG" ]]; then
  echo "== $(wc -l < "$TESSERA_SKIP_LOG") test(s) skipped; every test must run here:" >&2
  cat "$TESSERA_SKIP_LOG" >&2
  exit 1
fi
echo "== no test skipped"
# The .deb and .rpm packages: built from this build (dev profile), lintian,
# rpm against deb, dpkg -i, the installed binaries and units, the demo on
# them, dpkg --purge, and nothing left behind.
bash scripts/test-packages.sh --profile dev
echo "== benchmark smoke run"
TESSERA_BENCH_QUICK=1 bash scripts/bench-cdi.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-hook.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-vgpu.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-sm-limit.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-apiserver.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-extender.sh
TESSERA_BENCH_QUICK=1 bash scripts/bench-plugin.sh
