#!/usr/bin/env bash
# Builds tessera-hook as a statically linked binary and prints its path.
#
#   hook/scripts/build-static.sh [release|debug]     (default: release)
#
# Stable Rust cannot set RUSTFLAGS per package, and a [target.x86_64-unknown-linux-gnu]
# rustflags entry in .cargo/config.toml would also apply to every cdylib of the
# workspace (the vGPU library, the simulated NVML/CUDA). So the flag goes in
# RUSTFLAGS for this one build, with an explicit --target: cargo then applies
# RUSTFLAGS to target artifacts only (not to build scripts and proc-macros),
# and keeps them apart in target/x86_64-unknown-linux-gnu/<profile>/.
#
# -C target-feature=+crt-static with the gnu target gives a static-pie binary:
# no program interpreter (PT_INTERP) and no DT_NEEDED entries, so the dynamic
# loader never runs and LD_PRELOAD / LD_LIBRARY_PATH are inert.
#
# Environment: CARGO (cargo to use, default "cargo"), CARGO_TARGET_DIR (as cargo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
profile="${1:-release}"
target=x86_64-unknown-linux-gnu
case "$profile" in
  release) profile_args=(--release); dir=release ;;
  debug) profile_args=(); dir=debug ;;
  *) echo "build-static.sh: profile must be release or debug, not '$profile'" >&2; exit 2 ;;
esac
cd "$root"
RUSTFLAGS="-C target-feature=+crt-static" "${CARGO:-cargo}" build --locked --quiet \
  -p tessera-hook --bin tessera-hook --target "$target" "${profile_args[@]}" >&2
echo "${CARGO_TARGET_DIR:-$root/target}/$target/$dir/tessera-hook"
