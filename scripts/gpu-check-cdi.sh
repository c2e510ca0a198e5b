#!/usr/bin/env bash
# Read-only check of tessera-cdi against a real NVIDIA driver (run on a GPU
# machine; changes no GPU setting, MIG mode included):
#   - tessera-cdi list, and generate to $OUT (not to /var/run/cdi);
#   - every GPU-instance profile (id, slices, memory, instance count) and its
#     possible placements as read through the driver's NVML, and the
#     differences from Tessera's catalogue entry for the GPU's model;
#   - nvidia-smi's own view, for comparison.
# Build first on the build machine: cargo build --release -p tessera-cdi -p tessera-hook
# Usage: OUT=/some/dir bash scripts/gpu-check-cdi.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${TESSERA_BIN:-target/release}
out=${OUT:-/tmp/tessera-gpu-check}
mkdir -p "$out"

run() { echo "\$ $*"; "$@"; echo "(exit $?)"; echo; }

{
    run nvidia-smi -L
    run nvidia-smi --query-gpu=index,name,uuid,memory.total,mig.mode.current --format=csv
    run nvidia-smi mig -lgip
    run nvidia-smi mig -lgipp
    run "$bin/tessera-cdi" list
    run "$bin/tessera-cdi" generate --output "$out/tessera.io-gpu.json" --hook-path /usr/bin/tessera-hook
    run "$bin/tessera-cdi" validate "$out/tessera.io-gpu.json"
    run "$bin/tessera-cdi" profiles --compare-catalogue
    "$bin/tessera-cdi" profiles --json > "$out/profiles.json"
    echo "profiles JSON: $out/profiles.json"
} 2>&1 | tee "$out/report.txt"
