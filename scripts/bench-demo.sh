#!/usr/bin/env bash
# Times the README's first command as a newcomer meets it, against the issue's
# goal (the whole demo in under ten minutes on a fresh 2-core machine):
#   cold  — a fresh clone of HEAD with an empty target directory: the dev build
#           of the workspace, the .debs, the cluster and the three pods;
#   warm  — the same clone again, everything built (cargo and package.sh find
#           little to do);
#   run   — `--no-build`: the cluster flow alone.
# The three side by side show where the time goes (the build, by far). Not run
# by scripts/test.sh: a cold build takes minutes. What it cannot remove: the
# apt packages, rustup's toolchain, cargo's registry and the cargo-deb install
# of this machine stay (on a truly fresh machine add their times, printed by
# the set-up: about 1 min for apt and 1.3 min for `cargo install cargo-deb`).
#
# Usage: bash scripts/bench-demo.sh [--keep-clone]   (as root)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$tessera_root"
[ "$(id -u)" = 0 ] || { echo "bench-demo.sh: run as root (the demo needs it)" >&2 && exit 1; }

clone=$(mktemp -d /tmp/tessera-bench-demo.XXXXXX)
[ "${1:-}" = --keep-clone ] || trap 'rm -rf "$clone"' EXIT
git clone -q "$tessera_root" "$clone/tessera"
work="$clone/demo"

run() { # label, demo arguments…
    local label=$1 start end
    shift
    start=$(date +%s.%N)
    if ! (cd "$clone/tessera" && env -u CARGO_TARGET_DIR bash scripts/demo.sh --work-dir "$work" "$@") \
        >"$clone/$label.log" 2>&1; then
        echo "bench-demo.sh: the $label demo failed; its output: $clone/$label.log" >&2
        trap - EXIT
        exit 1
    fi
    end=$(date +%s.%N)
    local built
    built=$(sed -n 's/^built, \([0-9]*\) s after the demo started$/\1/p' "$clone/$label.log")
    printf '| %-5s | %7.0f s | %s |\n' "$label" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "${built:+built after $built s}"
}

echo "| demo  | wall time | of which |"
echo "|---|---|---|"
run cold
run warm
run run --no-build
