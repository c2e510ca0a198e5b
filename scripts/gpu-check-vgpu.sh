#!/usr/bin/env bash
# Check of libtessera_vgpu.so's memory limit against a real NVIDIA driver.
# Runs on a GPU machine that reaches no package registry: everything it runs
# is built here and carried (the library and tessera-cuda-probe, which reaches
# libcuda.so.1 as the CUDA runtime does, dlopen + cuGetProcAddress). No
# PyTorch: the probe's `script` and `stress` commands make the same call
# sequences as vgpu/tests/framework_sequences.rs. Changes no GPU setting.
#
#   0. a context's own memory: what nvidia-smi shows for a process that only
#      holds a context (the per-context cost), natively;
#   1. each framework sequence (VMM release-before-unmap, NCCL retain,
#      import, a pool that keeps everything, a pool at the default threshold,
#      context destroy / last primary release / reset, the malloc heap) runs
#      natively (all succeed: the program is legal) and with an 8 GiB slice
#      (the allocation the slice cannot hold is refused, the rest succeed);
#   2. contexts' own memory is charged: three processes holding a context,
#      a fourth sees 8 GiB − 4 × the per-context cost free (±64 MiB), and
#      nvidia-smi's per-process memory of the four sums within the slice;
#   3. four processes × 2 threads of random allocations running into the
#      slice: what nvidia-smi shows for them at the end is within the slice;
#   4. nvidia-smi run with the library preloaded shows an 8192 MiB total;
#   5. overhead: tessera-cuda-probe bench natively and preloaded.
#
# Build first (here): cargo build --release -p tessera-vgpu -p tessera-sim-cuda
# Usage: OUT=/some/dir bash scripts/gpu-check-vgpu.sh   (TESSERA_BIN: the build dir)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${TESSERA_BIN:-$PWD/target/release}
out=${OUT:-/tmp/tessera-gpu-check-vgpu}
lib="$bin/libtessera_vgpu.so"
probe="$bin/tessera-cuda-probe"
mkdir -p "$out"
failures=0
slice=8192

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

if [ -e /usr/local/tessera/vgpu.json ]; then
    echo "/usr/local/tessera/vgpu.json exists: it would override this check's limits; run elsewhere" >&2
    exit 2
fi
for f in "$lib" "$probe"; do
    [ -x "$f" ] || [ -f "$f" ] || { echo "$f missing: cargo build --release -p tessera-vgpu -p tessera-sim-cuda" >&2; exit 2; }
done
command -v nvidia-smi >/dev/null || { echo "nvidia-smi missing: not a GPU machine?" >&2; exit 2; }

uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
acct="$out/accounting"
cat >"$out/vgpu.json" <<EOF
{"version": 1,
 "devices": [{"uuid": "$uuid", "memoryLimitMiB": $slice}],
 "accountingDir": "$acct",
 "logLevel": "info"}
EOF
# A fresh region per run, made as tessera-hook makes it.
fresh_region() {
    rm -rf "$acct"
    mkdir -p -m 0755 "$acct"
    install -m 0666 /dev/null "$acct/vgpu.accounting"
}
native() { env CUDA_VISIBLE_DEVICES=0 "$probe" "$@"; }
limited() {
    env LD_PRELOAD="$lib" TESSERA_VGPU_CONFIG="$out/vgpu.json" CUDA_VISIBLE_DEVICES=0 "$probe" "$@"
}
# The results of a script run, one word per step (ok / oom / other).
results() {
    sed -n 's/^step\.[0-9]*=[^ ]* //p' | sed -e 's/^CUDA_SUCCESS$/ok/' -e 's/^CUDA_ERROR_OUT_OF_MEMORY$/oom/' | tr '\n' ' ' | sed 's/ $//'
}
# check <name> <expected with the library> <steps...>: natively every step
# must succeed; with the slice, the expected results.
check() {
    local name=$1 want=$2
    shift 2
    local all_ok got_native got
    all_ok=$(printf 'ok %.0s' "$@" | sed 's/ $//')
    got_native=$(native script "$@" 2>"$out/$name.native.err" | results)
    fresh_region
    got=$(limited script "$@" 2>"$out/$name.err" | results)
    echo "$name: native [$got_native] sliced [$got]"
    if [ "$got_native" != "$all_ok" ]; then
        fail "$name: natively [$got_native], expected [$all_ok] (see $out/$name.native.err)"
    elif [ "$got" != "$want" ]; then
        fail "$name: with the slice [$got], expected [$want] (see $out/$name.err)"
    else
        pass "$name"
    fi
}

# Starts a probe holding a primary context; its pid in $holder_pid.
hold_context() {
    local fifo="$out/hold.$1"
    rm -f "$fifo"
    mkfifo "$fifo"
    "${@:2}" script "retain 0" "info held" "wait" <"$fifo" >"$out/hold.$1.out" 2>&1 &
    holder_pid=$!
    exec {holder_fd}>"$fifo"
    eval "holder_fd_$1=$holder_fd"
    for _ in $(seq 100); do grep -q '^state=waiting' "$out/hold.$1.out" && break; sleep 0.1; done
}
release_context() {
    local fd_var="holder_fd_$1"
    eval "exec ${!fd_var}>&-"
}
smi_used_of() { # pid -> MiB nvidia-smi shows for it
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits -i 0 |
        awk -F', *' -v p="$1" '$1 == p { print $2 }'
}

