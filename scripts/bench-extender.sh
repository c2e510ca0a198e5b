#!/usr/bin/env bash
# Benchmark of the scheduler extender (`tessera-scheduler-extender`), real
# processes over HTTP: starts the stand-in API server (`tessera-sim
# apiserver`), writes 1000 nodes × 8 A100-40GB (`tessera.io/node-gpus`: 6
# shared GPUs, 2 in MIG mode) and 5000 placed pods (`tessera.io/allocation`:
# share slices, 3g.20gb and 1g.5gb instances) into it, starts the extender
# and, beside it, a trivial extender that accepts every node (the baseline:
# HTTP + JSON alone); then measures, side by side in one run, /filter and
# /prioritize latency p50/p99 (every node name per request, nodeCacheCapable,
# sequential; goal p99 ≤ 5 ms) and bind throughput (2000 pods, 32 at once,
# two per node, half share slices, half MIG: Lease, annotation patch and
# Binding; a stand-in device-plugin loop sets bind-phase: success so each
# node's lock comes free; goal ≥ 500 pods/s) against the baseline posting
# the Binding alone. Prints a table; exits non-zero when a figure is missing
# or an answer is wrong (a node failing filter, a bind error, a pod not
# holding what it asked for), never because a goal is not met.
# The driver is extender/examples/bench-extender.rs.
# TESSERA_BENCH_QUICK=1: debug build, 100 nodes, 500 pods, 200 binds, few
# requests (a smoke test for CI). TESSERA_BENCH_REQUESTS sets the requests
# per verb.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug; flag=(); nodes=100; pods=500; bind_pods=200; requests=${TESSERA_BENCH_REQUESTS:-50}
else
    profile=release; flag=(--release); nodes=1000; pods=5000; bind_pods=2000; requests=${TESSERA_BENCH_REQUESTS:-500}
fi
concurrency=32
cargo build "${flag[@]}" --locked -p tessera-sim --bin tessera-sim \
    -p tessera-scheduler-extender --bin tessera-scheduler-extender --example bench-extender
bin="$PWD/target/$profile"
driver="$bin/examples/bench-extender"

work=$(mktemp -d /tmp/tessera-bench-extender.XXXXXX)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# Prints a service's log and fails.
died() {
    echo "bench-extender: $1 exited:" >&2
    cat "$2" >&2
    exit 1
}

TESSERA_LOG=${TESSERA_LOG:-warn} "$bin/tessera-sim" apiserver --listen 127.0.0.1:0 \
    --kubeconfig-out "$work/kubeconfig" 2>"$work/apiserver.log" &
apiserver_pid=$!
pids+=("$apiserver_pid")
for _ in $(seq 200); do
    [ -s "$work/kubeconfig" ] && break
    kill -0 "$apiserver_pid" 2>/dev/null || died "the API server" "$work/apiserver.log"
    sleep 0.1
done
if [ ! -s "$work/kubeconfig" ]; then
    echo "bench-extender: no kubeconfig from the API server after 20 s" >&2
    cat "$work/apiserver.log" >&2
    exit 1
fi

"$driver" populate --kubeconfig "$work/kubeconfig" \
    --nodes "$nodes" --pods "$pods" --bind-pods "$bind_pods"

# The MIG profiles the placed pods hold and the asking pods may get.
cat >"$work/cluster.yaml" <<'YAML'
nvidia:
  deviceSplitCount: 10
  migProfileAllowlist:
    - models: ["A100-SXM4-40GB"]
      profiles: ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
YAML

port=$("$driver" free-port)
"$bin/tessera-scheduler-extender" --kubeconfig "$work/kubeconfig" --config "$work/cluster.yaml" \
    --listen "127.0.0.1:$port" --identity bench-extender --log-format text \
    2>"$work/extender.log" &
extender_pid=$!
pids+=("$extender_pid")

"$driver" serve-baseline --kubeconfig "$work/kubeconfig" --address-out "$work/baseline.addr" \
    2>"$work/baseline.log" &
baseline_pid=$!
pids+=("$baseline_pid")
for _ in $(seq 200); do
    [ -s "$work/baseline.addr" ] && break
    kill -0 "$baseline_pid" 2>/dev/null || died "the baseline extender" "$work/baseline.log"
    sleep 0.1
done
[ -s "$work/baseline.addr" ] || died "the baseline extender (no address after 20 s)" "$work/baseline.log"
kill -0 "$extender_pid" 2>/dev/null || died "the extender" "$work/extender.log"

echo "extender pid $extender_pid, baseline $(cat "$work/baseline.addr"), API server pid $apiserver_pid ($profile build)"
# The figures depend on what else runs: say so next to them.
echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) before measuring"
status=0
"$driver" measure --kubeconfig "$work/kubeconfig" \
    --extender "http://127.0.0.1:$port" --baseline "http://$(cat "$work/baseline.addr")" \
    --nodes "$nodes" --pods "$pods" --bind-pods "$bind_pods" \
    --requests "$requests" --concurrency "$concurrency" || status=$?
if [ "$status" != 0 ]; then
    echo "bench-extender: the extender's log (last 40 lines):" >&2
    tail -n 40 "$work/extender.log" >&2
    kill -0 "$extender_pid" 2>/dev/null || echo "bench-extender: the extender is no longer running" >&2
fi
exit "$status"
