#!/usr/bin/env bash
# Accuracy of libtessera_vgpu.so's SM limiter, on the simulated node: each
# tenant (a container of its own: its own limits file and accounting
# directory) runs `tessera-cuda-probe launch` with the library preloaded and
# an SM limit, alone or beside a second tenant on the same device. The
# achieved share is read from the device's shared timeline in the CUDA
# stand-in (`tessera-sim timeline`: the device time each process's kernels
# really took, all processes serialized on one device clock), over a window
# after the limiter settled - never from the NVML utilization the limiter
# itself reads. Kernel costs are not what the limiter assumes: 20 us per
# launch, blocks in whole waves (2 per SM), 10 % seeded noise, kernels of
# 100, 300 and 1000 blocks in turn. Repeated; median (min-max) over the runs.
# Controls: no SM limit, and a limiter misled by a utilization report 20 %
# off (TESSERA_SIM_CUDA_UTIL_BIAS_PCT).
#
# TESSERA_BENCH_QUICK=1: debug build, one run, a 1 s window (a smoke run for
# CI; the goal is not checked). TESSERA_BENCH_REPEATS overrides the repeats.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug
    repeats=${TESSERA_BENCH_REPEATS:-1}
    warmup=1.2
    window=1
    cargo build --locked -p tessera-vgpu -p tessera-sim -p tessera-sim-cuda -p tessera-sim-nvml
else
    profile=release
    repeats=${TESSERA_BENCH_REPEATS:-5}
    warmup=1.2
    window=3
    cargo build --release --locked -p tessera-vgpu -p tessera-sim -p tessera-sim-cuda -p tessera-sim-nvml
fi
bin="$PWD/target/$profile"
lib="$bin/libtessera_vgpu.so"
run_seconds=$(awk -v w="$warmup" -v x="$window" 'BEGIN { print w + x + 0.6 }')

if [ -e /usr/local/tessera/vgpu.json ]; then
    echo "bench-sm-limit: /usr/local/tessera/vgpu.json exists and would override the benchmark's limits" >&2
    exit 2
fi