{
    echo "== GPU"
    nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv
    echo

    echo "== 0. a context's own memory (native)"
    hold_context base native
    sleep 1
    ctx_mib=$(smi_used_of "$holder_pid")
    release_context base
    wait "$holder_pid" 2>/dev/null
    echo "per-context memory: ${ctx_mib:-?} MiB"
    [ -n "${ctx_mib:-}" ] || { fail "nvidia-smi shows no memory for a process holding a context"; ctx_mib=0; }
    echo

    echo "== 1. framework sequences in a $slice MiB slice (blocks of 5120 MiB: one fits, two do not)"
    check vmm-release-before-unmap "ok ok ok ok ok oom ok ok" \
        "retain 0" "vmm h 5120 0" "reserve va 5120" "map va h" "release-handle h" \
        "vmm more 5120 0" "unmap va" "vmm after 5120 0"
    check vmm-nccl-retain "ok ok ok ok ok ok ok oom ok ok" \
        "retain 0" "vmm h 4096 0" "reserve va 4096" "map va h" "retain-handle again va" \
        "release-handle again" "release-handle h" "vmm more 5120 0" "address-free va" "vmm after 5120 0"
    check vmm-import "ok ok ok ok ok oom ok ok" \
        "retain 0" "vmm h 4096 0" "export fd h" "import mine fd" "release-handle h" \
        "vmm more 5120 0" "release-handle mine" "vmm after 5120 0"
    check pool-keeps-all "ok ok ok ok ok oom ok ok ok ok" \
        "retain 0" "pool-threshold 0 max" "async a 5120 null" "free-async a null" "sync" \
        "alloc other 5120" "async again 5120 null" "free-async again null" "pool-trim 0 0" "alloc other2 5120"
    check pool-default-threshold "ok ok ok ok ok" \
        "retain 0" "async a 5120 null" "free-async a null" "sync" "alloc other 5120"
    check ctx-destroy "ok ok ok ok ok" \
        "ctx-create c 0" "alloc a 5120" "ctx-destroy c" "retain 0" "alloc b 5120"
    check primary-release "ok ok ok ok ok" \
        "retain 0" "alloc a 5120" "release 0" "retain 0" "alloc b 5120"
    check primary-reset "ok ok ok ok ok" \
        "retain 0" "alloc a 4096" "async p 1024 null" "reset 0" "alloc b 5120"
    check malloc-heap "ok ok oom ok ok" \
        "retain 0" "heap 4096" "alloc a 5120" "heap 0" "alloc b 5120"
    echo

    echo "== 2. contexts' own memory is charged"
    fresh_region
    pids=()
    for n in 1 2 3; do
        hold_context "c$n" limited
        pids+=("$holder_pid")
    done
    fourth=$(limited script "retain 0" "info mine" 2>"$out/fourth.err")
    free_mib=$(( $(echo "$fourth" | sed -n 's/^mine\.free=//p') / 1048576 ))
    want_mib=$(( slice - 4 * ctx_mib ))
    echo "fourth process: ${free_mib} MiB free of $slice (expected about $want_mib)"
    if [ $(( free_mib - want_mib )) -le 64 ] && [ $(( want_mib - free_mib )) -le 64 ]; then
        pass "every context's own memory counts against the slice"
    else
        fail "free ${free_mib} MiB, expected ${want_mib} ± 64 (per-context ${ctx_mib} MiB)"
    fi
    smi_sum=0
    for p in "${pids[@]}"; do smi_sum=$(( smi_sum + $(smi_used_of "$p" || echo 0) )); done
    echo "nvidia-smi: the three holders use $smi_sum MiB"
    for n in 1 2 3; do release_context "c$n"; done
    wait 2>/dev/null
    echo

    echo "== 3. four processes running into the slice"
    fresh_region
    spids=()
    for seed in 1 2 3 4; do
        fifo="$out/stress.$seed"
        rm -f "$fifo"; mkfifo "$fifo"
        limited stress --seed "$seed" --threads 2 --ops 400 --max-mib 512 --hold <"$fifo" >"$out/stress.$seed.out" 2>/dev/null &
        spids+=("$!")
        exec {sfd}>"$fifo"
        eval "stress_fd_$seed=$sfd"
    done
    for seed in 1 2 3 4; do
        for _ in $(seq 600); do grep -q '^state=holding' "$out/stress.$seed.out" && break; sleep 0.1; done
    done
    total=0
    for p in "${spids[@]}"; do total=$(( total + $(smi_used_of "$p" || echo 0) )); done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i 0
    echo "nvidia-smi: the four hold $total MiB together (slice $slice MiB)"
    if [ "$total" -le "$slice" ]; then pass "four processes stay within the slice"; else fail "four processes hold $total MiB"; fi
    for seed in 1 2 3 4; do fd_var="stress_fd_$seed"; eval "exec ${!fd_var}>&-"; done
    wait 2>/dev/null
    grep -h '^errors=' "$out"/stress.*.out | sort | uniq -c
    echo

    echo "== 4. nvidia-smi sees the slice"
    fresh_region
    smi=$(env LD_PRELOAD="$lib" TESSERA_VGPU_CONFIG="$out/vgpu.json" \
        nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
    echo "nvidia-smi memory.total: ${smi} MiB"
    if [ "$smi" = "$slice" ]; then pass "nvidia-smi shows $slice MiB"; else fail "nvidia-smi shows $smi MiB, not $slice"; fi
    echo

    echo "== 5. overhead against the real driver"
    echo "-- native"; native bench --iterations 200000
    fresh_region
    echo "-- with Tessera"; limited bench --iterations 200000
    echo
    echo "failures: $failures"
} 2>&1 | tee "$out/report.txt"
grep -q '^failures: 0$' "$out/report.txt"
