#!/usr/bin/env bash
# Positive control of the vGPU framework-sequence tests: builds
# libtessera_vgpu.so at an earlier revision (default 94705f4, before issue 8)
# and runs today's vgpu/tests/framework_sequences.rs against it. The tests
# are expected to FAIL there; the output shows what each caught, and the
# stress test prints the most memory the GPU held for the 1024 MiB slice.
#
# Usage: scripts/control-vgpu-previous.sh [REV]   (as root, like the tests)
# TESSERA_STRESS_SECS sets the random stress test's length (default 6).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rev=${1:-94705f4}

work=$(mktemp -d /tmp/tessera-control.XXXXXX)
cleanup() {
    git worktree remove --force "$work/tree" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT
git worktree add --detach "$work/tree" "$rev" >/dev/null
echo "== building libtessera_vgpu.so at $rev"
CARGO_TARGET_DIR="$work/target" cargo build --manifest-path "$work/tree/Cargo.toml" -p tessera-vgpu
old_lib="$work/target/debug/libtessera_vgpu.so"
[ -f "$old_lib" ] || { echo "control-vgpu-previous: no $old_lib after the build" >&2; exit 1; }

echo "== building today's tests and stand-ins"
cargo build --locked -p tessera-sim -p tessera-sim-cuda -p tessera-sim-nvml
cargo test --locked -p tessera-vgpu --test framework_sequences --no-run

echo "== framework_sequences against the library of $rev (failures expected)"
# An old library can make a test hang (issue 8's four-process test did):
# the run is cut off after TESSERA_CONTROL_TIMEOUT seconds, which counts as failing.
set +e
TESSERA_TEST_VGPU_LIBRARY="$old_lib" TESSERA_REQUIRE_ALL=1 timeout "${TESSERA_CONTROL_TIMEOUT:-180}" \
    cargo test --locked -p tessera-vgpu --test framework_sequences -- --nocapture --test-threads=2
status=$?
set -e
[ "$status" = 124 ] && echo "== cut off after ${TESSERA_CONTROL_TIMEOUT:-180} s (a test hung)"
case "$status" in
    0)
        echo "control-vgpu-previous: every test passed against $rev: the tests do not tell that library from today's" >&2
        exit 1 ;;
    101 | 124) ;; # test failures, or a hang cut off
    *)
        echo "control-vgpu-previous: the run itself failed (exit $status), which proves nothing" >&2
        exit 1 ;;
esac
echo "== as expected, the tests fail against $rev"