work=$(mktemp -d /tmp/tessera-bench-sm.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/tessera-sim" create --profile h100-80gb --root "$work/node" >/dev/null
libdir="$work/node/usr/lib/x86_64-linux-gnu"
uuid=$(env -u LD_PRELOAD LD_LIBRARY_PATH="$libdir" "$bin/tessera-cuda-probe" info |
    sed -n 's/^device\.0\.uuid=//p' | head -n1)
if [ -z "$uuid" ]; then
    echo "bench-sm-limit: tessera-cuda-probe info printed no device.0.uuid" >&2
    exit 1
fi

# Starts one tenant in the background: <slot> <sm percent|none> <bias %> <seed>;
# "none": without the library. Leaves its pid in $tenant_pid.
start_tenant() {
    local slot=$1 percent=$2 bias=$3 seed=$4
    local -a preload=()
    if [ "$percent" != none ]; then
        mkdir -p -m 0755 "$work/acct-$slot"
        [ -e "$work/acct-$slot/vgpu.accounting" ] || install -m 0666 /dev/null "$work/acct-$slot/vgpu.accounting"
        cat >"$work/limits-$slot.json" <<EOF
{"version": 1,
 "devices": [{"uuid": "GPU-${uuid#GPU-}", "memoryLimitMiB": 0, "smLimitPercent": $percent}],
 "accountingDir": "$work/acct-$slot"}
EOF
        preload=(LD_PRELOAD="$lib" TESSERA_VGPU_CONFIG="$work/limits-$slot.json")
    fi
    env -u LD_PRELOAD "${preload[@]}" LD_LIBRARY_PATH="$libdir" \
        TESSERA_SIM_CUDA_LAUNCH_NS=20000 TESSERA_SIM_CUDA_BLOCKS_PER_SM=2 \
        TESSERA_SIM_CUDA_NOISE_PCT=10 TESSERA_SIM_CUDA_NOISE_SEED="$seed" \
        TESSERA_SIM_CUDA_UTIL_BIAS_PCT="$bias" \
        "$bin/tessera-cuda-probe" launch --kernels 10 --blocks 100,300,1000 \
        --seconds "$run_seconds" >"$work/out-$slot" 2>&1 &
    tenant_pid=$!
}

# One run of tenants "<percent>:<bias>" ... at once; prints each tenant's
# achieved percent of the device, in order.
run_once() {
    local -a pids=()
    local slot=0 spec
    for spec in "$@"; do
        start_tenant "$slot" "${spec%%:*}" "${spec##*:}" "$((RANDOM + 1))"
        pids+=("$tenant_pid")
        slot=$((slot + 1))
    done
    local measured
    measured=$("$bin/tessera-sim" timeline --root "$work/node" --gpu 0 --after "$warmup" --window "$window")
    local pid
    for pid in "${pids[@]}"; do
        if ! wait "$pid"; then
            echo "bench-sm-limit: tenant $pid failed:" >&2
            cat "$work"/out-* >&2
            exit 1
        fi
    done
    for pid in "${pids[@]}"; do
        sed -n "s/^pid\.$pid\.busy_fraction=//p" <<<"$measured" |
            awk '{ printf "%.2f\n", $1 * 100 }'
    done
}

stats() { # values on stdin -> "median min max"
    sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "nan nan nan"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.1f %.1f %.1f\n", m, v[1], v[NR] }'
}

within() { # achieved target -> exit 0 if within 10 % of the target (at least 1 point)
    awk -v a="$1" -v t="$2" 'BEGIN { d = a - t; if (d < 0) d = -d; tol = 0.1 * t; if (tol < 1) tol = 1; exit !(d <= tol) }'
}

# Setups: "<label>|<tenant>,<tenant>|<kind>"; a tenant is <percent|none>:<bias>.
setups=(
    "one tenant|10:0|limit"
    "one tenant|30:0|limit"
    "one tenant|50:0|limit"
    "one tenant|70:0|limit"
    "two tenants, 30 + 50|30:0,50:0|limit"
    "two tenants, 10 + 70|10:0,70:0|limit"
    "beside a greedy tenant without the library|30:0,none:0|limit"
    "control: no SM limit (library without one)|0:0|control"
    "control: report 20 % low|30:-20|control"
    "control: report 20 % high|30:20|control"
)

for ((i = 0; i < ${#setups[@]}; i++)); do
    IFS='|' read -r _ tenants _ <<<"${setups[$i]}"
    IFS=',' read -r -a specs <<<"$tenants"
    for ((r = 0; r < repeats; r++)); do
        run_once "${specs[@]}" >"$work/result.$i.$r"
    done
done

echo
echo "SM limiter accuracy, $profile build: achieved share of the device (device time of the"
echo "tenant's kernels on the stand-in's shared timeline / wall time) over a ${window} s window"
echo "opened ${warmup} s after the start, median (min-max) over $repeats run(s). Goal: within"
echo "10 % of the target (at least 1 point). Against the CUDA stand-in (sim/cuda): 20 us per"
echo "launch, 2 blocks per SM per wave, 10 % noise, kernels of 100/300/1000 blocks."
echo
echo "| setup | tenant's SM limit | achieved %, median (min-max) | within 10 % |"
echo "|---|---|---|---|"
missed=""
broken=""
for ((i = 0; i < ${#setups[@]}; i++)); do
    IFS='|' read -r label tenants kind <<<"${setups[$i]}"
    IFS=',' read -r -a specs <<<"$tenants"
    for ((k = 0; k < ${#specs[@]}; k++)); do
        percent=${specs[$k]%%:*}
        bias=${specs[$k]##*:}
        read -r med min max <<<"$(for ((r = 0; r < repeats; r++)); do
            sed -n "$((k + 1))p" "$work/result.$i.$r"
        done | stats)"
        # A missing figure is a broken measurement, in any build.
        if ! [[ $med =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
            broken="$broken $label/$percent"
        fi
        case "$percent" in
            none) limit="none (no library)"; verdict="-" ;;
            0)
                limit="none (0)"; verdict="-"
                # Unlimited, the workload must fill the device, or the
                # controls above prove nothing.
                if ! awk -v m="$med" 'BEGIN { exit !(m > 90) }'; then
                    broken="$broken $label($med: an unlimited tenant did not fill the device)"
                fi
                ;;
            *)
                limit="$percent %"
                [ "$bias" != 0 ] && limit="$limit, report ${bias#-}% $([ "${bias:0:1}" = - ] && echo low || echo high)"
                if within "$med" "$percent"; then verdict=yes; else verdict=no; fi
                if [ "$kind" = limit ] && [ "$verdict" = no ]; then
                    missed="$missed $label/$percent($med)"
                fi
                if [ "$kind" = control ] && [ "$verdict" = yes ]; then
                    missed="$missed $label/$percent($med: a control passed)"
                fi
                ;;
        esac
        echo "| $label | $limit | $med ($min-$max) | $verdict |"
    done
done
echo
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
if [ -n "$broken" ]; then
    echo "bench-sm-limit: broken measurement:$broken" >&2
    exit 1
fi
if [ -n "$missed" ]; then
    if [ "$profile" = release ]; then
        echo "missed:$missed"
        exit 1
    fi
    echo "($profile build smoke run; judged on the release build:$missed)"
else
    echo "every limited tenant within 10 % of its target, every control outside ($profile build)"
fi
