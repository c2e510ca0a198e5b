#!/usr/bin/env bash
# Check of libtessera_vgpu.so against a real NVIDIA driver (run on a GPU
# machine with PyTorch; changes no GPU setting). Written for a future session
# with a GPU; it has not been run yet.
#
#   1. memory: a 4 GiB slice on GPU 0; PyTorch allocates 3 GiB (must work),
#      then 5 GiB (must fail with an out-of-memory error), and
#      torch.cuda.mem_get_info() must report a 4 GiB total;
#   2. nvidia-smi run with the library preloaded shows 4096 MiB total;
#   3. compute: a matmul loop for a few seconds without a limit, then with a
#      30 % SM limit: the limited rate must be about 30 % of the unlimited one
#      (the script accepts 20-40 %);
#   4. overhead: tessera-cuda-probe's bench against the real driver, native
#      and preloaded (if the probe was built).
#
# Build first: cargo build --release -p tessera-vgpu -p tessera-sim-cuda
# Usage: OUT=/some/dir bash scripts/gpu-check-vgpu.sh
# Needs: nvidia-smi, python3 with torch (CUDA build), a GPU without other load.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${TESSERA_BIN:-$PWD/target/release}
out=${OUT:-/tmp/tessera-gpu-check-vgpu}
lib="$bin/libtessera_vgpu.so"
mkdir -p "$out"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

if [ -e /usr/local/tessera/vgpu.json ]; then
    echo "/usr/local/tessera/vgpu.json exists: it would override this check's limits; run elsewhere" >&2
    exit 2
fi
[ -f "$lib" ] || { echo "$lib missing: cargo build --release -p tessera-vgpu" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "nvidia-smi missing: not a GPU machine?" >&2; exit 2; }
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' ||
    { echo "python3 with a CUDA build of torch is needed" >&2; exit 2; }

uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
acct="$out/accounting"
mkdir -p "$acct"
write_config() { # <memory MiB> <sm percent>
    cat >"$out/vgpu.json" <<EOF
{"version": 1,
 "devices": [{"uuid": "$uuid", "memoryLimitMiB": $1, "smLimitPercent": $2}],
 "accountingDir": "$acct",
 "logLevel": "info"}
EOF
}
# Every run: the library preloaded, the limits from our file (the testing
# hook, honoured because /usr/local/tessera/vgpu.json does not exist), GPU 0.
run_limited() {
    rm -f "$acct/vgpu.accounting"
    env LD_PRELOAD="$lib" TESSERA_VGPU_CONFIG="$out/vgpu.json" CUDA_VISIBLE_DEVICES=0 "$@"
}

{
    echo "== GPU"
    nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv
    echo

    echo "== 1. memory: 4 GiB slice"
    write_config 4096 0
    run_limited python3 - <<'PY'
import torch
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info: free={free} total={total}")
ok = True
if total != 4 << 30:
    print(f"FAIL: total {total} != {4 << 30}"); ok = False
a = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
print("3 GiB: allocated")
del a
torch.cuda.empty_cache()
try:
    b = torch.empty(5 << 30, dtype=torch.uint8, device="cuda")
    print("FAIL: 5 GiB allocated past a 4 GiB slice"); ok = False
except torch.cuda.OutOfMemoryError as e:
    print("5 GiB: out of memory, as it must be:", str(e).splitlines()[0])
raise SystemExit(0 if ok else 1)
PY
    if [ $? = 0 ]; then pass "memory slice holds in PyTorch"; else fail "memory slice in PyTorch"; fi
    echo

    echo "== 2. nvidia-smi sees the slice"
    smi=$(run_limited nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
    echo "nvidia-smi memory.total: ${smi} MiB"
    if [ "$smi" = 4096 ]; then pass "nvidia-smi shows 4096 MiB"; else fail "nvidia-smi shows $smi MiB, not 4096"; fi
    run_limited nvidia-smi -i 0
    echo

    echo "== 3. compute: 30 % SM limit"
    cat >"$out/matmul.py" <<'PY'
import time, torch
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
for _ in range(10):
    a @ b
torch.cuda.synchronize()
n, start = 0, time.time()
while time.time() - start < 8:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    n += 10
print(f"rate={n / (time.time() - start):.2f}")
PY
    write_config 0 0
    free_rate=$(run_limited python3 "$out/matmul.py" | sed -n 's/^rate=//p')
    write_config 0 30
    limited_rate=$(run_limited python3 "$out/matmul.py" | sed -n 's/^rate=//p')
    echo "matmul/s unlimited: $free_rate, 30 % limit: $limited_rate"
    ratio=$(awk -v a="$limited_rate" -v b="$free_rate" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "nan" }')
    echo "limited / unlimited: $ratio %"
    if awk -v r="$ratio" 'BEGIN { exit !(r >= 20 && r <= 40) }'; then
        pass "SM limit: $ratio % of the unlimited rate (target 30)"
    else
        fail "SM limit: $ratio % of the unlimited rate (target 30, accepted 20-40)"
    fi
    echo

    echo "== 4. overhead against the real driver"
    if [ -x "$bin/tessera-cuda-probe" ]; then
        write_config 65536 0
        echo "-- native"; "$bin/tessera-cuda-probe" bench --iterations 200000
        echo "-- with Tessera"; run_limited "$bin/tessera-cuda-probe" bench --iterations 200000
    else
        echo "tessera-cuda-probe not built; skipped"
    fi
    echo
    echo "failures: $failures"
} 2>&1 | tee "$out/report.txt"
grep -q '^failures: 0$' "$out/report.txt"
