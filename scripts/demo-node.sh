#!/usr/bin/env bash
# Tessera's smaller tour (the README's second demo; `scripts/demo.sh` is the
# whole cluster flow): one simulated GPU node and podman, as root on a fresh
# Debian machine:
# builds Tessera, creates a node with two GPUs (GPU 0: H100 80GB, whole;
# GPU 1: A100 40GB in MIG mode with three instances), generates its CDI spec,
# and runs podman containers that ask for `tessera.io/gpu=0` and for a MIG
# device, showing the device nodes each one sees.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$tessera_root"

tessera_install_packages
tessera_install_rust
tessera_fix_hybrid_cgroups

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "build"
cargo build --release --locked -p tessera-cdi -p tessera-sim -p tessera-sim-nvml -p tessera-sim-cuda -p tessera-vgpu
bin="$tessera_root/target/release"
hook=$(bash scripts/build-hook.sh release)   # statically linked, as installed

work=${TESSERA_DEMO_NODE_DIR:-/tmp/tessera-demo-node}
node="$work/node"
rootfs="$work/rootfs"
spec=/var/run/cdi/tessera.io-gpu.json
mkdir -p "$work"

step "simulated node: tessera-sim create --profile demo --root $node"
"$bin/tessera-sim" create --profile demo --root "$node" --force
"$bin/tessera-sim" show --root "$node"

step "what the node offers: tessera-cdi list"
"$bin/tessera-cdi" list --driver-root "$node"

step "static spec: tessera-cdi generate -> $spec"
if [ -e "$spec" ]; then
    cp "$spec" "$work/previous-tessera.io-gpu.json"
    echo "(an existing $spec was saved to $work/previous-tessera.io-gpu.json)"
fi
"$bin/tessera-cdi" generate --driver-root "$node" --hook-path "$hook" --output "$spec"
"$bin/tessera-cdi" validate "$spec"
jq -r '.devices[].name' "$spec" | sed 's/^/  tessera.io\/gpu=/'

step "a busybox root filesystem for the containers"
rm -rf "$rootfs" && mkdir -p "$rootfs/bin"
cp "$(command -v busybox)" "$rootfs/bin/busybox"
for applet in sh ls cat; do ln -sf busybox "$rootfs/bin/$applet"; done

# in_container [--device NAME]... -- COMMAND: podman with the busybox root.
# Sandboxed machines may forbid raising rlimits and podman asks for huge ones,
# so they are pinned. `--rootfs` goes last: podman reads the command after it.
in_container() {
    local args=()
    while [ "$1" != -- ]; do args+=("$1"); shift; done
    shift
    podman run --rm --network none "${TESSERA_PODMAN_LIMITS[@]}" \
        "${args[@]}" --rootfs "$rootfs" /bin/sh -c "$*"
}
show_nodes='ls -l $(busybox find /dev -name "nvidia*" -type c | busybox sort)'

mig_device=$(jq -r '[.devices[].name | select(test("^[0-9]+:[0-9]+$"))][0]' "$spec")

step "podman run --device tessera.io/gpu=0  (the whole H100)"
in_container --device tessera.io/gpu=0 -- "$show_nodes"

step "podman run --device tessera.io/gpu=$mig_device  (a MIG instance of the A100)"
in_container --device "tessera.io/gpu=$mig_device" -- "$show_nodes"

step "podman run without a GPU"
in_container -- "ls /dev/nvidia* 2>/dev/null || echo 'no NVIDIA device nodes'"

step "a vGPU slice: 4096 MiB of the H100 for a CUDA program, enforced by libtessera_vgpu.so"
# tessera-cuda-probe reaches libcuda.so.1 as the CUDA runtime does (dlopen +
# cuGetProcAddress); the node's lib dir gives it the simulated driver. The
# limits file is what the device plugin will mount at /usr/local/tessera/vgpu.json;
# on this host (no such file) TESSERA_VGPU_CONFIG names it instead.
gpu0_uuid=$(jq -r '.gpus[0].uuid' "$node/run/tessera-sim/state.json")
# The accounting directory and its (empty) region file, as tessera-hook
# makes them: the directory root's 0755, the file 0666.
mkdir -p -m 0755 "$work/accounting"
install -m 0666 /dev/null "$work/accounting/vgpu.accounting"
printf '{"version": 1, "devices": [{"uuid": "%s", "memoryLimitMiB": 4096}], "accountingDir": "%s"}\n' \
    "$gpu0_uuid" "$work/accounting" >"$work/vgpu.json"
cat "$work/vgpu.json"
sliced() {
    env LD_LIBRARY_PATH="$node/usr/lib/x86_64-linux-gnu" CUDA_VISIBLE_DEVICES=0 \
        LD_PRELOAD="$bin/libtessera_vgpu.so" TESSERA_VGPU_CONFIG="$work/vgpu.json" \
        "$bin/tessera-cuda-probe" "$@"
}
echo "-- cuMemGetInfo inside the slice:"
sliced info | grep -E 'device.0.(name|mem_total_bytes|mem_free_bytes)'
echo "-- allocate 3 GiB (fits):"
sliced alloc --api mem_alloc --mib 3072 | grep -E '^result='
echo "-- allocate 5 GiB (over the slice; the driver is never asked):"
sliced alloc --api mem_alloc --mib 5120 | grep -E '^result=' || true

step "done"
echo "The spec stays at $spec; the simulated node at $node."
echo "Remove both with: rm -rf $node $spec"
