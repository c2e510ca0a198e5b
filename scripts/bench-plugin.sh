#!/usr/bin/env bash
# Benchmark of the device plugin (`tessera-device-plugin`), real processes
# over kubelet's gRPC sockets: starts the stand-in API server, builds a
# simulated node (one H100-80GB for vGPU slices, one A100-40GB in MIG mode
# without instances), and runs plugin/examples/bench-plugin.rs, which plays
# kubelet (Registration, PodResources) and the extender (reservations, the
# bind Lease) and times, side by side in one run: Allocate of a share slice
# and of a 1g MIG instance against a trivial plugin's Allocate (the gRPC
# floor), with the NVML stand-in's own GI+CI time beside them; reclaim after
# the pod's deletion; and the time from a lost GPU, its return and an XID to
# ListAndWatch's new list. Prints a table; exits non-zero when an answer is
# wrong, never because a figure is slow.
# TESSERA_BENCH_QUICK=1: debug build, 5 allocations per kind, 2 health flips
# (a smoke test for CI).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug; flag=(); iterations=5; flips=2
else
    profile=release; flag=(--release); iterations=${TESSERA_BENCH_ITERATIONS:-100}; flips=20
fi
cargo build "${flag[@]}" --locked -p tessera-sim -p tessera-sim-nvml -p tessera-sim-cuda \
    -p tessera-vgpu -p tessera-hook -p tessera-device-plugin --bins --example bench-plugin \
    -p tessera-e2e --bin example-device-plugin
bin="$PWD/target/$profile"

work=$(mktemp -d /tmp/tessera-bench-plugin.XXXXXX)
apiserver_pid=
cleanup() {
    if [ -n "$apiserver_pid" ]; then
        kill "$apiserver_pid" 2>/dev/null || true
        wait "$apiserver_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/profile.toml" <<'TOML'
name = "bench-plugin"
description = "H100-80GB for slices + A100-40GB in MIG mode, no instances"

[[gpu]]
model = "H100-80GB"

[[gpu]]
model = "A100-40GB"
mig = true
TOML
"$bin/tessera-sim" create --profile "$work/profile.toml" --root "$work/node" >/dev/null

TESSERA_LOG=${TESSERA_LOG:-warn} "$bin/tessera-sim" apiserver --listen 127.0.0.1:0 \
    --kubeconfig-out "$work/kubeconfig" 2>"$work/apiserver.log" &
apiserver_pid=$!
for _ in $(seq 200); do
    [ -s "$work/kubeconfig" ] && break
    if ! kill -0 "$apiserver_pid" 2>/dev/null; then
        echo "bench-plugin: the API server exited:" >&2
        cat "$work/apiserver.log" >&2
        exit 1
    fi
    sleep 0.1
done
[ -s "$work/kubeconfig" ] || { echo "bench-plugin: no kubeconfig after 20 s" >&2; exit 1; }

echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) before measuring ($profile build)"
"$bin/examples/bench-plugin" --kubeconfig "$work/kubeconfig" --node-root "$work/node" \
    --plugin-bin "$bin/tessera-device-plugin" --baseline-bin "$bin/example-device-plugin" \
    --sim-bin "$bin/tessera-sim" --hook-bin "$bin/tessera-hook" \
    --vgpu-library "$bin/libtessera_vgpu.so" \
    --iterations "$iterations" --health-flips "$flips"
