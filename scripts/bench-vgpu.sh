#!/usr/bin/env bash
# Overhead of libtessera_vgpu.so per driver call, on the simulated node:
# `tessera-cuda-probe bench` run natively and with the library preloaded (a
# generous memory limit, no SM limit), side by side in one run, repeated and
# reduced to the median (and the minimum) of the repeats. Prints a markdown
# table with Tessera's goals, judged on the medians. Every figure stands on
# the CUDA stand-in (sim/cuda), not a real driver: it measures what the
# library adds to a call, not what a GPU call costs.
#
# TESSERA_BENCH_QUICK=1: debug build, few iterations and repeats (a smoke run
# for CI; the goals are not checked). TESSERA_BENCH_REPEATS and
# TESSERA_BENCH_ITERATIONS override the defaults.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug
    repeats=${TESSERA_BENCH_REPEATS:-2}
    iterations=${TESSERA_BENCH_ITERATIONS:-2000}
    cargo build --locked -p tessera-vgpu -p tessera-sim -p tessera-sim-cuda -p tessera-sim-nvml
else
    profile=release
    repeats=${TESSERA_BENCH_REPEATS:-7}
    iterations=${TESSERA_BENCH_ITERATIONS:-200000}
    cargo build --release --locked -p tessera-vgpu -p tessera-sim -p tessera-sim-cuda -p tessera-sim-nvml
fi
bin="$PWD/target/$profile"
lib="$bin/libtessera_vgpu.so"

if [ -e /usr/local/tessera/vgpu.json ]; then
    echo "bench-vgpu: /usr/local/tessera/vgpu.json exists and would override the benchmark's limits" >&2
    exit 2
fi

work=$(mktemp -d /tmp/tessera-bench-vgpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/tessera-sim" create --profile h100-80gb --root "$work/node" >/dev/null
libdir="$work/node/usr/lib/x86_64-linux-gnu"
probe() { env -u LD_PRELOAD LD_LIBRARY_PATH="$libdir" "$bin/tessera-cuda-probe" "$@"; }

# The probe prints the bare uuid; limits files spell it as NVML does.
uuid=$(probe info | sed -n 's/^device\.0\.uuid=//p' | head -n1)
if [ -z "$uuid" ]; then
    echo "bench-vgpu: tessera-cuda-probe info printed no device.0.uuid" >&2
    exit 1
fi
mkdir -p -m 0755 "$work/accounting"
install -m 0666 /dev/null "$work/accounting/vgpu.accounting"
cat >"$work/vgpu.json" <<EOF
{"version": 1,
 "devices": [{"uuid": "GPU-${uuid#GPU-}", "memoryLimitMiB": 65536}],
 "accountingDir": "$work/accounting"}
EOF

# The library must really be in the measured process: with it, the device's
# total memory is the limit (64 GiB); without it, the stand-in's 80 GB.
limit_bytes=$((65536 * 1024 * 1024))
preloaded_total=$(env LD_PRELOAD="$lib" TESSERA_VGPU_CONFIG="$work/vgpu.json" LD_LIBRARY_PATH="$libdir" \
    "$bin/tessera-cuda-probe" info | sed -n 's/^device\.0\.total_bytes=//p')
native_total=$(probe info | sed -n 's/^device\.0\.total_bytes=//p')
if [ "$preloaded_total" != "$limit_bytes" ] || [ "$native_total" = "$limit_bytes" ]; then
    echo "bench-vgpu: the library is not in force in the measured process (total memory $preloaded_total with it, $native_total without; expected $limit_bytes with it)" >&2
    exit 1
fi

# One run of each, alternating, so drifts of the machine hit both alike.
for ((r = 0; r < repeats; r++)); do
    probe bench --iterations "$iterations" >"$work/native.$r"
    env LD_PRELOAD="$lib" TESSERA_VGPU_CONFIG="$work/vgpu.json" LD_LIBRARY_PATH="$libdir" \
        "$bin/tessera-cuda-probe" bench --iterations "$iterations" >"$work/tessera.$r"
done

# name -> the goal (added ns) for the calls the issue names; others get "-".
goal_of() {
    case "$1" in
        *launch*) echo "≤ +10" ;;
        *alloc*free* | *malloc*) echo "≤ +100" ;;
        *get_info* | *getinfo* | *mem_info*) echo "≤ +50" ;;
        *) echo "-" ;;
    esac
}

names=$(sed -n 's/^bench\.\(.*\)_ns=.*/\1/p' "$work/native.0")
if [ -z "$names" ]; then
    echo "bench-vgpu: tessera-cuda-probe bench printed no bench.<name>_ns= lines" >&2
    exit 1
fi

stats() { # <file prefix> <name> -> "median min"
    local values
    values=$(for ((r = 0; r < repeats; r++)); do
        sed -n "s/^bench\.$2_ns=//p" "$1.$r"
    done | sort -g)
    awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "nan nan"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.1f %.1f\n", m, v[1] }' <<<"$values"
}

echo
echo "Per-call cost in ns, $profile build, $iterations calls x 5 rounds per run (the probe keeps"
echo "its fastest round), $repeats runs each, alternating: median (min) over the runs."
echo "Added = with Tessera - native, from the medians and from the minimums; the goals are"
echo "judged on the medians. Against the CUDA stand-in (sim/cuda), the library checked in force."
echo
echo "| API | native ns | with Tessera ns | added ns, median (min) | goal |"
echo "|---|---|---|---|---|"
missed=""
for name in $names; do
    read -r n_med n_min <<<"$(stats "$work/native" "$name")"
    read -r t_med t_min <<<"$(stats "$work/tessera" "$name")"
    added_med=$(awk -v a="$t_med" -v b="$n_med" 'BEGIN { printf "%+.1f", a - b }')
    added_min=$(awk -v a="$t_min" -v b="$n_min" 'BEGIN { printf "%+.1f", a - b }')
    goal=$(goal_of "$name")
    echo "| $name | $n_med ($n_min) | $t_med ($t_min) | $added_med ($added_min) | $goal |"
    if [ "$goal" != "-" ]; then
        limit=$(sed 's/[^0-9]//g' <<<"$goal")
        if awk -v a="$added_med" -v l="$limit" 'BEGIN { exit !(a > l) }'; then
            missed="$missed $name($added_med>$limit)"
        fi
    fi
done
echo
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
if [ -n "$missed" ]; then
    if [ "$profile" = release ]; then
        echo "goals missed:$missed"
        exit 1
    fi
    echo "($profile build smoke run; the goals are judged on the release build:$missed)"
else
    echo "all goals met ($profile build)"
fi
