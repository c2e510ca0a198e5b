#!/usr/bin/env bash
# Benchmark of `tessera-cdi generate` as a whole process on simulated nodes,
# side by side with baselines, in one hyperfine run:
#   - `tessera-cdi --version`: the same binary doing no work (process floor);
#   - generate on a 1-GPU node (H100 80GB, MIG off);
#   - generate on 8x H100 80GB, each with 7 MIG instances (the goal: <= 30 ms median);
#   - list on the 8x H100 node.
# TESSERA_BENCH_QUICK=1 uses the debug build and few runs (a smoke test for CI).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug; runs=5; warmup=1
    cargo build --locked -p tessera-cdi -p tessera-sim -p tessera-sim-nvml -p tessera-sim-cuda
else
    profile=release; runs=${TESSERA_BENCH_RUNS:-200}; warmup=10
    cargo build --release --locked -p tessera-cdi -p tessera-sim -p tessera-sim-nvml -p tessera-sim-cuda
fi
bin="$PWD/target/$profile"

work=$(mktemp -d /tmp/tessera-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/tessera-sim" create --profile bench-8xh100 --root "$work/8xh100" >/dev/null
"$bin/tessera-sim" create --profile h100-80gb --root "$work/1xh100" >/dev/null

out="$work/out"
hyperfine --style basic --shell=none --warmup "$warmup" --runs "$runs" \
    --export-json "$work/result.json" \
    -n "baseline: tessera-cdi --version" "$bin/tessera-cdi --version" \
    -n "generate, 1x H100 (no MIG)" "$bin/tessera-cdi generate --driver-root $work/1xh100 --output $out-1.json" \
    -n "generate, 8x H100 x 7 MIG" "$bin/tessera-cdi generate --driver-root $work/8xh100 --output $out-8.json" \
    -n "list, 8x H100 x 7 MIG" "$bin/tessera-cdi list --driver-root $work/8xh100"

echo
echo "| command | median (ms) | mean ± σ (ms) | min (ms) |"
echo "|---|---|---|---|"
jq -r '.results[] | "| \(.command) | \(.median*1000*100|round/100) | \(.mean*1000*100|round/100) ± \(.stddev*1000*100|round/100) | \(.min*1000*100|round/100) |"' "$work/result.json"
median_ms=$(jq -r '.results[] | select(.command | startswith("generate, 8x")) | .median*1000' "$work/result.json")
devices=$(jq '.devices | length' "$out-8.json")
echo
echo "8x H100 x 7 MIG: $devices devices in the spec, median ${median_ms} ms (goal <= 30 ms, $profile build)"
if [ "$profile" = release ] && awk -v m="$median_ms" 'BEGIN { exit !(m > 30) }'; then
    echo "GOAL MISSED: median above 30 ms" >&2
    exit 1
fi
