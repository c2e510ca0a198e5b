#!/usr/bin/env bash
# Scale benchmark of the stand-in API server (`tessera-sim apiserver`): loads
# 1000 nodes and 10 000 pods concurrently (16 connections), then measures,
# side by side in one run: GET /version and a list of 100 pods (baselines),
# the list of all pods, a namespace list of 100 among them, fieldSelector
# spec.nodeName and labelSelector lists, all nodes, a paged walk (limit 500),
# watch event latency with 1 and 100 watchers, create throughput, and the
# server's VmRSS/VmHWM. The load generator is
# sim/kube/apiserver/examples/apiserver-load.rs (plain HTTP/1.1, hyper).
# TESSERA_BENCH_QUICK=1: debug build, 100 nodes and 1000 pods, few runs (a
# smoke test for CI). TESSERA_BENCH_RUNS sets the runs per measurement.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug; flag=(); nodes=100; pods=1000; runs=${TESSERA_BENCH_RUNS:-5}
else
    profile=release; flag=(--release); nodes=1000; pods=10000; runs=${TESSERA_BENCH_RUNS:-20}
fi
cargo build "${flag[@]}" --locked -p tessera-sim --bin tessera-sim
cargo build "${flag[@]}" --locked -p tessera-kube-apiserver --example apiserver-load
bin="$PWD/target/$profile"

work=$(mktemp -d /tmp/tessera-bench-apiserver.XXXXXX)
server_pid=
cleanup() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

TESSERA_LOG=${TESSERA_LOG:-warn} "$bin/tessera-sim" apiserver --listen 127.0.0.1:0 \
    --kubeconfig-out "$work/kubeconfig" 2>"$work/apiserver.log" &
server_pid=$!
for _ in $(seq 200); do
    [ -s "$work/kubeconfig" ] && break
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "bench-apiserver: the server exited:" >&2
        cat "$work/apiserver.log" >&2
        exit 1
    fi
    sleep 0.1
done
server=$(awk '$1 == "server:" { gsub(/"/, "", $2); print $2; exit }' "$work/kubeconfig")
if [ -z "$server" ]; then
    echo "bench-apiserver: no server URL in the kubeconfig after 20 s" >&2
    cat "$work/apiserver.log" >&2
    exit 1
fi
echo "server $server (pid $server_pid, $profile build); $nodes nodes, $pods pods, $runs runs"
"$bin/examples/apiserver-load" --server "$server" --pid "$server_pid" \
    --nodes "$nodes" --pods "$pods" --runs "$runs"
